"""Automatic recovery on 2 real gloo ranks where only one rank's metrics degrade.

The decision is made once (any rank's trigger, rank 0's limits) and every rank restores the
same step, applies the same actions and ends bitwise identical; the limit then stops
every rank with the same error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _launch import launch

from ckptkit.checkpoint import manifest_io
from ckptkit.signals import recovery as rc

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

WORKER = Path(__file__).parents[1] / "ranks" / "_recovery_worker.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("recovery2")
    codes, res = launch(
        2, root / "out", worker=WORKER, ckpt=str(root / "ckpt"), steps=70, bad_rank=1,
        warn_from=34, nan_at=43, again_at=62,
    )
    assert codes == [0, 0], res
    return {"ckpt": root / "ckpt", "res": res}


def test_one_rank_degrades_every_rank_restores_the_same_step(run: dict[str, Any]) -> None:
    r0, r1 = run["res"]
    assert [e["kind"] for e in r0["events"]] == [e["kind"] for e in r1["events"]]
    assert [e["kind"] for e in r0["events"]] == ["restored", "skipped"]
    a, b = r0["events"][0], r1["events"][0]
    assert a["step"] == b["step"] == 30  # the newest checkpoint before rank 1's warning
    assert a["hash"] == b["hash"] and a["lr"] == b["lr"] == pytest.approx(5e-3)
    trig = a["record"]["trigger"]
    assert trig["ranks"] == [1] and trig["first_warning_step"] == 34
    assert "loss.nonfinite" in trig["signals"] and trig["signals"]["loss.nonfinite"]["ranks"] == [1]
    # Step 40 was saved while rank 1 warned (rank 0 saw nothing): not healthy, set aside.
    assert [c["step"] for c in a["record"]["abandoned"]] == [40]
    assert a["record"]["abandoned"][0]["health"] == "warn"
    drop = ("timing",)  # each rank's own clock
    assert {k: v for k, v in a["record"].items() if k not in drop} == {
        k: v for k, v in b["record"].items() if k not in drop
    }
    # Both ranks replayed 31-33, then skipped the batches of 34-43 (their own ids each).
    for r in (r0, r1):
        seen = {}
        for step, ids in r["trained"][:43]:
            seen[step] = ids
        window = [i for s in range(34, 44) for i in seen[s]]
        skip = r["events"][1]["record"]["actions"]["skip"]
        assert r["events"][1]["step"] == 33
        assert [i for _, i in skip["ids"][str(r["rank"])]] == window
        after = [ids for _, ids in r["trained"][43 + 3 :]]
        assert not set(window) & {i for ids in after for i in ids}
    skip = r0["events"][1]["record"]["actions"]["skip"]
    assert skip["samples"] == 2 * 4 * 10 and skip["ids_known"] is True


def test_the_limit_stops_every_rank_with_the_same_error(run: dict[str, Any]) -> None:
    r0, r1 = run["res"]
    for r in (r0, r1):
        assert r["error"] is not None and r["error"]["code"] == "CK-D010"
        assert r["error"]["step"] == 62 and "max_recoveries=1" in r["error"]["text"]
    assert r0["final_hash"] == r1["final_hash"]
    assert r0["clip"] == r1["clip"] == pytest.approx(0.5)


def test_rank0_recorded_it_once_in_the_log_and_the_manifests(run: dict[str, Any]) -> None:
    data = rc.read_log(run["ckpt"])
    assert len(data["recoveries"]) == 1 and len(data["refusals"]) == 1
    rec = data["recoveries"][0]
    assert rec["world_size"] == 2 and rec["restored"]["step"] == 30
    assert set(rec["actions"]["skip"]["ids"]) == {"0", "1"}
    man = manifest_io.read(run["ckpt"] / "step-00000060")
    assert man.recoveries is not None and man.recoveries["count"] == 1
    assert man.recoveries["history"][0]["trigger"]["ranks"] == [1]
    assert (run["ckpt"] / rc.ABANDONED / "recovery-001").is_dir()


def test_an_emergency_save_on_one_ranks_warning_is_taken_by_every_rank(tmp_path: Path) -> None:
    """mgr.observe() on every rank: only rank 1 warns, yet both ranks save (no hang)."""
    import ckptkit

    codes, res = launch(
        2, tmp_path / "out", worker=WORKER, ckpt=str(tmp_path / "ckpt"), steps=36, bad_rank=1,
        warn_from=34, nan_at=1000, observe=True,
    )
    assert codes == [0, 0], res
    mgr = ckptkit.CheckpointManager(tmp_path / "ckpt", readonly=True)
    pinned = {c.step: c for c in mgr.list() if "emergency" in c.pins}
    assert 34 in pinned and pinned[34].status == "verified"
    assert pinned[34].health == "warn"  # the worst rank's health
