"""``ckptkit adopt``: write a ckptkit manifest beside a foreign checkpoint.

The manifest (``ckptkit-manifest.json`` inside a checkpoint directory, or
``<file>.ckptkit-manifest.json`` beside a single-file checkpoint) is a valid ckptkit
manifest: its ``manifest_digest`` covers everything, its component table is the one verify
detected, and ``user.adopted`` records the foreign format, what is missing and the xxh3-128
digest and size of every file. Foreign names (``epoch=0-step=2.ckpt``, ``.metadata``) fall
outside the native ``files[].path`` grammar, so the digests live in ``user.adopted.files``
and the native ``files`` list stays empty: the foreign directory is never taken for a
native checkpoint. The original files are never modified.

Adopting blesses the bytes as the reference later verifies compare against, so it first
runs the full verify: a damaged checkpoint (integrity errors, NaN weights) or one whose
resume state sits in a pickle that needs code to load (``CK-F103``: it cannot be checked,
and ``torch.load(weights_only=False)`` would run that code) is refused unless ``force``.
What verify says (missing components included) comes back with the result.
"""

from __future__ import annotations

import contextlib
import os
import platform
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError, IntegrityError, UnsafeInputError
from ckptkit.format import manifest as mf
from ckptkit.storage import digest
from ckptkit.storage.atomic import fsync_dir
from ckptkit.verify.findings import ERROR, INFO, Finding
from ckptkit.verify.foreign.adopted import adopted_path, load_adopted
from ckptkit.verify.foreign.report import ForeignReport, verify_foreign
from ckptkit.verify.foreign.scan import ADOPTED_SUFFIX as ADOPTED_NAME
from ckptkit.verify.view import Expect


@dataclass
class Adoption:
    """What :func:`adopt_checkpoint` did: the manifest written (or why not), and the verify."""

    manifest: Path | None
    """The adopted manifest, None when refused."""
    report: ForeignReport
    """What verify says about the checkpoint (before the digests were recorded)."""
    refused: CkptkitError | None = None
    """Why it was not adopted (without ``force``)."""

    @property
    def missing(self) -> list[str]:
        """Components the checkpoint should hold (as verified) but does not."""
        return sorted(
            n for n, c in self.report.components.items() if c.required and not c.present
        )

    @property
    def unverifiable(self) -> list[str]:
        """Files whose resume state needs code to unpickle (never executed, not checked)."""
        return sorted({f.path for f in _needs_code(self.report.findings) if f.path})

    @property
    def ok(self) -> bool:
        """Adopted, and the checkpoint verifies."""
        return self.manifest is not None and self.report.ok

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``ckptkit adopt --json`` prints."""
        return {
            "adopted": str(self.manifest) if self.manifest is not None else None,
            "refused": str(self.refused) if self.refused is not None else None,
            "ok": self.ok,
            "missing": self.missing,
            "unverifiable": self.unverifiable,
            "report": self.report.to_dict(),
        }


@dataclass(frozen=True)
class Notes:
    """What a framework integration adds to an adopted manifest (see :func:`adopt_checkpoint`)."""

    step: int | None = None
    """The optimizer step of the checkpoint (when the files do not hold it, or hold another
    counter: Accelerate's ``step`` counts micro-steps)."""
    health: Mapping[str, Any] | None = None
    """The stability watch's snapshot (``ckptkit ls`` health, ``rollback``)."""
    pins: tuple[str, ...] = ()
    """Pin labels (``emergency``): rotation never deletes a pinned checkpoint."""
    lookahead: Mapping[str, Any] | None = None
    """What the next step will use (the drill's continuity check)."""
    data: Mapping[str, Any] | None = None
    """Data identity (``snapshot`` ...), compared on resume."""


def _needs_code(findings: list[Finding]) -> list[Finding]:
    """CK-F103 findings about resume state (info-level ones are about config files)."""
    return [f for f in findings if f.code == codes.F103 and f.severity is not INFO]


def adopt_checkpoint(
    path: Path | str,
    fmt: str | None = None,
    *,
    force: bool = False,
    expect: Expect | None = None,
    notes: Notes | None = None,
    key: bytes | None = None,
) -> Adoption:
    """Verify a foreign checkpoint, then record its digests and component table beside it.

    Refused (nothing written, ``refused`` set) without ``force`` when verify finds
    integrity errors or bad values (``CK-F``/``CK-M``/``CK-S`` errors: a damaged state
    must not become the reference) or resume state in a pickle that needs code
    (``CK-F103``). A checkpoint that is merely incomplete is adopted; ``report`` and
    ``missing`` say what it lacks.

    Args:
        path: a foreign checkpoint (directory or file).
        fmt: its format; detected when None.
        force: adopt whatever verify says.
        expect: ``weights`` or ``training`` (recorded; later verifies use it); inferred
            when None.
        notes: what the training loop knows that the files do not say (the step of an
            Accelerate ``checkpoint_N``, health, pins, look-ahead, data identity);
            written into the adopted manifest by the framework integrations.
        key: an HMAC key (:func:`ckptkit.format.signing.resolve_key`): the adopted manifest is
            signed with it, as a native one is, and verifies under it only.

    A checkpoint adopted before keeps the step its manifest records: a ``notes.step``
    that differs is refused (``refused`` names both); an adopted step is never rewritten.

    Raises:
        CkptkitError: the layout is not recognised.

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ck.pt"
        >>> torch.save({"model": {"w": torch.ones(2)}}, p)
        >>> a = adopt_checkpoint(p); a.manifest.name, a.ok, a.report.expect
        ('ck.pt.ckptkit-manifest.json', True, 'weights')
    """
    rep = verify_foreign(path, fmt, expect=expect)
    s = rep.scan
    assert s is not None
    recorded = recorded_step(s.target)
    wanted = notes.step if notes is not None else None
    if recorded is not None and wanted is not None and wanted != recorded:
        return Adoption(manifest=None, report=rep, refused=_step_conflict(s.target, recorded, wanted))
    refused = None if force else _refusal(rep)
    if refused is not None:
        return Adoption(manifest=None, report=rep, refused=refused)
    files = []
    for rel in s.files:
        if rel in s.outside:
            continue  # never read (CK-F009): recording it would bless what it points to
        hexd, size = digest.hash_file(s.path(rel))
        files.append({"path": rel, "size": size, "xxh3_128": hexd})
    adoption = Adoption(manifest=None, report=rep)
    record: dict[str, Any] = {
        "format": s.format,
        "target": s.target.name,
        "files": files,
        "missing": adoption.missing,
        "findings": sorted({f.code for f in rep.findings}),
    }
    if expect is not None:
        record["expect"] = expect
    if adoption.unverifiable:
        record["unverifiable"] = adoption.unverifiable
    notes = notes or Notes()
    components = dict(rep.components)
    if notes.data:
        components["data"] = mf.Component(
            "data", present=True, required=False, where=(f"{ADOPTED_NAME}:data",),
            summary=dict(notes.data),
        )
    m = mf.Manifest(
        files=(),
        tensors=(),
        tree=None,
        components=components,
        env={"torch": torch.__version__, "python": platform.python_version()},
        step=next((x for x in (recorded, notes.step, s.step) if x is not None), None),
        lookahead=dict(notes.lookahead) if notes.lookahead else None,
        health=dict(notes.health) if notes.health else None,
        pins=tuple(sorted(set(notes.pins))),
        user={"adopted": record},
    )
    if key is not None:
        m = m.signed(key)
    out = adopted_path(s.target)
    text = m.to_json()
    mf.Manifest.from_json(text, path=str(out), key=key)  # what we write must read back
    _write_atomic(out, text)
    adoption.manifest = out
    return adoption


def adopt(
    path: Path | str,
    fmt: str | None = None,
    *,
    force: bool = False,
    expect: Expect | None = None,
    key: bytes | None = None,
) -> Path:
    """Record digests and the component table of a foreign checkpoint; return the manifest path.

    The library twin of ``ckptkit adopt``; see :func:`adopt_checkpoint` for what is refused.

    Raises:
        IntegrityError: the checkpoint has integrity errors or bad values (not ``force``).
        UnsafeInputError: resume state needs code to unpickle (not ``force``).
        CkptkitError: the layout is not recognised.

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ck.pt"
        >>> torch.save({"model": {"w": torch.ones(2)}}, p)
        >>> adopt(p).name
        'ck.pt.ckptkit-manifest.json'
    """
    a = adopt_checkpoint(path, fmt, force=force, expect=expect, key=key)
    if a.refused is not None:
        raise a.refused
    assert a.manifest is not None
    return a.manifest


def recorded_step(target: Path, *, key: bytes | None = None) -> int | None:
    """The step the adopted manifest of ``target`` records; None without one (or one that
    cannot be read, or records no step). Without ``key`` it only keeps a step from being
    rewritten; with ``key`` (a step to act on: adopt at it, resume at it) a manifest not
    signed with that key records none.

    Example:
        >>> import tempfile, pathlib
        >>> recorded_step(pathlib.Path(tempfile.mkdtemp()) / "x.ckpt") is None
        True
    """
    with contextlib.suppress(CkptkitError, OSError):
        man = load_adopted(Path(target), key=key)
        if man is not None and man.step is not None:
            return int(man.step)
    return None


def _step_conflict(target: Path, recorded: int, wanted: int) -> CkptkitError:
    return CkptkitError(
        f"{target.name} was adopted at step {recorded}; step {wanted} differs: an adopted "
        "step is never rewritten",
        path=adopted_path(target),
        hint=f"if step {recorded} is wrong, remove that manifest, then adopt with "
        f"--step {wanted}",
    )


def _refusal(rep: ForeignReport) -> CkptkitError | None:
    s = rep.scan
    assert s is not None
    code = _needs_code(rep.findings)
    if code:
        first = code[0]
        more = f" ({len(code) - 1} more)" if len(code) > 1 else ""
        return UnsafeInputError(
            # The message says how the framework loads the file and what follows (the code
            # runs, or its load refuses the file and the resume crashes).
            f"refusing to adopt: {first.message}{more}; a resume cannot use this checkpoint "
            "as it is, and adopting it would make it the reference",
            path=s.root / first.path if first.path else s.target,
            code=codes.F103,
            hint="re-save that state as plain tensors, numbers and dicts (no custom classes, "
            "no numpy values), or pass --force to record the files as they are (unverified)",
        )
    bad = [
        f for f in rep.findings if f.severity is ERROR and f.code.startswith(("CK-F", "CK-M", "CK-S"))
    ]
    if bad:
        first = bad[0]
        return IntegrityError(
            f"refusing to adopt a damaged checkpoint: {first.message}"
            + (f" ({len(bad) - 1} more)" if len(bad) > 1 else ""),
            path=s.root / first.path if first.path else s.target,
            code=first.code,
            hint="restore the damaged files first, or pass --force to record them as they are",
        )
    return None


def _write_atomic(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` through a uniquely named sibling, fsync, rename, fsync dir.

    A unique temporary name lets concurrent adopts of one checkpoint race safely: each
    writes its own file and the last rename wins with a complete manifest.
    """
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # not every filesystem can fsync a directory
        fsync_dir(out.parent)


__all__ = ["Adoption", "Notes", "adopt", "adopt_checkpoint", "adopted_path", "recorded_step"]
