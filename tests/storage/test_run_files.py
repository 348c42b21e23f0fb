"""Run-level files are read as regular files only, through one helper (issue 23, #7).

``fs.read_small`` (and ``files.open_fd`` under it) serve ``latest``, the run index, the
lock, the recoveries log; ``foreign.adopted.load_adopted`` serves adopted manifests. A
FIFO, directory or symlink there is ``CK-F022`` (``CK-M008`` for an adopted manifest)
naming the file, never a blocked ``open()``. Each call runs under a deadline: before the
fix a FIFO blocked the reader forever.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deadline import within

from ckptkit.checkpoint.catalog import INDEX, LATEST, Catalog
from ckptkit.errors import UnsafeInputError
from ckptkit.storage import files, fs
from ckptkit.storage.lock import LOCK_NAME, RunLock, read_lock_info
from ckptkit.verify.foreign.adopted import adopted_path, load_adopted


def _make(kind: str, p: Path, tmp_path: Path) -> list[Path]:
    """Put a ``kind`` at ``p``; return the FIFOs a blocked reader could be woken through."""
    if kind == "fifo":
        os.mkfifo(p)
        return [p]
    if kind == "directory":
        p.mkdir()
    else:
        (tmp_path / "elsewhere").write_text("step-00000001\n")
        p.symlink_to(tmp_path / "elsewhere")
    return []


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_read_small_reads_regular_files_only(tmp_path: Path, kind: str) -> None:
    p = tmp_path / LATEST
    fifos = _make(kind, p, tmp_path)
    with pytest.raises(UnsafeInputError) as ei:
        within(20, lambda: fs.read_small(p, 4096), *fifos)
    assert ei.value.code == "CK-F022" and f"{p}: is a" in str(ei.value)
    assert "remove it" in str(ei.value)
    with pytest.raises(UnsafeInputError):
        fs.check_regular(p)


def test_read_small_reads_a_regular_file_up_to_one_past_the_limit(tmp_path: Path) -> None:
    p = tmp_path / INDEX
    p.write_bytes(b"x" * 100)
    assert fs.read_small(p, 1000) == b"x" * 100
    assert fs.read_small(p, 10) == b"x" * 11  # the caller sees it is over its limit
    assert fs.check_regular(p) is True
    assert fs.check_regular(tmp_path / "absent") is False
    with pytest.raises(FileNotFoundError):
        fs.read_small(tmp_path / "absent", 10)


def test_open_fd_creates_a_missing_file_and_refuses_a_fifo_for_writing(tmp_path: Path) -> None:
    p = tmp_path / "f"
    fd = files.open_fd(p, os.O_RDWR | os.O_CREAT, code="CK-F022")
    os.close(fd)
    assert p.is_file()
    q = tmp_path / "q"
    os.mkfifo(q)
    with pytest.raises(UnsafeInputError, match="FIFO"):
        within(20, lambda: files.open_fd(q, os.O_WRONLY, code="CK-F022"), q)


@pytest.mark.parametrize("name", [LATEST, INDEX])
def test_the_catalog_refuses_a_fifo_latest_or_index(tmp_path: Path, name: str) -> None:
    f = tmp_path / name
    os.mkfifo(f)
    cat = Catalog(tmp_path)
    with pytest.raises(UnsafeInputError) as ei:
        within(20, cat.list, f)
    assert ei.value.code == "CK-F022" and name in str(ei.value)
    if name == LATEST:
        with pytest.raises(UnsafeInputError):
            within(20, cat.latest_name, f)
    else:
        with pytest.raises(UnsafeInputError):
            within(20, cat.index, f)


def test_a_garbled_index_is_still_advisory(tmp_path: Path) -> None:
    (tmp_path / INDEX).write_text("{not json")
    assert Catalog(tmp_path).index() == {}


@pytest.mark.parametrize("use_flock", [True, False])
def test_the_lock_refuses_a_fifo_lock_file(tmp_path: Path, use_flock: bool) -> None:
    f = tmp_path / LOCK_NAME
    os.mkfifo(f)
    lock = RunLock(tmp_path, use_flock=use_flock)
    with pytest.raises(UnsafeInputError) as ei:
        within(20, lock.acquire, f)
    assert ei.value.code == "CK-F022" and f"{f}: is a FIFO" in str(ei.value)
    assert "remove this one" in str(ei.value)
    assert not lock.locked and f.is_fifo()
    assert within(20, lambda: read_lock_info(tmp_path), f) is None  # names nobody


def test_a_fifo_adopted_manifest_is_m008_with_the_fix(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"PK")
    m = adopted_path(target)
    os.mkfifo(m)
    with pytest.raises(UnsafeInputError) as ei:
        within(20, lambda: load_adopted(target), m)
    assert ei.value.code == "CK-M008" and m.name in str(ei.value)
    assert "remove it, then run 'ckptkit adopt" in str(ei.value)
    m.unlink()
    assert load_adopted(target) is None
