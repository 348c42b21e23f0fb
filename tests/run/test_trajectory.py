"""A process's trajectory: what ``CheckpointManager.trajectory.holds`` vouches for, and the branch a
save makes after restoring an older step (issue 23, repro 10 and "What to build" 6).

The pre-emption guard skips its save only when the run holds *this* state: the checkpoint
the process restored, or one it saved since, unchanged and verified. A directory of the
same step from another trajectory is not that state. A save past a restored older step
sets the newer checkpoints aside, so no later resume, rollback or rotation picks them.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.signals.recovery import ABANDONED
from ckptkit.storage import atomic

BRANCH_1 = "branch-001-from-step-00000020"


def _state(step: int = 0) -> ckptkit.TrainState:
    torch.manual_seed(0)
    return ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=step)


def _at(ts: ckptkit.TrainState, step: int, value: float) -> ckptkit.TrainState:
    """Put ``ts`` at ``step`` with every weight equal to ``value`` (a trajectory's mark)."""
    with torch.no_grad():
        for p in ts.model.parameters():
            p.fill_(value)
    ts.step = step
    return ts


def _run_to_40(root: Path) -> None:
    """Trajectory A: steps 10, 20, 30, 40, weights equal to the step."""
    ts = _state()
    with ckptkit.CheckpointManager(root, keep_last=10) as mgr:
        for s in (10, 20, 30, 40):
            mgr.save(_at(ts, s, float(s)))


def _weight(root: Path, step: int | None = None) -> tuple[int, float]:
    """What a fresh process restores (the newest, or ``step``): its step and weight."""
    ts = _state()
    res = ckptkit.CheckpointManager(root, readonly=True).restore(ts, step=step)
    assert res is not None
    return res.step, float(ts.model.weight.detach()[0, 0])


def _steps(root: Path) -> list[int]:
    return [c.step for c in ckptkit.CheckpointManager(root, readonly=True).list()]


def test_holds_what_this_process_saved(tmp_path: Path) -> None:
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(_at(_state(), 3, 1.0))
        assert mgr.trajectory.holds(3)
        assert not mgr.trajectory.holds(4)


def test_holds_the_restored_checkpoint_and_not_the_newer_ones(tmp_path: Path) -> None:
    _run_to_40(tmp_path)
    with ckptkit.CheckpointManager(tmp_path, keep_last=10) as mgr:
        assert mgr.restore(_state(), step=20) is not None
        # Directories of steps 30 and 40 exist: not this process's state at those steps.
        assert [mgr.trajectory.holds(s) for s in (10, 20, 30, 40)] == [False, True, False, False]


def test_a_checkpoint_another_writer_replaced_is_not_held(tmp_path: Path) -> None:
    mine = ckptkit.CheckpointManager(tmp_path)
    mine.save(_at(_state(), 5, 1.0))
    mine.close()
    with ckptkit.CheckpointManager(tmp_path) as other:
        other.save(_at(_state(), 5, 2.0), overwrite=True)
    assert not mine.trajectory.holds(5)  # same name, another manifest digest


def test_a_checkpoint_that_fails_its_verify_is_not_held(tmp_path: Path) -> None:
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        path = mgr.save(_at(_state(), 5, 1.0))
        mgr.wait()
        shard = next(p for p in Path(str(path)).iterdir() if p.suffix == ".safetensors")
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        shard.write_bytes(bytes(data))
        assert [c.status for c in mgr.list(verify=True)] == ["corrupt"]
        assert not mgr.trajectory.holds(5)


def test_a_save_past_a_restored_older_step_sets_the_newer_ones_aside(tmp_path: Path) -> None:
    _run_to_40(tmp_path)
    ts = _state()
    with ckptkit.CheckpointManager(tmp_path, keep_last=10) as mgr:
        mgr.restore(ts, step=20)
        mgr.save(_at(ts, 30, 30.5))  # trajectory B, at a step A also saved
        mgr.wait()
        assert mgr.trajectory.holds(30)
        assert mgr.latest() is not None and mgr.latest().step == 30  # type: ignore[union-attr]
        mgr.save(_at(ts, 35, 35.5))  # later saves branch no more
    assert _steps(tmp_path) == [10, 20, 30, 35]
    assert _weight(tmp_path, step=30) == (30, 30.5)
    assert _weight(tmp_path) == (35, 35.5)
    # A's newer checkpoints are kept whole, out of the run's namespace.
    aside = tmp_path / ABANDONED
    assert [p.name for p in aside.iterdir()] == [BRANCH_1]
    assert sorted(p.name for p in (aside / BRANCH_1).iterdir()) == ["step-00000030", "step-00000040"]
    for p in (aside / BRANCH_1).iterdir():
        assert ckptkit.verify(p).ok


def test_a_second_branch_gets_the_next_number(tmp_path: Path) -> None:
    _run_to_40(tmp_path)
    for value in (25.5, 25.75):
        ts = _state()
        with ckptkit.CheckpointManager(tmp_path, keep_last=10) as mgr:
            mgr.restore(ts, step=20)
            mgr.save(_at(ts, 25, value))
    assert sorted(p.name for p in (tmp_path / ABANDONED).iterdir()) == [
        BRANCH_1,
        "branch-002-from-step-00000020",
    ]
    assert _weight(tmp_path) == (25, 25.75)


def test_resuming_the_newest_branches_nothing(tmp_path: Path) -> None:
    _run_to_40(tmp_path)
    ts = _state()
    with ckptkit.CheckpointManager(tmp_path, keep_last=10) as mgr:
        mgr.restore(ts)
        mgr.save(_at(ts, 50, 50.0))
    assert _steps(tmp_path) == [10, 20, 30, 40, 50]
    assert not (tmp_path / ABANDONED).exists()


def test_a_save_that_fails_after_the_branch_leaves_the_run_at_the_restored_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newer checkpoints are set aside before the commit: a save that dies between
    the two leaves the run resuming the restored step, never the abandoned step 40."""
    _run_to_40(tmp_path)
    ts = _state()
    with ckptkit.CheckpointManager(tmp_path, keep_last=10) as mgr:
        mgr.restore(ts, step=20)

        def refuse(*a: object, **k: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(atomic.PendingCheckpoint, "create", refuse)
        with pytest.raises(OSError):
            mgr.save(_at(ts, 30, 30.5))
    assert _steps(tmp_path) == [10, 20]
    assert _weight(tmp_path) == (20, 20.0)


def test_the_guard_saves_its_step_when_the_directory_is_another_trajectorys(
    tmp_path: Path,
) -> None:
    _run_to_40(tmp_path)
    ts = _state()
    mgr = ckptkit.CheckpointManager(tmp_path, keep_last=10)
    mgr.restore(ts, step=20)
    _at(ts, 30, 30.5)
    with ckptkit.PreemptionGuard(mgr, ts) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop()
        out = guard.checkpoint()
    mgr.close()
    assert out.saved and out.step == 30, out.reason
    assert _weight(tmp_path) == (30, 30.5)


def test_the_guard_does_not_save_the_state_it_restored_again(tmp_path: Path) -> None:
    _run_to_40(tmp_path)
    ts = _state()
    mgr = ckptkit.CheckpointManager(tmp_path, keep_last=10)
    mgr.restore(ts, step=30)  # the signal comes before the first step
    with ckptkit.PreemptionGuard(mgr, ts) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop()
        out = guard.checkpoint()
    mgr.close()
    assert not out.saved and "step 30 is saved already" in out.reason
    assert _steps(tmp_path) == [10, 20, 30, 40]  # nothing saved, nothing set aside
