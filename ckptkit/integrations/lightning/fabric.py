"""The Fabric side of the Lightning integration: verified saves, rotation and exact
resumes around ``fabric.save`` / ``fabric.load``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ckptkit.capture.state import TrainState
from ckptkit.format.records import GUARD_KEY
from ckptkit.integrations.drill_env import DrillEnv
from ckptkit.integrations.lightning.checkpoint_io import DRILL_PIN, CkptkitIO, local_dir
from ckptkit.integrations.lightning.extras import (
    STATE_KEY,
    capture_extras,
    restore_rng,
    restore_sampler,
    restore_watch,
)
from ckptkit.integrations.lightning.guard import lookahead, start_guard
from ckptkit.run import resume_target
from ckptkit.run.layouts.lightning import LightningLayout
from ckptkit.signals import guard as guard_mod
from ckptkit.signals.recorder import Recorder
from ckptkit.signals.stability import StabilityWatch
from ckptkit.storage import fs


class FabricCheckpoints:
    """Verified saves, rotation and exact resumes around ``fabric.save`` / ``fabric.load``.

    Installs :class:`CkptkitIO` as the Fabric strategy's ``CheckpointIO`` (unless one is
    there), names files ``step=N.ckpt`` in ``dirpath`` (``$CKPTKIT_CKPT_DIR`` in a drill),
    adds every rank's RNG and the data cursor to the saved state, and restores them.

    Args:
        fabric: the ``lightning.Fabric``.
        dirpath: the checkpoint directory.
        sampler: the data cursor (as for :class:`CkptkitCallback`).
        keep_last, keep_every, max_bytes: verified rotation after each save.
        watch: a :class:`~ckptkit.StabilityWatch` whose snapshot is saved as health.
        restore_rng: restore the RNG on resume.
        recorder: the :class:`~ckptkit.Recorder` of the loop's step records (bound to a
            ``TrainState``): the resume guard watches the first records after a resume.
        guard_k: how many next sample ids and first steps the resume guard checks (0 turns
            it off): each save records a look-ahead (:func:`lookahead`) of the saved
            ``model``/``optimizer``/``scheduler`` and the sampler, each resume compares
            the restored run with it (:attr:`guard`, :func:`start_guard`).

    Example:
        >>> import tempfile, torch, lightning as L
        >>> fabric = L.Fabric(accelerator="cpu", devices=1)
        >>> m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        >>> ck = FabricCheckpoints(fabric, tempfile.mkdtemp(), keep_last=2)
        >>> ck.save(5, {"model": m, "optimizer": opt, "step": 5}).name
        'step=5.ckpt'
        >>> ck.resume({"model": m, "optimizer": opt})["step"]
        5
        >>> ck.close()
    """

    def __init__(
        self,
        fabric: L.Fabric,
        dirpath: str | os.PathLike[str],
        *,
        sampler: Any = None,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        watch: StabilityWatch | None = None,
        restore_rng: bool = True,
        recorder: Recorder | None = None,
        guard_k: int = guard_mod.DEFAULT_K,
    ) -> None:
        self.fabric = fabric
        self.recorder = recorder
        self.guard_k = int(guard_k)
        self.guard: guard_mod.ResumeGuard | None = None
        """The resume guard of the last :meth:`resume` (its ``findings``); None before one."""
        self.env = DrillEnv.from_env()
        self.dir = local_dir(self.env.ckpt_dir if self.env.ckpt_dir is not None else dirpath,
                             "FabricCheckpoints dirpath")
        self.sampler = sampler
        self.watch = watch
        self.restore_rng = restore_rng
        io = fabric.strategy.checkpoint_io
        if not isinstance(io, CkptkitIO):
            io = CkptkitIO(keep_last=keep_last, keep_every=keep_every, max_bytes=max_bytes)
            fabric.strategy.checkpoint_io = io  # type: ignore[misc]
        self.io: CkptkitIO = io
        if fabric.is_global_zero:
            # The run lock now, before any step: a second live writer of this directory
            # is refused here (LockHeldError names the holder), not at its first save.
            io.run(self.dir)

    def path(self, step: int) -> Path:
        """The file of ``step`` (``step=N.ckpt``: the run layout reads the step from the name)."""
        return self.dir / f"step={step}.ckpt"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """``fabric.save`` of ``state`` plus RNG and data cursor; verified, then rotated.

        Call it on every rank (as ``fabric.save``).
        """
        full = dict(state)
        full[STATE_KEY] = capture_extras(self.sampler, watch=self.watch)
        self._add_lookahead(full[STATE_KEY], step, state)
        p = self.path(step)
        self.fabric.save(p, full)
        if self.env.should_save(step) and self.fabric.is_global_zero:
            self.io.run(self.dir).pin(p, DRILL_PIN)  # rotation must not take it first
        return p

    def should_save(self, step: int) -> bool:
        """Whether the drill asks for a checkpoint after ``step`` (``CKPTKIT_DRILL_SAVE_AT``)."""
        return self.env.should_save(step)

    def latest(self) -> Path | None:
        """The checkpoint to resume from (None: a fresh start): the newest complete state,
        adopted on the spot when a kill came between ``fabric.save`` and its adoption;
        every newer one passed over is named in a warning. Rank 0 chooses, every rank gets
        its choice (:func:`ckptkit.run.resume_target`; call it on every rank).

        Raises:
            CkptkitError: the newest complete file's step is unknown (the fix named).
        """
        run = self.io.run(self.dir) if self.fabric.is_global_zero else None
        chosen = resume_target(self.dir, LightningLayout(), run=run)
        return None if chosen.path is None else fs.require_local(
            chosen.path, needs="FabricCheckpoints"
        )

    def resume(self, state: dict[str, Any], path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """Verify and load the checkpoint to resume from into ``state``; restore RNG and cursor.

        ``path`` defaults to ``$CKPTKIT_DRILL_RESUME_FROM`` in a drill, else the newest
        complete state of the directory, adopted on the spot; newer ones passed over are
        named (:meth:`latest`). Returns what ``fabric.load`` returns (the remainder:
        ``step`` and the like), or None for a fresh start.

        Raises:
            IntegrityError: the file fails its verify (never loaded).
            CkptkitError: the newest complete file's step is unknown (no adopted manifest):
                it is never resumed with the step counter at 0; the message names the fix.
        """
        if path is None:
            src = self.env.resume_from if self.env.resume_from is not None else self.latest()
            path = None if src is None else str(src)
        if path is None:
            return None
        remainder = self.fabric.load(Path(path), state)
        extras = remainder.pop(STATE_KEY, None) or {}
        restore_sampler(self.sampler, extras)
        restore_watch(self.watch, extras, where=str(path))
        if self.restore_rng:
            restore_rng(extras)
        self._start_guard(extras, state, remainder)
        return remainder

    def close(self) -> None:
        """Release the run lock."""
        self.io.teardown()

    # the resume guard ------------------------------------------------------------------

    def _guarded(self, state: Mapping[str, Any]) -> TrainState | None:
        """A TrainState of the objects in the saved ``state`` dict, for the guard only
        (no recorder: the loop's own TrainState keeps its binding)."""
        model = state.get("model")
        if self.guard_k <= 0 or not isinstance(model, torch.nn.Module):
            return None
        opt = state.get("optimizer")
        return TrainState(
            model=model,
            optimizer=opt if hasattr(opt, "param_groups") else None,
            scheduler=state.get("scheduler"),
            guard_k=self.guard_k,
        )

    def _add_lookahead(self, extras: dict[str, Any], step: int, state: Mapping[str, Any]) -> None:
        ts = self._guarded(state)
        if ts is not None:  # right after capture_extras: the RNG is the one it captured
            extras[GUARD_KEY] = lookahead(ts, step=step, sampler=self.sampler,
                                                    k=self.guard_k)

    def _start_guard(
        self, extras: Mapping[str, Any], state: Mapping[str, Any], remainder: Mapping[str, Any]
    ) -> None:
        saved = extras.get(GUARD_KEY)
        ts = self._guarded(state)
        if ts is None or not isinstance(saved, Mapping):
            return
        step = state.get("step", remainder.get("step"))
        if not isinstance(step, int) or isinstance(step, bool):
            # The step is not in the saved dict: the guard checks everything but it.
            nxt = saved.get("next_step")
            step = nxt - 1 if isinstance(nxt, int) and not isinstance(nxt, bool) else 0
        self.guard = start_guard(saved, ts, step=step, sampler=self.sampler,
                                 recorder=self.recorder)

