"""Reading a listed DCP file once, hashing each byte in file order, and checking its digest.

A listed file is opened only when it is a regular file (:func:`open_regular`); a small one is
read whole and checked (:func:`read_verified`), a shard through :class:`Shard`, whose byte
ranges land straight in the caller's buffer and are hashed right behind.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from typing import IO, Any, cast

from ckptkit import codes
from ckptkit.format import digest
from ckptkit.format import manifest as mf
from ckptkit.storage import files, fs, transfer
from ckptkit.storage.fs import Location


def read_verified(path: Location, fe: mf.FileEntry, *, rel: str) -> bytes:
    """Read a whole small file, refusing non-regular files, and check size and digest."""
    if not fs.is_local(path):
        if fs.kind(path) is None:
            raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel)
        data = fs.read_small(path, fe.size)
    else:
        with open_regular(path, rel=rel) as f:
            size = os.fstat(f.fileno()).st_size
            if size != fe.size:
                raise codes.error(
                    codes.F002, f"size is {size} bytes, the manifest records {fe.size}", path=rel
                )
            data = f.read(fe.size + 1)
    if len(data) != fe.size:
        raise codes.error(codes.F002, "file changed size while it was read", path=rel)
    got = digest.hexdigest_bytes(data)
    if got != fe.xxh3_128:
        raise codes.error(
            codes.F003, f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)", path=rel
        )
    return data


@contextlib.contextmanager
def open_regular(path: Location, *, rel: str) -> Iterator[io.BufferedReader]:
    """Open a listed local file for reading, only if it is a regular file (never blocks).

    Raises:
        IncompleteCheckpointError: ``CK-F001`` it does not exist.
        UnsafeInputError: ``CK-F022`` it is a FIFO, device, directory or symlink.
        UnreadableError: ``CK-F025`` it cannot be read now (a permission, an I/O error).
    """
    try:
        raw = files.open_regular(str(path), code=codes.F022, rel=rel)
    except FileNotFoundError:
        raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel) from None
    except OSError as e:  # a permission or I/O error is not damage: the classifier says
        raise codes.read_error(e, path=rel) from None
    with io.BufferedReader(cast(Any, raw)) as f:
        yield f


SHARD_CHUNK = 1 << 20
"""Bytes a shard read moves (and then hashes, while they are still in the CPU cache) per
step: hashing right behind the copy makes the digest cost a cache read, not a second
pass over memory."""
READ_GAP = 64 << 10
"""A read that starts at most this far past the hashed prefix hashes the gap first (the
zip headers between the records of a ``torch.save`` item); a read further ahead (the zip
directory at an item's end, which ``torch.load`` reads first) is hashed when the prefix
reaches it, re-read then: a few hundred bytes per item."""


class Shard:
    """One listed DCP file, read once: each byte hashed in file order as it is read.

    The reader of a load asks for byte ranges (:meth:`read_into`, or :meth:`item`, the
    file-like view ``torch.load`` parses), and the bytes land straight in the caller's
    buffer (a tensor's storage): a plain ``pread`` locally, as DCP's own reader does; a
    copy out of the one download remotely. Bytes that extend the hashed prefix are hashed
    right after they land, in :data:`SHARD_CHUNK` steps; :meth:`verify` hashes what no
    read asked for and compares the digest with the manifest's. There is no memory map
    (a file cut short while mapped kills the process with ``SIGBUS``; a short ``pread``
    is an error with a code).

    Open one with :func:`open_shard`.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "s"; _ = p.write_bytes(b"abcdef")
        >>> fe = mf.FileEntry(path="s", size=6, xxh3_128=digest.hexdigest_bytes(b"abcdef"))
        >>> with open_shard(fs.location(p), rel="s", expected_size=6) as sh:
        ...     buf = bytearray(2); _ = sh.read_into(2, memoryview(buf)); sh.verify(fe)
        >>> bytes(buf)
        b'cd'
    """

    def __init__(self, read_at: Callable[[int, memoryview], int], size: int, *, rel: str) -> None:
        """``read_at(pos, dst)`` reads up to ``len(dst)`` bytes at ``pos`` into ``dst``
        and returns how many (0 at the end of the file)."""
        self.size = size
        self.rel = rel
        self._read_at = read_at
        self._h = digest.new()
        self.hashed = 0
        """Bytes ``[0, hashed)`` are in the digest."""
        self._scratch: bytearray | None = None

    def read_into(self, pos: int, dst: memoryview) -> int:
        """Fill ``dst`` (a flat byte view) with the bytes at ``pos``; return how many
        (fewer only at the end of the file).

        Raises:
            IntegrityError: ``CK-F002`` the file got shorter while it was read.
            CkptkitError: ``CK-F025``/``CK-F004`` the read failed (:func:`ckptkit.codes.read_error`).
        """
        n = max(0, min(len(dst), self.size - pos))
        if self.hashed < pos <= self.hashed + READ_GAP:
            self.hash_to(pos)
        done = 0
        while done < n:
            k = min(SHARD_CHUNK, n - done)
            at = pos + done
            with dst[done : done + k] as part:
                self._fill(at, part)
                if at <= self.hashed < at + k:
                    with part[self.hashed - at :] as fresh:
                        self._h.update(fresh)
                    self.hashed = at + k
            done += k
        return n

    def hash_to(self, end: int) -> None:
        """Hash ``[hashed, end)``, reading it now (bytes no read asked for, or asked for
        ahead of the prefix)."""
        end = min(end, self.size)
        while self.hashed < end:
            k = min(SHARD_CHUNK, end - self.hashed)
            if self._scratch is None or len(self._scratch) < k:
                self._scratch = bytearray(k)
            with memoryview(self._scratch)[:k] as part:
                self._fill(self.hashed, part)
                self._h.update(part)
            self.hashed += k

    def verify(self, fe: mf.FileEntry) -> None:
        """Hash the rest of the file and compare with the manifest's digest.

        Raises:
            IntegrityError: ``CK-F003`` the digest does not match.
        """
        got = self.hexdigest()
        if got != fe.xxh3_128:
            raise codes.error(
                codes.F003,
                f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)",
                path=self.rel,
            )

    def hexdigest(self) -> str:
        """The digest of the whole file (what no read asked for is read now)."""
        self.hash_to(self.size)
        return str(self._h.hexdigest())

    def item(self, offset: int, length: int) -> IO[bytes]:
        """The bytes ``[offset, offset + length)`` as a seekable file (what ``torch.load``
        reads), every read going through :meth:`read_into`."""
        return cast(IO[bytes], _ItemReader(self, offset, length))

    def _fill(self, pos: int, dst: memoryview) -> None:
        got = 0
        try:
            while got < len(dst):
                with dst[got:] as rest:
                    k = self._read_at(pos + got, rest)
                if not k:
                    break
                got += k
        except OSError as e:
            raise codes.read_error(e, path=self.rel) from None
        if got != len(dst):
            raise codes.error(
                codes.F002,
                f"file changed size while it was read (ended at byte {pos + got} of {self.size})",
                path=self.rel,
            )


@contextlib.contextmanager
def open_shard(path: Location, *, rel: str, expected_size: int | None) -> Iterator[Shard]:
    """Open a listed file for one hashed read (:class:`Shard`): locally with ``pread``
    on the open file, remotely from one streamed download.

    Args:
        path: the file.
        rel: how errors name it.
        expected_size: the size the manifest records (None: whatever it is now).

    Raises:
        IncompleteCheckpointError: ``CK-F001`` missing.
        IntegrityError: ``CK-F002`` its size is not ``expected_size``.
        UnsafeInputError: ``CK-F022`` not a regular file.
        CkptkitError: ``CK-F025`` it cannot be read now.
    """
    if not fs.is_local(path):
        if fs.kind(path) is None:
            raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel)
        size = fs.size(path)
        _check_size(size, expected_size, rel)
        buf = bytearray(size)
        try:
            got = transfer.read_into(path, buf) if size else 0
        except OSError as e:
            raise codes.read_error(e, path=rel) from None
        if got != size:
            raise codes.error(codes.F002, f"read {got} of {size} bytes", path=rel)
        with memoryview(buf) as whole:

            def copy_at(pos: int, dst: memoryview) -> int:
                n = max(0, min(len(dst), size - pos))
                dst[:n] = whole[pos : pos + n]
                return n

            yield Shard(copy_at, size, rel=rel)
        return
    with open_regular(path, rel=rel) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        _check_size(size, expected_size, rel)
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        yield Shard(lambda pos, dst: os.preadv(fd, [dst], pos), size, rel=rel)


def _check_size(size: int, expected: int | None, rel: str) -> None:
    if expected is not None and size != expected:
        raise codes.error(
            codes.F002, f"size is {size} bytes, the manifest records {expected}", path=rel
        )


class _ItemReader(io.RawIOBase):
    """A seekable view of one item's bytes in a :class:`Shard` (what ``torch.load`` reads).

    Each read lands in the caller's buffer (the tensor's storage) directly.
    """

    def __init__(self, shard: Shard, offset: int, length: int) -> None:
        super().__init__()
        self._shard = shard
        self._off = offset
        self._len = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        with memoryview(b) as dst, dst.cast("B") as flat:
            n = max(0, min(len(flat), self._len - self._pos))
            with flat[:n] as out:
                n = self._shard.read_into(self._off + self._pos, out)
        self._pos += n
        return n

    def readall(self) -> bytes:
        buf = bytearray(max(0, self._len - self._pos))
        n = self.readinto(buf)
        return bytes(buf[:n])


def check_file(path: Location, fe: mf.FileEntry, *, rel: str) -> None:
    """Hash a whole file (one read, :class:`Shard`) and compare size and digest with its entry."""
    with open_shard(path, rel=rel, expected_size=fe.size) as shard:
        shard.verify(fe)


__all__ = [
    "SHARD_CHUNK",
    "Shard",
    "check_file",
    "open_regular",
    "open_shard",
    "read_verified",
]
