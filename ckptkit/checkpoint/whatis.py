"""Say what a path is when a call wanted a checkpoint or a run and got something else.

``ckptkit.load("runs/x")`` on a run directory, ``ckptkit inspect`` on a typo or on a
``torch.save`` file: "no manifest" is true but does not help. :func:`not_a_checkpoint`
looks at the path (existence, the checkpoints under it, a foreign format, a stray
``manifest.json``) and returns the error that names what is there and what to pass
instead; None when the path is a checkpoint directory (or something it cannot judge: a
URL, an interrupted save, which the manifest reader reports with its own code).
:func:`not_a_run` does the same for the run-level commands (``ls``, ``prune``,
``rollback``, ``verify``), and :func:`missing` is the one "no such file or directory"
error, with the closest names, that both give.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path

from ckptkit.checkpoint.catalog import step_of
from ckptkit.checkpoint.detect import FORMATS, detect
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.format.manifest import ADOPTED_SUFFIX
from ckptkit.storage import fs
from ckptkit.storage.atomic import MANIFEST_NAME, is_temporary

MAX_LISTED = 3
"""Checkpoint names an error spells out before it gives a count."""


def not_a_checkpoint(
    path: str | os.PathLike[str], *, foreign_ok: bool = False
) -> CkptkitError | None:
    """The error to raise for ``path`` when it is not one checkpoint directory, else None.

    Args:
        path: what the caller was given.
        foreign_ok: the caller reads foreign checkpoints too (``inspect``): a detected
            foreign file or directory is not an error.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> run = tempfile.mkdtemp()
        >>> _ = ckptkit.save({"w": torch.ones(1)}, run + "/step-00000010")
        >>> print(not_a_checkpoint(run).what)
        a run directory holding 1 checkpoint (step-00000010), not a checkpoint
        >>> not_a_checkpoint(run + "/step-00000010") is None
        True
    """
    p = fs.local_path(fs.location(path))
    if p is None:
        return None  # an object store: the manifest reader says what is missing
    if not os.path.lexists(p):
        return missing(p)
    if p.is_file():
        if p.name == MANIFEST_NAME:
            return CkptkitError(
                "this is a checkpoint's manifest, not the checkpoint",
                path=p,
                hint=f"pass the directory that holds it: {p.parent}",
            )
        fmt = detect(p)
        if fmt is not None and foreign_ok:
            return None
        what = f"a {FORMATS[fmt]} file" if fmt is not None else "a file"
        return IncompleteCheckpointError(
            f"{what}, not a ckptkit checkpoint directory",
            path=p,
            hint=f"'ckptkit verify {p}' checks it and 'ckptkit adopt {p}' records digests "
            "for it; ckptkit.load reads directories written by ckptkit.save",
        )
    if os.path.lexists(p / MANIFEST_NAME):
        return None
    fmt = detect(p)
    if foreign_ok and fmt is not None:
        return None
    if fmt == "dcp":
        signed = os.path.lexists(p / ADOPTED_SUFFIX)
        return IncompleteCheckpointError(
            f"a {FORMATS[fmt]}"
            + (" with a ckptkit manifest" if signed else "")
            + ", not a ckptkit.save checkpoint",
            path=p,
            hint="load it with ckptkit.dcp.load(state_dict, PATH) (or dcp.load with "
            "storage_reader=ckptkit.dcp.Reader(PATH)); 'ckptkit verify PATH' checks it",
        )
    inner = _checkpoints_under(p)
    if inner:
        return _run_directory(p, inner)
    if step_of(p.name) is not None or is_temporary(p):
        return None  # an interrupted save: the manifest reader's CK-M001 says so
    runs = [c for c in _subdirs(p) if any(step_of(k.name) is not None for k in _checkpoints_under(c))]
    if runs:
        return _directory_of_runs(
            p, runs, "a checkpoint", f"pass one checkpoint of a run; 'ckptkit ls {runs[0]}' lists that run's"
        )
    if not any(p.iterdir()):
        return IncompleteCheckpointError(
            "an empty directory, not a checkpoint",
            path=p,
            hint="pass a checkpoint directory (one that holds manifest.json)",
        )
    return None


def missing(path: str | os.PathLike[str]) -> IncompleteCheckpointError:
    """The error for a path that does not exist: the closest names beside it, or what the
    nearest existing parent holds.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "step-00000010").mkdir()
        >>> missing(d / "step-0000010").hint == f"did you mean {d / 'step-00000010'}?"
        True
    """
    p = Path(path)
    return IncompleteCheckpointError("no such file or directory", path=p, hint=_nearby(p))


def not_a_run(
    path: str | os.PathLike[str],
    *,
    checkpoint_ok: bool = False,
    claimed: Callable[[Path], bool] | None = None,
) -> CkptkitError | None:
    """The error to raise for ``path`` given where a run directory is read, else None.

    What a run-level command (``ls``, ``prune``, ``rollback``) tells its user: a typo
    (with the closest names), a file or one checkpoint (with the run that holds it), a
    directory above runs (with the runs under it). None for a directory holding
    checkpoints of any layout, an empty one (a run with none yet), or a URL (the store
    answers for itself).

    Args:
        path: what the command was given.
        checkpoint_ok: one checkpoint is fine too (``verify``): a checkpoint directory, a
            foreign checkpoint, any file.
        claimed: whether a framework run layout recognises a directory as its run (the
            run layer's detectors: :func:`ckptkit.run.directory.not_a_run` passes them).

    Example:
        >>> import tempfile, torch, ckptkit
        >>> top = tempfile.mkdtemp()
        >>> _ = ckptkit.save({"w": torch.ones(1)}, top + "/exp1/ckpt/step-00000010")
        >>> print(not_a_run(top).what)
        a directory of 1 run directory (exp1/ckpt), not a run
        >>> not_a_run(top + "/exp1/ckpt") is None
        True
    """
    p = fs.local_path(fs.location(path))
    if p is None:
        return None  # an object store: the store answers for itself
    if not os.path.lexists(p):
        return missing(p)
    if checkpoint_ok and (not p.is_dir() or os.path.lexists(p / MANIFEST_NAME) or detect(p)):
        return None
    if not p.is_dir() or os.path.lexists(p / MANIFEST_NAME):
        fmt = detect(p) if not p.is_dir() else None
        what = "one checkpoint" if p.is_dir() else f"a {fmt} file" if fmt else "a file"
        return CkptkitError(
            f"{what}, not a run directory",
            path=p,
            hint=f"pass the run directory that holds it ({p.parent}); 'ckptkit verify {p}' "
            "checks this one alone",
        )
    def is_run(d: Path) -> bool:
        return _holds_checkpoints(d) or (claimed is not None and claimed(d))

    if is_run(p):
        return None
    runs = _runs_below(p, is_run)
    if not runs:
        return None  # an empty run, or one with nothing recognisable yet: the listing says so
    what = "a run or a checkpoint" if checkpoint_ok else "a run"
    return _directory_of_runs(p, runs, what, f"pass one of them, e.g. {runs[0]}")


def _directory_of_runs(p: Path, runs: list[Path], not_what: str, hint: str) -> CkptkitError:
    names = [c.relative_to(p).as_posix() for c in runs]
    shown = ", ".join(names[:MAX_LISTED]) + (" …" if len(names) > MAX_LISTED else "")
    n = len(runs)
    return IncompleteCheckpointError(
        f"a directory of {n} run director{'ies' if n != 1 else 'y'} ({shown}), not {not_what}",
        path=p,
        hint=hint,
    )


MAX_SEARCHED = 256
"""Directories :func:`not_a_run` looks into for runs below the one given (two levels)."""


def _holds_checkpoints(p: Path) -> bool:
    """``p`` holds checkpoints of some layout: step directories (even interrupted ones),
    checkpoint directories, or files and folders a foreign format recognises."""
    try:
        kids = sorted(p.iterdir())
    except OSError:
        return False
    if any(c.is_dir() and (step_of(c.name) is not None or os.path.lexists(c / MANIFEST_NAME))
           for c in kids):
        return True
    return any(detect(c) is not None for c in kids[:MAX_SEARCHED])


def _runs_below(p: Path, is_run: Callable[[Path], bool]) -> list[Path]:
    """Runs one or two levels below ``p`` (``runs/`` holding ``exp1/ckpt``), in name order."""
    found: list[Path] = []
    budget = MAX_SEARCHED
    for child in _subdirs(p):
        budget -= 1
        if is_run(child):
            found.append(child)
            continue
        for grandchild in _subdirs(child):
            budget -= 1
            if is_run(grandchild):
                found.append(grandchild)
            if budget <= 0:
                return found
        if budget <= 0:
            break
    return found


def _subdirs(p: Path) -> list[Path]:
    try:
        return sorted(c for c in p.iterdir() if c.is_dir() and not is_temporary(c))
    except OSError:
        return []


def _checkpoints_under(p: Path) -> list[Path]:
    """Child directories holding a manifest, step directories first by step, then by name."""
    found = [c for c in _subdirs(p) if os.path.lexists(c / MANIFEST_NAME)]
    return sorted(found, key=lambda c: (step_of(c.name) is None, step_of(c.name) or 0, c.name))


def _run_directory(p: Path, inner: list[Path]) -> CkptkitError:
    names = [c.name for c in inner]
    shown = ", ".join(names[:MAX_LISTED] if len(names) <= MAX_LISTED else [names[0], "…", names[-1]])
    steps = [c for c in inner if step_of(c.name) is not None]
    kind = "a run directory" if steps else "a directory"
    n = len(inner)
    newest = steps[-1] if steps else inner[-1]
    hint = f"pass one checkpoint, e.g. {newest} (the newest); 'ckptkit ls {p}' lists them"
    if steps:
        hint += f"; CheckpointManager('{p}').restore(state) resumes from the newest verified one"
    return IncompleteCheckpointError(
        f"{kind} holding {n} checkpoint{'s' if n != 1 else ''} ({shown}), not a checkpoint",
        path=p,
        hint=hint,
    )


def _nearby(p: Path) -> str:
    """The fix for a path that does not exist: the closest existing names, or the parent."""
    parent = p.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return "check the path"
    try:
        names = sorted(c.name for c in parent.iterdir())
    except OSError:
        return "check the path"
    if parent == p.parent:
        close = difflib.get_close_matches(p.name, names, n=2, cutoff=0.6)
        if close:
            return "did you mean " + " or ".join(str(parent / c) for c in close) + "?"
    return f"check the path; {parent} exists" + (
        f" and holds {', '.join(names[:MAX_LISTED])}{' …' if len(names) > MAX_LISTED else ''}"
        if names
        else " and is empty"
    )


__all__ = ["missing", "not_a_checkpoint", "not_a_run"]
