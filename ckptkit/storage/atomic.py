"""Atomic commit of a checkpoint directory (spec §2).

On a local filesystem, files are written into a temporary sibling directory and
fsynced; the manifest (the commit marker) is written and fsynced last; the directory is
renamed into place and the parent fsynced. A crash at any instant leaves either the
previous state or the complete new checkpoint; leftovers carry :data:`TMP_SUFFIX` so they
are recognised, reported and cleaned, never loaded.

On an object store (no rename) the files are uploaded into the final prefix and the
manifest is written last, after every upload succeeded: the manifest is still the commit
marker, and a prefix without one is an interrupted save that is never loaded and is
removed by the next writer that opens the run (under the run lock). Overwriting a
committed checkpoint there first removes its manifest (uncommitting it): unlike the local
swap, the old checkpoint is gone if the new save then fails.

Example:
    >>> import tempfile, pathlib
    >>> final = pathlib.Path(tempfile.mkdtemp()) / "ckpt"
    >>> p = PendingCheckpoint.create(final)
    >>> p.tmp.exists(), final.exists()
    (True, False)
    >>> _ = (p.tmp / "manifest.json").write_text("{}"); p.finalize()
    >>> p.tmp.exists(), final.exists()
    (False, True)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ckptkit import crashpoints
from ckptkit.errors import CheckpointExistsError
from ckptkit.format.manifest import MANIFEST_NAME
from ckptkit.storage import fs
from ckptkit.storage.fs import Location

TMP_SUFFIX = ".ckptkit-tmp"
"""Marks a directory being written; never a committed checkpoint."""
OLD_SUFFIX = ".ckptkit-old"
"""Marks a replaced checkpoint during an overwrite, removed right after the swap."""


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename or create inside it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush one file's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temporary(path: Location) -> bool:
    """Return whether ``path`` is a leftover of an unfinished save or overwrite."""
    return TMP_SUFFIX in path.name or OLD_SUFFIX in path.name


def is_committed(path: Location) -> bool:
    """Return whether ``path`` is a directory holding a manifest (the commit marker).

    Whether that manifest is *valid* is verify's business; without one, a directory is
    an incomplete save and is never loaded.
    """
    return not is_temporary(path) and fs.kind(path / MANIFEST_NAME) == "file"


@dataclass
class PendingCheckpoint:
    """A checkpoint being written: a temporary sibling directory, then a rename.

    Use :meth:`create`, write files into :attr:`tmp`, write the manifest last, then
    :meth:`finalize`; :meth:`abort` removes the temporary directory on failure.
    """

    final: Location
    """Where the checkpoint will live once committed."""
    tmp: Location
    """Where the files are written: a temporary sibling directory, or :attr:`final`
    itself on an object store."""
    overwrite: bool = False
    """Replace an existing committed checkpoint at :attr:`final`."""

    @property
    def in_place(self) -> bool:
        """True on an object store: files go straight to :attr:`final`, manifest last."""
        return self.tmp == self.final

    @classmethod
    def create(
        cls, final: Location | str, *, overwrite: bool = False
    ) -> PendingCheckpoint:
        """Make the temporary sibling directory of ``final`` (or prepare ``final`` itself
        on an object store).

        Raises:
            CheckpointExistsError: ``final`` exists and is not a checkpoint this call may
                replace (never delete data ckptkit did not write).
        """
        loc = fs.location(final)
        if not fs.is_local(loc):
            return cls._create_in_place(loc, overwrite=overwrite)
        final = Path(str(loc)).absolute()
        if final.exists() or final.is_symlink():
            replaceable = is_committed(final) or (final.is_dir() and not any(final.iterdir()))
            if not replaceable:
                raise CheckpointExistsError(
                    "destination exists and is not a ckptkit checkpoint",
                    path=final,
                    hint="choose a new path, or move the existing data away; ckptkit never "
                    "deletes data it did not write",
                )
            if not overwrite and is_committed(final):
                raise CheckpointExistsError(
                    "a checkpoint already exists here",
                    path=final,
                    hint="pass overwrite=True to replace it, or save under a new step",
                )
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{final.name}{TMP_SUFFIX}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return cls(final=final, tmp=tmp, overwrite=overwrite)

    @classmethod
    def _create_in_place(cls, final: Location, *, overwrite: bool) -> PendingCheckpoint:
        files = [rel for rel, _ in fs.walk_files(final)]
        if MANIFEST_NAME in files:
            if not overwrite:
                raise CheckpointExistsError(
                    "a checkpoint already exists here",
                    path=fs.url(final),
                    hint="pass overwrite=True to replace it, or save under a new step",
                )
            fs.remove_file(final / MANIFEST_NAME)  # uncommit first: never a mixed checkpoint
        elif files and not all(_ours(rel) for rel in files):
            raise CheckpointExistsError(
                "destination holds objects that are not a ckptkit checkpoint",
                path=fs.url(final),
                hint="choose a new path, or move the existing data away; ckptkit never "
                "deletes data it did not write",
            )
        if files:
            fs.remove_tree(final)  # an interrupted save of ours, or the uncommitted old one
        return cls(final=final, tmp=final, overwrite=overwrite)

    def finalize(self, *, fsync: bool = True) -> None:
        """Commit: fsync the temporary directory, rename it into place, fsync the parent.

        The manifest must already be written and fsynced inside :attr:`tmp`. ``fsync=False``
        skips the flushes (tests of other things only: a crash may then lose the commit).
        On an object store the manifest, written last, was the commit: nothing to do.
        """
        if self.in_place:
            return
        assert isinstance(self.tmp, Path) and isinstance(self.final, Path)
        if fsync:
            for sub in sorted(p for p in self.tmp.rglob("*") if p.is_dir()):
                fsync_dir(sub)  # entries of subdirectories (DCP shards) must be durable too
            fsync_dir(self.tmp)
        old: Path | None = None
        if self.final.exists() and not self.overwrite:
            # Another writer committed here since create(): never replace it silently.
            self.abort()
            raise CheckpointExistsError(
                "a checkpoint appeared here while this one was being written",
                path=self.final,
                hint="two writers saved to the same path; save under a new step or pass "
                "overwrite=True",
            )
        if self.final.exists():
            # Keep the old checkpoint whole until the new one is in place.
            old = self.final.parent / f"{self.final.name}{OLD_SUFFIX}.{uuid.uuid4().hex[:8]}"
            os.rename(self.final, old)
        os.rename(self.tmp, self.final)
        crashpoints.reached("commit.renamed")
        if fsync:
            fsync_dir(self.final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        """Remove what this save wrote (the temporary directory, or on an object store the
        uncommitted files under :attr:`final`); never a committed checkpoint."""
        if self.in_place:
            if fs.kind(self.final / MANIFEST_NAME) != "file":
                fs.remove_tree(self.final)
            return
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(str(self.tmp))


def _ours(rel: str) -> bool:
    """Whether a file name inside a step prefix is one a ckptkit save writes."""
    head = rel.split("/", 1)[0]
    return rel.endswith((".safetensors", ".safetensors.zst")) or head == "dcp" or rel == MANIFEST_NAME


def leftovers(parent: Location) -> list[Location]:
    """List temporary directories of unfinished saves directly under ``parent``."""
    if fs.kind(parent) != "dir":
        return []
    return sorted(
        (p for p in parent.iterdir() if is_temporary(p) and fs.kind(p) == "dir"), key=str
    )


def unfinished_saves(ckpt: Location) -> list[Location]:
    """Temporary directories left by unfinished saves of checkpoint ``ckpt``: beside it
    (``NAME.ckptkit-tmp…``, ``NAME.ckptkit-old…``) and inside it.

    An object store has none: a save uploads to the final prefix (its manifest, written
    last, is the commit), so nothing is ever staged under another name there.
    """
    local = fs.local_path(ckpt)
    if local is None:
        return []
    found: list[Location] = [
        p for p in leftovers(local.parent) if p.name.startswith(local.name + ".")
    ]
    if local.is_dir():
        found += [p for p in local.rglob("*") if p.is_dir() and is_temporary(p)]
    return found


def move_tree(src: Location, dst: Location, *, remove: Callable[[Location], object]) -> None:
    """Move checkpoint ``src`` to ``dst`` whole, so that a crash never loses it.

    Local: one rename (same filesystem), then both parent directories synced. An object
    store has no rename: every object is copied first, then ``remove(src)`` deletes the
    original (the run's own deletion, which takes the manifest away first), so a crash
    leaves the checkpoint where it was (and maybe a partial copy), never neither.
    """
    local = fs.local_path(src)
    if local is None:
        fs.copy_tree(src, dst)
        remove(src)
        return
    d = Path(str(dst))
    d.parent.mkdir(parents=True, exist_ok=True)
    os.rename(local, d)
    fsync_dir(d.parent)
    fsync_dir(local.parent)
