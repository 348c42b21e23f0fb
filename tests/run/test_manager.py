"""CheckpointManager: retention through the manager, latest, async, leftovers, read-only."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.checkpoint.catalog import LATEST, step_dir_name
from ckptkit.run import saving as saving_mod
from ckptkit.run.manager import CheckpointManager
from ckptkit.storage import atomic


def _state(step: int = 0) -> ckptkit.TrainState:
    torch.manual_seed(0)
    return ckptkit.TrainState(model=torch.nn.Linear(8, 8), step=step)


def _save_steps(mgr: CheckpointManager, steps: list[int], **pins: str) -> ckptkit.TrainState:
    ts = _state()
    for s in steps:
        ts.step = s
        mgr.save(ts, pin=pins.get(f"s{s}"))
    mgr.wait()  # the last save's read-back verify and rotation run in the background
    return ts


def _steps(mgr: CheckpointManager) -> list[int]:
    return [c.step for c in mgr.list()]


def _latest(root: Path) -> str:
    return (root / LATEST).read_text().strip()


def _flip(path: Path) -> None:
    """Flip one bit near the end of a file, keeping its size and mtime (silent bit rot)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_keep_last_and_keep_every(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2, keep_every=40)
    _save_steps(mgr, list(range(10, 101, 10)))
    assert _steps(mgr) == [40, 80, 90, 100]
    assert all(c.status == "verified" for c in mgr.list())
    assert _latest(tmp_path) == step_dir_name(100)
    mgr.close()


def test_pins_survive_rotation(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1)
    _save_steps(mgr, [10, 20, 30, 40, 50], s20="emergency", s30="best")
    assert _steps(mgr) == [20, 30, 50]
    pins = {c.step: c.pins for c in mgr.list()}
    assert pins[20] == ("emergency",) and pins[30] == ("best",)
    mgr.close()


def test_max_bytes_drops_oldest_unpinned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    probe = CheckpointManager(tmp_path / "probe")
    _save_steps(probe, [1])
    size = probe.list()[0].size
    probe.close()
    caplog.set_level(logging.INFO, logger="ckptkit")
    mgr = CheckpointManager(tmp_path / "run", keep_last=10, max_bytes=int(2.5 * size))
    _save_steps(mgr, [10, 20, 30, 40], s10="best")
    # 10 is pinned (never dropped), 40 is the newest verified: 20 and 30 go for the budget.
    assert _steps(mgr) == [10, 40]
    assert any("deleted step-00000020: over max_bytes budget" in r.message for r in caplog.records)
    assert mgr.last_save.deleted and "max_bytes" in mgr.last_save.deleted[0]
    mgr.close()


def test_budget_smaller_than_one_checkpoint_keeps_newest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3, max_bytes=1)
    _save_steps(mgr, [1, 2, 3])
    assert _steps(mgr) == [3]
    assert mgr.plan().budget_note is not None
    mgr.close()


def test_failed_verify_deletes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1)
    ts = _save_steps(mgr, [10])
    real = saving_mod.commit

    def commit_then_rot(final, *a, **kw):  # type: ignore[no-untyped-def]
        man = real(final, *a, **kw)
        _flip(Path(final) / "model.safetensors")
        return man

    monkeypatch.setattr(saving_mod, "commit", commit_then_rot)
    ts.step = 20
    mgr.save(ts)  # committed; the read-back verify runs in the background
    with pytest.raises(ckptkit.CommittedError, match="read-back verify failed: CK-F003") as ei:
        mgr.wait()
    assert ei.value.committed == tmp_path / step_dir_name(20) and ei.value.code == "CK-F003"
    monkeypatch.undo()
    status = {c.step: c.status for c in mgr.list()}
    assert status == {10: "verified", 20: "corrupt"}  # 10 kept although keep_last=1
    assert _latest(tmp_path) == step_dir_name(10)
    # The corrupt one never counts as good: the next save keeps 30, drops 10, flags 20.
    ts.step = 30
    mgr.save(ts)
    assert {c.step: c.status for c in mgr.list()} == {20: "corrupt", 30: "verified"}
    mgr.close()


def test_no_good_checkpoint_left(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1)
    ts = _save_steps(mgr, [10, 20])
    _flip(tmp_path / step_dir_name(20) / "model.safetensors")
    with pytest.raises(ckptkit.IncompleteCheckpointError, match="CK-F003"):
        mgr.restore(_state())
    assert [(c.step, c.status) for c in mgr.list()] == [(20, "corrupt")]
    assert mgr.latest() is None and not (tmp_path / LATEST).exists()
    # Recorded corrupt is a claim, re-checked from the bytes (issue 23): still damaged.
    with pytest.raises(ckptkit.IncompleteCheckpointError, match="CK-F003"):
        mgr.restore(_state())
    assert [(c.step, c.status) for c in mgr.list()] == [(20, "corrupt")]
    ts.step = 30
    mgr.save(ts)
    assert [(c.step, c.status) for c in mgr.list()] == [(20, "corrupt"), (30, "verified")]
    mgr.close()


def test_latest_points_at_newest_verified(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    _save_steps(mgr, [10, 20, 30])
    _flip(tmp_path / step_dir_name(30) / "model.safetensors")
    res = mgr.restore(_state())
    assert res is not None and res.step == 20
    assert any("skipped step-00000030" in n for n in res.notes)
    assert _latest(tmp_path) == step_dir_name(20)
    assert mgr.latest() is not None and mgr.latest().step == 20  # type: ignore[union-attr]
    plan = mgr.plan(keep_last=1)
    assert plan.by_step()[20].keep and "newest verified" in plan.by_step()[20].reason
    assert plan.by_step()[30].flagged
    mgr.close()


def test_async_snapshot_is_consistent(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3)
    ts = _state(step=1)
    before = {k: v.clone() for k, v in ts.model.state_dict().items()}
    mgr.save(ts, async_=True)
    with torch.no_grad():  # the training loop goes on while the save writes
        for p in ts.model.parameters():
            p.add_(100.0)
    mgr.wait()
    fresh = _state()
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.zero_()
    assert mgr.restore(fresh) is not None
    for k, v in fresh.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    mgr.close()


def test_async_reuses_one_staging_copy(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2)
    ts = _state()
    ptrs = []
    for s in (1, 2, 3):
        ts.step = s
        mgr.save(ts, async_=True)
        ptrs.append(sorted(t.data_ptr() for t in mgr._saves._stager._bufs.values()))
    mgr.wait()
    assert ptrs[0] == ptrs[1] == ptrs[2]
    assert _steps(mgr) == [2, 3]
    mgr.close()


def test_async_error_surfaces_at_next_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = CheckpointManager(tmp_path)
    ts = _state(step=1)
    mgr.save(ts)

    def boom(*a, **kw):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected background failure")

    monkeypatch.setattr(saving_mod, "commit", boom)
    ts.step = 2
    mgr.save(ts, async_=True)
    with pytest.raises(RuntimeError, match="injected background failure"):
        mgr.wait()
    mgr.wait()  # raised once, then cleared
    ts.step = 3
    mgr.save(ts, async_=True)
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="injected"):
        mgr.save(ts)  # the next save joins the failed one and raises its error
    assert _steps(mgr) == [1]
    mgr.close()


def test_leftovers_cleaned_on_open_committed_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    _save_steps(mgr, [10, 20])
    mgr.close()
    before = sorted(p.name for p in (tmp_path / step_dir_name(20)).iterdir())
    # An interrupted save, an interrupted delete, and an overwrite caught between renames.
    tmp = tmp_path / f"{step_dir_name(30)}{atomic.TMP_SUFFIX}.abcd1234"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"partial")
    dele = tmp_path / f"{step_dir_name(5)}{atomic.TMP_SUFFIX}.del-1234abcd"
    dele.mkdir()
    moved = tmp_path / f"{step_dir_name(10)}{atomic.OLD_SUFFIX}.feedbeef"
    os.rename(tmp_path / step_dir_name(10), moved)
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        mgr = CheckpointManager(tmp_path, keep_last=5)
    msgs = " ".join(r.message for r in caplog.records)
    assert "3 leftover temporary directories" in msgs and "cleaning up" in msgs
    assert "restored it as step-00000010" in msgs
    assert not tmp.exists() and not dele.exists() and not moved.exists()
    assert _steps(mgr) == [10, 20]
    assert all(c.status == "verified" for c in mgr.list())
    assert sorted(p.name for p in (tmp_path / step_dir_name(20)).iterdir()) == before
    mgr.close()


def test_leftovers_left_alone_while_a_writer_holds_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = CheckpointManager(tmp_path)
    _save_steps(writer, [1])  # holds the lock from now on
    tmp = tmp_path / f"{step_dir_name(2)}{atomic.TMP_SUFFIX}.0000aaaa"
    tmp.mkdir()
    # A second writer is refused at open, before it touches anything; a reader reports.
    with pytest.raises(ckptkit.LockHeldError):
        CheckpointManager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        CheckpointManager(tmp_path, readonly=True)
    assert tmp.exists()
    assert "left in place" in caplog.text
    writer.close()


def test_readonly_creates_and_cleans_nothing(tmp_path: Path) -> None:
    ro = CheckpointManager(tmp_path / "absent", readonly=True)
    assert not (tmp_path / "absent").exists() and ro.list() == []
    mgr = CheckpointManager(tmp_path / "run")
    _save_steps(mgr, [1])
    mgr.close()
    tmp = tmp_path / "run" / f"{step_dir_name(2)}{atomic.TMP_SUFFIX}.0000bbbb"
    tmp.mkdir()
    ro = CheckpointManager(tmp_path / "run", readonly=True)
    assert tmp.exists() and ro.leftovers() == [tmp]
    with pytest.raises(ckptkit.CkptkitError, match="read-only"):
        ro.save(_state(step=3))
    assert ro.restore(_state()) is not None


def test_status_follows_bytes_not_mtimes(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    _save_steps(mgr, [1])
    f = tmp_path / step_dir_name(1) / "model.safetensors"
    # A copy (cp -r) changes modification times, not content: still verified.
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    (info,) = mgr.list()
    assert info.status == "verified" and info.verified_at is not None
    # A resized file is no longer vouched for until verified again.
    with open(f, "ab") as fh:
        fh.write(b"x")
    (info,) = mgr.list()
    assert info.status == "committed" and "resized" in (info.problem or "")
    (info,) = mgr.list(verify=True)
    assert info.status == "corrupt" and "CK-F002" in (info.problem or "")
    mgr.close()


def test_prune_keeps_newest_verified(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=10)
    _save_steps(mgr, [1, 2, 3, 4])
    plan = mgr.prune(dry_run=True, keep_last=1)
    assert [c.step for c in plan.delete] == [1, 2, 3] and _steps(mgr) == [1, 2, 3, 4]
    mgr.prune(keep_last=1)
    assert _steps(mgr) == [4]
    shutil.rmtree(tmp_path / step_dir_name(4))
    assert mgr.restore(_state()) is None
    mgr.close()


def test_rotation_works_without_verify_after_save(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    import ckptkit

    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    mgr = ckptkit.CheckpointManager(tmp_path, keep_last=2, verify_after_save=False)
    for s in range(1, 6):
        ts.step = s
        mgr.save(ts)
    assert [c.step for c in mgr.list()] == [4, 5]
    mgr.close()


def test_a_plain_dict_is_refused_with_the_fix_not_an_attribute_error(tmp_path: Path) -> None:
    """``mgr.save({"w": t})`` failed deep in the look-ahead with ``AttributeError``."""
    with ckptkit.CheckpointManager(tmp_path / "run") as mgr:
        with pytest.raises(ckptkit.errors.StateError, match=r"takes a ckptkit.TrainState.*ckptkit.save"):
            mgr.save({"w": torch.ones(2)}, step=1)
        with pytest.raises(ckptkit.errors.StateError, match=r"CheckpointManager\.restore takes"):
            mgr.restore({"w": torch.ones(2)})
    assert not list((tmp_path / "run").glob("step-*"))
