"""Replica agreement at save time on real gloo ranks (issue 26 item 3).

One bit of one rank's parameter or Adam moment is flipped between two training steps, as a
faulty accelerator would: the next save finds it, names the tensor and the ranks, records
the checkpoint ``replica-divergent`` (never ``latest``, never restored) and tells the
stability watch; ``on_divergence`` decides whether training stops. The saves before the
flip are clean runs: they never report a divergence.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _launch import launch

from ckptkit import codes

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

WORKER = Path(__file__).parents[1] / "ranks" / "_replica_worker.py"


def run(tmp_path: Path, world: int, **spec: Any) -> tuple[Path, list[dict[str, Any]]]:
    ckpt = tmp_path / "ckpt"
    exit_codes, res = launch(world, tmp_path / "o", worker=WORKER, ckpt=str(ckpt), **spec)
    assert exit_codes == [0] * world
    assert all(r is not None for r in res)
    return ckpt, res  # type: ignore[return-value]


def clean(save: dict[str, Any]) -> bool:
    rec = save["replicas"]
    return save["raised"] is None and rec is not None and rec["divergent"] == [] and rec["tensors"] > 0


def keys(save: dict[str, Any]) -> dict[str, Any]:
    return {d["key"]: d for d in save["replicas"]["divergent"]}


def test_moment_flip_on_two_ranks_stops_training_at_the_next_save(tmp_path: Path) -> None:
    """on_divergence="raise", async saves sampled every second save: every rank raises
    CK-F120 naming the moment; the save the sampling skipped records no check."""
    ckpt, res = run(
        tmp_path, 2, on_divergence="raise", saves=3, every=2,
        flips=[{"at": 2, "rank": 1, "what": "moment"}], **{"async": True},
    )
    for r in res:
        first, second, third = r["saves"]
        assert clean(first) and second["replicas"] is None and second["raised"] is None
        assert third["raised"]["code"] == codes.F120
        div = keys(third)
        moment = [k for k in div if k.startswith("optimizer/") and k.endswith("exp_avg")]
        assert moment, div
        assert div[moment[0]]["minority"] is None  # two replicas: no majority
        assert sorted(r for rs in div[moment[0]]["copies"].values() for r in rs) == [0, 1]
        assert "ranks 0 | 1" in third["raised"]["message"] and moment[0] in third["raised"]["message"]
        assert [(s, st) for s, st, _ in r["listed"]] == [
            (1, "verified"), (2, "verified"), (3, "replica-divergent")
        ]
        assert r["latest"] == 2
        assert r["watch"]["level"] == "critical" and "replicas.divergent" in r["watch"]["signals"]
    ls = subprocess.run(
        [sys.executable, "-m", "ckptkit", "ls", str(ckpt)], capture_output=True, text=True, timeout=120
    )
    assert ls.returncode == 1, ls.stdout + ls.stderr
    assert "replica-divergent" in ls.stdout and codes.F120 in ls.stdout


def test_param_flip_on_two_ranks_warns_and_restore_passes_over_it(tmp_path: Path) -> None:
    """on_divergence="warn": training goes on; the divergent saves are never resumed from."""
    _, res = run(
        tmp_path, 2, on_divergence="warn", saves=3, restore=True,
        flips=[{"at": 1, "rank": 0, "what": "param"}],
    )
    for r in res:
        first, second, third = r["saves"]
        assert clean(first)
        for s in (second, third):
            assert s["raised"] is None
            assert list(keys(s)) == ["model/a.weight"]  # the flipped parameter, nothing else
        assert [st for _, st, _ in r["listed"]] == ["verified", "replica-divergent", "replica-divergent"]
        assert r["latest"] == 1
        assert r["restored"]["step"] == 1
        assert any("step-00000003" in n and "replica-divergent" in n for n in r["restored"]["notes"])


def test_four_ranks_name_the_minority_rank(tmp_path: Path) -> None:
    """Four DDP replicas: the flipped rank is named as the minority, parameter then moment."""
    _, res = run(
        tmp_path, 4, on_divergence="warn", saves=3,
        flips=[{"at": 1, "rank": 3, "what": "param"}, {"at": 2, "rank": 1, "what": "moment"}],
    )
    for r in res:
        first, second, third = r["saves"]
        assert clean(first)
        assert {k: d["minority"] for k, d in keys(second).items()} == {"model/a.weight": [3]}
        last = keys(third)
        assert last["model/a.weight"]["minority"] == [1, 3]  # rank 1's update diverged too
        moment = [k for k in last if k.endswith("exp_avg")]
        assert moment and last[moment[0]]["minority"] == [1]
        assert [st for _, st, _ in r["listed"]] == ["verified", "replica-divergent", "replica-divergent"]


def test_hsdp_replicas_of_a_shard_are_compared(tmp_path: Path) -> None:
    """HSDP (2 replicas x 2 shards, DCP storage): ranks 1 and 3 hold the same shard."""
    _, res = run(
        tmp_path, 4, on_divergence="warn", saves=3, hsdp=True,
        flips=[{"at": 2, "rank": 3, "what": "param"}],
    )
    for r in res:
        first, second, third = r["saves"]
        assert clean(first) and clean(second)
        assert first["replicas"]["groups"] == 2  # {0, 2} and {1, 3}
        (div,) = third["replicas"]["divergent"]
        assert div["key"].startswith("dcp/model/a.weight@")
        assert sorted(rs[0] for rs in div["copies"].values()) == [1, 3]
        assert [st for _, st, _ in r["listed"]] == ["verified", "verified", "replica-divergent"]
