"""What a check sees: the checkpoint path, its manifest (or why it has none) and file scans."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckptkit import codes
from ckptkit.errors import CkptkitError, UnsafeInputError
from ckptkit.format import manifest as mf
from ckptkit.format.dtypes import HeaderEntry
from ckptkit.storage import files, fs, remote, tensors, tensors_scan, transfer
from ckptkit.storage.fs import Location

SCAN_WORKERS = 2
"""Threads that scan a checkpoint's files unless told otherwise (``ckptkit verify --workers``).

Threads, not processes: the scan's work is reads and xxh3/torch reductions over 8 MiB
chunks, which release the GIL (measured in docs/performance.md, "Parallel verify")."""


@dataclass
class FileScan:
    """One listed file as found on disk."""

    entry: mf.FileEntry
    exists: bool
    outside: bool = False
    """The path resolves outside the checkpoint (a symlink): never read."""
    not_regular: str | None = None
    """What sits there instead of a regular file (``"a FIFO (named pipe)"`` ...): never opened."""
    size: int | None = None
    digest: str | None = None
    header: dict[str, HeaderEntry] | None = None
    header_error: str | None = None
    header_error_code: str | None = None
    """``CK-F004`` (bad header) or ``CK-F008`` (will not decompress), from the reader."""
    io_error: str | None = None
    """Why the file could not be read (the message of :func:`ckptkit.codes.read_error`)."""
    io_error_code: str | None = None
    """``CK-F025`` when that read failure is not evidence of damage, else ``CK-F004``."""
    finite: tensors_scan.FiniteScan | None = None
    """NaN/Inf seen in floating tensors during the digest pass (uncompressed files)."""

    def finding(self, code: str, message: str, *, hint: str | None = None) -> codes.Finding:
        """A finding of ``code`` about this file: its path, and the component it holds
        (``checkpoint`` for a file of several)."""
        return codes.CODES[code].finding(
            message, path=self.entry.path, component=self.entry.component or "checkpoint", hint=hint
        )

    @classmethod
    def unreadable(cls, fe: mf.FileEntry, exc: BaseException) -> FileScan:
        """The scan of a listed file whose read failed: damage or not, the classifier says
        (:func:`ckptkit.codes.read_error`)."""
        err = codes.read_error(exc, path=fe.path)
        return cls(fe, exists=True, io_error=err.what, io_error_code=err.code)


SwappedLink = Literal["outside", "replaced"]
"""How a symlink found when a file is opened (after the ``lstat`` saw a regular file) is
reported: outside the checkpoint (``CK-F009``) or replaced while being checked."""


def scan_local(
    root: Path,
    fe: mf.FileEntry,
    read: Callable[[Path, mf.FileEntry], FileScan],
    *,
    outside: bool = False,
    swapped_link: SwappedLink = "outside",
) -> FileScan:
    """The one scan of a listed file of a local checkpoint directory, native or foreign.

    Looks before it reads: a missing file, one that cannot be looked at, a symlink or a
    path that resolves outside ``root`` (:func:`ckptkit.storage.fs.escapes`, the rule of
    every read of a checkpoint's files), anything but a regular file, or a size that is
    not the recorded one is reported from the ``lstat`` alone and never opened. Only then
    is ``read(path, fe)`` called for the digest (and whatever else the caller reads in the
    same pass); a read that fails is the file's ``io_error``, and a file swapped for a FIFO
    or device after the look is "replaced while being checked".

    Args:
        root: the checkpoint directory (local).
        fe: the file as recorded (path relative to ``root``, size, digest).
        read: the caller's read of a regular file of the recorded size.
        outside: the caller already knows the file is a symlink or outside (a foreign
            reader's listing, :attr:`ckptkit.verify.foreign.scan.Scan.outside`).
        swapped_link: what a symlink swapped in after the look is reported as: the native
            verify says outside (``CK-F009``), the foreign readers replaced.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "ln").symlink_to("/etc/hostname")
        >>> fe = mf.FileEntry(path="ln", size=1, xxh3_128="")
        >>> scan_local(d, fe, lambda p, fe: FileScan(fe, exists=True)).outside
        True
    """
    p = root / fe.path
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return FileScan(fe, exists=False)
    except OSError as e:
        return FileScan.unreadable(fe, e)
    if outside or fs.escapes(root, fe.path):
        return FileScan(fe, exists=True, outside=True)
    what = files.kind(st.st_mode)
    if what is not None:
        return FileScan(fe, exists=True, not_regular=what)
    if st.st_size != fe.size:
        # Not read: the size alone proves the file is not the one recorded.
        return FileScan(fe, exists=True, size=st.st_size)
    try:
        return read(p, fe)
    except UnsafeInputError as e:  # swapped for a symlink or a FIFO after the lstat: never read
        if e.code not in (codes.F009, codes.F022):
            raise
        if e.code == codes.F009 and swapped_link == "outside":
            return FileScan(fe, exists=True, outside=True)
        return FileScan(fe, exists=True, not_regular="replaced while being checked")
    except OSError as e:
        return FileScan.unreadable(fe, e)


@dataclass
class CheckContext:
    """Everything checks need; file scans are computed once and shared between checks."""

    root: Location
    manifest: mf.Manifest | None
    manifest_error: CkptkitError | None = None
    signature_checked: bool = False
    """The manifest's signature was checked against a key (it had to be valid to get here)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    on_bytes: Callable[[int], None] | None = None
    workers: int = SCAN_WORKERS
    """How many files are scanned at once (threads)."""
    _scans: dict[str, FileScan] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _memo: dict[str, Any] = field(default_factory=dict)

    @property
    def has(self) -> frozenset[str]:
        """What this context holds, matched against a check's ``needs``.

        A manifest gives all three: the manifest itself, the state it records (``state``,
        read through :mod:`ckptkit.verify.view`) and the files it lists (``files``).
        """
        return frozenset({"manifest", "state", "files"} if self.manifest is not None else set())

    def rel(self, p: Location) -> str:
        base, here = str(self.root).rstrip("/") + "/", str(p)
        return here[len(base):] if here.startswith(base) else here

    def scan_all(self) -> dict[str, FileScan]:
        """Scan every listed file (size, digest, header), in parallel, once.

        The scans are kept in the manifest's file order whoever made them (this pool, or
        another rank whose scans the caller put in ``_scans``): the checks report in it.
        """
        assert self.manifest is not None
        todo = [f for f in self.manifest.files if f.path not in self._scans]
        if todo:
            for s in self.scan_files(todo):
                self._scans[s.entry.path] = s
            self._scans = {
                f.path: self._scans[f.path] for f in self.manifest.files if f.path in self._scans
            }
        return self._scans

    def scan_files(self, entries: Sequence[mf.FileEntry]) -> list[FileScan]:
        """Scan ``entries`` on :attr:`workers` threads; the scans in the order of ``entries``.

        The one per-file scan of verify: :meth:`scan_all` and a rank's share of a
        rank-parallel verify (:mod:`ckptkit.verify.ranked`) both go through it. Nothing is
        cached here.
        """
        if not entries:
            return []
        with ThreadPoolExecutor(max(1, min(self.workers, len(entries)))) as pool:
            return list(pool.map(self._scan, entries))

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per context: one analysis several checks report from."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _scan(self, fe: mf.FileEntry) -> FileScan:
        root = fs.local_path(self.root)
        if root is None:  # an object store: no lstat, no links; its own scan
            return self._scan_remote(fe, self.root / fe.path)
        return scan_local(root, fe, self._read_local)

    def _read_local(self, p: Path, fe: mf.FileEntry) -> FileScan:
        """Digest, safetensors header and NaN/Inf values of a listed file, in one read."""
        hexd, size, header, err, finite = tensors_scan.scan_file(
            p,
            compression=fe.compression,  # type: ignore[arg-type]
            raw_size=fe.raw_size,
            rel=fe.path,
            on_bytes=self.on_bytes,
            values=self.options.get("scan_values", True) is not False,
        )
        if not fe.path.endswith((".safetensors", ".safetensors.zst")):
            header, err = None, None
        return FileScan(
            fe, exists=True, size=size, digest=hexd, header=header,
            header_error=err[1] if err else None, header_error_code=err[0] if err else None,
            finite=finite,
        )

    def _scan_remote(self, fe: mf.FileEntry, p: Location) -> FileScan:
        """The same scan on an object store: size, parallel ranged digest, header, values.

        A compressed object's header is checked when it is loaded, not here (it would take
        a second download); its digest is checked like any other.
        """
        try:
            if fs.kind(p) is None:
                return FileScan(fe, exists=False)
            size = fs.size(p)
            if size != fe.size:
                return FileScan(fe, exists=True, size=size)
            header: dict[str, HeaderEntry] | None = None
            err: tuple[str, str] | None = None
            finite: tensors_scan.FiniteScan | None = None
            if fe.compression is None and fe.path.endswith(".safetensors"):
                try:
                    pre = transfer.read_ranges(p, [(0, min(8, size))])[0]
                    n = int.from_bytes(pre, "little") if len(pre) == 8 else -1
                    if n < 0 or n > min(tensors.MAX_HEADER, size - 8):
                        raise codes.error(codes.F004, "safetensors header length is absurd or "
                                          "the file is truncated", path=fe.path)
                    raw = transfer.read_ranges(p, [(8, 8 + n)])[0]
                    header = tensors.parse_header(raw, path=fe.path, data_len=size - 8 - n)
                    if self.options.get("scan_values", True) is not False:
                        finite = tensors_scan.FiniteScan(header, 8 + n)
                except CkptkitError as e:
                    err = (e.code or codes.F004, e.what)
            hexd, size = remote.hash_file(
                p, on_bytes=self.on_bytes, on_chunk=finite.feed if finite is not None else None
            )
        except Exception as e:  # s3fs lets some transport errors through unconverted
            if not isinstance(e, OSError) and not codes.transient(e):
                raise
            return FileScan.unreadable(fe, e)
        return FileScan(
            fe, exists=True, size=size, digest=hexd, header=header,
            header_error=err[1] if err else None, header_error_code=err[0] if err else None,
            finite=finite,
        )
