"""Emergency checkpoints: when the manager saves and pins one on a warning, and the save.

:class:`EmergencyPolicy` is pure bookkeeping over the watch's
:class:`~ckptkit.signals.verdicts.Verdict` stream, no I/O; :func:`emergency_checkpoint`
saves (or pins) the checkpoint when the policy makes one due.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.collective import any_true, current
from ckptkit.signals.verdicts import RANK, Level, Verdict
from ckptkit.storage.fs import Location

if TYPE_CHECKING:
    from ckptkit.capture.state import TrainState
    from ckptkit.signals.recovery import Host

log = logging.getLogger("ckptkit")


@dataclass
class EmergencyPolicy:
    """When the checkpoint manager saves and pins an emergency checkpoint.

    On the first step of an episode that reaches ``on`` (default ``warn``, so also
    ``critical``), at most once per ``min_interval_steps``. Pure bookkeeping, no I/O:
    :meth:`CheckpointManager.observe` asks :meth:`should_save` and calls :meth:`saved`.

    Example:
        >>> p = EmergencyPolicy(min_interval_steps=100)
        >>> p.should_save(Verdict("warn", [], 10)), p.saved(10)
        (True, None)
        >>> p.should_save(Verdict("ok", [], 11)), p.should_save(Verdict("warn", [], 50))
        (False, False)
    """

    enabled: bool = True
    """False: never save an emergency checkpoint."""
    min_interval_steps: int = 500
    """Rate limit: steps between two emergency saves."""
    pin: str = "emergency"
    """Pin label of the emergency checkpoint (rotation never deletes a pinned one)."""
    on: Level = "warn"
    """The lowest level that triggers a save."""
    last_saved_step: int | None = None
    """Step of the last emergency save."""
    _prev: Level = field(default="ok", repr=False)

    def should_save(self, verdict: Verdict) -> bool:
        """Return True when this verdict starts an episode that deserves an emergency save."""
        prev, self._prev = self._prev, verdict.level
        if not self.enabled or RANK[verdict.level] < RANK[self.on]:
            return False
        if RANK[prev] >= RANK[self.on]:
            return False  # not the first step of the episode
        return (
            self.last_saved_step is None
            or verdict.step - self.last_saved_step >= self.min_interval_steps
        )

    def saved(self, step: int) -> None:
        """Record that an emergency checkpoint was saved at ``step``."""
        self.last_saved_step = step

    def rewind(self, step: int) -> None:
        """Forget what happened after ``step`` (the run was rolled back to it).

        The next warning starts a new episode, and a save after ``step`` no longer
        rate-limits the next one.

        Example:
            >>> p = EmergencyPolicy(); _ = p.should_save(Verdict("warn", [], 80)); p.saved(80)
            >>> p.rewind(50); p.last_saved_step, p.should_save(Verdict("warn", [], 60))
            (None, True)
        """
        self._prev = "ok"
        if self.last_saved_step is not None and self.last_saved_step > step:
            self.last_saved_step = None


def emergency_checkpoint(host: Host, state: TrainState, verdict: Any = None) -> Location | None:
    """Save and pin an emergency checkpoint when the stability verdict makes one due.

    :meth:`CheckpointManager.observe <ckptkit.CheckpointManager.observe>`: collective with
    several ranks (they agree to save when any rank's verdict is due). ``verdict`` defaults
    to ``host.watch.last``; :class:`~ckptkit.signals.emergency.EmergencyPolicy` (``host.emergency``)
    says when one is due. A state the run holds saved already (``trajectory.holds``) is
    pinned instead of saved again.

    Returns:
        The emergency checkpoint's directory, or None when nothing was saved.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> from ckptkit.signals.stability import StabilityWatch
        >>> w = StabilityWatch()
        >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), watch=w)
        >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=7)
        >>> mgr.observe(ts) is None  # the watch has seen nothing wrong
        True
        >>> _ = w.update(7, loss=float("nan"))
        >>> mgr.observe(ts).name, mgr.list()[0].pins
        ('step-00000007', ('emergency',))
    """
    v = verdict if verdict is not None else (host.watch.last if host.watch else None)
    policy = host.emergency
    due = v is not None and policy is not None and policy.should_save(v)
    if policy is None or not any_true(current(), due):  # agreed: one rank may degrade alone
        return None
    host.wait()  # a save of this very step may still be settling
    if host.trajectory.holds(state.step):
        path = host.root / step_dir_name(state.step)
        if current().rank == 0:  # the lock holder; holds() agreed on every rank
            host.run.pin(path, policy.pin)
    else:
        path = host.save(state, pin=policy.pin)
    policy.saved(state.step)
    log.warning("ckptkit: emergency checkpoint %s (%s)", path.name,
                v.summary() if v is not None else "another rank's watch warned")
    return path


__all__ = ["EmergencyPolicy", "emergency_checkpoint"]
