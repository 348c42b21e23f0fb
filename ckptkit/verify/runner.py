"""Run the registered checks over one checkpoint, or every checkpoint under a run directory."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptkit import _progress, codes
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import native_evidence
from ckptkit.checkpoint.detect import detect
from ckptkit.checkpoint.whatis import missing
from ckptkit.collective import Collective
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.format import manifest as mf
from ckptkit.format import signing
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location
from ckptkit.verify import atsave
from ckptkit.verify import checks as _checks  # noqa: F401  (registers every check)
from ckptkit.verify.context import SCAN_WORKERS, CheckContext, FileScan
from ckptkit.verify.findings import CODES, Finding, Severity, ordered, run_checks
from ckptkit.verify.foreign.read import resolve_format
from ckptkit.verify.foreign.report import verify_foreign
from ckptkit.verify.ranked import prescan
from ckptkit.verify.report import Report, VerifyResult, empty_components
from ckptkit.verify.view import EXPECTS, Expect, apply_expect

DEFAULT_FAMILIES = ("integrity", "completeness", "consistency")


def verify_one(
    path: Location | str,
    *,
    families: Iterable[str] = DEFAULT_FAMILIES,
    strict: bool = False,
    options: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    key: bytes | None = None,
    manifest: mf.Manifest | None = None,
    committed: bool = False,
    workers: int | None = None,
    scans: Mapping[str, FileScan] | None = None,
    only: mf.RankSelect | None = None,
) -> Report:
    """Run the checks of ``families`` on one checkpoint directory and return its report.

    A checkpoint deleted while it is checked (a live run rotating it) is reported gone
    (``report.gone``, one ``CK-F020`` info), not damaged: see :func:`_deleted_meanwhile`.

    Args:
        path: the checkpoint directory.
        families: which check families run.
        strict: count warnings as failures.
        options: options the checks read (``against_env``, ``scan_values`` ...).
        progress: show a progress bar.
        key: an HMAC key (resolved, see :func:`ckptkit.format.signing.resolve_key`): the
            manifest must be signed with it (``CK-M010``/``CK-M011`` otherwise).
        manifest: the manifest of ``path`` when the caller has just read it (with the same
            ``key``): it is not read and validated a second time.
        committed: the caller listed ``path`` with its manifest (a run's listing): if the
            manifest is gone by the time it is read, rotation deleted it meanwhile.
        workers: how many files are scanned at once (threads; default
            :data:`~ckptkit.verify.context.SCAN_WORKERS`).
        scans: scans of some listed files made elsewhere (the other ranks of a
            rank-parallel verify, :mod:`ckptkit.verify.ranked`): not scanned again; the
            checks read them as they read their own.
        only: of a multi-rank checkpoint, read the manifests of these ranks only (a
            restoring rank's: :func:`ckptkit.checkpoint.manifest_io.read`); the checks
            pass over what unread manifests hold (:meth:`ckptkit.format.manifest.Manifest.elsewhere`).
    """
    root = fs.location(path)
    t0 = time.perf_counter()
    existed = fs.kind(root) is not None
    m: mf.Manifest | None = manifest
    err: CkptkitError | None = None
    if m is None:
        try:
            m = manifest_io.read(root, key=key, only=only)
        except CkptkitError as e:
            err = e
    ctx = CheckContext(
        root=root,
        manifest=m,
        manifest_error=err,
        signature_checked=key is not None,
        options=dict(options or {}),
        workers=workers if workers is not None else SCAN_WORKERS,
    )
    if scans and m is not None:
        ctx._scans = {f.path: scans[f.path] for f in m.files if f.path in scans}
    fams = set(families)
    findings: list[Finding] = []
    total = m.total_bytes if m is not None else 0
    with _progress.bar(f"verifying {root.name}", total, progress) as on_bytes:
        ctx.on_bytes = on_bytes
        try:
            findings = run_checks(ctx, fams)
        except FileNotFoundError:
            # A directory listing under a checkpoint that a live run's rotation renamed
            # away mid-check: gone, not damaged (see below; the findings so far are
            # replaced by that one). Still there: a real error.
            if not (existed and fs.kind(root) is None):
                raise
    if err is not None and "integrity" not in fams:
        # Without a manifest the key vouches for, no family's verdict means anything: the
        # manifest's own finding (the integrity family's) is never dropped.
        code = err.code if err.code in CODES else codes.F024
        findings.append(
            CODES[code].finding(err.what, path=atomic.MANIFEST_NAME, hint=err.hint)
        )
    if m is not None and "consistency" in fams:  # what the saver found and accepted
        values = ctx.options.get("scan_values", True) is not False
        findings = atsave.reconcile(m, findings, values_scanned=values)
    gone = _deleted_meanwhile(
        root, existed=existed, committed=committed or m is not None, findings=findings
    )
    if gone:
        # Rotation of a live run deleted it while we read: not damage, and not a finding
        # about the bytes we saw half of.
        findings = [
            CODES[codes.F020].finding("deleted while it was being checked (a live run rotated it)")
        ]
    comps = empty_components()
    if m is not None:
        comps.update(_proven(m, findings))
    return Report(
        path=root,
        findings=ordered(findings),
        components=comps,
        manifest=m,
        strict=strict,
        files_checked=len(ctx._scans),
        bytes_checked=sum(s.size or 0 for s in ctx._scans.values()),
        seconds=time.perf_counter() - t0,
        gone=gone,
    )


def _deleted_meanwhile(
    root: Location, *, existed: bool, committed: bool, findings: list[Finding]
) -> bool:
    """True when the checkpoint at ``root`` was deleted while it was checked, so that its
    findings say nothing about damage.

    Either the directory that existed when the check began is gone now, or the checkpoint
    was committed (its manifest listed or read) and the check found errors, and its
    manifest, the commit marker, no longer exists. Rotation deletes the manifest first on an
    object store (then the other objects one by one, so the prefix can outlive it) and
    renames the directory away locally; either way a checkpoint whose manifest is gone is no
    longer one. The manifest is looked up afresh (not in a listing cached before the delete),
    and only after errors, so a clean check costs no extra request. A file missing under a
    manifest that is still there stays damage.
    """
    if existed and fs.kind(root) is None:
        return True
    if not committed or not any(f.severity == Severity.ERROR for f in findings):
        return False
    return fs.kind(root / atomic.MANIFEST_NAME, fresh=True) is None


_DAMAGE = frozenset(
    {codes.F001, codes.F002, codes.F003, codes.F004, codes.F005, codes.F008, codes.F009, codes.F022,
     codes.F025}  # an unreadable file is not damaged, but proves nothing either
)


def _proven(m: mf.Manifest, findings: list[Finding]) -> dict[str, mf.Component]:
    """The component table as the bytes prove it: a component whose files are damaged or
    whose bytes are absent (``CK-C010``) is reported not present, whatever the table says."""
    damaged = {f.path for f in findings if f.code in _DAMAGE and f.path}
    unproven = {f.component for f in findings if f.code == codes.C010}
    out: dict[str, mf.Component] = {}
    for name, c in m.components.items():
        if c.present and (name in unproven or any(w in damaged for w in c.where)):
            c = replace(c, present=False)
        out[name] = c
    return out


def find_checkpoints(path: Location) -> list[Location]:
    """Return the checkpoint directories at ``path``: itself, or its children.

    A directory with a manifest is a checkpoint. Otherwise every child directory that
    has a manifest, or looks like an interrupted save (a leftover temporary directory,
    or a step directory without manifest), is included so that verify reports it.
    """
    return [p for p, _ in _listed(path)]


def _listed(path: Location) -> list[tuple[Location, bool]]:
    """:func:`find_checkpoints`, each with whether its manifest was there when listed."""
    if fs.kind(path / atomic.MANIFEST_NAME) is not None:
        return [(path, True)]
    if fs.kind(path) != "dir":
        return [(path, False)]
    out: list[tuple[Location, bool]] = []
    children: list[Location] = list(path.iterdir())
    for child in sorted(children, key=str):
        if fs.kind(child) != "dir" or atomic.is_temporary(child):
            continue
        committed = fs.kind(child / atomic.MANIFEST_NAME) is not None
        if committed or child.name.startswith("step-"):
            out.append((child, committed))
    return out or [(path, False)]


def verify(
    path: Location | str,
    *,
    strict: bool = False,
    against_env: bool = False,
    families: Iterable[str] | None = None,
    progress: bool | None = None,
    format: str | None = None,
    key: signing.KeyLike | None = None,
    expect: Expect | None = None,
    workers: int | None = None,
    group: Collective | None = None,
) -> VerifyResult:
    """Verify one checkpoint, or every checkpoint under a run directory.

    A path without ``manifest.json`` holding a foreign layout (Trainer, Accelerate,
    Lightning, DCP, torch.save; see :mod:`ckptkit.verify.foreign`) is verified as that format,
    and so is each foreign child of a run directory (``checkpoint-N/``, ``*.ckpt``).

    Args:
        path: a checkpoint directory or a run directory holding several.
        strict: count warnings as failures.
        against_env: add the resume-compatibility family (this machine vs the save).
        families: override which check families run.
        progress: show a progress bar (default: on a terminal, for big checkpoints).
        format: a foreign format name (``ckptkit.verify.foreign.FORMATS``) overriding detection.
        key: HMAC key every manifest must be signed with (default: ``CKPTKIT_HMAC_KEY`` or
            ``CKPTKIT_HMAC_KEY_FILE``, else none). Without a key a signed manifest still
            verifies and reports ``CK-M012`` (signature not checked).
        expect: what the checkpoint must be: ``"weights"`` (only the model is required:
            inference and fine-tuning checkpoints) or ``"training"`` (a resume point:
            model, optimizer and progress at least). None: a native checkpoint is held to
            what its run recorded, a foreign one to what its content shows (weights when
            it holds model tensors only, training otherwise).
        workers: how many files of a checkpoint are read and hashed at once (threads;
            default :data:`~ckptkit.verify.context.SCAN_WORKERS`). The report is the same
            whatever the number.
        group: the ranks of a job (``ckptkit.collective.TorchGroup()``) that share the
            reading: collective, every rank calls it with the same arguments; each scans
            its share of every checkpoint's files (:mod:`ckptkit.verify.ranked`) and rank
            0 runs the checks. The report is the same as without ``group``, on rank 0;
            the other ranks return a result without reports. A foreign checkpoint is
            verified by rank 0 alone.

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
    root = fs.location(path)
    k = signing.resolve_key(key)
    local = fs.local_path(root)
    if fs.kind(root) is None:
        if local is not None:
            raise missing(local)  # with the closest names beside it
        raise IncompleteCheckpointError("no such file or directory", path=root, hint="check the URL")
    if expect is not None and expect not in EXPECTS:
        raise CkptkitError(
            f"unknown expectation {expect!r}", hint="pass expect='weights' or expect='training'"
        )
    if workers is not None and workers < 1:
        raise CkptkitError(f"workers={workers}: a verify needs at least one reader",
                           hint="pass workers >= 1, or None for the default")
    fams = list(families) if families is not None else list(DEFAULT_FAMILIES)
    if against_env and "compat" not in fams:
        fams.append("compat")
    result = VerifyResult(path=root, strict=strict)
    ranked = group is not None and group.world_size > 1
    lead = not ranked or (group is not None and group.rank == 0)
    # foreign formats are read by their frameworks' files: on a local filesystem only
    foreign = _foreign_targets(local, format) if local is not None and lead else None
    listed = _listed(root) if foreign is None and lead else []
    if ranked and group is not None:
        # Rank 0 decides what is verified, so that every rank walks the same checkpoints
        # through the same collectives, whatever each one lists meanwhile.
        what = group.broadcast(
            (foreign is not None, [(str(ck), c) for ck, c in listed]), src=0
        )
        listed = [(fs.location(ck), c) for ck, c in what[1]]
        if what[0] and not lead:
            return result
    if foreign is not None:
        for p, fmt in foreign:
            with _progress.activity(f"verifying {p.name}", _progress.bytes_under(p), progress):
                result.reports.append(
                    verify_foreign(p, fmt, strict=strict, expect=expect, families=fams, key=k)
                )
        return result
    options: dict[str, Any] = {"against_env": against_env, "expect": expect}
    for ck, committed in listed:
        m: mf.Manifest | None = None
        scans: dict[str, FileScan] | None = None
        scan_seconds = 0.0
        if ranked and group is not None and "integrity" in fams:
            # Only where a single-process verify scans every file (the integrity family
            # does), so that the report counts the same files.
            t0 = time.perf_counter()
            got = prescan(ck, group, key=k, workers=workers or SCAN_WORKERS, options=options)
            if got is None:
                continue  # not rank 0: its share is scanned and sent
            m, scans = got
            scan_seconds = time.perf_counter() - t0
        elif not lead:
            continue
        rep = verify_one(ck, families=fams, strict=strict, progress=progress, key=k,
                         options=options, committed=committed, workers=workers,
                         manifest=m, scans=scans)
        rep.seconds += scan_seconds  # the ranks' reading is part of this verify's time
        if expect is not None:
            rep.expect, rep.expect_source = expect, "given"
            rep.components = apply_expect(rep.components, expect)
        result.reports.append(rep)
    return result


def _foreign_targets(root: Path, fmt: str | None) -> list[tuple[Path, str | None]] | None:
    """Foreign checkpoints at ``root`` (itself, or its children in a run directory), or None.

    None means: verify natively (a manifest is there, or nothing foreign was found).
    """
    if fmt is not None:
        return [(root, fmt)]
    if os.path.lexists(root / atomic.MANIFEST_NAME):
        return None
    if native_evidence(fs.location(root)) is not None:
        # A native run, whatever else lies in it (a trainer_state.json, a stray
        # checkpoint-3/): its step directories are what is verified; the CLI names the
        # strays as ignored (ckptkit.run.directory.ignored).
        return None
    found = detect(root)
    if found is not None:
        return [(root, found)]
    if not root.is_dir():
        resolve_format(root, None)  # raises: not a recognised layout
    if any((c / atomic.MANIFEST_NAME).exists() for c in find_checkpoints(root) if c != root):
        return None  # a native run (its interrupted step directories are reported natively)
    children = [(c, detect(c)) for c in sorted(root.iterdir()) if not c.is_symlink()]
    # A lone .safetensors file counts only when named: inside a directory it is as likely
    # a shard of a native checkpoint that lost its manifest (CK-M001), never a pass.
    out: list[tuple[Path, str | None]] = [
        (c, f) for c, f in children if f is not None and (f != "safetensors" or c.is_dir())
    ]
    return out or None
