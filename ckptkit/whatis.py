"""Say what a path is when a call wanted one checkpoint and got something else.

``ckptkit.load("runs/x")`` on a run directory, ``ckptkit inspect`` on a typo or on a
``torch.save`` file: "no manifest" is true but does not help. :func:`not_a_checkpoint`
looks at the path (existence, the checkpoints under it, a foreign format, a stray
``manifest.json``) and returns the error that names what is there and what to pass
instead; None when the path is a checkpoint directory (or something it cannot judge: a
URL, an interrupted save, which the manifest reader reports with its own code).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from ckptkit.catalog import step_of
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.foreign.detect import FORMATS, detect
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
    text = str(path)
    if "://" in text:
        return None  # a URL (object store): the manifest reader says what is missing
    p = Path(text)
    if not os.path.lexists(p):
        return IncompleteCheckpointError("no such file or directory", path=p, hint=_nearby(p))
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
    if foreign_ok and detect(p) is not None:
        return None
    inner = _checkpoints_under(p)
    if inner:
        return _run_directory(p, inner)
    if step_of(p.name) is not None or is_temporary(p):
        return None  # an interrupted save: the manifest reader's CK-M001 says so
    runs = [c for c in _subdirs(p) if any(step_of(k.name) is not None for k in _checkpoints_under(c))]
    if runs:
        names = ", ".join(c.name for c in runs[:MAX_LISTED]) + (" …" if len(runs) > MAX_LISTED else "")
        return IncompleteCheckpointError(
            f"a directory of {len(runs)} run director{'ies' if len(runs) != 1 else 'y'} "
            f"({names}), not a checkpoint",
            path=p,
            hint=f"pass one checkpoint of a run; 'ckptkit ls {runs[0]}' lists that run's",
        )
    if not any(p.iterdir()):
        return IncompleteCheckpointError(
            "an empty directory, not a checkpoint",
            path=p,
            hint="pass a checkpoint directory (one that holds manifest.json)",
        )
    return None


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


__all__ = ["not_a_checkpoint"]
