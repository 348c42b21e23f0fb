"""Verify and describe foreign checkpoints with the same checks as native ones.

:func:`verify_foreign` reads the checkpoint with its format's reader
(:mod:`ckptkit.verify.foreign.read`), then runs the *registered* checks
(:mod:`ckptkit.verify.checks`) over the reader's state view and file scans: completeness,
NaN/Inf, optimizer moments, counters and the "file inside the checkpoint" rule report the
same codes with the same words as for a native checkpoint. Only what is about the foreign
container itself (a zip CRC, a pickle needing code, a missing DCP shard, content not
recognised) comes from the reader. When ``ckptkit adopt`` wrote a manifest beside the
checkpoint, every file is checked against its digests (drift and corruption); otherwise
``CK-F107`` says that silent corruption cannot be detected.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptkit import codes
from ckptkit.checkpoint import safeload
from ckptkit.verify import checks as _checks  # noqa: F401  (registers every check)
from ckptkit.verify.checks.consistency import guard_findings
from ckptkit.verify.findings import ordered, run_checks
from ckptkit.verify.foreign.adopted import adopted_path, read_adopted, recorded_files
from ckptkit.verify.foreign.read import scan
from ckptkit.verify.foreign.scan import Scan
from ckptkit.verify.reader import ReaderContext
from ckptkit.verify.report import Report
from ckptkit.verify.view import EXPECTS, Expect

DEFAULT_FAMILIES = ("integrity", "completeness", "consistency")


@dataclass
class ForeignReport(Report):
    """A verify report for a foreign checkpoint (``format`` names the tool)."""

    detected_step: int | None = None
    """Global step read from the foreign files (``trainer_state.json``, ``global_step`` ...)."""
    scan: Scan | None = field(default=None, repr=False, compare=False)
    """What the reader found (files, container findings), for ``adopt``."""

    @property
    def step(self) -> int | None:
        return self.detected_step


def verify_foreign(
    path: Path | str,
    fmt: str | None = None,
    *,
    strict: bool = False,
    expect: Expect | None = None,
    families: Iterable[str] = DEFAULT_FAMILIES,
    key: bytes | None = None,
) -> ForeignReport:
    """Verify a foreign checkpoint: integrity, completeness, consistency, drift since adopt.

    Args:
        path: a Trainer/Accelerate/DCP directory, a Lightning/torch.save/safetensors file.
        fmt: a :data:`~ckptkit.checkpoint.detect.FORMATS` name; detected when None.
        strict: count warnings as failures.
        expect: ``"weights"`` (only the model is required) or ``"training"`` (a resume
            point: model, optimizer, progress ...); inferred from the content when None
            (weights when it holds model tensors and nothing of a training run).
        families: the check families to run.
        key: an HMAC key: the adopted manifest must be signed with it (``CK-M010``
            unsigned, ``CK-M011`` another key), as a native manifest must.

    Returns:
        A :class:`ForeignReport` (``.ok``, ``.findings``, ``.components``, ``.found``).

    Raises:
        CkptkitError: the layout is not recognised (message lists the formats).

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ck.pt"
        >>> torch.save({"model": {"w": torch.ones(2)}}, p)
        >>> r = verify_foreign(p); r.format, r.components["model"].present, r.expect, r.ok
        ('torch-save', True, 'weights', True)
    """
    if expect is not None and expect not in EXPECTS:
        raise ValueError(f"expect must be one of {EXPECTS}, not {expect!r}")
    t0 = time.perf_counter()
    s = scan(path, fmt, adopted=True, key=key)
    adopted, adopted_man = s.adopted_record, s.adopted
    recorded = recorded_files(s, adopted) if adopted is not None else None
    if adopted is None and not s.opaque:  # opaque: nothing was checked, say only why
        s.add(
            codes.F107,
            "no digests: the files carry no checksums "
            "(safetensors none at all, torch zip archives only CRC-32), so a flipped bit, "
            "e.g. a low-order bit of a weight, cannot be detected; this verify checked "
            "structure only",
        )
    source = "given" if expect is not None else "inferred"
    if expect is None and adopted and adopted.get("expect") in EXPECTS:
        expect, source = adopted["expect"], "given"
    state = s.finish(expect)
    unread_now = any(f.code == codes.UNREADABLE for f in s.findings)
    if s.opaque or unread_now:
        # What it holds is unknown (a pickle needing code, or a file that cannot be read
        # now: a permission, EIO): no component can be called missing, and "missing" would
        # turn a checkpoint that is only unreadable now into a corrupt one.
        families = [f for f in families if f != "completeness"]
    ctx = ReaderContext(root=s.target, manifest=None, state=state, files=s.file_scans(recorded))
    # The adopted manifest's look-ahead (a DCP save's, an integration's), by the native rule.
    families = list(families)
    guarded: list[Any] = []
    if adopted_man is not None and "consistency" in families:
        guarded = guard_findings(adopted_man)
    findings = ordered([*s.findings, *run_checks(ctx, families), *guarded])
    scans = ctx.files.values()
    return ForeignReport(
        path=s.target,
        findings=findings,
        components=dict(state.components()),
        strict=strict,
        files_checked=len(s.files),
        bytes_checked=sum(f.size or 0 for f in scans if not f.outside),
        seconds=time.perf_counter() - t0,
        format=s.format,
        found=dict(state.found()),
        expect=state.expect,
        expect_source=source if state.expect is not None else None,
        expect_why=state.expect_why if source == "inferred" else "",
        detected_step=s.step,
        scan=s,
    )


def describe_foreign(path: Path | str, fmt: str | None = None) -> dict[str, Any]:
    """Describe a foreign checkpoint for ``ckptkit inspect`` (no tensor values are read).

    Returns the same keys as :func:`ckptkit.verify.describe.describe`; ``files`` carry the adopted
    digest when ``ckptkit adopt`` recorded one, else an empty string; each present
    component says where it was found and how surely (``how``: found / inferred).
    """
    s = scan(path, fmt, scan_values=False)
    adopted = read_adopted(s)
    state = s.finish((adopted or {}).get("expect") if adopted else None)
    digests = {f["path"]: f["xxh3_128"] for f in (adopted or {}).get("files", [])}
    files = [
        {"path": f, "size": _size(s.path(f)), "xxh3_128": digests.get(f, "")} for f in s.files
    ]
    tensors = []
    for f in s.files:
        if f.endswith(".safetensors") and s.readable(f):
            hdr, _ = safeload.check_safetensors(s.path(f), f)
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
    mtime = max((_mtime(s.path(f)) for f in s.files), default=0.0)
    comps = {}
    for n, c in state.components().items():
        d = c.to_dict()
        where = state.found().get(n)
        if where is not None and c.present:
            d["how"] = where.how
            d["found"] = where.describe()
        comps[n] = d
    return {
        "path": str(path),
        "format": s.format,
        "step": s.step,
        "created_at": _dt.datetime.fromtimestamp(mtime, _dt.UTC).isoformat(timespec="seconds"),
        "ckptkit_version": None,
        "schema_version": None,
        "total_bytes": sum(f["size"] for f in files),
        "expect": {"as": state.expect, "why": state.expect_why},
        "components": comps,
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
        return p.lstat().st_size
    except OSError:
        return 0


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return 0.0


__all__ = ["ForeignReport", "describe_foreign", "verify_foreign"]
