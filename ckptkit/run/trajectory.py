"""This process's trajectory in a run: which checkpoints hold its state, and where it branched.

A run directory holds one line of training. A process continues it from the checkpoint it
restored; when that is not the newest one (``restore(ts, step=20)`` on a run holding 20,
30, 40, or a fallback past a damaged newest one) and it then saves, it trains another line
than the checkpoints newer than its restore point. :class:`Trajectory` keeps the two facts
that follow from that, for :class:`~ckptkit.CheckpointManager`:

* **which checkpoints hold this process's state** (:meth:`Trajectory.holds`): the one it
  restored last and each one it committed since, by name and manifest digest. A directory
  of the same step written by another line is not this state, whatever its name: the
  pre-emption guard saves unless the state is held (issue 23);
* **the branch point**: the first save past the restored step sets the newer checkpoints
  aside, whole, into ``.ckptkit-abandoned/branch-NNN-from-step-XXXXXXXX/``, before it
  commits (:meth:`Trajectory.branch`). Set aside, they are kept for a post-mortem but no
  longer listed, resumed, rotated or rolled back to, and their steps can be saved again. A
  crash between the two leaves the run at the restored step, never at a step of the
  abandoned line. Restoring without saving changes nothing (evaluating an old step does
  not supersede the newer ones).

This is the rule torchtitan and Orbax leave to the user (Orbax skips a save whose step is
not past the newest one); automatic recovery sets its abandoned line aside the same way
(:meth:`ckptkit.run.Run.set_aside`, under ``recovery-NNN/``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.collective import current
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.run import Run
from ckptkit.signals.recovery import ABANDONED
from ckptkit.storage import fs
from ckptkit.storage.fs import Location

log = logging.getLogger("ckptkit")

BRANCH = "branch"
"""Prefix of the folders of ``.ckptkit-abandoned/`` that branches set aside."""


class Trajectory:
    """What one manager knows of its own line of checkpoints (rank 0 knows the commits).

    Args:
        run: the run (:class:`ckptkit.run.Run`): its catalog is read, its ``good``
            statuses count as saved (``verified``; with the manager's
            ``verify_after_save=False``, ``committed`` too), and it sets checkpoints aside.
        join: waits for the manager's background work (a save's verify), so that
            :meth:`holds` sees the outcome of the last save.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp())
        >>> _ = mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=3))
        >>> mgr.trajectory.holds(3), mgr.trajectory.holds(4)
        (True, False)
    """

    def __init__(self, run: Run, *, join: Callable[[], None] | None = None) -> None:
        self.run = run
        self.catalog = run.catalog
        self.good = frozenset(run.good)
        self._join = join
        self._ours: dict[str, str] = {}
        """Checkpoint name -> manifest digest: the one restored last, each committed since."""
        self._branch_from: int | None = None
        """The step restored last, until a save past it sets aside what is newer."""

    def restored(self, name: str, manifest: mf.Manifest | None, step: int) -> None:
        """A restore took checkpoint ``name`` (of ``step``): the line starts again there."""
        self._ours = {name: manifest.digest} if manifest is not None else {}
        self._branch_from = step

    def committed(self, name: str, digest: str) -> None:
        """This process committed checkpoint ``name`` with this manifest digest."""
        self._ours[name] = digest

    def digest_of(self, step: int) -> str | None:
        """The manifest digest this process read or wrote for ``step`` (None: not its own)."""
        return self._ours.get(step_dir_name(step))

    def holds(self, step: int) -> bool:
        """Return whether the run holds, saved, the state this process has at ``step``.

        True only for the checkpoint this process restored last or one it committed
        since, while its manifest digest is the one it read or wrote (another writer may
        have replaced it) and its status is good (verified). A directory of that step from
        another line is not this state. Collective with several ranks: every rank calls
        it and gets rank 0's answer (rank 0 commits the manifests).
        """
        if self._join is not None:
            self._join()  # the last save's verify decides whether it counts
        coll = current()
        return bool(coll.broadcast(self._holds(step) if coll.rank == 0 else None))

    def _holds(self, step: int) -> bool:
        want = self.digest_of(step)
        if want is None:
            return False
        for c in self.catalog.list():
            if c.path.name == step_dir_name(step) and c.status in self.good:
                try:
                    return self.catalog.manifest(c.path)[1] == want
                except CkptkitError:
                    return False
        return False

    def branch(self, step: int) -> list[str]:
        """Before committing ``step`` (under the run lock): set aside what this save supersedes.

        Only the first save past the restored step branches; it sets aside every
        checkpoint newer than that step and points ``latest`` at the newest good one
        left. Returns the names set aside.

        Raises:
            OSError, CkptkitError: a move failed (the save must not commit then: the run
                would mix two lines).
        """
        base = self._branch_from
        if base is None or step <= base:
            return []
        newer = [c for c in self.catalog.list() if c.step > base]
        moved: list[str] = []
        if newer:
            dest = _branch_dir(self.catalog.root, base)
            moved = self.run.set_aside(newer, dest)
            log.warning(
                "ckptkit: this run restored %s and now saves step %d from it: %s of the "
                "abandoned trajectory set aside into %s (kept, never resumed or rotated)",
                step_dir_name(base),
                step,
                ", ".join(moved),
                f"{ABANDONED}/{dest.name}",
            )
        self._branch_from = None
        return moved


def _branch_dir(root: Location, base: int) -> Location:
    """A new ``.ckptkit-abandoned/branch-NNN-from-step-XXXXXXXX`` (NNN: one past any)."""
    parent = root / ABANDONED
    taken = [0]
    if fs.kind(parent) == "dir":
        for p in parent.iterdir():
            head, _, rest = p.name.partition("-")
            num = rest.split("-", 1)[0]
            if head == BRANCH and num.isascii() and num.isdigit():
                taken.append(int(num))
    return parent / f"{BRANCH}-{max(taken) + 1:03d}-from-{step_dir_name(base)}"


__all__ = ["BRANCH", "Trajectory"]
