"""The torchtitan integration on two gloo ranks: saves carry one manifest
listing every rank's shard, and a load falls back past a newest step whose rank-1 shard
was cut short, the same step on both ranks (rank 0 chooses, the other is told)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _launch import launch

import ckptkit.checkpoint.dcp

pytest.importorskip("torchtitan")
pytestmark = [pytest.mark.integration, pytest.mark.distributed]


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_two_ranks_save_and_fall_back_past_a_cut_shard_together(
    tmp_path: Path, async_mode: str
) -> None:
    # Before: rank 0's run lock created the checkpoint folder in the manager's constructor,
    # and a rank whose first load looked for it sooner skipped the collective choice of the
    # step; its next collective then met rank 0's broadcast and the ranks locked up (gloo
    # timeout, in whichever save came next: async or not).
    dump = tmp_path / "dump"
    worker = Path(__file__).parents[1] / "ranks" / "_titan_worker.py"
    rcs, res = launch(2, tmp_path / "out", worker=worker, dump=str(dump), async_mode=async_mode)
    assert rcs == [0, 0], res
    r0, r1 = res
    assert r0 is not None and r1 is not None
    assert sorted(r0["saved"]) == ["2", "4"]
    for r in (r0, r1):
        # Both ranks pass step 4 over and load step 2: the weights saved there, bit for bit.
        assert (r["chosen"], r["loaded"], r["digest"]) == (2, 2, r0["saved"]["2"]), r
    for step in (2, 4):
        man = ckptkit.dcp.read_manifest(dump / "checkpoint" / f"step-{step}")
        listed = {f["path"] for f in man.user["adopted"]["files"]}
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= listed
        assert man.step == step
