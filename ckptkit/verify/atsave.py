"""Consistency findings known when a checkpoint is saved, and what verify does with them.

A save can be whole and still hold an inconsistent state: NaN weights, an unusable loss
scale, a fresh optimizer at step 500 (after an intentional reset). The
:class:`~ckptkit.CheckpointManager` runs the registered consistency checks over the
manifest it is about to commit (:func:`check_before_commit`), with tensor values scanned
in memory where they are already hot, and records what they found in the manifest's
``findings`` field together with its policy, ``on_inconsistent``:

``raise`` (the default)
    the findings stay errors: the post-save verify records the checkpoint corrupt and the
    next ``save``/``wait`` raises :class:`~ckptkit.errors.CommittedError`; ``restore``
    passes over it and its notes say why.
``warn``
    the saver accepted them (an intended state): every later verify reports them as
    warnings marked "accepted at save", so the checkpoint is verified, becomes
    ``latest`` and is restored, with the findings in the restore notes and ``ls``.

:func:`reconcile` is that rule, applied by every verify (:func:`ckptkit.verify.runner.verify_one`).
It also puts back the recorded value findings (NaN/Inf) when a verify did not scan values
(a restore reads with digests only), so a restore never misses what the save saw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import torch

from ckptkit import codes
from ckptkit.codes import CODES, ERROR, WARNING, Finding, Severity
from ckptkit.format import manifest as mf
from ckptkit.storage import fs, tensors_scan
from ckptkit.verify import checks as _checks  # noqa: F401  (registers every check)
from ckptkit.verify.checks._state import SCANNED, tensor_component
from ckptkit.verify.context import CheckContext, FileScan
from ckptkit.verify.findings import CHECKS

Policy = Literal["raise", "warn"]
POLICIES: tuple[Policy, ...] = ("raise", "warn")

VALUE_CODES = (codes.S010, codes.S011)
"""The consistency checks that read tensor values (NaN/Inf): a verify that does not scan
values (``scan_values=False``) cannot find them again, so their recorded findings stand."""
MAX_RECORDED = 100
"""Findings recorded in a manifest at most (the first, most severe ones)."""
ACCEPTED = "accepted at save: on_inconsistent='warn'"
TO_ACCEPT = (
    "if this state is intended (e.g. an optimizer reset), "
    "CheckpointManager(on_inconsistent='warn') saves it as good and records the finding"
)


def check_before_commit(
    man: mf.Manifest,
    root: Any,
    tensors: Mapping[str, torch.Tensor],
    *,
    policy: Policy,
) -> mf.Manifest:
    """Run the consistency checks over a manifest about to be committed; record the findings.

    Args:
        man: the manifest built from every rank's files (not written yet).
        root: the temporary checkpoint directory holding those files.
        tensors: this rank's tensors by manifest key, as the writer wrote them (the
            staged copies of an async save): their values are scanned in memory, and a
            file is read back only to count the NaN/Inf of a tensor found non-finite.
        policy: ``on_inconsistent`` of the saver, recorded with the findings.

    Returns:
        ``man`` itself when nothing was found, else a copy whose ``findings`` field holds
        the policy and the error and warning findings.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp() + "/c"
        >>> m = ckptkit.save({"model": {"w": torch.tensor([1.0, float("nan")])}}, d)
        >>> check_before_commit(m, d, {"model/w": torch.tensor([1.0, float("nan")])},
        ...                     policy="warn").findings["items"][0]["code"]
        'CK-S010'
    """
    if policy not in POLICIES:
        raise ValueError(f"on_inconsistent must be 'raise' or 'warn', not {policy!r}")
    local = scans_in_memory(root)
    ctx = CheckContext(
        root=fs.location(root),
        manifest=man,
        options={"scan_values": local},
        _scans=_scans_from_memory(man, tensors) if local else {},
    )
    found = [
        f
        for chk in CHECKS
        if chk.family == "consistency" and chk.needs <= ctx.has
        for f in chk.run(ctx)
        if f.severity in (ERROR, WARNING)
    ]
    if not found:
        return man
    found.sort(key=lambda f: f.severity is not ERROR)
    items = [f.to_dict() for f in found[:MAX_RECORDED]]
    return replace(man, findings={"policy": policy, "items": items})


def scans_in_memory(root: Any) -> bool:
    """Return whether :func:`check_before_commit` scans tensor values for a checkpoint at ``root``.

    It does where the written files can be read back cheaply (a local directory) to count
    the NaN/Inf of a tensor found non-finite; on an object store the values are left to
    the read-back verify. The save asks this before it lets that verify check digests only.

    Example:
        >>> scans_in_memory("/tmp/run/step-00000001"), scans_in_memory("memory://b/run")
        (True, False)
    """
    return fs.reads_back_cheaply(fs.location(root))


def _scans_from_memory(man: mf.Manifest, tensors: Mapping[str, torch.Tensor]) -> dict[str, FileScan]:
    """What a digest pass over the just-written files would report, from memory.

    Each file's digest is the one its writer computed (the bytes are those tensors); the
    value scan of the model's and optimizer's floating tensors is one fused ``aminmax``
    per tensor here. A tensor found non-finite, or not in memory on this rank, is left to
    the check, which reads it from its file to count the NaN/Inf.
    """
    by_file: dict[str, list[mf.TensorEntry]] = {}
    for te in man.tensors:
        by_file.setdefault(te.file, []).append(te)
    out: dict[str, FileScan] = {}
    for fe in man.files:
        finite = tensors_scan.FiniteScan({}, 0)
        for te in by_file.get(fe.path, ()):
            if tensor_component(te.key) not in SCANNED or not te.dtype.startswith(("F", "BF", "C")):
                continue
            t = tensors.get(te.key)
            if t is None:
                finite.unchecked.add(te.key)
            elif not _finite(t):
                finite.nonfinite.add(te.key)
        out[fe.path] = FileScan(
            fe, exists=True, size=fe.size, digest=fe.xxh3_128, finite=finite
        )
    return out


def _finite(t: torch.Tensor) -> bool:
    """Whether every element is finite: one fused reduction (NaN reaches min and max)."""
    t = t.detach()
    if t.numel() == 0:
        return True
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = t.float()  # float8 and friends lack reductions; widening is exact
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


# --- what later verifies do with the record ------------------------------------------------


def policy(man: mf.Manifest) -> Policy | None:
    """The saver's ``on_inconsistent`` when the manifest records findings, else None."""
    rec = man.findings if isinstance(man.findings, Mapping) else None
    p = rec.get("policy") if rec else None
    return p if p in POLICIES else None


def recorded(man: mf.Manifest) -> list[Finding]:
    """The consistency findings recorded at save, as findings (other codes are ignored).

    Example:
        >>> m = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={},
        ...                 findings={"policy": "warn", "items": [{"code": "CK-S001",
        ...                 "severity": "error", "component": "optimizer", "message": "m",
        ...                 "hint": "h"}]})
        >>> [(f.code, str(f.severity)) for f in recorded(m)]
        [('CK-S001', 'error')]
    """
    rec = man.findings if isinstance(man.findings, Mapping) else None
    out = []
    for it in (rec or {}).get("items") or ():
        code = it.get("code") if isinstance(it, Mapping) else None
        if code not in CODES or CODES[code].family != "consistency":
            continue  # only consistency findings can be recorded (and accepted) at save
        try:
            sev = Severity(it.get("severity"))
        except ValueError:
            continue
        out.append(
            Finding(
                code=code,
                severity=sev,
                component=str(it.get("component") or CODES[code].component),
                message=str(it.get("message") or CODES[code].title),
                hint=str(it.get("hint") or CODES[code].hint),
                path=it.get("path") if isinstance(it.get("path"), str) else None,
            )
        )
    return out


def reconcile(man: mf.Manifest, findings: list[Finding], *, values_scanned: bool) -> list[Finding]:
    """Apply the saver's record to what a verify found.

    * ``warn``: an error finding of a code the save recorded is reported as a warning,
      marked "accepted at save" (a later, different finding stays an error);
    * ``raise``: such errors stay errors, and their fix says how to accept them;
    * a verify that did not scan values gets the recorded NaN/Inf findings back.

    Example:
        >>> m = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={},
        ...                 findings={"policy": "warn", "items": [{"code": "CK-S010",
        ...                 "severity": "error", "component": "model", "message": "NaN",
        ...                 "hint": "h"}]})
        >>> [(f.code, str(f.severity)) for f in reconcile(m, [], values_scanned=False)]
        [('CK-S010', 'warning')]
    """
    rec = recorded(man)
    if not rec:
        return findings
    pol = policy(man)
    codes = {f.code for f in rec}
    out = list(findings)
    if not values_scanned:
        seen = {f.code for f in out}
        out += [f for f in rec if f.code in VALUE_CODES and f.code not in seen]
    return [_as_recorded(f, pol) if f.code in codes and f.severity is ERROR else f for f in out]


def _as_recorded(f: Finding, pol: Policy | None) -> Finding:
    if pol == "warn":
        return replace(f, severity=WARNING, message=f"{f.message} ({ACCEPTED})")
    return replace(f, hint=f"{f.hint}; {TO_ACCEPT}" if TO_ACCEPT not in f.hint else f.hint)


def summary(man: mf.Manifest) -> str | None:
    """One line for ``ls``: the error findings a ``warn`` saver accepted, else None.

    Example:
        >>> m = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={},
        ...                 findings={"policy": "warn", "items": [{"code": "CK-S001",
        ...                 "severity": "error", "component": "optimizer",
        ...                 "message": "no state", "hint": "h"}]})
        >>> summary(m)
        "accepted at save (on_inconsistent='warn'): CK-S001 no state"
    """
    if policy(man) != "warn":
        return None
    errs = [f for f in recorded(man) if f.severity is ERROR]
    if not errs:
        return None
    return "accepted at save (on_inconsistent='warn'): " + "; ".join(
        f"{f.code} {f.message}" for f in errs[:3]
    ) + (f"; and {len(errs) - 3} more" if len(errs) > 3 else "")


__all__ = [
    "ACCEPTED",
    "POLICIES",
    "VALUE_CODES",
    "Policy",
    "check_before_commit",
    "policy",
    "reconcile",
    "recorded",
    "summary",
]
