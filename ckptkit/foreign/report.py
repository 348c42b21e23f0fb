"""Verify and describe foreign checkpoints, returning what the native verify returns.

:func:`verify_foreign` produces a :class:`ForeignReport` (a
:class:`ckptkit.verify.runner.Report` with ``format`` set and the step read from the
foreign files), with the same spec §1 component table and finding codes as native
checkpoints. When ``ckptkit adopt`` wrote a manifest beside the checkpoint, every file is
checked against its digests (drift and corruption); otherwise ``CK-F107`` says that
silent corruption cannot be detected.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptkit.foreign import _load
from ckptkit.foreign.adopt import adopted_path, check_adopted, read_adopted
from ckptkit.foreign.read import scan
from ckptkit.verify.findings import CODES, Severity
from ckptkit.verify.report import Report

_SEV = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass
class ForeignReport(Report):
    """A verify report for a foreign checkpoint (``format`` names the tool)."""

    detected_step: int | None = None
    """Global step read from the foreign files (``trainer_state.json``, ``global_step`` ...)."""

    @property
    def step(self) -> int | None:
        return self.detected_step


def verify_foreign(
    path: Path | str, fmt: str | None = None, *, strict: bool = False
) -> ForeignReport:
    """Verify a foreign checkpoint: integrity, completeness, NaN/Inf, drift since adopt.

    Args:
        path: a Trainer/Accelerate/DCP directory or a Lightning/torch.save file.
        fmt: a :data:`~ckptkit.foreign.detect.FORMATS` name; detected when None.
        strict: count warnings as failures.

    Returns:
        A :class:`ForeignReport` (``.ok``, ``.findings``, ``.components``).

    Raises:
        CkptkitError: the layout is not recognised (message lists the formats).

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ck.pt"
        >>> torch.save({"model": {"w": torch.ones(2)}, "optimizer": {"state": {}}}, p)
        >>> r = verify_foreign(p); r.format, r.components["model"].present
        ('torch-save', True)
    """
    t0 = time.perf_counter()
    s = scan(path, fmt)
    drift = check_adopted(s)
    if drift is None:
        s.add(
            "CK-F107",
            "no digests: the files carry no checksums "
            "(safetensors none at all, torch zip archives only CRC-32), so a flipped bit, "
            "e.g. a low-order bit of a weight, cannot be detected; this verify checked "
            "structure only",
        )
    order = {code: i for i, code in enumerate(CODES)}
    s.findings.sort(key=lambda f: (_SEV[f.severity], order.get(f.code, 0)))
    sizes = [_size(s.path(f)) for f in s.files]
    return ForeignReport(
        path=s.target,
        findings=s.findings,
        components=s.components,
        strict=strict,
        files_checked=len(s.files),
        bytes_checked=sum(sizes),
        seconds=time.perf_counter() - t0,
        format=s.format,
        detected_step=s.step,
    )


def describe_foreign(path: Path | str, fmt: str | None = None) -> dict[str, Any]:
    """Describe a foreign checkpoint for ``ckptkit inspect`` (no tensor values are read).

    Returns the same keys as :func:`ckptkit.describe.describe`; ``files`` carry the adopted
    digest when ``ckptkit adopt`` recorded one, else an empty string.
    """
    s = scan(path, fmt, scan_values=False)
    adopted = read_adopted(s)
    digests = {f["path"]: f["xxh3_128"] for f in (adopted or {}).get("files", [])}
    files = [{"path": f, "size": _size(s.path(f)), "xxh3_128": digests.get(f, "")} for f in s.files]
    tensors = []
    for f in s.files:
        if f.endswith(".safetensors"):
            hdr, _ = _load.check_safetensors(s.path(f), f)
            for key, h in (hdr or {}).items():
                tensors.append(
                    {
                        "key": key,
                        "file": f,
                        "dtype": h.dtype,
                        "shape": list(h.shape),
                        "offsets": list(h.offsets),
                        "nbytes": h.offsets[1] - h.offsets[0],
                    }
                )
    mtime = max((s.path(f).stat().st_mtime for f in s.files), default=0.0)
    return {
        "path": str(path),
        "format": s.format,
        "step": s.step,
        "created_at": _dt.datetime.fromtimestamp(mtime, _dt.UTC).isoformat(timespec="seconds"),
        "ckptkit_version": None,
        "schema_version": None,
        "total_bytes": sum(f["size"] for f in files),
        "components": {n: c.to_dict() for n, c in s.components.items()},
        "files": files,
        "tensors": tensors,
        "env": {},
        "pins": [],
        "health": None,
        "adopted": adopted_path(s.target).name if adopted else None,
        "findings": [f.to_dict() for f in s.findings],
    }


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
