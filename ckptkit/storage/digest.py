"""Streaming xxh3-128 digests, computed while bytes move (no second pass).

The algorithm itself (what a manifest records) is :mod:`ckptkit.format.digest`; this
module moves bytes through it.

xxh3 hashes at 17-26 GB/s on one core and releases the GIL on large buffers, so
hashing runs on a helper thread, overlapped with the write or read syscalls of the
next chunk: the digest costs close to nothing next to the disk.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ckptkit import codes
from ckptkit.format.digest import new
from ckptkit.storage import files

CHUNK = 8 << 20
"""Bytes per write/read/hash step: large enough to amortise syscalls, small enough for RAM."""


class PipelinedHasher:
    """Hash chunks on a helper thread, in order, while the caller does I/O.

    The chunks must stay alive and unmodified until :meth:`hexdigest` returns
    (they are views of tensors or of a reused buffer; :meth:`barrier` waits until
    every submitted chunk has been hashed, so a buffer can be reused after it).

    Example:
        >>> from ckptkit.format.digest import hexdigest_bytes
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


READ_AHEAD = 3
"""Chunks read ahead by parallel ``pread`` calls while the current one is hashed: several
requests in flight keep a cold disk (or a network volume) at its throughput limit."""


def hash_file(
    path: str | os.PathLike[str],
    *,
    chunk: int = CHUNK,
    on_bytes: Callable[[int], None] | None = None,
    on_chunk: Callable[[int, memoryview], None] | None = None,
    read_ahead: int = READ_AHEAD,
) -> tuple[str, int]:
    """Return ``(xxh3-128 hex digest, size)`` of a regular file, reading it once.

    ``read_ahead`` reader threads ``pread`` the next chunks into their own buffers while
    this thread hashes the current one (xxh3 releases the GIL), so reading and hashing
    overlap and the disk sees several requests at once. ``on_chunk(offset, bytes)`` sees
    every chunk in file order (verify scans tensor values there, so the file is read once).
    The size is the one ``fstat`` gave when the file was opened.

    Raises:
        UnsafeInputError: ``CK-F022`` the path is a FIFO, directory or device (never
            opened, so never a hang); ``CK-F009`` it is a symlink.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "f"; _ = p.write_bytes(b"abc")
        >>> from ckptkit.format.digest import hexdigest_bytes
        >>> hash_file(p) == (hexdigest_bytes(b"abc"), 3)
        True
    """
    with files.open_regular(path, code=codes.F022, symlink_code=codes.F009) as f:
        return hash_fd(
            f.fileno(), chunk=chunk, on_bytes=on_bytes, on_chunk=on_chunk, read_ahead=read_ahead
        )


def hash_fd(
    fd: int,
    *,
    chunk: int = CHUNK,
    on_bytes: Callable[[int], None] | None = None,
    on_chunk: Callable[[int, memoryview], None] | None = None,
    read_ahead: int = READ_AHEAD,
    scatter: Callable[[int, memoryview], None] | None = None,
    direct: bool = False,
) -> tuple[str, int]:
    """:func:`hash_file` of an open file descriptor (whole file, whatever its position).

    The one read pipeline of a local file, for verify and for load alike: ``read_ahead``
    threads ``pread`` the next chunks into their own page-aligned buffers; ``scatter(offset,
    bytes)``, when given, runs on that reader thread as soon as its chunk has landed (load
    copies the chunk into the tensors there, several chunks at once); this thread then
    hashes the chunks in file order and hands each to ``on_chunk``. Every byte is read once
    from the disk and hashed once. The returned size is the number of bytes read, which is
    less than ``fstat``'s when the file shrank while being read.

    ``direct`` reads with ``O_DIRECT`` (set on ``fd`` for the pass, cleared after), which
    skips the page cache: a cold buffered read spent 4-5x the kernel CPU of a direct
    one on the benchmark VM (allocating, filling and then evicting cache pages), CPU
    the hashing and the copies into the tensors need on a 2-core machine. A file system
    that refuses ``O_DIRECT`` is read through the page cache.
    """
    size = os.fstat(fd).st_size
    use_direct = direct and size > 0 and _set_direct(fd, True)
    if not use_direct and hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
    try:
        return _pipeline(fd, size, chunk, read_ahead, on_bytes, on_chunk, scatter)
    finally:
        if use_direct:
            _set_direct(fd, False)


def _set_direct(fd: int, on: bool) -> bool:
    """Set or clear ``O_DIRECT`` on ``fd``; whether that worked."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        import fcntl

        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except OSError:
        return False  # EINVAL: this file system has no O_DIRECT
    return True


ALIGN = 4096
"""Buffer and request alignment: ``O_DIRECT`` needs the logical block size, a page is
a multiple of every block size in use."""


def _pipeline(
    fd: int,
    size: int,
    chunk: int,
    read_ahead: int,
    on_bytes: Callable[[int], None] | None,
    on_chunk: Callable[[int, memoryview], None] | None,
    scatter: Callable[[int, memoryview], None] | None,
) -> tuple[str, int]:
    h = new()
    n_chunks = -(-size // chunk)
    depth = max(1, min(read_ahead, n_chunks))
    buf_size = max(ALIGN, min(chunk, -(-size // ALIGN) * ALIGN))

    def read_into(buf: mmap.mmap, off: int) -> int:
        want = min(chunk, size - off)
        mv = memoryview(buf)
        try:
            got = 0
            while got < want:
                # The request stays a whole number of blocks (O_DIRECT); at the end of the
                # file the kernel returns the bytes there are.
                k = os.preadv(fd, [mv[got : -(-want // ALIGN) * ALIGN]], off + got)
                if k == 0:
                    break  # truncated while we read: the caller sees the short size
                if k % ALIGN and got + k < want:
                    # A short read mid-file (a network file system may return one): the
                    # next request would start off a block boundary, which O_DIRECT
                    # refuses. Read the rest of the pass through the page cache.
                    _set_direct(fd, False)
                got += k
            got = min(got, want)
            if scatter is not None and got:
                scatter(off, mv[:got])
            return got
        finally:
            mv.release()

    total = 0
    bufs = [mmap.mmap(-1, buf_size) for _ in range(depth + 1)]
    try:
        with ThreadPoolExecutor(depth, thread_name_prefix="ckptkit-read") as pool:
            pending: collections.deque[tuple[int, mmap.mmap, Future[int]]] = collections.deque()
            free = list(bufs)
            nxt = 0
            try:
                while nxt < n_chunks and len(pending) < depth:
                    buf = free.pop()
                    pending.append((nxt * chunk, buf, pool.submit(read_into, buf, nxt * chunk)))
                    nxt += 1
                while pending:
                    off, buf, fut = pending.popleft()
                    n = fut.result()
                    if nxt < n_chunks and free:
                        b2 = free.pop()
                        pending.append((nxt * chunk, b2, pool.submit(read_into, b2, nxt * chunk)))
                        nxt += 1
                    view = memoryview(buf)[:n]
                    try:
                        h.update(view)
                        if on_chunk is not None:
                            on_chunk(off, view)
                    finally:
                        view.release()
                    if on_bytes is not None:
                        on_bytes(n)
                    total += n
                    free.append(buf)
                    if n < min(chunk, size - off):
                        break
            finally:
                for _, _, fut in pending:
                    fut.cancel()
                for _, _, fut in pending:
                    with contextlib.suppress(BaseException):
                        fut.result()  # a running read still uses its buffer
    finally:
        for b in bufs:
            b.close()
    return str(h.hexdigest()), total
