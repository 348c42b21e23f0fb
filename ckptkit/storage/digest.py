"""Streaming xxh3-128 digests, computed while bytes move (no second pass).

xxh3 hashes at 17-26 GB/s on one core and releases the GIL on large buffers, so
hashing runs on a helper thread, overlapped with the write or read syscalls of the
next chunk: the digest costs close to nothing next to the disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import xxhash

from ckptkit.storage import files

ALGORITHM = "xxh3_128"
CHUNK = 8 << 20
"""Bytes per write/read/hash step: large enough to amortise syscalls, small enough for RAM."""


def new() -> Any:
    """Return a fresh xxh3-128 hasher.

    Example:
        >>> h = new(); h.update(b"abc"); len(h.hexdigest())
        32
    """
    return xxhash.xxh3_128()


def hexdigest_bytes(data: bytes | memoryview) -> str:
    """Return the xxh3-128 hex digest of ``data`` in one call.

    Example:
        >>> hexdigest_bytes(b"") == new().hexdigest()
        True
    """
    return xxhash.xxh3_128_hexdigest(data)


class PipelinedHasher:
    """Hash chunks on a helper thread, in order, while the caller does I/O.

    The chunks must stay alive and unmodified until :meth:`hexdigest` returns
    (they are views of tensors or of a reused buffer; :meth:`barrier` waits until
    every submitted chunk has been hashed, so a buffer can be reused after it).

    Example:
        >>> with PipelinedHasher() as ph:
        ...     ph.update(b"ab"); ph.update(b"c")
        ...     ph.hexdigest() == hexdigest_bytes(b"abc")
        True
    """

    def __init__(self) -> None:
        self._h = new()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptkit-hash")
        self._pending: Future[None] | None = None

    def update(self, chunk: bytes | memoryview) -> None:
        """Queue ``chunk`` for hashing (after every chunk queued before it)."""
        # A single worker runs submissions in order; small chunks are hashed inline
        # because a thread hop costs more than hashing them.
        if len(chunk) < (1 << 20):
            self.barrier()
            self._h.update(chunk)
            return
        self.barrier()
        self._pending = self._pool.submit(self._h.update, chunk)

    def barrier(self) -> None:
        """Wait until every queued chunk has been hashed."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def hexdigest(self) -> str:
        """Return the digest of everything queued so far."""
        self.barrier()
        return str(self._h.hexdigest())

    def close(self) -> None:
        """Stop the helper thread."""
        self.barrier()
        self._pool.shutdown(wait=True)

    def __enter__(self) -> PipelinedHasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)


def hash_file(
    path: str | os.PathLike[str],
    *,
    chunk: int = CHUNK,
    on_bytes: Callable[[int], None] | None = None,
    on_chunk: Callable[[int, memoryview], None] | None = None,
) -> tuple[str, int]:
    """Return ``(xxh3-128 hex digest, size)`` of a regular file, reading it once.

    Reads into two alternating buffers so that hashing chunk *i* overlaps reading
    chunk *i+1*. ``on_chunk(offset, bytes)`` sees every chunk while the helper thread
    hashes it (verify scans tensor values there, so the file is read once).

    Raises:
        UnsafeInputError: ``CK-F010`` the path is a FIFO, directory or device (never
            opened, so never a hang); ``CK-F009`` it is a symlink.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "f"; _ = p.write_bytes(b"abc")
        >>> hash_file(p) == (hexdigest_bytes(b"abc"), 3)
        True
    """
    with files.open_regular(path, code="CK-F010", symlink_code="CK-F009") as f:
        return hash_open(f, chunk=chunk, on_bytes=on_bytes, on_chunk=on_chunk)


def hash_open(
    f: BinaryIO,
    *,
    chunk: int = CHUNK,
    on_bytes: Callable[[int], None] | None = None,
    on_chunk: Callable[[int, memoryview], None] | None = None,
) -> tuple[str, int]:
    """:func:`hash_file` of an open (unbuffered) file, from its current position."""
    bufs = [bytearray(chunk), bytearray(chunk)]
    size = 0
    with PipelinedHasher() as ph:
        i = 0
        while True:
            buf = bufs[i & 1]
            # The hasher may still be reading the other buffer; this one is free
            # because update() waited for the hash before the previous submission.
            n = f.readinto(buf)  # type: ignore[attr-defined]
            if not n:
                break
            view = memoryview(buf)[:n]
            ph.update(view)
            if on_chunk is not None:
                on_chunk(size, view)
            size += n
            if on_bytes is not None:
                on_bytes(n)
            i += 1
        return ph.hexdigest(), size
