"""Writing DCP state with every byte hashed on its way to the file.

DCP writes each ``.distcp`` file and ``.metadata`` through its filesystem's
``create_stream``; :class:`HashingFileSystem` wraps that one call, so each rank knows the
digest and size of every file it wrote without reading it back.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from ckptkit.format import digest
from ckptkit.storage import fs
from ckptkit.storage.dcp_errors import quiet, translated
from ckptkit.storage.dcp_meta import DCP_DIR, METADATA
from ckptkit.storage.fs import Location


def save(
    state_dict: dict[str, Any], root: Location, *, fsync: bool = True, process_group: Any = None
) -> dict[str, tuple[str, int]]:
    """Write ``state_dict`` (DTensors stay sharded) with DCP into ``root/dcp`` (collective).

    Without a process group this is a one-process DCP save (``no_dist``), the world of one.
    Every byte is hashed on its way to the file (:class:`HashingFileSystem`), locally and
    on an object store alike: nothing is read back.

    Returns:
        ``{name inside dcp/: (xxh3-128, size)}`` of the files this rank wrote (the
        coordinator's include ``.metadata``).

    Raises:
        CkptkitError: DCP failed (its ``CheckpointException`` translated).
    """
    import torch.distributed.checkpoint as dcp

    writer = writer_for(root / DCP_DIR, sync_files=fsync, thread_count=2)
    with translated("DCP save"), quiet():
        dcp.save(state_dict, storage_writer=writer, process_group=process_group)
    return dict(writer.fs.digests)


def writer_for(where: Location, **kwargs: Any) -> Any:
    """DCP's file writer for ``where``, with every file it writes hashed on the way out
    (``writer.fs.digests``)."""
    from torch.distributed.checkpoint import FileSystemWriter

    writer: Any = FileSystemWriter(fs.url(where), **kwargs)
    writer.path, writer.fs = hashing_filesystem(where)
    return writer


def hashing_filesystem(where: Location) -> tuple[Any, HashingFileSystem]:
    """DCP's path and filesystem for the DCP directory ``where`` (its local filesystem, or
    its fsspec one on an object store, as ``FsspecWriter`` sets up), hashing every file
    written through it.

    Returns:
        ``(path as DCP's writer keeps it, filesystem)``: assign them to a DCP writer's
        ``path`` and ``fs``.
    """
    inner: Any
    if fs.is_local(where):
        from torch.distributed.checkpoint.filesystem import FileSystem

        inner = FileSystem()
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem

        inner = FsspecFileSystem()
    return inner.init_path(fs.url(where)), HashingFileSystem(inner)


def files_of(root: Location, rank: int) -> list[str]:
    """The DCP files rank ``rank`` wrote under ``root/dcp`` (rank 0 also owns ``.metadata``)."""
    d = root / DCP_DIR
    names = [p.name for p in d.iterdir()] if fs.kind(d) == "dir" else []
    rels = sorted(f"{DCP_DIR}/{n}" for n in names if re.fullmatch(rf"__{rank}_\d+\.distcp", n))
    if rank == 0 and METADATA in names:
        rels.append(f"{DCP_DIR}/{METADATA}")
    return rels


class HashingFileSystem:
    """A DCP filesystem (local or fsspec) that hashes every stream written through it.

    DCP writes each ``.distcp`` file and ``.metadata`` through ``writer.fs.create_stream``;
    wrapping that one call gives the digest of every byte as it goes to the file, in the
    same pass (``digests``: ``{file name: (xxh3-128, size)}``). ``.metadata`` is written as
    ``.metadata.tmp`` and renamed: its digest follows the rename. Every other call is the
    wrapped filesystem's own.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.digests: dict[str, tuple[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            # Unpickling (DCP's process-based async save sends the writer to its worker)
            # looks attributes up before ``__dict__`` is restored: without this, the lookup
            # of ``self.inner`` recursed forever.
            raise AttributeError(name)
        return getattr(self.inner, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self.inner.create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            tee = _HashingStream(stream)
            yield tee
        # Recorded only once the stream closed cleanly: a failed write leaves no digest.
        self.digests[PurePosixPath(os.fspath(path)).name] = (tee.hexdigest(), tee.size)

    def rename(self, path: Any, new_path: Any) -> None:
        self.inner.rename(path, new_path)
        old = PurePosixPath(os.fspath(path)).name
        if old in self.digests:
            self.digests[PurePosixPath(os.fspath(new_path)).name] = self.digests.pop(old)


class _HashingStream(io.RawIOBase):
    """A write-only pass-through that hashes and counts what goes by (``tell`` included)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner
        self._h = digest.new()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        with memoryview(b) as mv, mv.cast("B") as flat:
            self._h.update(flat)
            self._inner.write(flat)
            self.size += len(flat)
            return len(flat)

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        # DCP fsyncs each file through ``stream.fileno()``; without it, it falls back to a
        # whole-system ``os.sync()``.
        return int(self._inner.fileno())

    def flush(self) -> None:
        self._inner.flush()

    def hexdigest(self) -> str:
        return str(self._h.hexdigest())


__all__ = [
    "HashingFileSystem",
    "files_of",
    "hashing_filesystem",
    "save",
    "writer_for",
]
