"""Issue 23 item 12: ``CheckpointManager(root)`` on a directory it cannot write raised a bare
``OSError`` (EROFS from the lock file). Now a ckptkit error names the directory and the two
fixes: make it writable, or open it read-only.

Root ignores permission bits, so as root the read-only filesystem is simulated in-process:
creating, writing or making a directory under it fails with EROFS, as a read-only mount
answers (an existing directory still answers EEXIST first, as Linux does).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.errors import NotWritableError

_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _under(path: Any, top: Path) -> bool:
    try:
        return Path(os.fsdecode(path)).resolve().is_relative_to(top)
    except (TypeError, ValueError):
        return False


@pytest.fixture
def read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory holding a saved run that this process cannot write (really, or as root
    by answering EROFS to every write under it)."""
    top = tmp_path / "ro"
    with ckptkit.CheckpointManager(top / "run") as mgr:
        mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=1))
    # The lock file is removed on release: a new writer must create it again.
    assert not (top / "run" / ".ckptkit.lock").exists()
    if os.geteuid() != 0:
        for d in (top, top / "run"):
            d.chmod(0o555)
        try:
            yield top
        finally:
            for d in (top, top / "run"):
                d.chmod(0o755)
        return
    real_open, real_mkdir = os.open, os.mkdir

    def ro_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & _WRITE and _under(path, top.resolve()):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
        return real_open(path, flags, *args, **kw)

    def ro_mkdir(path: Any, *args: Any, **kw: Any) -> None:
        if _under(path, top.resolve()):
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
        real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    yield top


@pytest.mark.parametrize("where", ["run", "run/new"], ids=["existing", "to-create"])
def test_read_only_run_directory_is_a_clear_error(read_only: Path, where: str) -> None:
    root = read_only / where
    with pytest.raises(NotWritableError) as ei:
        ckptkit.CheckpointManager(root)
    err = ei.value
    assert isinstance(err, ckptkit.CkptkitError) and isinstance(err, OSError)
    assert err.errno in (errno.EROFS, errno.EACCES)
    msg = str(err)
    assert str(root) in msg and "not writable" in msg
    assert "readonly=True" in msg and "writable" in msg.split("Fix:", 1)[1]


def test_read_only_run_directory_opens_read_only(read_only: Path) -> None:
    """The fix the error names works: listing and restoring need no write."""
    mgr = ckptkit.CheckpointManager(read_only / "run", readonly=True)
    assert [c.status for c in mgr.list()] == ["verified"]
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    res = mgr.restore(ts)
    assert res is not None and res.step == 1
