"""Verified retention always ends, and never on a verdict the bytes contradicted (issue 23, #6).

A long-lived process pruned forever after a manifest rotted in place with its size and
mtime kept: the catalog's manifest cache (keyed on inode, size, mtime) still vouched for
the old manifest, the re-verify failed but could not be recorded, and ``retain.apply``
made the same plan again and again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from deadline import within

import ckptkit
from ckptkit.checkpoint.catalog import Catalog, CheckpointInfo, step_dir_name
from ckptkit.codes import CODES, Finding
from ckptkit.run import retain
from ckptkit.run.manager import CheckpointManager


class _Store:
    """A run whose re-verify of some steps fails; ``records`` says whether the run can
    record that (a real run that cannot: a manifest it cannot parse, an index it cannot
    write)."""

    def __init__(self, steps: Sequence[int], *, bad: set[int], records: bool) -> None:
        self.status = dict.fromkeys(steps, "verified")
        self.bad = bad
        self.records = records
        self.reverified: list[int] = []
        self.removed: list[int] = []

    def checkpoints(self) -> list[CheckpointInfo]:
        return [
            CheckpointInfo(s, Path(step_dir_name(s)), st, 10, float(s))  # type: ignore[arg-type]
            for s, st in sorted(self.status.items())
        ]

    def reverify(self, info: CheckpointInfo) -> list[Finding]:
        # Before the fix the loop re-verified the same step forever: fail at the second try
        # instead of hanging the test.
        assert info.step not in self.reverified, f"step {info.step} re-verified twice"
        self.reverified.append(info.step)
        if info.step not in self.bad:
            return []
        if self.records:
            self.status[info.step] = "corrupt"
        return [CODES["CK-F003"].finding("digest mismatch", path="model.safetensors")]

    def remove(self, info: CheckpointInfo) -> bool:
        self.removed.append(info.step)
        del self.status[info.step]
        return True

    def fence(self) -> None:
        pass


def test_a_failure_the_run_cannot_record_stops_retention_deleting_nothing() -> None:
    run = _Store([10, 20, 30], bad={30}, records=False)
    out = retain.apply(run, retain.Policy(keep_last=1))
    assert run.reverified == [30]
    assert run.removed == [] and out.deleted == []
    assert out.stopped is not None and "step-00000030" in out.stopped
    assert "could not be recorded" in out.stopped
    # The plan handed back (what 'ckptkit prune' prints) deletes nothing and says why.
    assert not out.plan.delete
    assert all("not deleted" in d.reason for d in out.plan.decisions if d.ckpt.step != 30)


def test_a_recorded_failure_replans_on_the_next_good_checkpoint() -> None:
    run = _Store([10, 20, 30], bad={30}, records=True)
    out = retain.apply(run, retain.Policy(keep_last=1))
    assert run.reverified == [30, 20]
    assert out.stopped is None
    assert run.removed == [10]  # 20 justified it after 30 was recorded corrupt
    assert sorted(run.status) == [20, 30]


def test_every_good_checkpoint_failing_ends_with_nothing_deleted() -> None:
    run = _Store([10, 20, 30, 40], bad={10, 20, 30, 40}, records=True)
    out = retain.apply(run, retain.Policy(keep_last=1))
    # Once 10 is the only good one left, the plan deletes nothing: no re-verify needed.
    assert run.reverified == [40, 30, 20]
    assert run.removed == [] and out.stopped is None


def _rot_in_place(manifest: Path) -> None:
    """Change one byte of ``manifest`` in place, keeping its inode, size and mtime."""
    st = os.stat(manifest)
    data = bytearray(manifest.read_bytes())
    i = data.index(b'"step"')
    data[i + 1] = ord("S")  # "step" -> "Step": same size, no longer a valid manifest
    with open(manifest, "r+b") as f:
        f.write(data)
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(manifest)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
    )


def test_catalog_manifest_cache_does_not_vouch_for_changed_bytes(tmp_path: Path) -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=3)
    with CheckpointManager(tmp_path) as mgr:
        mgr.save(ts)
    cat = Catalog(tmp_path)
    ckpt = tmp_path / step_dir_name(3)
    cat.manifest(ckpt)  # cached
    _rot_in_place(ckpt / "manifest.json")
    with pytest.raises(ckptkit.ManifestError):
        cat.manifest(ckpt)
    assert [(c.step, c.status) for c in cat.list()] == [(3, "corrupt")]


def test_long_lived_prune_after_in_place_manifest_rot_returns(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4))
    mgr = CheckpointManager(tmp_path, keep_last=10)
    try:
        for s in (10, 20, 30):
            ts.step = s
            mgr.save(ts)
        mgr.wait()
        assert [c.status for c in mgr.list()] == ["verified"] * 3  # the cache holds all three
        _rot_in_place(tmp_path / step_dir_name(30) / "manifest.json")
        plan = within(120, lambda: mgr.prune(keep_last=1))
    finally:
        mgr.close()
    assert [c.step for c in plan.delete] == [10]
    # Nothing restorable was deleted: 20 (the newest whole one) is there and restores.
    assert (tmp_path / step_dir_name(20)).is_dir()
    assert (tmp_path / step_dir_name(30)).is_dir()  # corrupt: kept as evidence
    fresh = ckptkit.TrainState(model=torch.nn.Linear(4, 4))
    with CheckpointManager(tmp_path, readonly=True) as again:
        got = again.restore(fresh)
    assert got is not None and fresh.step == 20
