"""Issue 24, item 3: a writable ``CheckpointManager`` takes the run lock when it opens, so
another live writer is refused before any training, never at the first save after it.
What that must not break: a writer dropped without ``close()`` in this process does not
block the next one, and ``ckptkit ls --verify`` still reports on a run a live writer holds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hostile import make_run

import ckptkit
from ckptkit.errors import LockHeldError
from ckptkit.storage.fs import location
from ckptkit.storage.lease import LeaseLock

HOLDER = textwrap.dedent(
    """
    import sys, ckptkit
    mgr = ckptkit.CheckpointManager(sys.argv[1])  # a writer: holds the lock from here on
    print("open", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def held_run(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A run with checkpoints whose lock another live process holds (it only opened it)."""
    run = make_run(tmp_path / "run")
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        yield run, p.pid
    finally:
        p.kill()
        p.wait(timeout=30)
        for f in (p.stdin, p.stdout):
            if f is not None:
                f.close()


def test_a_writer_that_only_opened_is_seen_by_the_next_one_at_open(
    held_run: tuple[Path, int],
) -> None:
    run, pid = held_run
    with pytest.raises(LockHeldError, match=f"locked by pid {pid}"):
        ckptkit.CheckpointManager(run)


def test_ls_verify_reports_on_a_run_a_live_writer_holds(held_run: tuple[Path, int]) -> None:
    run, _ = held_run
    res = subprocess.run(
        [sys.executable, "-m", "ckptkit", "ls", str(run), "--verify"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "verified" in res.stdout


def test_a_dropped_unclosed_writer_does_not_block_the_next_one(tmp_path: Path) -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=1)
    # Never closed: dropped, still in a reference cycle. (With a background verify still
    # running it would rightly keep the lock: it is still writing the run.)
    ckptkit.CheckpointManager(tmp_path, background_verify=False).save(ts)
    with ckptkit.CheckpointManager(tmp_path) as mgr:  # lock_timeout 0: no waiting
        assert [c.step for c in mgr.list()] == [1]


def test_a_dropped_lease_holder_in_this_process_does_not_block_the_next_one() -> None:
    root = location("memory://writer-at-open/run")

    class Owner:
        def __init__(self) -> None:
            self.lock = LeaseLock(root)
            self.lock.acquire()
            self.me = self  # a reference cycle, as a CheckpointManager has

        def __del__(self) -> None:
            self.lock.release()

    Owner()
    lock = LeaseLock(root)  # timeout 0
    assert lock.acquire().fence == 1
    lock.release()


def test_a_second_live_writer_in_this_process_is_told_the_fix(tmp_path: Path) -> None:
    with (
        ckptkit.CheckpointManager(tmp_path),
        pytest.raises(LockHeldError, match="readonly=True") as ei,
    ):
        ckptkit.CheckpointManager(tmp_path)
    assert "this process" in str(ei.value)
