"""The whole ckptkit exception hierarchy.

Every error carries the file it concerns, a stable finding code (the same codes
`ckptkit verify` reports, see docs/verify-codes.md) and a hint saying how to fix
it. Leaves also subclass a built-in so existing ``except ValueError`` or
``except FileNotFoundError`` clauses keep working, as orbax does.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCS_URL = "docs/verify-codes.md"


class CkptkitError(Exception):
    """Root of every error ckptkit raises on purpose.

    Args:
        what: what is wrong, in one sentence.
        path: the file or directory concerned.
        code: the stable finding code (``CK-F003`` ...), when one applies.
        hint: how to fix it.

    Example:
        >>> err = CkptkitError("digest mismatch", path=Path("model.safetensors"),
        ...                    code="CK-F003", hint="restore the file")
        >>> str(err).startswith("CK-F003 model.safetensors: digest mismatch")
        True
    """

    def __init__(
        self,
        what: str,
        *,
        path: str | os.PathLike[str] | Any | None = None,
        code: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.path: Path | str | None = _as_path(path)
        self.code = code
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        parts: list[str] = []
        head = ""
        if self.code:
            head = self.code + " "
        if self.path is not None:
            head += f"{self.path}: "
        parts.append(head + self.what)
        if self.hint:
            parts.append(f"Fix: {self.hint}")
        if self.code:
            parts.append(f"See {DOCS_URL}#{self.code.lower()}")
        return " ".join(sentence(p) for p in parts)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keep errors picklable across multiprocessing boundaries (kwargs-only init).
        return (_rebuild, (type(self), self.what, self.path, self.code, self.hint))


def sentence(text: str) -> str:
    """End ``text`` with exactly one full stop (an ending ``?``, ``!`` or ellipsis stays).

    Messages are assembled from parts written in many places (a raise site's ``what``, a
    registered hint, an embedded error); some end with a period, some with a space.

    Example:
        >>> sentence("digest mismatch. "), sentence("see x (e.g. y.)"), sentence("why?")
        ('digest mismatch.', 'see x (e.g. y.).', 'why?')
    """
    t = text.rstrip()
    if t.endswith(("...", "\u2026", "?", "!")):
        return t
    return t.rstrip(".").rstrip() + "."


def _as_path(path: Any) -> Path | str | None:
    """A local path as a Path; a URL (``s3://bucket/run``, a remote UPath) as its string,
    which Path would mangle (it folds ``//``)."""
    if path is None:
        return None
    if isinstance(path, Path) and type(path).__module__.startswith("pathlib"):
        return path
    text = str(path)
    if "://" in text and not text.startswith(("file://", "local://")):
        return text
    return Path(os.fspath(path)) if isinstance(path, os.PathLike) else Path(text)


def _rebuild(
    cls: type[CkptkitError], what: str, path: Path | str | None, code: str | None,
    hint: str | None,
) -> CkptkitError:
    return cls(what, path=path, code=code, hint=hint)


class ManifestError(CkptkitError, ValueError):
    """The manifest is missing fields, malformed, or fails its schema."""


class UnsafeInputError(ManifestError):
    """Hostile or absurd input: a path escaping the checkpoint, an absurd size, a zstd bomb."""


class SignatureError(ManifestError):
    """A key was given and the manifest is unsigned, signed with another key, or altered."""


class IntegrityError(CkptkitError):
    """Bytes on disk differ from what the manifest recorded (size, digest, header)."""


class UnreadableError(CkptkitError):
    """A file could not be read *now* (permissions, an I/O error, a busy or unreachable
    store): not evidence that its bytes are damaged. The checkpoint is ``unreadable``, never
    ``corrupt``: it is tried again later and never deleted as corrupt."""


class IncompleteCheckpointError(CkptkitError, FileNotFoundError):
    """No committed checkpoint here: the manifest (commit marker) or a listed file is missing."""


class CheckpointExistsError(CkptkitError, FileExistsError):
    """The destination already holds a checkpoint and overwriting was not asked for."""


class LockHeldError(CkptkitError):
    """Another live writer holds the checkpoint directory's lock."""


class NotWritableError(CkptkitError, OSError):
    """A directory ckptkit must write (a run directory a writer opens) is not writable.

    An ``OSError`` with the errno of the refusal (``EROFS``, ``EACCES``, ``EPERM``), so
    ``except OSError`` clauses keep working.
    """

    ERRNOS = frozenset({_errno.EROFS, _errno.EACCES, _errno.EPERM})
    """Errnos that say "this process may not write here" (not damage, not a full disk)."""

    def __init__(self, what: str, *, errno: int | None = None, **kw: Any) -> None:
        super().__init__(what, **kw)
        self.errno = errno


class StateError(CkptkitError, ValueError):
    """Training state cannot be captured or restored safely (unsupported object, mismatch)."""


class DistributedError(CkptkitError, RuntimeError):
    """A collective save or restore failed on another rank (every rank raises together)."""


class ReplicaDivergenceError(CkptkitError, RuntimeError):
    """Replicas of the same tensor held different bytes at a save (silent data corruption
    or a non-deterministic kernel on one rank); raised on every rank under
    ``CheckpointManager(on_divergence="raise")`` after the checkpoint was committed and
    recorded ``replica-divergent``."""


class CommittedError(CkptkitError, OSError):
    """A save committed its checkpoint, then a later step failed (verify, record, rotate).

    The checkpoint directory is whole and listed; do not retry the same step (that would
    raise :class:`CheckpointExistsError`). ``committed`` names it.
    """

    def __init__(
        self,
        what: str,
        *,
        committed: Any,
        path: Any = None,
        code: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.committed = _as_path(committed)
        super().__init__(what, path=path, code=code, hint=hint)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild_committed, (self.what, self.committed, self.path, self.code, self.hint))


def _rebuild_committed(
    what: str, committed: Path, path: Path | str | None, code: str | None, hint: str | None
) -> CommittedError:
    return CommittedError(what, committed=committed, path=path, code=code, hint=hint)


class DrillError(CkptkitError):
    """A resume drill could not run (the script crashed, no checkpoint appeared)."""


class RecoveryError(CkptkitError, RuntimeError):
    """An automatic recovery was refused (a limit) or failed; training must stop.

    Raised on every rank together, after the refusal or failure is recorded in the run.
    """


@contextlib.contextmanager
def opening_run_writable(root: Any, *, readonly: bool = False) -> Iterator[None]:
    """Restate "may not write here" from opening the run at ``root`` as a writer.

    An ``OSError`` whose errno is in :attr:`NotWritableError.ERRNOS` (a read-only mount, no
    permission: creating the directory or its lock file) becomes a
    :class:`NotWritableError` naming ``root`` and both fixes. With ``readonly`` nothing is
    restated: a reader writes nothing, so the fix would be wrong.

    Example:
        >>> with opening_run_writable("/mnt/run"):
        ...     raise OSError(30, "Read-only file system", "/mnt/run/.ckptkit.lock")
        Traceback (most recent call last):
        ...
        ckptkit.errors.NotWritableError: /mnt/run: the run directory is not writable ...
    """
    try:
        yield
    except OSError as e:
        if readonly or isinstance(e, CkptkitError) or e.errno not in NotWritableError.ERRNOS:
            raise
        where = f": {e.filename}" if e.filename else ""
        raise NotWritableError(
            f"the run directory is not writable ({e.strerror or e}{where}); a writer "
            "creates its lock file and checkpoints there",
            errno=e.errno,
            path=root,
            hint="make it writable by this user, or open the run read-only to list and "
            "restore: CheckpointManager(root, readonly=True), 'ckptkit ls'",
        ) from e


__all__ = [
    "CheckpointExistsError",
    "CkptkitError",
    "CommittedError",
    "DistributedError",
    "DrillError",
    "IncompleteCheckpointError",
    "IntegrityError",
    "LockHeldError",
    "ManifestError",
    "NotWritableError",
    "RecoveryError",
    "ReplicaDivergenceError",
    "SignatureError",
    "StateError",
    "UnreadableError",
    "UnsafeInputError",
    "opening_run_writable",
]
