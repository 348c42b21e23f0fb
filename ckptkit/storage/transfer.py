"""The bytes of one file moved in bulk: a streamed upload or download, parallel range reads.

The local reads of a shard and the remote transfers here share one loop,
:func:`readinto_exact`, that fills a buffer from a file object until it is full or the
file ends (an unbuffered read, or a network stream, may return less than asked). The
remote operations take a location :func:`ckptkit.storage.fs.location` made; a local file
keeps its callers' own O_DIRECT/fsync path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO

from ckptkit.storage.fs import Location, is_s3, remote_fs


def readinto_exact(f: Any, mv: memoryview) -> int:
    """Fill ``mv`` from the file object ``f`` until it is full or ``f`` ends; return bytes read.

    Example:
        >>> import io
        >>> buf = bytearray(4)
        >>> readinto_exact(io.BytesIO(b"abcdef"), memoryview(buf)), bytes(buf)
        (4, b'abcd')
        >>> readinto_exact(io.BytesIO(b"ab"), memoryview(bytearray(4)))
        2
    """
    got = 0
    while got < len(mv):
        k = f.readinto(mv[got:])
        if not k:
            break
        got += k
    return got


def open_writer(p: Location, *, block_size: int = 64 << 20) -> BinaryIO:
    """A streamed upload to a remote ``p`` (multipart past ``block_size``).

    Nothing is visible at ``p`` until the stream is closed successfully.
    """
    fs, path = remote_fs(p)
    return fs.open(path, "wb", block_size=block_size)  # type: ignore[no-any-return]


def read_into(p: Location, buf: bytearray | memoryview, *, block_size: int = 16 << 20) -> int:
    """Read a whole remote file into ``buf`` (a streamed download); return bytes read."""
    fs, path = remote_fs(p)
    with fs.open(path, "rb", block_size=block_size) as f:
        return readinto_exact(f, memoryview(buf))


def read_ranges(p: Location, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """Bytes of ``[start, end)`` ranges of a remote file, requested in parallel."""
    fs, path = remote_fs(p)
    if not ranges:
        return []
    starts = [a for a, _ in ranges]
    ends = [b for _, b in ranges]
    out = fs.cat_ranges([path] * len(ranges), starts, ends)
    bad = [o for o in out if isinstance(o, BaseException)]
    if bad:
        raise bad[0]
    return [bytes(o) for o in out]


def read_ranges_into(p: Location, segments: Sequence[tuple[int, memoryview]]) -> None:
    """Fill each ``(offset, destination)`` from a remote file, the requests in parallel.

    On S3 the response bodies stream straight into the destinations (no intermediate
    object of the whole range); elsewhere each range is fetched, then copied.

    Raises:
        OSError: a range came back short (the object changed or was truncated).
    """
    if not segments:
        return
    fs, path = remote_fs(p)
    if is_s3(fs):
        _s3_ranges_into(fs, path, segments)
        return
    got = read_ranges(p, [(off, off + len(dst)) for off, dst in segments])
    for (off, dst), data in zip(segments, got, strict=True):
        if len(data) != len(dst):
            raise OSError(f"{path}: short read at byte {off} ({len(data)} of {len(dst)})")
        dst[:] = data


def _s3_ranges_into(fs: Any, path: str, segments: Sequence[tuple[int, memoryview]]) -> None:
    import asyncio

    from fsspec.asyn import sync

    bucket, _, key = path.partition("/")

    async def one(off: int, dst: memoryview) -> None:
        resp = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes={off}-{off + len(dst) - 1}"
        )
        body = resp["Body"]
        try:
            got = 0
            while got < len(dst):
                n = await body.readinto(dst[got : got + (1 << 20)])
                if not n:
                    break
                got += n
        finally:
            body.close()
        if got != len(dst):
            raise OSError(f"{path}: short read at byte {off} ({got} of {len(dst)})")

    async def everything() -> None:
        await asyncio.gather(*(one(off, dst) for off, dst in segments))

    sync(fs.loop, everything)


__all__ = ["open_writer", "read_into", "read_ranges", "read_ranges_into", "readinto_exact"]
