"""What a check sees: the checkpoint path, its manifest (or why it has none) and file scans."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptkit import manifest as mf
from ckptkit.errors import CkptkitError
from ckptkit.storage import tensors

SCAN_WORKERS = 2


@dataclass
class FileScan:
    """One listed file as found on disk."""

    entry: mf.FileEntry
    exists: bool
    outside: bool = False
    """The path resolves outside the checkpoint (a symlink): never read."""
    size: int | None = None
    digest: str | None = None
    header: dict[str, tensors.HeaderEntry] | None = None
    header_error: str | None = None
    header_error_code: str | None = None
    """``CK-F004`` (bad header) or ``CK-F008`` (will not decompress), from the reader."""
    io_error: str | None = None
    finite: tensors.FiniteScan | None = None
    """NaN/Inf seen in floating tensors during the digest pass (uncompressed files)."""


@dataclass
class CheckContext:
    """Everything checks need; file scans are computed once and shared between checks."""

    root: Path
    manifest: mf.Manifest | None
    manifest_error: CkptkitError | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    on_bytes: Callable[[int], None] | None = None
    _scans: dict[str, FileScan] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def has(self) -> frozenset[str]:
        """What this context holds, matched against a check's ``needs``.

        A manifest gives all three: the manifest itself, the state it records (``state``,
        read through :mod:`ckptkit.verify.view`) and the files it lists (``files``).
        """
        return frozenset({"manifest", "state", "files"} if self.manifest is not None else set())

    def rel(self, p: Path) -> str:
        try:
            return p.relative_to(self.root).as_posix()
        except ValueError:
            return str(p)

    def scan_all(self) -> dict[str, FileScan]:
        """Scan every listed file (size, digest, header), in parallel, once."""
        assert self.manifest is not None
        todo = [f for f in self.manifest.files if f.path not in self._scans]
        if todo:
            with ThreadPoolExecutor(max(1, min(SCAN_WORKERS, len(todo)))) as pool:
                for s in pool.map(self._scan, todo):
                    self._scans[s.entry.path] = s
        return self._scans

    def _scan(self, fe: mf.FileEntry) -> FileScan:
        p = self.root / fe.path
        if not (p.exists() or p.is_symlink()):
            return FileScan(fe, exists=False)
        real_root = self.root.resolve()
        if p.is_symlink() or not p.resolve().is_relative_to(real_root):
            return FileScan(fe, exists=True, outside=True)
        try:
            size = os.stat(p).st_size
            if size != fe.size:
                # Not hashed: the size alone proves the file is not the one recorded.
                return FileScan(fe, exists=True, size=size)
            hexd, size, header, err, finite = tensors.scan_file(
                p,
                compression=fe.compression,  # type: ignore[arg-type]
                raw_size=fe.raw_size,
                rel=fe.path,
                on_bytes=self.on_bytes,
                values=self.options.get("scan_values", True) is not False,
            )
        except OSError as e:
            return FileScan(fe, exists=True, io_error=f"{e.strerror or e}")
        if not fe.path.endswith((".safetensors", ".safetensors.zst")):
            header, err = None, None
        return FileScan(
            fe, exists=True, size=size, digest=hexd, header=header,
            header_error=err[1] if err else None, header_error_code=err[0] if err else None,
            finite=finite,
        )
