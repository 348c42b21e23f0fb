"""The drill contract: environment variables through which ``ckptkit drill`` drives a script.

A training script that uses :class:`~ckptkit.CheckpointManager` and
:class:`~ckptkit.Recorder` becomes drillable by reading these variables once at start:

``CKPTKIT_DRILL_SAVE_AT=W``
    save a checkpoint exactly after step ``W`` (in addition to the script's own saves);
``CKPTKIT_DRILL_STOP_AT=S``
    stop after step ``S`` (overrides the script's own step budget);
``CKPTKIT_DRILL_SAVE_FINAL=1``
    also save a checkpoint after the stop step ``S``, in every run of the drill: the drill
    compares the reference's and the resumed run's final states, component by component
    (:meth:`DrillEnv.should_save` says so at ``S`` too, so a script that saves when it
    returns True needs no change);
``CKPTKIT_DRILL_RESUME_FROM=PATH``
    restore from this checkpoint (a ``step-NNNNNNNN`` directory, or a run directory whose
    newest checkpoint is meant) instead of the newest one of the script's own directory;
``CKPTKIT_CKPT_DIR=PATH`` (this run's own checkpoint directory), ``CKPTKIT_DEVICE``,
``CKPTKIT_THREADS`` and ``CKPTKIT_DRILL_ROLE`` (``reference`` / ``resumed``) are set by
``ckptkit drill`` too; a drill-ready script prefers them over its own flags.

``CKPTKIT_METRICS=PATH``
    the JSONL file the :class:`~ckptkit.Recorder` writes (read by the Recorder itself).

Steps are counted as optimizer steps *completed*: "after step W" means once the global
step counter reads W, which is also the label of the checkpoint and of the last record
logged before it.

Example:
    >>> env = DrillEnv.from_env({"CKPTKIT_DRILL_SAVE_AT": "15", "CKPTKIT_DRILL_STOP_AT": "30"})
    >>> env.should_save(15), env.should_save(16), env.should_stop(29), env.should_stop(30)
    (True, False, False, True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ckptkit.checkpoint.catalog import step_of
from ckptkit.errors import DrillError
from ckptkit.run.manager import CheckpointManager
from ckptkit.signals.recorder import ENV_METRICS
from ckptkit.storage import fs
from ckptkit.storage.fs import Location

if TYPE_CHECKING:
    from ckptkit.capture.state import RestoreResult, TrainState

ENV_SAVE_AT = "CKPTKIT_DRILL_SAVE_AT"
"""Save a checkpoint exactly after this step."""
ENV_STOP_AT = "CKPTKIT_DRILL_STOP_AT"
"""Stop after this step."""
ENV_SAVE_FINAL = "CKPTKIT_DRILL_SAVE_FINAL"
"""``1``: also save a checkpoint after the stop step (the drill's end-state comparison)."""
ENV_RESUME_FROM = "CKPTKIT_DRILL_RESUME_FROM"
"""Restore from this checkpoint directory instead of the newest one."""
ENV_CKPT_DIR = "CKPTKIT_CKPT_DIR"
"""This run's own checkpoint directory; a drill-ready script prefers it over its own flag."""
ENV_DEVICE = "CKPTKIT_DEVICE"
"""The device the drill asks for (``cpu``, ``cuda``)."""
ENV_THREADS = "CKPTKIT_THREADS"
"""The pinned intra-op thread count (also set as OMP_NUM_THREADS and MKL_NUM_THREADS)."""
ENV_ROLE = "CKPTKIT_DRILL_ROLE"
"""``reference`` or ``resumed``: which run of the drill this process is (informational)."""

ENV_VARS = (
    ENV_SAVE_AT,
    ENV_STOP_AT,
    ENV_SAVE_FINAL,
    ENV_RESUME_FROM,
    ENV_METRICS,
    ENV_CKPT_DIR,
    ENV_DEVICE,
    ENV_THREADS,
    ENV_ROLE,
)
"""Every variable of the contract, for runners that clear or forward them."""


@dataclass(frozen=True)
class DrillEnv:
    """The drill settings of this process (all None outside a drill)."""

    save_at: int | None = None
    """Save a checkpoint exactly after this step."""
    stop_at: int | None = None
    """Stop after this step (overrides the script's step budget)."""
    resume_from: Location | None = None
    """Restore from this checkpoint (or run) directory instead of the newest."""
    metrics: Path | None = None
    """The Recorder's JSONL file."""
    ckpt_dir: Path | None = None
    """This run's own checkpoint directory (prefer it over the script's flag)."""
    device: str | None = None
    """The device the drill asks for."""
    threads: int | None = None
    """The intra-op thread count every run of the drill uses."""
    role: str | None = None
    """``reference`` or ``resumed``."""
    save_final: bool = False
    """Also save after ``stop_at`` (the drill compares both runs' final states)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DrillEnv:
        """Read the contract from the environment (``os.environ`` by default).

        Empty values count as unset.

        Raises:
            DrillError: a step variable is not a non-negative integer.

        Example:
            >>> DrillEnv.from_env({}).save_at is None
            True
        """
        env = os.environ if environ is None else environ
        resume = env.get(ENV_RESUME_FROM) or None
        metrics = env.get(ENV_METRICS) or None
        ckpt_dir = env.get(ENV_CKPT_DIR) or None
        threads = _step(env, ENV_THREADS)
        return cls(
            save_at=_step(env, ENV_SAVE_AT),
            stop_at=_step(env, ENV_STOP_AT),
            save_final=env.get(ENV_SAVE_FINAL, "").strip() not in ("", "0"),
            resume_from=fs.location(resume) if resume else None,
            metrics=Path(metrics) if metrics else None,
            ckpt_dir=Path(ckpt_dir) if ckpt_dir else None,
            device=env.get(ENV_DEVICE) or None,
            threads=threads if threads else None,
            role=env.get(ENV_ROLE) or None,
        )

    @property
    def active(self) -> bool:
        """Whether any drill variable is set."""
        return any(v is not None for v in (self.save_at, self.stop_at, self.resume_from))

    def should_save(self, step: int) -> bool:
        """Whether the drill wants a checkpoint right after ``step``: the save step, and
        with ``save_final`` the stop step (the final state both runs are compared on).

        Example:
            >>> DrillEnv(save_at=3).should_save(3)
            True
            >>> env = DrillEnv(save_at=3, stop_at=6, save_final=True)
            >>> env.should_save(5), env.should_save(6), DrillEnv(stop_at=6).should_save(6)
            (False, True, False)
        """
        if self.save_at is not None and step == self.save_at:
            return True
        return self.save_final and self.stop_at is not None and step == self.stop_at

    def should_stop(self, step: int) -> bool:
        """Whether the drill wants the run to end after ``step``.

        Example:
            >>> DrillEnv(stop_at=3).should_stop(2)
            False
        """
        return self.stop_at is not None and step >= self.stop_at

    def total_steps(self, default: int) -> int:
        """The step to stop after: ``stop_at`` when set, else the script's ``default``.

        Example:
            >>> DrillEnv(stop_at=30).total_steps(200), DrillEnv().total_steps(200)
            (30, 200)
        """
        return self.stop_at if self.stop_at is not None else default

    def restore(
        self, state: TrainState, manager: CheckpointManager, *, strict: bool = True
    ) -> RestoreResult | None:
        """Restore ``state`` the way the drill asks.

        With ``resume_from`` set, restore that checkpoint (read-only: the script keeps
        saving into its own ``manager``); otherwise ``manager.restore(state)``.

        Returns:
            The restore result, or None for a fresh start (no checkpoint, no ``resume_from``).

        Raises:
            DrillError: ``resume_from`` does not exist.
            CkptkitError: the checkpoint cannot be restored.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
            >>> DrillEnv().restore(ts, ckptkit.CheckpointManager(tempfile.mkdtemp())) is None
            True
        """
        if self.resume_from is None:
            return manager.restore(state, strict=strict)
        path = self.resume_from
        if fs.kind(path) != "dir":
            raise DrillError(
                f"{ENV_RESUME_FROM} points at {path}, which is not a directory",
                path=path,
                hint="pass a step-NNNNNNNN checkpoint directory or a run directory",
            )
        # Read-only: the --from run belongs to someone else; restoring from it must not
        # clean, lock, re-point ``latest`` or record anything there.
        step = step_of(path.name)
        if step is not None:
            return CheckpointManager(path.parent, readonly=True).restore(state, step, strict=strict)
        return CheckpointManager(path, readonly=True).restore(state, strict=strict)


def _step(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise DrillError(
            f"{name}={raw!r} is not a step number",
            hint=f"set {name} to a non-negative integer (an optimizer step count)",
        )
    return value


__all__ = [
    "ENV_CKPT_DIR",
    "ENV_DEVICE",
    "ENV_RESUME_FROM",
    "ENV_ROLE",
    "ENV_SAVE_AT",
    "ENV_SAVE_FINAL",
    "ENV_STOP_AT",
    "ENV_THREADS",
    "ENV_VARS",
    "DrillEnv",
]
