"""Per-rank state saved per rank, on real gloo ranks (issue 39 item 6).

DDP with ``broadcast_buffers=False`` and a BatchNorm: the ranks' running statistics differ
by design. Each rank's come back to it bitwise at the same world size (2 -> 2), and a
world of one takes rank 0's (the reshard rule, docs/distributed.md). A model whose rank 0
alone holds a parameter is refused at save on every rank with ``CK-S022`` naming the
parameter and the ranks, not with a message blaming a damaged manifest. One launch covers
both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _launch import launch
from _perrank_worker import buffers, fresh

import ckptkit
from ckptkit import codes

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

WORKER = Path(__file__).parents[1] / "ranks" / "_perrank_worker.py"


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("perrank")
    exit_codes, res = launch(
        2, root / "o", worker=WORKER, ckpt=str(root / "ck"), odd=str(root / "odd")
    )
    assert exit_codes == [0, 0], res
    assert all(r is not None for r in res)
    return root, res  # type: ignore[return-value]


def test_each_rank_gets_its_own_buffers_back_bitwise(
    ran: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, (r0, r1) = ran
    stats = [n for n in r0["saved"] if n.endswith(("running_mean", "running_var"))]
    assert stats and all(r0["saved"][n] != r1["saved"][n] for n in stats)  # they differ
    for r in (r0, r1):
        assert r["restored"] == r["saved"]
        assert r["params_equal"]
        assert not any("buffers" in n for n in r["notes"])


def test_each_rank_wrote_its_buffers_and_the_checkpoint_verifies(
    ran: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, _ = ran
    ckpt = root / "ck" / "step-00000002"
    assert (ckpt / "buffers-rank00000.safetensors").is_file()
    assert (ckpt / "buffers-rank00001.safetensors").is_file()
    res = ckptkit.verify(ckpt)
    assert res.ok, [f.to_dict() for f in res.findings]


def test_a_world_of_one_takes_rank_0s_buffers(
    ran: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, (r0, _) = ran
    model = fresh()
    ts = ckptkit.TrainState(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    res = ckptkit.CheckpointManager(root / "ck", readonly=True).restore(ts)
    assert res is not None and res.step == 2
    assert buffers(model) == r0["saved"]


def test_a_parameter_only_rank_0_holds_is_refused_naming_it(
    ran: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, res = ran
    for r in res:
        odd = r["odd"]
        assert odd is not None and odd["code"] == codes.S022, odd
        assert odd["type"] == "StateError"
        msg = odd["message"]
        assert "'model/extra' (float32 [3]) is held by rank 0, not by rank 1" in msg
        assert "register the tensor on every rank" in msg
        assert codes.M009 not in msg and "damaged" not in msg
    assert not list((root / "odd").glob("step-*"))  # nothing was written
