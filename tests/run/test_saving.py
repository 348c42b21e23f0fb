"""The save pipeline (ckptkit.run.saving) on its own and behind CheckpointManager.

Issue 24 moved it out of manager.py; what must not change: a background job's error
surfaces once, at the next save or wait; ``idle`` may be asked from another thread and
raises nothing; a script that never calls ``close`` still gets its checkpoint settled (the
interpreter-exit hook); a commit reaches the run's records through one hook, the manager's
``_settle``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.run import NativeLayout, Run, saving
from ckptkit.run.manager import CheckpointManager
from ckptkit.run.trajectory import Trajectory
from ckptkit.storage.fs import Location


def _state(step: int) -> ckptkit.TrainState:
    torch.manual_seed(0)
    return ckptkit.TrainState(model=torch.nn.Linear(3, 2), step=step)


def _pipeline(root: Path, settle: saving.Settle) -> saving.SavePipeline:
    return saving.SavePipeline(
        root,
        trajectory=Trajectory(Run(root, NativeLayout())),
        writer=lambda: None,
        fence=lambda: None,
        settle=settle,
    )


def test_settle_error_surfaces_once_at_the_next_wait(tmp_path: Path) -> None:
    def settle(final: Location, man: object, stats: saving.SaveStats, t0: float) -> None:
        raise ckptkit.CkptkitError("injected settle failure", path=final)

    saves = _pipeline(tmp_path, settle)
    final = saves.save(_state(4), 4, {})
    assert final == tmp_path / step_dir_name(4) and saves.last.step == 4
    assert (final / "manifest.json").is_file()  # committed before the settle step ran
    with pytest.raises(ckptkit.CkptkitError, match="injected settle failure"):
        saves.wait()
    saves.wait()  # raised once, then forgotten


def test_idle_from_another_thread_waits_and_raises_nothing(tmp_path: Path) -> None:
    release = threading.Event()
    started = threading.Event()

    def settle(final: Location, man: object, stats: saving.SaveStats, t0: float) -> None:
        started.set()
        assert release.wait(timeout=60), "the test never released the settle step"
        raise RuntimeError("left for wait()")

    saves = _pipeline(tmp_path, settle)
    saves.save(_state(1), 1, {})
    assert started.wait(timeout=60)
    seen: list[bool] = []
    watcher = threading.Thread(target=lambda: seen.append(saves.idle(timeout=0)))
    watcher.start()
    watcher.join(timeout=60)
    assert seen == [False]  # the job still runs: not idle, and no error raised
    release.set()
    assert saves.idle(timeout=60) is True  # idle leaves the error for wait()
    with pytest.raises(RuntimeError, match="left for wait"):
        saves.wait()


def test_manager_commits_reach_its_settle_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int | None]] = []
    real = Run.settle

    def spy(self: Run, path: Location, **kw: Any) -> Any:
        calls.append((path.name, kw.get("step")))
        return real(self, path, **kw)

    monkeypatch.setattr(Run, "settle", spy)
    mgr = CheckpointManager(tmp_path, keep_last=5)
    ts = _state(1)
    mgr.save(ts)
    ts.step = 2
    mgr.save(ts, async_=True)
    mgr.wait()
    assert calls == [(step_dir_name(1), 1), (step_dir_name(2), 2)]
    assert [(c.step, c.status) for c in mgr.list()] == [(1, "verified"), (2, "verified")]
    mgr.close()


def test_a_script_without_close_still_settles_its_last_save(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import torch, ckptkit
        mgr = ckptkit.CheckpointManager({str(run)!r}, keep_last=1)
        ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=1)
        mgr.save(ts)
        ts.step = 2
        mgr.save(ts, async_=True)
        # no wait(), no close(): the interpreter-exit hook joins the background job
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    mgr = CheckpointManager(run, readonly=True)
    assert [(c.step, c.status) for c in mgr.list()] == [(2, "verified")]  # step 1 rotated
    latest = mgr.latest()
    assert latest is not None and latest.step == 2


def test_last_save_is_known_when_a_synchronous_settle_fails(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, background_verify=False)
    ts = _state(3)
    with torch.no_grad():
        ts.model.weight[0, 0] = float("nan")
    with pytest.raises(ckptkit.CommittedError, match="read-back verify failed"):
        mgr.save(ts)  # committed, then recorded corrupt by its verify, inside save
    assert mgr.last_save.step == 3
    assert any(f.startswith("CK-S010") for f in mgr.last_save.findings), mgr.last_save
    mgr.close()
