"""Safetensors shard files, written and read in one streaming pass with digests.

The files are standard safetensors (the ``safetensors`` library reads them and we
read its files), but ckptkit writes and reads the bytes itself: that is what lets
the xxh3-128 digest be computed while writing (no second pass), verified while
reading, and lets a restore read straight into existing tensors (no extra copy of
the state in RAM), which ``safetensors.torch.load_file`` cannot do.

This module is also the byte layout both transports share. The local one is here
(:func:`write_file`, :func:`read_file`: file descriptors, ``preadv``, O_DIRECT through
:mod:`ckptkit.storage.tensors_direct`; verify's one read of a file is
:mod:`ckptkit.storage.tensors_scan`); the
object-store one, :mod:`ckptkit.storage.remote`, moves the same bytes through uploads
and range requests and builds on these, which are public for that reason:

* :func:`build_header` / :func:`parse_header` / :func:`check_header`: the header, and
  the check that it says what the manifest says;
* :func:`stream_file`: the header then every tensor's bytes, hashed, to any writer;
  :func:`compress_file`: the same bytes through zstd, to any hashing sink;
* :class:`Expected` and its :meth:`~Expected.check_size` / :meth:`~Expected.check_digest`:
  what the manifest says of a file, and the refusals when the bytes disagree;
* :func:`host_contiguous` and :func:`tensor_bytes`: a tensor's bytes, zero-copy when it
  can be;
* :func:`destination`: where a read tensor's bytes go (the caller's own tensor, when it
  fits);
* :func:`read_tensors`: the tensors of a data section read in order from any stream.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import io
import json
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format.dtypes import DTYPES, HeaderEntry, dtype_name
from ckptkit.storage import codec, digest, files
from ckptkit.storage.tensors_direct import DirectSink, use_direct_io
from ckptkit.storage.transfer import readinto_exact

if TYPE_CHECKING:
    from ckptkit.format.manifest import FileEntry

MAX_HEADER = 100 << 20
"""Largest safetensors header accepted (the safetensors library uses the same bound)."""

OnBytes = Callable[[int], None]


@dataclass(frozen=True)
class Written:
    """What :func:`write_file` wrote: sizes, digest and the header it produced."""

    size: int
    digest: str
    raw_size: int
    header: dict[str, HeaderEntry]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Return a zero-copy byte view of a CPU contiguous tensor (any dtype, any rank)."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


def host_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` detached, on the CPU and contiguous (``t`` itself when it already is):
    the tensor whose bytes :func:`tensor_bytes` can view without a copy."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    return t


def build_header(
    items: Sequence[tuple[str, torch.Tensor]], metadata: dict[str, str] | None
) -> tuple[bytes, dict[str, HeaderEntry]]:
    """Return the encoded safetensors header (length prefix included) and its entries."""
    hdr: dict[str, Any] = {}
    entries: dict[str, HeaderEntry] = {}
    if metadata:
        hdr["__metadata__"] = metadata
    off = 0
    for key, t in items:
        n = t.numel() * t.element_size()
        e = HeaderEntry(dtype_name(t.dtype, key=key), tuple(t.shape), (off, off + n))
        entries[key] = e
        hdr[key] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": list(e.offsets)}
        off += n
    raw = json.dumps(hdr, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8-byte alignment
    return struct.pack("<Q", len(raw)) + raw, entries


def stream_file(
    head: bytes,
    items: Sequence[tuple[str, torch.Tensor]],
    hasher: digest.PipelinedHasher,
    write: Callable[[memoryview], object],
    on_bytes: OnBytes | None,
) -> int:
    """Hash and write the header then every tensor's bytes, in chunks; return the size.

    Args:
        head: the encoded header (:func:`build_header`).
        items: the tensors, in the header's order.
        hasher: receives every byte written, in order.
        write: where the bytes go (a file descriptor's writer, an upload).
        on_bytes: progress, called with each chunk's size.
    """
    hasher.update(head)
    write(memoryview(head))
    size = len(head)
    for _, t in items:
        host = host_contiguous(t)
        mv = tensor_bytes(host)
        for i in range(0, len(mv), digest.CHUNK):
            chunk = mv[i : i + digest.CHUNK]
            hasher.update(chunk)
            write(chunk)
            if on_bytes:
                on_bytes(len(chunk))
        size += len(mv)
        # host may be a temporary copy: the hash must finish before it is freed.
        hasher.barrier()
    return size


def compress_file(
    head: bytes,
    items: Sequence[tuple[str, torch.Tensor]],
    sink: Any,
    raw_size: int,
    on_bytes: OnBytes | None,
) -> None:
    """zstd-compress the header then every tensor's bytes into ``sink``, in chunks.

    Args:
        head: the encoded header (:func:`build_header`).
        items: the tensors, in the header's order.
        sink: a writable (``write(data) -> int``) that hashes, stores and counts what it is
            given: the compressed bytes.
        raw_size: the uncompressed size, recorded in the zstd frame.
        on_bytes: progress, called with each uncompressed chunk's size.
    """
    with codec.compressor().stream_writer(sink, size=raw_size, closefd=False) as zw:
        zw.write(head)
        for _, t in items:
            mv = tensor_bytes(host_contiguous(t))
            for i in range(0, len(mv), digest.CHUNK):
                zw.write(mv[i : i + digest.CHUNK])
                if on_bytes:
                    on_bytes(min(digest.CHUNK, len(mv) - i))


class _FdSink:
    """A write target that hashes and writes every byte, for zstd's stream writer."""

    def __init__(self, fd: int, hasher: digest.PipelinedHasher) -> None:
        self.fd = fd
        self.hasher = hasher
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        mv = memoryview(data).cast("B")
        self.hasher.update(bytes(mv) if len(mv) >= (1 << 20) else mv)
        _write_all(self.fd, mv)
        self.size += len(mv)
        return len(mv)


def _write_all(fd: int, mv: memoryview) -> None:
    while len(mv):
        n = os.write(fd, mv)
        mv = mv[n:]


def write_file(
    path: Path,
    items: Sequence[tuple[str, torch.Tensor]],
    *,
    compress: codec.Compression | None = None,
    metadata: dict[str, str] | None = None,
    on_bytes: OnBytes | None = None,
    fsync: bool = True,
) -> Written:
    """Write ``items`` to a new safetensors file at ``path``, hashing as it writes.

    The file must not exist (it lives in a fresh temporary directory). Tensors on an
    accelerator are copied to the host one at a time; non-contiguous ones are made
    contiguous one at a time; others are written straight from their memory.

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.safetensors"
        >>> w = write_file(p, [("x", torch.arange(4))])
        >>> w.size == p.stat().st_size
        True
    """
    head, entries = build_header(items, metadata)
    raw_size = len(head) + sum(e.offsets[1] - e.offsets[0] for e in entries.values())
    if compress is None and use_direct_io(raw_size):
        try:
            return _write_direct(path, head, items, entries, raw_size, on_bytes, fsync)
        except OSError as e:
            # Filesystems without O_DIRECT (tmpfs, some network FS) say EINVAL: write
            # through the page cache instead.
            if e.errno != errno.EINVAL:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with digest.PipelinedHasher() as hasher:
            if compress is None:
                size = stream_file(head, items, hasher, lambda c: _write_all(fd, c), on_bytes)
            else:
                sink = _FdSink(fd, hasher)
                compress_file(head, items, sink, raw_size, on_bytes)
                size = sink.size
            hexd = hasher.hexdigest()
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return Written(size=size, digest=hexd, raw_size=raw_size, header=entries)


def _write_direct(
    path: Path,
    head: bytes,
    items: Sequence[tuple[str, torch.Tensor]],
    entries: dict[str, HeaderEntry],
    raw_size: int,
    on_bytes: OnBytes | None,
    fsync: bool,
) -> Written:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    sink = DirectSink(fd)
    try:
        with digest.PipelinedHasher() as hasher:
            stream_file(head, items, hasher, sink.write, on_bytes)
            sink.finish()
            hexd = hasher.hexdigest()
        if fsync:
            os.fsync(fd)
    finally:
        sink.close()
        os.close(fd)
    return Written(size=sink.size, digest=hexd, raw_size=raw_size, header=entries)


class HashingReader(io.RawIOBase):
    """Wrap a raw file: every byte read is hashed (used under the zstd reader)."""

    def __init__(self, f: BinaryIO, hasher: digest.PipelinedHasher) -> None:
        super().__init__()
        self.f = f
        self.hasher = hasher
        self.nread = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self.f.readinto(b)  # type: ignore[attr-defined]
        if n:
            self.hasher.update(bytes(memoryview(b)[:n]))
            self.nread += n
        return n or 0


def parse_header(raw: bytes, *, path: str, data_len: int | None) -> dict[str, HeaderEntry]:
    """Parse and validate a safetensors header (JSON part, no length prefix).

    Raises:
        IntegrityError: ``CK-F004`` when the header is not valid safetensors, or the
            offsets overlap, leave gaps, or run past the data section.
    """

    def bad(why: str) -> CkptkitError:
        return codes.error(codes.F004, f"safetensors header is invalid: {why}", path=path)

    try:
        hdr = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"not UTF-8 JSON ({e.__class__.__name__})") from None
    if not isinstance(hdr, dict):
        raise bad("not a JSON object")
    out: dict[str, HeaderEntry] = {}
    spans: list[tuple[int, int]] = []
    for key, v in hdr.items():
        if key == "__metadata__":
            continue
        if not isinstance(v, dict):
            raise bad(f"entry {key!r} is not an object")
        dt, shape, offs = v.get("dtype"), v.get("shape"), v.get("data_offsets")
        if dt not in DTYPES:
            raise bad(f"entry {key!r} has unknown dtype {dt!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise bad(f"entry {key!r} has an invalid shape {shape!r}")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) and o >= 0 for o in offs)
            and offs[0] <= offs[1]
        ):
            raise bad(f"entry {key!r} has invalid data_offsets {offs!r}")
        numel = 1
        for d in shape:
            numel *= d
        if numel * torch.empty((), dtype=DTYPES[dt]).element_size() != offs[1] - offs[0]:
            raise bad(f"entry {key!r}: shape {shape} x {dt} does not fill offsets {offs}")
        out[key] = HeaderEntry(dt, tuple(shape), (offs[0], offs[1]))
        spans.append((offs[0], offs[1]))
    spans.sort()
    pos = 0
    for start, end in spans:
        if start != pos:
            raise bad(f"tensor data is not contiguous at byte {pos} (next tensor starts at {start})")
        pos = end
    if data_len is not None and pos != data_len:
        raise bad(f"tensors cover {pos} bytes but the data section holds {data_len}")
    return out


def read_header_from(f: BinaryIO, *, path: str, file_size: int | None) -> tuple[int, bytes]:
    """Read the 8-byte length and the header bytes; return ``(header length, bytes)``."""
    pre = _read_exact(f, 8)
    if len(pre) < 8:
        raise codes.error(
            codes.F004,
            "file is shorter than a safetensors header (truncated)",
            path=path,
        )
    (n,) = struct.unpack("<Q", pre)
    limit = MAX_HEADER if file_size is None else min(MAX_HEADER, max(file_size - 8, 0))
    if n > limit:
        raise codes.error(
            codes.F004,
            f"safetensors header length {n} is absurd (file holds at most {limit})",
            path=path,
        )
    raw = _read_exact(f, n)
    if len(raw) < n:
        raise codes.error(
            codes.F004,
            "file ends inside the safetensors header (truncated)",
            path=path,
        )
    return n, raw


def _read_exact(f: Any, n: int) -> bytes:
    buf = bytearray(n)
    got = readinto_exact(f, memoryview(buf))
    return bytes(buf[:got])


@dataclass(frozen=True)
class Expected:
    """What the manifest says about one file, to check against while reading."""

    rel: str
    size: int
    digest: str
    compression: codec.Compression | None = None
    raw_size: int | None = None

    @classmethod
    def of(cls, entry: FileEntry, rel: str | None = None) -> Expected:
        """What the manifest's file ``entry`` says, named ``rel`` in messages (default: its
        path in the checkpoint)."""
        return cls(
            rel=entry.path if rel is None else rel,
            size=entry.size,
            digest=entry.xxh3_128,
            compression=entry.compression,  # type: ignore[arg-type]
            raw_size=entry.raw_size,
        )

    def check_size(self, size: int) -> None:
        """Refuse a file whose size is not the one the manifest records.

        Raises:
            IntegrityError: ``CK-F002``, saying whether it was truncated or grew.

        Example:
            >>> Expected("a.safetensors", 10, "0" * 32).check_size(8)
            Traceback (most recent call last):
            ...
            ckptkit.errors.IntegrityError: CK-F002 a.safetensors: size is 8 bytes, the manifest records 10 (truncated)...
        """
        if size != self.size:
            raise codes.error(
                codes.F002,
                f"size is {size} bytes, the manifest records {self.size} "
                f"({'truncated' if size < self.size else 'grown'})",
                path=self.rel,
            )

    def check_digest(self, hexd: str) -> None:
        """Refuse bytes whose xxh3-128 ``hexd`` is not the digest the manifest records.

        Raises:
            IntegrityError: ``CK-F003``.
        """
        if hexd != self.digest:
            raise codes.error(
                codes.F003,
                f"digest mismatch (expected {self.digest[:12]}…, got {hexd[:12]}…)",
                path=self.rel,
            )


def read_file(
    path: Path,
    expected: Expected,
    wanted: dict[str, HeaderEntry],
    *,
    targets: dict[str, torch.Tensor] | None = None,
    on_bytes: OnBytes | None = None,
) -> dict[str, torch.Tensor]:
    """Read every tensor of one file, verifying size, header and digest as it streams.

    ``wanted`` is what the manifest records for the file's tensors: the header must
    agree with it exactly. A tensor whose key is in ``targets`` with the same dtype
    and shape (CPU, contiguous) is read straight into that tensor's memory.

    Raises:
        IncompleteCheckpointError: ``CK-F001``, the file is missing.
        UnsafeInputError: ``CK-F022`` a FIFO, directory or device (never opened); ``CK-F009``
            a symlink.
        IntegrityError: ``CK-F002`` wrong size, ``CK-F004`` bad header, ``CK-F005``
            header disagrees with the manifest, ``CK-F003`` digest mismatch.
        UnsafeInputError: ``CK-F008`` a compressed file expands past its declared size.

    If a digest fails, tensors in ``targets`` hold bytes of the damaged file: the
    caller must not use them (the manager restores another checkpoint into them).
    """
    rel = expected.rel
    try:
        # Regular files only: a FIFO here would block the read forever, a directory raise
        # IsADirectoryError (CK-F022; a symlink is CK-F009).
        f = files.open_regular(path, code=codes.F022, rel=rel, symlink_code=codes.F009)
    except (FileNotFoundError, NotADirectoryError):
        raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel) from None
    except OSError as e:
        raise codes.read_error(e, path=rel) from None
    try:
        size = os.fstat(f.fileno()).st_size
        expected.check_size(size)
        if expected.compression is None:
            # The header is parsed from a plain read, then the whole file (header again
            # included) streams through the one read pipeline, which hashes every byte
            # and checks that the header it hashed is the one parsed here.
            n, raw = read_header_from(f, path=rel, file_size=size)
            header = parse_header(raw, path=rel, data_len=size - 8 - n)
            check_header(header, wanted, rel)
            head = struct.pack("<Q", n) + raw
            sec = _Section(f.fileno(), head, header, rel, targets or {}, on_bytes)
            if in_place(header, sec.targets):
                out, hexd = _read_plain(sec, size)
            else:
                # Fresh tensors: the kernel copies straight into them (their first-touch
                # faults inside the read); a bounce buffer plus a copy measured slower.
                with digest.PipelinedHasher() as hasher:
                    hasher.update(head)  # the very bytes parsed above
                    out = _pread_tensors(sec, hasher)
                    hexd = hasher.hexdigest()
        else:
            with digest.PipelinedHasher() as hasher:
                hr = HashingReader(f, hasher)  # type: ignore[arg-type]
                buffered = io.BufferedReader(hr, buffer_size=digest.CHUNK)
                src = codec.LimitedReader(
                    buffered,  # type: ignore[arg-type]
                    limit=expected.raw_size if expected.raw_size is not None else size,
                    path=rel,
                )
                data_limit = expected.raw_size
                n, raw = read_header_from(src, path=rel, file_size=data_limit)  # type: ignore[arg-type]
                data_len = None if data_limit is None else data_limit - 8 - n
                header = parse_header(raw, path=rel, data_len=data_len)
                check_header(header, wanted, rel)
                out = read_tensors(src, header, rel, targets or {}, on_bytes)
                src.check_exhausted()
                while buffered.read(digest.CHUNK):  # trailing bytes count in the digest
                    pass
                hexd = hasher.hexdigest()
        expected.check_digest(hexd)
        return out
    except CkptkitError:
        raise
    except OSError as e:  # a read failed half-way: damage or not, the classifier says
        raise codes.read_error(e, path=rel) from None
    finally:
        f.close()


def check_header(header: dict[str, HeaderEntry], wanted: dict[str, HeaderEntry], rel: str) -> None:
    """Check that a file's header holds exactly the tensors the manifest lists, as listed.

    Raises:
        CkptkitError: ``CK-F005`` a tensor missing, different, or not listed.
    """
    for key, want in wanted.items():
        got = header.get(key)
        if got != want:
            what = "is missing from the file header" if got is None else (
                f"is {got.dtype}{list(got.shape)} at {list(got.offsets)} in the file header but "
                f"{want.dtype}{list(want.shape)} at {list(want.offsets)} in the manifest"
            )
            raise codes.error(codes.F005, f"tensor '{key}' {what}", path=rel)
    extra = sorted(set(header) - set(wanted))
    if extra:
        raise codes.error(
            codes.F005,
            f"file header holds tensors the manifest does not list: {extra[:5]}",
            path=rel,
        )


def destination(
    key: str, e: HeaderEntry, targets: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(tensor to return, tensor whose memory receives the bytes)``.

    The caller's own tensor in ``targets`` receives them in place when it has the saved
    dtype and shape and is a contiguous CPU tensor; otherwise a new tensor does (and the
    caller copies it where it belongs).
    """
    tgt = targets.get(key)
    if tgt is not None and receives(tgt, e):
        return tgt, tgt.detach()
    t = torch.empty(e.shape, dtype=DTYPES[e.dtype])
    return t, t


def receives(tgt: torch.Tensor, e: HeaderEntry) -> bool:
    """Whether the bytes of ``e`` can be read straight into ``tgt``: the saved dtype and
    shape, a contiguous CPU tensor."""
    return (
        tgt.dtype == DTYPES[e.dtype]
        and tuple(tgt.shape) == e.shape
        and tgt.device.type == "cpu"
        and tgt.is_contiguous()
    )


READ_WORKERS = 2
"""Concurrent positional reads per file: overlaps page faults of fresh memory with I/O."""


def in_place(header: dict[str, HeaderEntry], targets: dict[str, torch.Tensor]) -> bool:
    """Whether every non-empty tensor of ``header`` lands in the caller's own tensor
    (a restore into a live state), so :func:`_read_plain` can read the file in whole
    ``O_DIRECT`` chunks and copy them into memory that is already there."""
    for key, e in header.items():
        if e.offsets[1] == e.offsets[0]:
            continue
        tgt = targets.get(key)
        if tgt is None or not receives(tgt, e):
            return False
    return True


@dataclass(frozen=True)
class _Section:
    """An uncompressed file's data section, its header parsed: what its two readers take."""

    fd: int
    head: bytes
    """The length prefix and the header, the very bytes parsed (the section starts after)."""
    header: dict[str, HeaderEntry]
    rel: str
    targets: dict[str, torch.Tensor]
    on_bytes: OnBytes | None


def _pread_tensors(sec: _Section, hasher: digest.PipelinedHasher) -> dict[str, torch.Tensor]:
    """Read an uncompressed data section with parallel ``preadv`` into the destinations.

    Reads run on :data:`READ_WORKERS` threads (the first touch of fresh memory is the
    bottleneck on a VM, and it parallelises); chunks are hashed in file order as they
    complete, so the digest is the same streaming xxh3 as a sequential read.
    """
    out: dict[str, torch.Tensor] = {}
    segs: list[tuple[int, memoryview, str]] = []
    base = len(sec.head)
    for key, e in sorted(sec.header.items(), key=lambda kv: kv[1].offsets[0]):
        ret, dest = destination(key, e, sec.targets)
        out[key] = ret
        mv = tensor_bytes(dest)
        for i in range(0, len(mv), digest.CHUNK):
            segs.append((base + e.offsets[0] + i, mv[i : i + digest.CHUNK], key))

    def pread_into(off: int, mv: memoryview, key: str) -> None:
        got = 0
        while got < len(mv):
            k = os.preadv(sec.fd, [mv[got:]], off + got)
            if k == 0:
                raise codes.error(
                    codes.F002,
                    f"file ends inside tensor '{key}' (truncated)",
                    path=sec.rel,
                )
            got += k

    if not segs:
        return out
    with ThreadPoolExecutor(min(READ_WORKERS, len(segs)), thread_name_prefix="ckptkit-pread") as pool:
        futs = [pool.submit(pread_into, off, mv, key) for off, mv, key in segs]
        try:
            for (_, mv, _), fut in zip(segs, futs, strict=True):
                fut.result()
                hasher.update(mv)
                if sec.on_bytes:
                    sec.on_bytes(len(mv))
        except BaseException:
            for fut in futs:
                fut.cancel()
            raise
    return out


def _read_plain(sec: _Section, size: int) -> tuple[dict[str, torch.Tensor], str]:
    """Read an uncompressed file into its tensors through :func:`digest.hash_fd`.

    The file is read in whole chunks (``O_DIRECT`` for large files, like the writes); each
    reader thread copies its chunk's bytes into the destination tensors as soon as it
    lands (numpy copies release the GIL, so several run at once and the first touch of
    fresh tensor memory is paid in parallel), and the digest is computed over the same
    chunks in file order. ``sec.head`` (the length prefix and header already parsed) must be
    what the digest pass read at the start of the file, or the parse was of other bytes.

    Returns ``(tensors by key, digest of every byte read)``.

    Raises:
        CkptkitError: ``CK-F002`` the file ends early (it shrank while being read),
            ``CK-F003`` its header changed between the parse and the digest pass.
    """
    out: dict[str, torch.Tensor] = {}
    starts: list[int] = []
    dests: list[tuple[int, int, Any]] = []
    base = len(sec.head)
    for key, e in sorted(sec.header.items(), key=lambda kv: kv[1].offsets[0]):
        ret, dest = destination(key, e, sec.targets)
        out[key] = ret
        if e.offsets[1] > e.offsets[0]:
            starts.append(base + e.offsets[0])
            dests.append((base + e.offsets[0], base + e.offsets[1], _np_bytes(dest)))

    def scatter(off: int, chunk: memoryview) -> None:
        src = np.frombuffer(chunk, dtype=np.uint8)
        end = off + len(chunk)
        i = max(0, bisect.bisect_right(starts, off) - 1)
        while i < len(dests) and dests[i][0] < end:
            lo, hi, dst = dests[i]
            a, b = max(lo, off), min(hi, end)
            if a < b:
                dst[a - lo : b - lo] = src[a - off : b - off]
            i += 1

    def same_head(off: int, chunk: memoryview) -> None:
        if off < base and chunk[: base - off] != sec.head[off : off + len(chunk)]:
            raise codes.error(
                codes.F003, "the file changed while being read (its header differs)", path=sec.rel
            )
        if sec.on_bytes:
            sec.on_bytes(len(chunk))

    hexd, got = digest.hash_fd(
        sec.fd, on_chunk=same_head, scatter=scatter, direct=use_direct_io(size)
    )
    if got < size:
        raise codes.error(
            codes.F002, f"file ends at byte {got} of {size} while being read (truncated)", path=sec.rel
        )
    return out, hexd


def _np_bytes(t: torch.Tensor) -> Any:
    """A writable uint8 numpy view of a CPU contiguous tensor's bytes."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def read_tensors(
    src: Any,
    header: dict[str, HeaderEntry],
    rel: str,
    targets: dict[str, torch.Tensor],
    on_bytes: OnBytes | None,
) -> dict[str, torch.Tensor]:
    """Read the tensors of a data section in file order from the stream ``src``.

    For a decompressed file, or one fetched as a stream; ``src`` is positioned at the
    start of the data section, and hashing (if any) is the stream's business.

    Raises:
        CkptkitError: ``CK-F002`` the stream ends inside a tensor.
    """
    out: dict[str, torch.Tensor] = {}
    for key, e in sorted(header.items(), key=lambda kv: kv[1].offsets[0]):
        ret, dest = destination(key, e, targets)
        mv = tensor_bytes(dest)
        for i in range(0, len(mv), digest.CHUNK):
            chunk = mv[i : i + digest.CHUNK]
            got = readinto_exact(src, chunk)
            if got < len(chunk):
                raise codes.error(
                    codes.F002,
                    f"file ends inside tensor '{key}' (truncated)",
                    path=rel,
                )
            if on_bytes:
                on_bytes(got)
        out[key] = ret
    return out
