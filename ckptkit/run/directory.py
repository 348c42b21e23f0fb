"""Run directories of every layout behind one interface: native ckptkit runs and framework runs.

The run-level commands (``ckptkit ls``, ``prune``, ``rollback``, ``verify RUN``, ``adopt
RUN``) work on a *run*: a :class:`ckptkit.run.Run`, which owns the lock, the run index,
``latest`` and retention for every built-in layout (native step directories, a Trainer's
``checkpoint-N/``, an Accelerate ``checkpoint_N/``, a Lightning ``*.ckpt``). An
integration registers a detector with :func:`register` that recognises its run
directories and returns a run for them (a :class:`ckptkit.run.Run` with its layout, or
any object with the :class:`RunLike` methods); :func:`open_run` asks the detectors in order
and falls back to the native layout.

Layouts never hide each other: a directory that holds a native run
(:func:`ckptkit.checkpoint.catalog.native_evidence` says what counts: a step directory with a
manifest, the ``latest`` pointer naming one ...) is the native run, whatever else lies in
it, and no detector is asked. A stray framework entry beside it (a ``checkpoint-3/``, an Accelerate
``checkpoints/``, a ``trainer_state.json``) and a second directory for a step are
:func:`ignored`: never listed, verified, restored or pruned as part of the run, and named
by every run-level command (on stderr).
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib
from pathlib import Path
from typing import Any

from ckptkit import codes
from ckptkit.checkpoint import catalog, whatis
from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.checkpoint.detect import FORMATS
from ckptkit.checkpoint.detect import detect as foreign_format
from ckptkit.errors import CkptkitError
from ckptkit.format import signing
from ckptkit.run import NativeLayout, Run, retain, rotation
from ckptkit.run.registry import DETECTORS, Detector, RunLike, register
from ckptkit.signals import recovery_log
from ckptkit.storage import fs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.adopt import Adoption, Notes, adopt_checkpoint
from ckptkit.verify.view import Expect

BUILTIN_LAYOUTS: tuple[str, ...] = (
    "ckptkit.run.layouts.hf",
    "ckptkit.run.layouts.lightning",
    "ckptkit.run.layouts.torchtitan",
)
"""Modules of :mod:`ckptkit.run.layouts` that :func:`open_run` imports (each registers itself)."""

_loaded = False


def _load_builtin_layouts() -> None:
    """Import the built-in layout modules once (they register at import, like plugins)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for name in BUILTIN_LAYOUTS:
            importlib.import_module(name)


@dataclasses.dataclass(frozen=True)
class Ignored:
    """An entry of a run directory that is not one of the run's checkpoints (see
    :func:`ignored`)."""

    path: Location
    why: str
    """What it is, why the run ignores it, and what to do about it."""

    def to_dict(self) -> dict[str, str]:
        """Return the JSON form (``ckptkit ls --json``: ``ignored``)."""
        return {"path": str(self.path), "why": self.why}


def native_run(root: str | Location, **options: Any) -> Run:
    """The native run at ``root`` (``options``: as :class:`ckptkit.run.Run`; read-only by
    default).

    Example:
        >>> import tempfile
        >>> native_run(tempfile.mkdtemp()).layout
        'ckptkit'
    """
    options.setdefault("readonly", True)
    return Run(root, NativeLayout(), **options)


def _native_ignored(run: Run) -> builtins.list[Ignored]:
    """Entries of a native run directory that are not its checkpoints: second directories
    for a step, and framework entries a layout would claim if the run were not here."""
    out = [
        Ignored(
            dup,
            f"{dup.name} is a second directory for step {catalog.step_of(dup.name)} "
            f"(the run uses {used.name}): ignored ({codes.S021}): never listed, restored or "
            "pruned; compare the two ('ckptkit verify' checks both) and remove or move "
            "out the one you do not want",
        )
        for dup, used in run.catalog.duplicates()
    ]
    evidence = catalog.native_evidence(run.root)
    if evidence is not None:
        out += _strays(run.root, evidence)
    return out


def _strays(root: Location, evidence: str) -> builtins.list[Ignored]:
    """What the framework layouts would see in the native run at ``root`` (``evidence``:
    why it is native): each layout's checkpoints, and top-level files that make ``root``
    itself look like a framework checkpoint (``trainer_state.json``)."""
    _load_builtin_layouts()
    out: builtins.list[Ignored] = []
    tail = (
        f"lies in a native ckptkit run ({evidence}): ignored: not listed, verified, "
        "restored or pruned as part of the run; move it out of the run directory"
    )
    for name, detect in DETECTORS:
        try:
            run = detect(root, {})
        except CkptkitError:
            continue  # a layout that cannot even list it claims nothing
        if run is None:
            continue
        try:
            found = sorted(run.checkpoints(), key=lambda c: (c.step, str(c.path)))
        finally:
            run.close()
        out += [
            Ignored(c.path, f"{_rel(c.path, root)} (a checkpoint of the {run.layout or name} "
                            f"layout) {tail}")
            for c in found
        ]
    local = fs.local_path(root)  # the foreign-format detector reads local files
    if local is not None:
        fmt = foreign_format(local)
        if fmt is not None:
            own = {catalog.LATEST}
            files = sorted(
                p.name for p in root.iterdir()
                if fs.kind(p) == "file" and not p.name.startswith(".") and p.name not in own
            )
            out.append(
                Ignored(
                    root,
                    f"its top-level files ({', '.join(files[:4]) or 'none'}) look like a "
                    f"{FORMATS[fmt]}, but the directory holds a native ckptkit run "
                    f"({evidence}): they are ignored, and the directory is listed, verified "
                    "and pruned as the native run; move them out of the run directory",
                )
            )
    return out


def _rel(path: Location, root: Location) -> str:
    """``path`` relative to ``root`` (both local or both under one URL)."""
    p, r = str(path), str(root).rstrip("/") + "/"
    return p[len(r):] if p.startswith(r) else p


def ignored(run: RunLike) -> builtins.list[Ignored]:
    """Entries of ``run``'s directory that are not its checkpoints (the run never lists,
    restores or prunes them); empty for a layout that reports none.

    A native run reports second directories for a step and stray framework entries (a
    ``checkpoint-3/``, a ``checkpoints/checkpoint_0/``, a ``trainer_state.json`` at the
    top): :func:`open_run` made it the native run although a framework layout would
    have claimed it.

    Example:
        >>> import tempfile, torch, ckptkit, os
        >>> d = tempfile.mkdtemp()
        >>> _ = ckptkit.save({"w": torch.ones(1)}, d + "/step-00000001", step=1)
        >>> os.mkdir(d + "/step-1")
        >>> [i.path.name for i in ignored(open_run(d))]
        ['step-1']
    """
    if isinstance(run, Run):
        return _native_ignored(run) if run.layout == NativeLayout.name else []
    find = getattr(run, "ignored", None)
    return list(find()) if callable(find) else []


def ignored_at(path: str | Location) -> builtins.list[Ignored]:
    """:func:`ignored` of the run at ``path`` (opened read-only, closed again)."""
    run = open_run(path)
    try:
        return ignored(run)
    finally:
        run.close()


def framework_run(root: str | Location, **options: Any) -> RunLike | None:
    """The framework run at ``root``: the first registered layout that recognises it; None
    for a native run (:func:`ckptkit.checkpoint.catalog.native_evidence`: asked first, so a stray
    framework entry never hides a native run) or a directory no layout claims."""
    _load_builtin_layouts()
    loc = fs.location(root)
    if catalog.native_evidence(loc) is not None:
        return None
    for _name, detect in DETECTORS:
        run = detect(loc, dict(options))
        if run is not None:
            return run
    return None


def open_run(root: str | Location, **options: Any) -> RunLike:
    """The run at ``root``: the native run when it holds one, else the first registered
    framework layout that recognises it, else the native layout (see the module docstring).

    ``options`` are those of :class:`ckptkit.run.Run`; a writable run opened here takes its
    lock at its first write (``lazy``: ``ls --verify`` records only while no training run
    holds it; ``prune`` takes it before it plans).

    Example:
        >>> import tempfile
        >>> open_run(tempfile.mkdtemp()).layout
        'ckptkit'
    """
    options.setdefault("lazy", True)
    run = framework_run(root, **options)
    return run if run is not None else native_run(fs.location(root), **options)


def listing(run: RunLike, *, verify: bool = False) -> builtins.list[CheckpointInfo]:
    """Every checkpoint of ``run``, oldest first, with its status and real step (``ckptkit ls``).

    Args:
        verify: re-verify every checkpoint that is not incomplete from its bytes first
            (the run records the outcome where it can).
    """
    if isinstance(run, Run):
        return run.listing(verify=verify)
    if verify:
        for c in run.checkpoints():
            if c.status != "incomplete":
                run.reverify(c)
    return sorted(run.checkpoints(), key=lambda c: c.step)


def prune(run: RunLike, policy: retain.Policy, *, dry_run: bool = False) -> rotation.RetentionPlan:
    """Apply ``policy`` to ``run`` by hand (``ckptkit prune``) with :mod:`ckptkit.run.retain`'s rules.

    The newest checkpoint the plan keeps is verified again from its bytes before anything
    is deleted; the newest good one is never deleted. Needs the run's lock (a framework
    run: no live writer), unless ``dry_run``.
    """
    if isinstance(run, Run):
        return run.prune(policy, dry_run=dry_run).plan
    return retain.apply(run, policy, dry_run=dry_run).plan


def rollback(
    run_dir: str | Location, *, key: signing.KeyLike | None = None
) -> rotation.RollbackChoice:
    """The checkpoint of the run at ``run_dir`` to roll back to: the newest with health ok.

    Read-only: lists the run (any layout), changes nothing. Without health data in the
    run (no StabilityWatch), the newest verified checkpoint, and the choice says so.
    ``choice.resume`` says how to resume from it in the run's own terms.

    Args:
        run_dir: the run's checkpoint directory.
        key: the HMAC key manifests must be signed with (default: the environment's, see
            :func:`ckptkit.format.signing.resolve_key`); a checkpoint that is not counts as corrupt.

    Raises:
        CkptkitError: ``run_dir`` is not a directory, or the key is unusable.

    Example:
        >>> import tempfile
        >>> rollback(tempfile.mkdtemp()).checkpoint is None
        True
    """
    root = fs.location(run_dir)
    if fs.kind(root) != "dir":
        raise CkptkitError(
            "not a run directory", path=root, hint="pass the run's checkpoint directory"
        )
    run = open_run(root, key=key)
    try:
        choice = rotation.choose_rollback(listing(run))
        # The run's automatic recoveries (ckptkit.signals.recovery): what was rolled back already.
        choice = dataclasses.replace(choice, recoveries=tuple(recovery_log.iter_records(root)))
        if choice.checkpoint is None:
            return choice
        return dataclasses.replace(choice, resume=resume_hint(run, choice.checkpoint))
    finally:
        run.close()


def framework_checkpoints(path: str | Location) -> builtins.list[Location] | None:
    """The checkpoints of a framework run at ``path``, oldest first; None for a native run,
    a single checkpoint, or a directory no layout claims (``ckptkit verify RUN_DIR``)."""
    loc = fs.location(path)
    if fs.kind(loc) != "dir" or fs.kind(loc / "manifest.json") is not None:
        return None
    run = open_run(loc)
    try:
        if run.layout == "ckptkit":
            return None
        return [c.path for c in sorted(run.checkpoints(), key=lambda c: c.step)]
    finally:
        run.close()


def not_a_run(path: str | Location, *, checkpoint_ok: bool = False) -> CkptkitError | None:
    """The error to raise for ``path`` given to a run-level command, else None.

    A directory a framework layout claims is a run; anything else is judged by
    :func:`ckptkit.checkpoint.whatis.not_a_run` (a typo with the closest names, a file or one
    checkpoint with the run that holds it, a directory above runs with the runs in it).
    ``checkpoint_ok``: one checkpoint is fine too (``ckptkit verify``).

    Example:
        >>> import tempfile, os
        >>> top = tempfile.mkdtemp(); os.makedirs(top + "/out/checkpoint-5")
        >>> print(not_a_run(top).what)
        a directory of 1 run directory (out), not a run
        >>> not_a_run(top + "/out") is None
        True
    """
    return whatis.not_a_run(str(fs.location(path)), checkpoint_ok=checkpoint_ok, claimed=_claimed)


def _claimed(root: Path) -> bool:
    """A registered framework layout recognises ``root`` as its run directory."""
    run = framework_run(root)
    if run is None:
        return False
    run.close()
    return True


def adopt(
    path: str | Location,
    fmt: str | None = None,
    *,
    step: int | None = None,
    force: bool = False,
    expect: Expect | None = None,
    key: signing.KeyLike | None = None,
) -> Adoption:
    """Adopt one foreign checkpoint (``ckptkit adopt PATH``) through its run when a
    framework layout claims its directory, else on its own.

    Through the run (:meth:`ckptkit.run.Run.adopt`): its real step (an adopted step is
    never rewritten; an Accelerate checkpoint needs one: its intent record, or ``step``),
    signed with the run's key, the outcome recorded in its index; it takes the run lock
    first. On its own: signed with ``key`` (default: the environment's).

    Raises:
        LockHeldError: a live writer (a training run) holds the run: nothing is written.
        CkptkitError: the layout is not recognised, or its step is unknown.
    """
    loc = fs.location(path)
    run = framework_run(loc.parent, readonly=False, lazy=True, key=key)
    if isinstance(run, Run) and any(c.path == loc for c in run.checkpoints()):
        try:
            return run.adopt(loc, step=step, force=force, expect=expect)
        finally:
            run.close()
    if run is not None:
        run.close()
    return adopt_checkpoint(
        fs.require_local(loc, needs="adopting a foreign checkpoint"), fmt, force=force,
        expect=expect, notes=Notes(step=step),
        key=signing.resolve_key(key),
    )


def resume_hint(run: RunLike, info: CheckpointInfo) -> str:
    """How to resume ``run`` from ``info``, in the run's own terms (its framework's call)."""
    hint = getattr(run, "resume_hint", None)
    if callable(hint):
        return str(hint(info))
    return f"resume from {info.path}"


def signature_note(run: RunLike) -> str | None:
    """What a command run without a key says of a signed run (:meth:`ckptkit.run.Run.
    signature_note`); None for an unsigned run, or a third party's run that cannot tell."""
    note = getattr(run, "signature_note", None)
    said = note() if callable(note) else None
    return str(said) if said is not None else None


__all__ = [
    "BUILTIN_LAYOUTS",
    "DETECTORS",
    "Detector",
    "Ignored",
    "RunLike",
    "adopt",
    "framework_checkpoints",
    "framework_run",
    "ignored",
    "ignored_at",
    "listing",
    "native_run",
    "not_a_run",
    "open_run",
    "prune",
    "register",
    "resume_hint",
    "rollback",
    "signature_note",
]
