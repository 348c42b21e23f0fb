"""Issue 24: deleting needs the writer lock, always. A read-only ``CheckpointManager``
passed ``fence()`` (it checked a lock only when it held one) and then deleted the newest
verified checkpoint through the public ``remove(info)`` while another process held the
writer lock; the framework runs already refused the same call."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import make_run

import ckptkit
from ckptkit.errors import LockHeldError


def test_a_read_only_manager_can_neither_fence_nor_remove(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    with ckptkit.CheckpointManager(run) as writer:
        writer.prune(keep_last=5)  # the writer holds the run lock from here on
        with ckptkit.CheckpointManager(run, readonly=True) as reader:
            newest = reader.list()[-1]
            with pytest.raises(ckptkit.CkptkitError, match="read-only"):
                reader.fence()
            with pytest.raises(ckptkit.CkptkitError, match="read-only"):
                reader.remove(newest)
        assert (Path(str(newest.path)) / "manifest.json").exists()


def test_a_second_writer_cannot_remove_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    with ckptkit.CheckpointManager(run) as writer:
        writer.prune(keep_last=5)
        newest = writer.list()[-1]
        # A writer takes the lock when it opens: the second one is refused there, before
        # it can remove (or train toward saving) anything.
        with pytest.raises(LockHeldError, match="this process"):
            ckptkit.CheckpointManager(run, lock_timeout=0)
        assert (Path(str(newest.path)) / "manifest.json").exists()


def test_the_writer_removes(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    with ckptkit.CheckpointManager(run) as mgr:
        oldest = mgr.list()[0]
        assert mgr.remove(oldest)
        assert oldest.step not in {c.step for c in mgr.list()}
        assert not Path(str(oldest.path)).exists()
