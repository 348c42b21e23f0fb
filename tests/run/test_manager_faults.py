"""Faults during and after a save: disk full, permission errors, two writers, bit rot."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.checkpoint.catalog import LATEST, step_dir_name
from ckptkit.cli import main as cli
from ckptkit.run.manager import CheckpointManager
from ckptkit.storage import atomic
from ckptkit.verify.runner import verify_one

pytestmark = pytest.mark.integration


def _state(step: int = 0, n: int = 64) -> ckptkit.TrainState:
    torch.manual_seed(0)
    return ckptkit.TrainState(model=torch.nn.Linear(n, n), step=step)


def _run_with_two(root: Path) -> ckptkit.TrainState:
    mgr = CheckpointManager(root, keep_last=5)
    ts = _state()
    for s in (10, 20):
        ts.step = s
        mgr.save(ts)
    mgr.close()
    return ts


def _intact(root: Path, steps: list[int]) -> None:
    """The run holds exactly ``steps``, each verifies, ``latest`` is the newest, no temp dirs."""
    mgr = CheckpointManager(root, readonly=True)
    assert [c.step for c in mgr.list()] == steps
    for s in steps:
        assert verify_one(root / step_dir_name(s), progress=False).ok
    assert (root / LATEST).read_text().strip() == step_dir_name(steps[-1])
    assert atomic.leftovers(root) == []
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


# --- disk full -------------------------------------------------------------------------------


def _fill_disk_after(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    """Make ``os.write`` fail with ENOSPC once ``budget`` more bytes have been written."""
    real = os.write
    left = [budget]

    def write(fd: int, data: bytes | memoryview) -> int:
        n = len(memoryview(data).cast("B"))
        if left[0] < n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= n
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("budget", [0, 100, 20_000])
@pytest.mark.parametrize("async_", [False, True])
def test_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int, async_: bool
) -> None:
    ts = _run_with_two(tmp_path)
    mgr = CheckpointManager(tmp_path, keep_last=1)
    _fill_disk_after(monkeypatch, budget)
    ts.step = 30
    with pytest.raises(OSError) as ei:
        mgr.save(ts, async_=async_)
        mgr.wait()
    monkeypatch.undo()
    err = ei.value
    assert err.errno == errno.ENOSPC
    assert "disk full while saving step-00000030" in str(err)
    assert "older checkpoints are intact" in str(err)
    _intact(tmp_path, [10, 20])  # keep_last=1 deleted nothing: the new one never verified
    mgr.save(ts)  # space is back: the same manager saves and rotates
    assert [c.step for c in mgr.list()] == [30]
    mgr.close()


# --- permissions -----------------------------------------------------------------------------


def test_permission_denied_creating_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = _run_with_two(tmp_path)
    mgr = CheckpointManager(tmp_path)
    real = os.mkdir

    def mkdir(path: str | os.PathLike[str], *a: object, **kw: object) -> None:
        if atomic.TMP_SUFFIX in os.fspath(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        real(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", mkdir)
    ts.step = 30
    with pytest.raises(PermissionError, match="permission denied while saving step-00000030"):
        mgr.save(ts)
    monkeypatch.undo()
    mgr.close()
    _intact(tmp_path, [10, 20])


def test_permission_denied_writing_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = _run_with_two(tmp_path)
    mgr = CheckpointManager(tmp_path)
    real = os.open

    def open_(path: str | os.PathLike[str], flags: int, *a: object, **kw: object) -> int:
        if os.fspath(path).endswith(".safetensors") and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real(path, flags, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    ts.step = 30
    with pytest.raises(PermissionError) as ei:
        mgr.save(ts)
    monkeypatch.undo()
    assert ".safetensors" in str(ei.value)  # names the file it could not create
    mgr.close()
    _intact(tmp_path, [10, 20])


# --- two writers -----------------------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time, torch, ckptkit
    mgr = ckptkit.CheckpointManager(sys.argv[1])
    mgr.save(ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=1))
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    mgr.close()
    print("released", flush=True)
    time.sleep(60)
    """
)


def _holder(root: Path, hold_s: float) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root), str(hold_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "locked"
    return p


def _stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()
    if p.stdout is not None:
        p.stdout.close()


def test_second_writer_fails_with_a_clear_message(tmp_path: Path) -> None:
    p = _holder(tmp_path, 60)
    try:
        # A writer takes the lock when it opens: refused there, before any training.
        with pytest.raises(ckptkit.LockHeldError) as ei:
            CheckpointManager(tmp_path)
        msg = str(ei.value)
        assert f"locked by pid {p.pid}" in msg and f"kill {p.pid}" in msg
        # Readers still work while the writer holds the run; nothing was written.
        mgr = CheckpointManager(tmp_path, readonly=True)
        assert [c.step for c in mgr.list()] == [1]
        assert mgr.restore(ckptkit.TrainState(model=torch.nn.Linear(4, 4))) is not None
        assert atomic.leftovers(tmp_path) == []
        # prune is a writer too.
        res = CliRunner().invoke(cli, ["prune", str(tmp_path), "--keep-last", "1"])
        assert res.exit_code == 2 and "locked by pid" in res.output
    finally:
        _stop(p)


def test_second_writer_waits_for_the_lock(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = _holder(tmp_path, 3.0)  # long enough that the first attempt surely finds it held
    try:
        with caplog.at_level(logging.WARNING, logger="ckptkit"):
            mgr = CheckpointManager(tmp_path, lock_timeout=30)  # waits here, at open
        # it really waited, and said on whom (a wait is never silent)
        assert f"waiting for the run lock held by pid {p.pid}" in caplog.text
        mgr.save(_state(step=2, n=4))
        assert [c.step for c in mgr.list()] == [1, 2]
        mgr.close()
    finally:
        _stop(p)


def test_stale_lock_of_a_killed_writer_is_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = _holder(tmp_path, 60)
    p.send_signal(signal.SIGKILL)
    _stop(p)
    assert json.loads((tmp_path / ".ckptkit.lock").read_text())["pid"] == p.pid
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        mgr = CheckpointManager(tmp_path)  # a writer takes the lock at open
        mgr.save(_state(step=2, n=4))
    assert f"took over stale lock held by pid {p.pid}" in caplog.text
    assert [c.step for c in mgr.list()] == [1, 2]
    mgr.close()


# --- bit rot after commit --------------------------------------------------------------------


def test_bit_flip_in_newest_falls_back_to_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=3)
    ts = _state()
    for s in (10, 20, 30):
        ts.step = s
        mgr.save(ts)
    mgr.close()
    f = tmp_path / step_dir_name(30) / "model.safetensors"
    st = f.stat()
    with open(f, "r+b") as fh:  # one bit, in place; size and mtime as before
        fh.seek(st.st_size - 7)
        b = fh.read(1)
        fh.seek(st.st_size - 7)
        fh.write(bytes([b[0] ^ 0x01]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))

    mgr = CheckpointManager(tmp_path, keep_last=3)
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        res = mgr.restore(_state())
    assert res is not None and res.step == 20
    assert "skipping step-00000030: CK-F003" in caplog.text
    assert "restored step-00000020 after skipping 1 newer checkpoint" in caplog.text
    assert res.notes[0].startswith("skipped step-00000030: CK-F003")
    assert (tmp_path / LATEST).read_text().strip() == step_dir_name(20)

    out = CliRunner().invoke(cli, ["ls", str(tmp_path), "--json"], catch_exceptions=False)
    rows = {c["step"]: c for c in json.loads(out.stdout)["checkpoints"]}
    assert out.exit_code == 1
    assert rows[30]["status"] == "corrupt" and "CK-F003" in rows[30]["problem"]
    assert rows[20]["status"] == rows[10]["status"] == "verified"

    # Rotation never counts it as good: it is flagged evidence, never "newest verified".
    plan = mgr.plan(keep_last=1)
    assert plan.by_step()[20].keep and "newest verified" in plan.by_step()[20].reason
    assert plan.by_step()[30].flagged
    # The next save continues from step 20, so the run branches there: 30 is set aside
    # whole (never deleted, never resumed), and keep_last=1 drops 10 and 20.
    mgr.keep_last = 1
    ts.step = 40
    mgr.save(ts)
    assert [(c.step, c.status) for c in mgr.list()] == [(40, "verified")]
    assert list((tmp_path / ".ckptkit-abandoned").glob(f"branch-*/{step_dir_name(30)}/manifest.json"))
    mgr.close()
