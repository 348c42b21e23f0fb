"""Verify's one read of a safetensors file: its digest, its header and NaN/Inf in its values.

:func:`scan_file` hashes a whole file and parses its header without keeping tensors;
:class:`FiniteScan` checks the floating tensors of an uncompressed file chunk by chunk
from their bits (:func:`nonfinite_bits`) as the digest pass reads them.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptkit import codes
from ckptkit.errors import IntegrityError, UnsafeInputError
from ckptkit.format.dtypes import DTYPES, HeaderEntry
from ckptkit.storage import codec, digest, files
from ckptkit.storage.tensors import HashingReader, OnBytes, parse_header, read_header_from
from ckptkit.storage.tensors_direct import use_direct_io

_NONFINITE_BITS: dict[torch.dtype, tuple[type[np.signedinteger[Any]], type[np.unsignedinteger[Any]], int]] = {
    torch.float64: (np.int64, np.uint64, 0x7FF0_0000_0000_0000),
    torch.float32: (np.int32, np.uint32, 0x7F80_0000),
    torch.complex64: (np.int32, np.uint32, 0x7F80_0000),  # two float32 per element
    torch.float16: (np.int16, np.uint16, 0x7C00),
    torch.bfloat16: (np.int16, np.uint16, 0x7F80),
    torch.float8_e5m2: (np.int8, np.uint8, 0x7C),
    torch.float8_e4m3fn: (np.int8, np.uint8, 0x7F),  # NaN only (S.1111.111); no Inf
}
"""Sign-and-magnitude floats whose NaN/Inf are exactly the patterns with every exponent
bit set: ``(signed view, unsigned view, smallest such pattern without the sign bit)``."""


def nonfinite_bits(raw: memoryview, dt: torch.dtype) -> bool | None:
    """Whether the ``dt`` values in ``raw`` hold a NaN or an Inf, read from their bits.

    A value is NaN or Inf exactly when every exponent bit is set, so a positive one is
    the signed integer view's maximum at or above ``pattern`` and a negative one the
    unsigned view's maximum at or above ``sign | pattern``. Two integer ``max``
    reductions answer it exactly (no overflow, unlike a sum), on the calling thread
    (numpy never spreads a reduction over threads, and releases the GIL), without a
    temporary. torch's reductions are used nowhere here on purpose: on a 2-core
    machine their OpenMP pool waited on cores the reader threads held, and the value
    scan fell to 1-2 GB/s (issue 27 item 5).

    Returns None for a dtype this cannot read (the fnuz float8s put NaN at -0, e8m0 has
    no sign bit): the caller checks those with torch.

    Example:
        >>> import torch
        >>> x = torch.tensor([1.0, -float("inf")], dtype=torch.bfloat16)
        >>> mv = memoryview(x.view(torch.uint8).numpy())
        >>> nonfinite_bits(mv, torch.bfloat16), nonfinite_bits(mv[:2], torch.bfloat16)
        (True, False)
    """
    spec = _NONFINITE_BITS.get(dt)
    if spec is None:
        return None
    signed, unsigned, pattern = spec
    if not len(raw):
        return False
    bits = 8 * np.dtype(signed).itemsize
    if int(np.frombuffer(raw, dtype=signed).max()) >= pattern:
        return True
    return int(np.frombuffer(raw, dtype=unsigned).max()) >= (1 << (bits - 1)) | pattern


class FiniteScan:
    """Which floating tensors of an uncompressed file hold NaN/Inf, seen chunk by chunk.

    Fed each chunk as the digest pass reads it: a tensor whose element boundaries cannot
    straddle a chunk edge (its file offset is a multiple of its item size, which also
    divides the chunk size) is checked piece by piece from its bits
    (:func:`nonfinite_bits`; torch's ``aminmax`` for the few dtypes it cannot read); the
    rest are left for a second look (``unchecked``).
    """

    def __init__(self, header: dict[str, HeaderEntry], base: int) -> None:
        self.ranges: list[tuple[int, int, str, torch.dtype]] = []
        self.unchecked: set[str] = set()
        self.nonfinite: set[str] = set()
        for key, e in sorted(header.items(), key=lambda kv: kv[1].offsets[0]):
            dt = DTYPES[e.dtype]
            if not (dt.is_floating_point or dt.is_complex) or e.offsets[0] == e.offsets[1]:
                continue
            item = torch.empty((), dtype=dt).element_size()
            start = base + e.offsets[0]
            if start % item or digest.CHUNK % item:
                self.unchecked.add(key)
            else:
                self.ranges.append((start, base + e.offsets[1], key, dt))

    def feed(self, offset: int, chunk: memoryview) -> None:
        end = offset + len(chunk)
        for lo, hi, key, dt in self.ranges:
            if hi <= offset or lo >= end or key in self.nonfinite:
                continue
            a, b = max(lo, offset) - offset, min(hi, end) - offset
            bad = nonfinite_bits(chunk[a:b], dt)
            if bad is None:
                bad = _nonfinite_torch(chunk[a:b], dt)
            if bad:
                self.nonfinite.add(key)


def _nonfinite_torch(raw: memoryview, dt: torch.dtype) -> bool:
    """Whether ``raw`` holds a NaN/Inf ``dt`` value, by torch (dtypes without a bit rule)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only chunk: the scan never writes
        t = torch.frombuffer(raw, dtype=dt)
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = t.float()  # float8 has no CPU reductions; widening is exact
    lo_v, hi_v = torch.aminmax(t)
    return not (math.isfinite(float(lo_v)) and math.isfinite(float(hi_v)))


def scan_file(
    path: Path,
    *,
    compression: codec.Compression | None,
    raw_size: int | None,
    rel: str,
    on_bytes: OnBytes | None = None,
    values: bool = False,
) -> tuple[str, int, dict[str, HeaderEntry] | None, tuple[str, str] | None, FiniteScan | None]:
    """Hash a whole file and parse its header without keeping tensors (for verify).

    Returns ``(digest, size, header or None, (code, message) of a header or
    decompression error or None, value scan or None)``.
    Errors about the header are returned, not raised, so a verify can report the digest
    too. With ``values`` an uncompressed file's floating tensors are scanned for NaN/Inf
    in the same single read.
    """
    if compression is None:
        header: dict[str, HeaderEntry] | None = None
        err: tuple[str, str] | None = None
        finite: FiniteScan | None = None
        with files.open_regular(path, code=codes.F022, rel=rel, symlink_code=codes.F009) as f:
            try:
                fsize = os.fstat(f.fileno()).st_size
                n, raw = read_header_from(f, path=rel, file_size=fsize)
                header = parse_header(raw, path=rel, data_len=fsize - 8 - n)
                if values:
                    finite = FiniteScan(header, 8 + n)
            except (IntegrityError, UnsafeInputError) as e:
                err = (e.code or codes.F004, e.what)
            hexd, size = digest.hash_fd(
                f.fileno(),
                on_bytes=on_bytes,
                on_chunk=finite.feed if finite is not None else None,
                direct=use_direct_io(fsize),
            )
        return hexd, size, header, err, finite
    with (
        files.open_regular(path, code=codes.F022, rel=rel, symlink_code=codes.F009) as f,
        digest.PipelinedHasher() as hasher,
    ):
        hr = HashingReader(f, hasher)  # type: ignore[arg-type]
        buffered = io.BufferedReader(hr, buffer_size=digest.CHUNK)
        size = os.fstat(f.fileno()).st_size
        err = None
        header = None
        try:
            src = codec.LimitedReader(
                buffered,  # type: ignore[arg-type]
                limit=raw_size if raw_size is not None else 0,
                path=rel,
            )
            n, raw = read_header_from(src, path=rel, file_size=raw_size)  # type: ignore[arg-type]
            data_len = None if raw_size is None else raw_size - 8 - n
            header = parse_header(raw, path=rel, data_len=data_len)
            sink = bytearray(digest.CHUNK)
            while True:
                k = src.readinto(sink)
                if not k:
                    break
                if on_bytes:
                    on_bytes(k)
            src.check_exhausted()
            if raw_size is not None and src.produced != raw_size:
                err = (codes.F008, f"decompresses to {src.produced} bytes, manifest says {raw_size}")
        except (IntegrityError, UnsafeInputError) as e:
            err = (e.code or codes.F004, e.what)
        while buffered.read(digest.CHUNK):
            pass
        return hasher.hexdigest(), size, header, err, None
