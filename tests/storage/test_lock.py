"""RunLock with real processes: contention, release on exit, takeover after kill -9."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptkit.errors import LockHeldError
from ckptkit.storage import lock as lockmod
from ckptkit.storage.lock import LOCK_NAME, RunLock, read_lock_info

REPO = Path(__file__).resolve().parents[2]

# Children import only the lock module, not the package __init__ (which pulls in torch and
# costs seconds per process): the tests are about the lock, and stay fast with many processes.
PRELUDE = f"""
import sys, types
for name, sub in (("ckptkit", ""), ("ckptkit.storage", "storage")):
    mod = types.ModuleType(name)
    mod.__path__ = [{str(REPO / "ckptkit")!r} + ("/" + sub if sub else "")]
    sys.modules[name] = mod
"""

# Takes the lock, says so, then holds it until stdin closes (or for argv[3] seconds).
CHILD = (
    PRELUDE
    + """
import sys, time
from ckptkit.errors import LockHeldError
from ckptkit.storage.lock import RunLock
root, mode, hold, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
try:
    with RunLock(root, use_flock=(mode == "flock"), timeout=timeout, poll=0.02):
        print("LOCKED", flush=True)
        if hold < 0:
            sys.stdin.read()
        else:
            time.sleep(hold)
except LockHeldError as e:
    print("HELD", e, flush=True)
    sys.exit(3)
"""
)

MODES = ["flock", "excl"] if lockmod.fcntl is not None else ["excl"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Child:
    """A subprocess running CHILD; always reaped, so no ResourceWarning escapes."""

    def __init__(self, root: Path, mode: str, *, hold: float = -1, timeout: float = 0) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), mode, str(hold), str(timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_locked(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "LOCKED":
            out, err = self.finish()
            pytest.fail(f"child did not lock: {line!r} {out!r} {err!r}")

    def finish(self, timeout: float = 20) -> tuple[str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return out, err


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        if c.proc.poll() is None:
            c.proc.kill()
        c.proc.communicate()


def test_second_process_is_refused_then_gets_it(
    tmp_path: Path, mode: str, children: list[Child]
) -> None:
    holder = Child(tmp_path, mode)
    children.append(holder)
    holder.wait_locked()

    contender = Child(tmp_path, mode, hold=0)
    children.append(contender)
    out, _ = contender.finish()
    assert contender.proc.returncode == 3
    assert f"pid {holder.pid} on host {socket.gethostname()}" in out

    with pytest.raises(LockHeldError) as ei:
        RunLock(tmp_path, use_flock=(mode == "flock")).acquire()
    msg = str(ei.value)
    assert str(tmp_path / LOCK_NAME) in msg
    assert f"pid {holder.pid}" in msg and "Fix:" in msg and f"kill {holder.pid}" in msg

    holder.finish()  # closes stdin: the holder releases and exits
    assert holder.proc.returncode == 0
    assert not (tmp_path / LOCK_NAME).exists()
    with RunLock(tmp_path, use_flock=(mode == "flock")) as lk:
        assert lk.info is not None and read_lock_info(tmp_path) == lk.info
    assert not (tmp_path / LOCK_NAME).exists()


def test_waits_up_to_timeout(tmp_path: Path, mode: str, children: list[Child]) -> None:
    holder = Child(tmp_path, mode, hold=0.5)
    children.append(holder)
    holder.wait_locked()
    t0 = time.monotonic()
    with RunLock(tmp_path, use_flock=(mode == "flock"), timeout=15, poll=0.02) as lk:
        assert lk.locked
    assert time.monotonic() - t0 < 10
    holder.finish()


def test_timeout_expires_with_clear_error(tmp_path: Path, mode: str, children: list[Child]) -> None:
    holder = Child(tmp_path, mode)
    children.append(holder)
    holder.wait_locked()
    t0 = time.monotonic()
    with pytest.raises(LockHeldError, match=r"after waiting 0\.3 s"):
        RunLock(tmp_path, use_flock=(mode == "flock"), timeout=0.3, poll=0.05).acquire()
    assert 0.25 < time.monotonic() - t0 < 5


def test_sigkilled_holder_is_taken_over(
    tmp_path: Path, mode: str, children: list[Child], caplog: pytest.LogCaptureFixture
) -> None:
    holder = Child(tmp_path, mode)
    children.append(holder)
    holder.wait_locked()
    os.kill(holder.pid, signal.SIGKILL)
    holder.finish()
    assert (tmp_path / LOCK_NAME).exists()  # kill -9 leaves the file behind

    with (
        caplog.at_level(logging.WARNING, logger="ckptkit"),
        RunLock(tmp_path, use_flock=(mode == "flock")) as lk,
    ):
        assert lk.info is not None and lk.info.pid == os.getpid()
        assert read_lock_info(tmp_path) == lk.info
    assert any(
        "took over stale lock" in r.getMessage() and f"pid {holder.pid}" in r.getMessage()
        for r in caplog.records
    ), caplog.text


def test_unreaped_killed_holder_counts_as_dead(
    tmp_path: Path, children: list[Child], caplog: pytest.LogCaptureFixture
) -> None:
    # A zombie still answers kill(pid, 0); the /proc state check must see through it.
    holder = Child(tmp_path, "excl")
    children.append(holder)
    holder.wait_locked()
    os.kill(holder.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while lockmod._pid_alive(holder.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not lockmod._pid_alive(holder.pid)
    with caplog.at_level(logging.WARNING, logger="ckptkit"), RunLock(tmp_path, use_flock=False):
        pass
    assert "took over stale lock" in caplog.text


def test_same_process_twice_is_refused(tmp_path: Path, mode: str) -> None:
    with RunLock(tmp_path, use_flock=(mode == "flock")) as lk:
        with pytest.raises(LockHeldError, match="this process"):
            RunLock(tmp_path, use_flock=(mode == "flock")).acquire()
        with pytest.raises(RuntimeError, match="already holds"):
            lk.acquire()
    assert not (tmp_path / LOCK_NAME).exists()


COUNTER = (
    PRELUDE
    + """
import sys
from pathlib import Path
from ckptkit.storage.lock import RunLock
root, mode, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for _ in range(n):
    with RunLock(root, use_flock=(mode == "flock"), timeout=60, poll=0.001):
        f = root / "counter"
        v = int(f.read_text()) if f.exists() else 0
        f.write_text(str(v + 1))
"""
)


def test_mutual_exclusion_under_contention(tmp_path: Path, mode: str) -> None:
    # Lost updates would show if two processes ever held the lock at once (for flock,
    # that includes a waiter locking the inode a releaser just unlinked).
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", COUNTER, str(tmp_path), mode, "40"], env=env)
        for _ in range(6)
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0
    assert (tmp_path / "counter").read_text() == "240"
    assert not (tmp_path / LOCK_NAME).exists()


def _foreign(path: Path, *, host: str, pid: int = 999_999_999) -> dict[str, object]:
    d = {"pid": pid, "host": host, "created": 0.0, "token": "someone-else"}
    path.write_text(json.dumps(d))
    return d


def test_release_leaves_a_lock_that_is_no_longer_ours(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    lk = RunLock(tmp_path, use_flock=(mode == "flock"))
    lk.acquire()
    _foreign(tmp_path / LOCK_NAME, host=socket.gethostname())
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        lk.release()
    assert (tmp_path / LOCK_NAME).exists() and not lk.locked
    assert "no longer ours" in caplog.text
    lk.release()  # idempotent


def test_exclusive_mode_never_takes_over_another_hosts_lock(tmp_path: Path) -> None:
    _foreign(tmp_path / LOCK_NAME, host="some-other-host")
    with pytest.raises(LockHeldError) as ei:
        RunLock(tmp_path, use_flock=False).acquire()
    assert "host some-other-host" in str(ei.value)
    assert f"delete {tmp_path / LOCK_NAME} by hand" in str(ei.value)


def test_exclusive_mode_unreadable_lock(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / LOCK_NAME
    p.write_text("")  # a creator between O_EXCL and write
    with pytest.raises(LockHeldError, match="being written"):
        RunLock(tmp_path, use_flock=False).acquire()
    os.utime(p, (time.time() - 60, time.time() - 60))  # ...that died there long ago
    with caplog.at_level(logging.WARNING, logger="ckptkit"), RunLock(tmp_path, use_flock=False):
        pass
    assert "unreadable for 10 s" in caplog.text


@pytest.mark.skipif(lockmod.fcntl is None, reason="needs flock")
def test_flock_takeover_of_other_host_lock_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Under flock a free lock is free; a leftover file naming another host gets a louder warning.
    _foreign(tmp_path / LOCK_NAME, host="some-other-host")
    with caplog.at_level(logging.WARNING, logger="ckptkit"), RunLock(tmp_path, use_flock=True):
        pass
    assert "it ran on another host" in caplog.text


@pytest.mark.skipif(lockmod.fcntl is None, reason="needs flock")
def test_falls_back_when_filesystem_has_no_flock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_flock(fd: int, op: int) -> None:
        raise OSError(37, "No locks available")  # ENOLCK on Linux

    monkeypatch.setattr(lockmod.fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING, logger="ckptkit"), RunLock(tmp_path) as lk:
        assert not lk.use_flock
        assert read_lock_info(tmp_path) == lk.info
    assert "does not support flock" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()


def test_read_lock_info_garbage(tmp_path: Path) -> None:
    assert read_lock_info(tmp_path) is None
    (tmp_path / LOCK_NAME).write_text("{not json")
    assert read_lock_info(tmp_path) is None


@pytest.mark.skipif(lockmod.fcntl is None, reason="needs flock")
def test_flock_on_a_released_inode_is_not_ownership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race flock-on-a-path must survive: B opens the lock file, A releases (unlinks)
    # and C takes a fresh file, then B's flock succeeds on the dead inode. B must notice.
    a, c = RunLock(tmp_path), RunLock(tmp_path)
    a.acquire()
    real_flock = lockmod.fcntl.flock
    calls = []

    def racy_flock(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # B's first attempt, with the old inode open
            a.release()
            c.acquire()
        real_flock(fd, op)

    monkeypatch.setattr(lockmod.fcntl, "flock", racy_flock)
    b = RunLock(tmp_path)
    with pytest.raises(LockHeldError, match="this process"):
        b.acquire()
    monkeypatch.setattr(lockmod.fcntl, "flock", real_flock)
    assert not b.locked and read_lock_info(tmp_path) == c.info
    c.release()
