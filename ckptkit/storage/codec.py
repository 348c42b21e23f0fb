"""Streaming zstd for checkpoint files, with a hard decompression size limit.

A compressed file's digest covers the bytes on disk (so verify never needs to
decompress to detect a flipped bit); its manifest entry records the raw size, and
decompression stops with :class:`~ckptkit.errors.UnsafeInputError` the moment the
output would exceed it (a decompression bomb, or a lying manifest).
"""

from __future__ import annotations

import io
from typing import BinaryIO, Literal

import zstandard

from ckptkit import codes
from ckptkit.errors import CkptkitError

Compression = Literal["zstd"]
SUFFIX = {"zstd": ".zst"}
DEFAULT_LEVEL = 3
MAX_WINDOW = 1 << 27
"""Largest zstd window a reader allocates (128 MiB; level 3 needs about 2 MiB)."""


def compressor(*, level: int = DEFAULT_LEVEL, threads: int = -1) -> zstandard.ZstdCompressor:
    """Return a multithreaded zstd compressor (``threads=-1``: one per core).

    Example:
        >>> c = compressor(); c.compress(b"x" * 100)[:4] == b"\\x28\\xb5\\x2f\\xfd"
        True
    """
    return zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=False)


class LimitedReader(io.RawIOBase):
    """Decompress a zstd stream, refusing to produce more than ``limit`` bytes.

    Args:
        raw: the compressed file object (already wrapped for hashing if wanted).
        limit: the most bytes the stream may decompress to (the manifest's raw size).
        path: file name used in errors.

    Example:
        >>> import io as _io
        >>> data = compressor().compress(b"a" * 1000)
        >>> r = LimitedReader(_io.BytesIO(data), limit=1000, path="f.zst")
        >>> len(r.read())
        1000
    """

    def __init__(self, raw: BinaryIO, *, limit: int, path: str) -> None:
        super().__init__()
        # Frame checksums are off (the file digest covers integrity); read_across_frames
        # so a concatenated stream is read whole rather than silently truncated.
        self._reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
            raw, read_across_frames=True, closefd=False
        )
        self.limit = limit
        self.path = path
        self.produced = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        want = len(mv)
        if want == 0:
            return 0
        try:
            # Ask for one byte more than allowed so overflow is seen, not silently cut.
            room = self.limit - self.produced
            if room <= 0:
                probe = self._reader.read(1)
                if probe:
                    raise self._bomb()
                return 0
            n = self._reader.readinto(mv[: min(want, room)])
        except zstandard.ZstdError as e:
            raise codes.error(codes.F008, f"zstd stream is corrupt ({e})", path=self.path) from e
        self.produced += n
        return n

    def _bomb(self) -> CkptkitError:
        return codes.error(
            codes.F008,
            f"decompresses to more than the {self.limit} bytes the manifest declares "
            "(decompression bomb or tampered file)",
            path=self.path,
        )

    def check_exhausted(self) -> None:
        """Raise if the stream holds more data than the declared raw size."""
        if self._reader.read(1):
            raise self._bomb()
