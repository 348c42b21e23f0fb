"""Safetensors shards on an object store: streamed out, read back in parallel ranges.

The same bytes, header and digests as a local shard (:mod:`ckptkit.storage.tensors`); only
the transport differs:

* :func:`write_file` streams the header and every tensor's bytes through an upload
  (:func:`ckptkit.storage.upload.open_upload`: parallel multipart parts on S3), hashing
  on the way out, so the digest in the manifest is of the bytes sent, with no read-back;
* :func:`read_file` fetches the header, checks it against the manifest, then requests the
  tensor bytes as parallel ranges straight into the destination tensors, hashing them in
  file order, and checks size and digest before returning; compressed files stream
  through the same bounded zstd reader as local ones;
* :func:`hash_file` is the verify pass: parallel ranges, hashed in order, with the same
  ``on_chunk`` hook the value scan uses locally.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ckptkit import codes
from ckptkit.format import digest as fmt_digest
from ckptkit.format.dtypes import HeaderEntry
from ckptkit.storage import codec, digest, fs, tensors, transfer
from ckptkit.storage.fs import Location
from ckptkit.storage.upload import open_upload

RANGE = 64 << 20
"""Bytes per ranged request; an object no larger is fetched in one GET (as ``fs.cat``)."""
RANGES_IN_FLIGHT = 8
"""Ranged requests issued together (then hashed in order)."""

OnBytes = Callable[[int], None]


def write_file(
    loc: Location,
    items: Sequence[tuple[str, torch.Tensor]],
    *,
    compress: codec.Compression | None = None,
    metadata: dict[str, str] | None = None,
    on_bytes: OnBytes | None = None,
) -> tensors.Written:
    """Upload ``items`` as one safetensors object at ``loc``, hashing what is sent."""
    head, entries = tensors.build_header(items, metadata)
    raw_size = len(head) + sum(e.offsets[1] - e.offsets[0] for e in entries.values())
    up = open_upload(loc)
    try:
        with digest.PipelinedHasher() as hasher:
            if compress is None:
                size = tensors.stream_file(head, items, hasher, up.write, on_bytes)
            else:
                sink = _HashingSink(up, hasher)
                tensors.compress_file(head, items, sink, raw_size, on_bytes)
                size = sink.size
            hexd = hasher.hexdigest()
        up.close()
    except BaseException:
        up.abort()
        raise
    return tensors.Written(size=size, digest=hexd, raw_size=raw_size, header=entries)


class _HashingSink:
    def __init__(self, up: Any, hasher: digest.PipelinedHasher) -> None:
        self.up = up
        self.hasher = hasher
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        b = bytes(data)  # immutable: the hasher thread may still read it
        self.hasher.update(b)
        self.up.write(b)
        self.size += len(b)
        return len(b)


def _ranges(start: int, end: int, step: int = RANGE) -> list[tuple[int, int]]:
    return [(a, min(a + step, end)) for a in range(start, end, step)]


def hash_file(
    loc: Location,
    *,
    on_bytes: OnBytes | None = None,
    on_chunk: Callable[[int, memoryview], None] | None = None,
) -> tuple[str, int]:
    """``(xxh3-128, size)`` of a remote file: parallel ranges, hashed in file order."""
    size = fs.size(loc)
    h = fmt_digest.new()
    todo = _ranges(0, size)
    for i in range(0, len(todo), RANGES_IN_FLIGHT):
        batch = todo[i : i + RANGES_IN_FLIGHT]
        for (a, _b), data in zip(batch, transfer.read_ranges(loc, batch), strict=True):
            mv = memoryview(data)
            h.update(mv)
            if on_chunk is not None:
                on_chunk(a, mv)
            if on_bytes is not None:
                on_bytes(len(mv))
    return str(h.hexdigest()), size


def read_file(
    loc: Location,
    expected: tensors.Expected,
    wanted: dict[str, HeaderEntry],
    *,
    targets: dict[str, torch.Tensor] | None = None,
    on_bytes: OnBytes | None = None,
) -> dict[str, torch.Tensor]:
    """Read and verify one remote shard (see the module docstring); tensors by key.

    Raises the same ckptkit errors as the local reader, with the same codes.
    """
    rel = expected.rel
    try:
        size = fs.size(loc)  # one request: exists, and its size
    except FileNotFoundError:
        raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel) from None
    expected.check_size(size)
    targets = targets or {}
    if expected.compression is not None:
        return _read_compressed(loc, expected, wanted, targets, on_bytes)
    # One request for the start of the file: the header and the bytes after it (a whole
    # object up to RANGE, as fs.cat would fetch it: the fewest requests).
    head = bytearray(size if size <= RANGE else HEAD_PREFETCH)
    _fill(loc, [(0, memoryview(head))], rel)
    if len(head) < 8:
        raise codes.error(
            codes.F004, "file is shorter than a safetensors header (truncated)", path=rel
        )
    (n_head,) = struct.unpack("<Q", head[:8])
    limit = min(tensors.MAX_HEADER, max(size - 8, 0))
    if n_head > limit:
        raise codes.error(
            codes.F004,
            f"safetensors header length {n_head} is absurd (file holds at most {limit})",
            path=rel,
        )
    if 8 + n_head > len(head):  # a header larger than the prefetch: fetch the rest
        more = bytearray(8 + n_head - len(head))
        _fill(loc, [(len(head), memoryview(more))], rel)
        head += more
    base = 8 + n_head
    header = tensors.parse_header(bytes(head[8:base]), path=rel, data_len=size - base)
    tensors.check_header(header, wanted, rel)
    h = fmt_digest.new()
    h.update(head)
    out: dict[str, torch.Tensor] = {}
    plan = _Plan(len(head), h, on_bytes)
    head_mv = memoryview(head)
    for key, e in sorted(header.items(), key=lambda kv: kv[1].offsets[0]):
        ret, dest = tensors.destination(key, e, targets)
        out[key] = ret
        start, end = base + e.offsets[0], base + e.offsets[1]
        if start == end:
            continue  # an empty tensor: no bytes
        mv = tensors.tensor_bytes(dest)
        if start < len(head):  # already fetched with the header
            k = min(end, len(head)) - start
            mv[:k] = head_mv[start : start + k]
            start, mv = start + k, mv[k:]
        if start < end:
            plan.add(start, mv)
    plan.add_gap_to(size)
    plan.run(loc, rel)
    expected.check_digest(str(h.hexdigest()))
    return out


HEAD_PREFETCH = 1 << 20
"""Bytes of a shard fetched with its header in the first request."""
DIRECT = 8 << 20
"""A tensor at least this large streams straight into its memory; smaller ones (and the
gaps between tensors) are fetched together in one range and copied out."""


def _fill(loc: Location, segments: list[tuple[int, memoryview]], rel: str) -> None:
    try:
        transfer.read_ranges_into(loc, segments)
    except Exception as e:  # s3fs lets some transport errors through unconverted
        if not isinstance(e, OSError) and not codes.transient(e):
            raise
        raise codes.read_error(
            e, path=rel, damage=codes.F002, what="cannot be read (truncated or rewritten?)"
        ) from None


class _Plan:
    """The ranged requests that read a file's data region in file order.

    Large tensors are read straight into their memory in ``RANGE`` pieces; runs of small
    tensors and gaps are coalesced into one scratch range (up to ``RANGE``) and copied out.
    Requests go out ``RANGES_IN_FLIGHT`` at a time; every byte is hashed in file order.
    """

    def __init__(self, pos: int, h: Any, on_bytes: OnBytes | None) -> None:
        self.pos = pos
        self.h = h
        self.on_bytes = on_bytes
        self.items: list[tuple[int, memoryview, list[tuple[int, memoryview]]]] = []
        self._group: list[tuple[int, memoryview]] = []  # (file offset, destination)
        self._group_start = pos

    def add(self, start: int, dest: memoryview) -> None:
        if start > self.pos:
            self._extend(start, None)
        if len(dest) >= DIRECT:
            self._flush()
            for a in range(0, len(dest), RANGE):
                self.items.append((start + a, dest[a : a + RANGE], []))
            self.pos = self._group_start = start + len(dest)
        else:
            self._extend(start + len(dest), (start, dest))

    def add_gap_to(self, end: int) -> None:
        if end > self.pos:
            self._extend(end, None)
        self._flush()

    def _extend(self, end: int, copy: tuple[int, memoryview] | None) -> None:
        if not self._group:
            self._group_start = self.pos
        if copy is not None:
            self._group.append(copy)
        self.pos = end
        if self.pos - self._group_start >= RANGE:
            self._flush()

    def _flush(self) -> None:
        if self.pos > self._group_start:
            scratch = memoryview(bytearray(self.pos - self._group_start))
            self.items.append((self._group_start, scratch, list(self._group)))
        self._group = []
        self._group_start = self.pos

    def run(self, loc: Location, rel: str) -> None:
        self._flush()
        for i in range(0, len(self.items), RANGES_IN_FLIGHT):
            batch = self.items[i : i + RANGES_IN_FLIGHT]
            _fill(loc, [(off, buf) for off, buf, _ in batch], rel)
            for off, buf, copies in batch:
                self.h.update(buf)
                for at, dest in copies:
                    dest[:] = buf[at - off : at - off + len(dest)]
                if self.on_bytes:
                    self.on_bytes(len(buf))


def _read_compressed(
    loc: Location,
    expected: tensors.Expected,
    wanted: dict[str, HeaderEntry],
    targets: dict[str, torch.Tensor],
    on_bytes: OnBytes | None,
) -> dict[str, torch.Tensor]:
    rel = expected.rel
    raw = bytearray(expected.size)
    got = transfer.read_into(loc, raw)
    if got != expected.size:
        raise codes.error(codes.F002, f"read {got} of {expected.size} bytes", path=rel)
    expected.check_digest(fmt_digest.hexdigest_bytes(memoryview(raw)))
    src = codec.LimitedReader(
        io.BytesIO(raw),  # type: ignore[arg-type]
        limit=expected.raw_size if expected.raw_size is not None else 0,
        path=rel,
    )
    n, head = tensors.read_header_from(src, path=rel, file_size=expected.raw_size)  # type: ignore[arg-type]
    data_len = None if expected.raw_size is None else expected.raw_size - 8 - n
    header = tensors.parse_header(head, path=rel, data_len=data_len)
    tensors.check_header(header, wanted, rel)
    return tensors.read_tensors(src, header, rel, targets, on_bytes)


__all__ = ["hash_file", "read_file", "write_file"]
