"""Run the registered checks over one checkpoint, or every checkpoint under a run directory."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptkit import _progress
from ckptkit import manifest as mf
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.foreign.detect import detect
from ckptkit.foreign.read import resolve_format
from ckptkit.foreign.report import verify_foreign
from ckptkit.storage import atomic
from ckptkit.verify import atsave
from ckptkit.verify import checks as _checks  # noqa: F401  (registers every check)
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CHECKS, CODES, FAMILY_ORDER, Finding, Severity
from ckptkit.verify.report import Report, VerifyResult, empty_components

DEFAULT_FAMILIES = ("integrity", "completeness", "consistency")


def verify_one(
    path: Path | str,
    *,
    families: Iterable[str] = DEFAULT_FAMILIES,
    strict: bool = False,
    options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> Report:
    """Run the checks of ``families`` on one checkpoint directory and return its report."""
    root = Path(path)
    t0 = time.perf_counter()
    existed = os.path.lexists(root)
    m: mf.Manifest | None = None
    err: CkptkitError | None = None
    try:
        m = mf.read(root)
    except CkptkitError as e:
        err = e
    ctx = CheckContext(root=root, manifest=m, manifest_error=err, options=dict(options or {}))
    fams = set(families)
    findings: list[Finding] = []
    total = m.total_bytes if m is not None else 0
    with _progress.bar(f"verifying {root.name}", total, progress) as on_bytes:
        ctx.on_bytes = on_bytes
        for fam in FAMILY_ORDER:
            if fam not in fams:
                continue
            for chk in CHECKS:
                if chk.family == fam and chk.needs <= ctx.has:
                    findings.extend(chk.run(ctx))
    if m is not None and "consistency" in fams:  # what the saver found and accepted
        values = ctx.options.get("scan_values", True) is not False
        findings = atsave.reconcile(m, findings, values_scanned=values)
    gone = existed and not os.path.lexists(root)
    if gone:
        # Rotation of a live run deleted it while we read: not damage, and not a finding
        # about the bytes we saw half of.
        findings = [
            CODES["CK-F020"].finding("deleted while it was being checked (a live run rotated it)")
        ]
    comps = empty_components()
    if m is not None:
        comps.update(_proven(m, findings))
    order = {code: i for i, code in enumerate(CODES)}
    findings.sort(key=lambda f: (_SEV_ORDER[f.severity], order.get(f.code, 0)))
    return Report(
        path=root,
        findings=findings,
        components=comps,
        manifest=m,
        strict=strict,
        files_checked=len(ctx._scans),
        bytes_checked=sum(s.size or 0 for s in ctx._scans.values()),
        seconds=time.perf_counter() - t0,
        gone=gone,
    )


_DAMAGE = frozenset(
    {"CK-F001", "CK-F002", "CK-F003", "CK-F004", "CK-F005", "CK-F008", "CK-F009", "CK-F022"}
)


def _proven(m: mf.Manifest, findings: list[Finding]) -> dict[str, mf.Component]:
    """The component table as the bytes prove it: a component whose files are damaged or
    whose bytes are absent (``CK-C010``) is reported not present, whatever the table says."""
    damaged = {f.path for f in findings if f.code in _DAMAGE and f.path}
    unproven = {f.component for f in findings if f.code == "CK-C010"}
    out: dict[str, mf.Component] = {}
    for name, c in m.components.items():
        if c.present and (name in unproven or any(w in damaged for w in c.where)):
            c = replace(c, present=False)
        out[name] = c
    return out


_SEV_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def find_checkpoints(path: Path) -> list[Path]:
    """Return the checkpoint directories at ``path``: itself, or its children.

    A directory with a manifest is a checkpoint. Otherwise every child directory that
    has a manifest, or looks like an interrupted save (a leftover temporary directory,
    or a step directory without manifest), is included so that verify reports it.
    """
    if (path / atomic.MANIFEST_NAME).exists() or not path.is_dir():
        return [path]
    out = []
    for child in sorted(path.iterdir()):
        if not child.is_dir() or child.is_symlink() or atomic.is_temporary(child):
            continue
        if (child / atomic.MANIFEST_NAME).exists() or child.name.startswith("step-"):
            out.append(child)
    return out or [path]


def verify(
    path: Path | str,
    *,
    strict: bool = False,
    against_env: bool = False,
    families: Iterable[str] | None = None,
    progress: bool | None = None,
    format: str | None = None,
) -> VerifyResult:
    """Verify one checkpoint, or every checkpoint under a run directory.

    A path without ``manifest.json`` holding a foreign layout (Trainer, Accelerate,
    Lightning, DCP, torch.save; see :mod:`ckptkit.foreign`) is verified as that format,
    and so is each foreign child of a run directory (``checkpoint-N/``, ``*.ckpt``).

    Args:
        path: a checkpoint directory or a run directory holding several.
        strict: count warnings as failures.
        against_env: add the resume-compatibility family (this machine vs the save).
        families: override which check families run.
        progress: show a progress bar (default: on a terminal, for big checkpoints).
        format: a foreign format name (``ckptkit.foreign.FORMATS``) overriding detection.

    Returns:
        A :class:`VerifyResult`; ``.ok`` is False when any error finding (``strict``:
        warning) was made.

    Raises:
        IncompleteCheckpointError: ``path`` does not exist.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp() + "/ckpt"
        >>> _ = ckptkit.save({"model": {"w": torch.ones(2)}}, d)
        >>> ckptkit.verify(d).ok
        True
    """
    root = Path(path)
    if not root.exists():
        raise IncompleteCheckpointError(
            "no such file or directory", path=root, hint="check the path"
        )
    fams = list(families) if families is not None else list(DEFAULT_FAMILIES)
    if against_env and "compat" not in fams:
        fams.append("compat")
    result = VerifyResult(path=root, strict=strict)
    foreign = _foreign_targets(root, format)
    if foreign is not None:
        for p, fmt in foreign:
            with _progress.activity(f"verifying {p.name}", _progress.bytes_under(p), progress):
                result.reports.append(verify_foreign(p, fmt, strict=strict))
        return result
    for ck in find_checkpoints(root):
        result.reports.append(
            verify_one(ck, families=fams, strict=strict, progress=progress,
                       options={"against_env": against_env})
        )
    return result


def _foreign_targets(root: Path, fmt: str | None) -> list[tuple[Path, str | None]] | None:
    """Foreign checkpoints at ``root`` (itself, or its children in a run directory), or None.

    None means: verify natively (a manifest is there, or nothing foreign was found).
    """
    if fmt is not None:
        return [(root, fmt)]
    if (root / atomic.MANIFEST_NAME).exists():
        return None
    found = detect(root)
    if found is not None:
        return [(root, found)]
    if not root.is_dir():
        resolve_format(root, None)  # raises: not a recognised layout
    if find_checkpoints(root) != [root]:
        return None
    children = [(c, detect(c)) for c in sorted(root.iterdir()) if not c.is_symlink()]
    out: list[tuple[Path, str | None]] = [(c, f) for c, f in children if f is not None]
    return out or None
