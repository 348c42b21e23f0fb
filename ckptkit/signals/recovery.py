"""Automatic recovery from a training collapse (opt-in): roll back, act, continue, in step.

A :class:`RecoveryPolicy` given to :class:`~ckptkit.CheckpointManager` (``recovery=``, with
a ``watch=``) makes :meth:`CheckpointManager.recover` act on the
:class:`~ckptkit.signals.stability.StabilityWatch`'s verdicts. Called once per step after the
step's metrics were logged, it does nothing until the verdict is ``critical`` (or has been
``warn`` or worse for ``warn_steps`` consecutive steps); then, on every rank together:

1. **decide once**: every rank says whether its own watch fired (one small all-reduce per
   step; the identity for one process), rank 0 checks the limits against the run's
   recoveries log and broadcasts the decision. A refusal is recorded, then every rank
   raises :class:`~ckptkit.errors.RecoveryError` (``CK-D010``): never a loop;
2. **restore** the newest healthy checkpoint in-process (``restore(healthy=True)``, which
   :func:`ckptkit.run.rotation.choose_rollback` picks; every rank restores the same step: the
   choice is rank 0's listing, broadcast);
3. **set aside** the checkpoints newer than it (the abandoned trajectory: its warn/critical
   checkpoints, the pinned emergency one) into ``.ckptkit-abandoned/recovery-NNN/`` of the
   run directory: kept for the post-mortem, no longer listed, restored or rotated, and the
   replayed steps save again under their names;
4. **rewind the watch** to the copy taken when this process saved that checkpoint (so the
   resumed run is judged against the healthy baseline at once; without a copy, e.g. a
   checkpoint of an earlier process, the watch is reset and re-warms), and the emergency
   policy and the Recorder's in-memory window with it;
5. **act**: scale the LR (``lr_factor`` times the scale in effect when the collapse was
   detected: param groups and the scheduler's base LRs, so later checkpoints carry it),
   tighten clipping (``clip_factor``; the loop reads :meth:`AutoRecovery.clip_norm`), skip
   the batch window since the first warning (``skip``), call the user's ``callback``;
6. **record** it (which checkpoint, which signals, which actions, which sample ids were
   skipped, how long it took) in the run's recoveries log ``.ckptkit-recoveries.json``,
   written by rank 0 under the run lock, and in every later manifest (``recoveries``); and
   ``ckptkit ls`` / ``ckptkit rollback`` show it.

Skipping uses the data cursor (the ``TrainState``'s sampler ``state_dict`` /
``load_state_dict``): with ``skip="warning"`` the replay trains again on the batches up to
the first warning, and at that step the cursor jumps to where it stood at the detection,
so the batches seen during the warning episode are not trained on again; ``"checkpoint"``
skips every batch since the restored checkpoint (no replay at all); ``"none"`` replays
them. With a :class:`~ckptkit.ResumableSampler` the skipped ``(epoch, sample id)`` pairs of
every rank are recorded.

Example:
    >>> import tempfile, torch, ckptkit
    >>> from ckptkit.signals.stability import StabilityWatch
    >>> model = torch.nn.Linear(2, 2)
    >>> ts = ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    >>> watch = StabilityWatch(warmup=0, window=16, recent=8)  # judges from step 16 on
    >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), watch=watch,
    ...                                 recovery=RecoveryPolicy(lr_factor=0.5))
    >>> for step in range(1, 21):
    ...     _ = watch.update(step, loss=1.0 + 0.01 * (step % 3))
    >>> ts.step = 20; _ = mgr.save(ts)       # health ok: a checkpoint recovery may return to
    >>> ts.step = 21; _ = watch.update(21, loss=float("nan"))
    >>> event = mgr.recover(ts)
    >>> event.step, ts.step, ts.optimizer.param_groups[0]["lr"]
    (20, 20, 0.05)
    >>> mgr.close()
"""

from __future__ import annotations

import builtins
import copy
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ckptkit import codes
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.collective import Collective, any_true, consensus, current
from ckptkit.errors import CkptkitError
from ckptkit.format.records import Health, Recoveries, Recovery
from ckptkit.signals.emergency import EmergencyPolicy
from ckptkit.signals.recovery_log import (
    LOG,
    LOG_VERSION,
    describe,
    iter_records,
    read_log,
    write_log,
)
from ckptkit.signals.stability import StabilityWatch
from ckptkit.storage.fs import Location

if TYPE_CHECKING:
    from ckptkit.capture.state import RestoreResult, TrainState

log = logging.getLogger("ckptkit")

ABANDONED = ".ckptkit-abandoned"
"""Where a recovery sets aside the checkpoints of the trajectory it abandons."""
MANIFEST_IDS = 4096
"""Skipped sample ids carried in a manifest's record at most (all of them are in the log)."""
_WATCH_COPIES = 16
"""Watch copies kept, one per healthy checkpoint saved by this process (the newest)."""

SkipMode = Literal["warning", "checkpoint", "none"]


@dataclass(frozen=True)
class RecoveryContext:
    """What a user ``callback`` is given, on every rank, after the built-in actions."""

    state: TrainState
    """The restored training state (change it in place: an extra LR cut, a data filter)."""
    record: Mapping[str, Any]
    """The recovery so far: trigger, restored checkpoint, built-in actions (read-only)."""
    rank: int
    world_size: int
    n: int
    """Which recovery of the run this is (1-based)."""


@dataclass(frozen=True)
class RecoveryPolicy:
    """When to recover automatically, how, and how often at most (off unless given).

    Args:
        critical: recover on a ``critical`` verdict of the watch.
        warn_steps: also recover once the verdict has been ``warn`` or worse for this many
            consecutive steps (None: only on ``critical``).
        lr_factor: multiply the LR in effect at the detection by this (None: leave it).
        clip_factor: multiply the clip norm in effect by this; the loop clips with
            ``mgr.recovery.clip_norm(base)`` (None: leave it).
        skip: ``"warning"``: do not train again on the batches seen since the first warning
            (the cursor jumps over them when the replay reaches that step);
            ``"checkpoint"``: not on any batch since the restored checkpoint;
            ``"none"``: replay every batch.
        callback: ``fn(RecoveryContext) -> dict | None``, called on every rank after the
            built-in actions; what rank 0's returns (JSON-able) is recorded.
        max_recoveries: recoveries allowed in the run directory (counted in its log, across
            restarts); the next trigger stops the run with ``CK-D010``.
        min_steps_between: a trigger fewer than this many steps after the step the last
            recovery restored stops the run with ``CK-D010`` (the recovery did not help).
        max_recorded_ids: skipped sample ids recorded per rank at most.

    Example:
        >>> RecoveryPolicy(lr_factor=0.3, clip_factor=0.3, max_recoveries=2).skip
        'warning'
    """

    critical: bool = True
    warn_steps: int | None = None
    lr_factor: float | None = 0.3
    clip_factor: float | None = 0.3
    skip: SkipMode = "warning"
    callback: Callable[[RecoveryContext], Mapping[str, Any] | None] | None = None
    max_recoveries: int = 3
    min_steps_between: int = 50
    max_recorded_ids: int = 100_000

    def __post_init__(self) -> None:
        if not self.critical and self.warn_steps is None:
            raise ValueError("RecoveryPolicy: nothing triggers it (critical=False, warn_steps=None)")
        if self.warn_steps is not None and self.warn_steps < 1:
            raise ValueError(f"RecoveryPolicy: warn_steps must be >= 1, got {self.warn_steps}")
        for name in ("lr_factor", "clip_factor"):
            f = getattr(self, name)
            if f is not None and not 0.0 < f <= 1.0:
                raise ValueError(f"RecoveryPolicy: {name} must be in (0, 1], got {f}")
        if self.skip not in ("warning", "checkpoint", "none"):
            raise ValueError(f"RecoveryPolicy: skip must be warning/checkpoint/none, not {self.skip!r}")
        if self.max_recoveries < 1 or self.min_steps_between < 0 or self.max_recorded_ids < 0:
            raise ValueError(
                "RecoveryPolicy: need max_recoveries >= 1, min_steps_between >= 0, "
                "max_recorded_ids >= 0"
            )

    def describe(self) -> dict[str, Any]:
        """Return the policy as recorded with each recovery (JSON-able): its fields in
        order but ``max_recorded_ids``, the callback by its qualified name."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "max_recorded_ids"}
        out["callback"] = getattr(self.callback, "__qualname__", None) if self.callback else None
        return out


@dataclass(frozen=True)
class RecoveryEvent:
    """What :meth:`CheckpointManager.recover` did this step (it returns None otherwise).

    After one, the state and the data cursor changed under the loop: create data iterators
    again (``ResumableSampler.batches(loader)``, ``iter(loader)``) before the next batch.
    """

    kind: Literal["restored", "skipped"]
    """``restored``: rolled back to ``step``; ``skipped``: the data cursor jumped."""
    step: int
    """The training state's step after the event."""
    record: Mapping[str, Any]
    """The recovery's record, as written to the run's log."""


class Saved(Protocol):
    """The run's saved trajectory, as far as an emergency checkpoint asks about it."""

    def holds(self, step: int) -> bool:
        """Whether the run already holds a checkpoint of ``step`` on its current trajectory."""
        ...


class RunRecords(Protocol):
    """What the recovery changes in the run's records (:class:`ckptkit.run.Run` is one)."""

    def may_record(self) -> AbstractContextManager[bool]:
        """Yield whether this process may change the run's records (it holds the run lock,
        or took it for the block because no other writer runs)."""
        ...

    def checkpoints(self) -> Sequence[CheckpointInfo]:
        """Every checkpoint of the run, oldest first, with its status."""
        ...

    def pin(self, path: Location, label: str) -> None:
        """Pin a checkpoint as the run's writer (rotation never deletes it)."""
        ...

    def set_aside(self, infos: Collection[CheckpointInfo], dest: Location) -> list[str]:
        """Move checkpoints out of the run into ``dest``, whole, and re-point ``latest``."""
        ...


class Host(Protocol):
    """What the recovery and the emergency checkpoint need of a run's manager.

    Public members only (:class:`~ckptkit.CheckpointManager` is one): the run's records are
    changed through its :attr:`run` (:class:`RunRecords`), never by reaching into its
    catalog or its lock.
    """

    root: Location
    watch: Any
    emergency: EmergencyPolicy | None

    @property
    def trajectory(self) -> Saved:
        """The run's saved trajectory (read-only here)."""
        ...

    def save(
        self, state: TrainState, step: int | None = None, *, pin: str | Iterable[str] | None = None
    ) -> Location: ...

    def wait(self) -> None: ...

    def restore(
        self, state: TrainState, step: int | None = None, *, strict: bool = True,
        healthy: bool = False,
    ) -> RestoreResult | None: ...

    @property
    def run(self) -> RunRecords:
        """The run's records: changed only through it, under its lock."""
        ...


class AutoRecovery:
    """A :class:`RecoveryPolicy` at work on one manager (``mgr.recovery``).

    Attributes:
        lr_scale: the LR scale the recoveries in this state's history left in effect.
        clip_scale: the clip-norm scale in effect (read through :meth:`clip_norm`).
        history: the records of those recoveries (carried in every later manifest).
    """

    def __init__(self, policy: RecoveryPolicy, host: Host) -> None:
        if not isinstance(host.watch, StabilityWatch):
            raise ValueError(
                "CheckpointManager(recovery=...) needs watch=StabilityWatch(...): the "
                "recovery acts on its verdicts"
            )
        self.policy = policy
        self.host = host
        self.lr_scale = 1.0
        self.clip_scale = 1.0
        self.history: list[dict[str, Any]] = []
        self._pending: dict[str, Any] | None = None
        """A data skip still due: ``{n, at_step, to}`` (``to``: this rank's target cursor)."""
        self._pending_all: dict[str, Any] | None = None
        """The same with every rank's target cursor (what a manifest carries)."""
        self._seen: Any = None
        self._streak = 0
        self._watch_copies: dict[int, dict[str, Any]] = {}
        self._clip_read = False
        self._from_ckpt: Recoveries | None = None
        self._restoring = False

    # --- what the loop reads -------------------------------------------------------------

    def clip_norm(self, base: float) -> float:
        """The clip norm to use: ``base`` times the clip-norm scale the recoveries left.

        Example:
            >>> import tempfile, ckptkit
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), watch=StabilityWatch(),
            ...                                 recovery=RecoveryPolicy())
            >>> mgr.recovery.clip_norm(1.0)
            1.0
        """
        self._clip_read = True
        return float(base) * self.clip_scale

    # --- manager hooks -------------------------------------------------------------------

    def on_save(self, step: int, health: Mapping[str, Any] | None) -> dict[str, Any]:
        """Manifest fields for a save of ``step`` (``recoveries``), and keep a watch copy.

        Called on every rank by :meth:`CheckpointManager.save` before the capture.
        """
        h = Health.of(health)
        if h is not None and h.healthy:
            self._watch_copies[int(step)] = self.host.watch.state_dict()
            for old in sorted(self._watch_copies)[:-_WATCH_COPIES]:
                del self._watch_copies[old]
        if not self.history:
            return {}
        out = Recoveries(
            count=len(self.history),
            lr_scale=self.lr_scale,
            clip_scale=self.clip_scale,
            history=tuple(_compact(r) for r in self.history),
            pending_skip=self._pending_all,
        )
        return {"recoveries": out.to_dict()}

    def on_restore(self, result: RestoreResult) -> None:
        """Take the recovery history of the restored checkpoint (every restore calls it).

        A restore at the start of a process continues the history the checkpoint carries:
        the scales in effect, the records, a data skip still due. Inside a recovery only
        the checkpoint's scales are noted (the recovery computes the new ones).
        """
        man = result.manifest
        # Checked by verify first (CK-S031: restore skips such a checkpoint); a reader
        # that reaches here without it gets the same error, never a TypeError later.
        rec = Recoveries.read(getattr(man, "recoveries", None), path=result.path)
        self._from_ckpt = rec
        self._seen, self._streak = self.host.watch.last, 0
        if self._restoring:
            return
        self.lr_scale = rec.lr_scale if rec is not None else 1.0
        self.clip_scale = rec.clip_scale if rec is not None else 1.0
        self.history = [dict(r) for r in rec.history] if rec is not None else []
        self._pending = self._pending_all = None
        if rec is not None and rec.pending_skip is not None:
            self._arm(rec.pending_skip, current())

    # --- the step ------------------------------------------------------------------------

    def check(self, state: TrainState) -> RecoveryEvent | None:
        """Act on the newest verdict (see the module docstring); collective when multi-rank.

        Call once per step on every rank, after the step's metrics reached the watch (and
        after :meth:`CheckpointManager.observe`); ``mgr.recover(state)`` calls it.

        Returns:
            The event when ``state`` was rolled back or its data cursor jumped (create data
            iterators again before the next batch), else None.

        Raises:
            RecoveryError: a limit refused the recovery (``CK-D010``) or it failed
                (``CK-D011``); recorded in the run first, raised on every rank.
        """
        coll = current()
        event: RecoveryEvent | None = None
        if self._pending is not None and state.step >= int(self._pending["at_step"]):
            event = self._skip_now(state, coll)
        local = self._local_trigger(coll.rank)
        if not any_true(coll, local is not None):
            return event
        return self._recover(state, coll, local)

    def _local_trigger(self, rank: int) -> dict[str, Any] | None:
        watch: StabilityWatch = self.host.watch
        v = watch.last
        if v is None or v is self._seen:
            return None
        self._seen = v
        if v.level == "ok":
            self._streak = 0
            return None
        self._streak += 1
        p = self.policy
        if p.critical and v.level == "critical":
            reason = "critical verdict"
        elif p.warn_steps is not None and self._streak >= p.warn_steps:
            reason = f"warn or worse for {self._streak} consecutive steps"
        else:
            return None
        signals = {name: s.to_dict() for name, s in sorted(watch.episode_signals.items())}
        for s in v.signals:
            if s.name != "episode":
                signals[s.name] = s.to_dict()
        return {
            "rank": rank,
            "step": v.step,
            "level": v.level,
            "reason": reason,
            "episode_start": watch.episode_start,
            "signals": signals,
            "summary": v.summary(),
        }

    # --- one recovery --------------------------------------------------------------------

    def _recover(
        self, state: TrainState, coll: Collective, local: dict[str, Any] | None
    ) -> RecoveryEvent:
        t0 = time.perf_counter()
        p = self.policy
        detect = int(state.step)
        triggers = [t for t in coll.all_gather(local) if t is not None]
        decision = coll.broadcast(self._decide(detect) if coll.rank == 0 else None)
        n = int(decision["n"])
        first_warn = min(int(t["episode_start"] or t["step"]) for t in triggers)
        record: dict[str, Any] = {
            "n": n,
            "time": decision["time"],
            "detected_at": detect,
            "trigger": {
                "reason": triggers[0]["reason"],
                "level": max((t["level"] for t in triggers), key=("warn", "critical").index),
                "ranks": [t["rank"] for t in triggers],
                "first_warning_step": first_warn,
                "signals": _merged_signals(triggers),
                "summary": triggers[0]["summary"],
            },
            "policy": p.describe(),
            "world_size": coll.world_size,
        }
        if not decision["ok"]:
            record["refused"] = decision["why"]
            self._write(coll, lambda data: data["refusals"].append(record))
            raise codes.error(
                codes.D010,
                f"automatic recovery #{n} at step {detect} refused: {decision['why']} "
                f"({triggers[0]['summary']})",
                path=self.host.root,
            )
        before = _cursor(state)
        live = (self.lr_scale, self.clip_scale, list(self.history))
        t_restore = time.perf_counter()
        self._restoring = True
        try:
            result = self.host.restore(state, healthy=True)
        except CkptkitError as e:
            self._fail(coll, record, f"no healthy checkpoint could be restored: {e}", e)
        finally:
            self._restoring = False
        if result is None or result.step >= detect:
            got = "none" if result is None else f"step {result.step}"
            self._fail(coll, record, f"the healthy checkpoint ({got}) is not before step {detect}")
        assert result is not None
        restore_s = time.perf_counter() - t_restore
        restored = int(result.step)
        record["restored"] = {
            "step": restored,
            "checkpoint": getattr(result.path, "name", str(result.path)),
            "notes": [n for n in result.notes if "healthy=True" in n],
        }
        record["steps_lost"] = detect - restored
        self._rewind(state, restored)
        t_aside = time.perf_counter()
        aside: Any = None
        if coll.rank == 0:
            try:
                aside = {"ok": self._set_aside(restored, n)}
            except (CkptkitError, OSError) as e:
                aside = {"error": f"{type(e).__name__}: {e}"}
        aside = coll.broadcast(aside)
        if "error" in aside:
            self._fail(coll, record, f"could not set aside the abandoned checkpoints: {aside['error']}")
        record["abandoned"] = aside["ok"]
        set_aside_s = time.perf_counter() - t_aside
        err: BaseException | None = None
        actions: dict[str, Any] = {}
        try:
            actions = self._act(
                state, coll, n=n, detect=detect, restored=restored, first_warn=first_warn,
                live=live, before=before,
            )
        except BaseException as e:  # shared below: every rank stops together
            err = e
        try:
            consensus(coll, err, what=f"automatic recovery #{n}")
        except BaseException as e:
            self._fail(coll, record, f"a recovery action failed: {e}", e)
        record["actions"] = actions
        if p.callback is not None:
            cb: Any = None
            err = None
            try:
                cb = p.callback(RecoveryContext(state, record, coll.rank, coll.world_size, n))
            except BaseException as e:
                err = e
            try:
                consensus(coll, err, what=f"the recovery callback of recovery #{n}")
            except BaseException as e:
                self._fail(coll, record, f"the recovery callback failed: {e}", e)
            actions["callback"] = _jsonable(dict(cb)) if isinstance(cb, Mapping) else None
        self._guard_expects(result, state)
        record["timing"] = {
            "detect_to_resume_s": round(time.perf_counter() - t0, 4),
            "restore_s": round(restore_s, 4),
            "set_aside_s": round(set_aside_s, 4),
        }
        self.history.append(record)
        self._write(coll, lambda data: data["recoveries"].append(record))
        if self._pending is not None and state.step >= int(self._pending["at_step"]):
            self._skip_now(state, coll)  # skip="checkpoint": nothing to replay first
        log.warning("ckptkit: %s", describe(record))
        return RecoveryEvent("restored", int(state.step), record)

    def _decide(self, detect: int) -> dict[str, Any]:
        """Rank 0: is one more recovery allowed (the run's log, across restarts)?"""
        try:
            data = read_log(self.host.root, strict=True)
        except CkptkitError as e:
            return {
                "ok": False,
                "n": 0,
                "time": time.time(),
                "why": f"the recoveries log cannot be read ({e.what})",
            }
        done = data["recoveries"]
        n = len(done) + 1
        p = self.policy
        if len(done) >= p.max_recoveries:
            return {
                "ok": False,
                "n": n,
                "time": time.time(),
                "why": f"{len(done)} recoveries already in this run (max_recoveries="
                f"{p.max_recoveries}); the instability keeps coming back",
            }
        last = Recovery.from_dict(done[-1]) if done else None  # checked by read_log
        step = last.restored.get("step") if last is not None else None
        if last is not None and isinstance(step, int):
            since = detect - step
            if since < p.min_steps_between:
                return {
                    "ok": False,
                    "n": n,
                    "time": time.time(),
                    "why": f"only {since} steps after recovery #{last.n} restored step "
                    f"{step} (min_steps_between={p.min_steps_between}): "
                    "the recovery did not help",
                }
        return {"ok": True, "n": n, "time": time.time()}

    def _fail(
        self, coll: Collective, record: dict[str, Any], why: str, cause: BaseException | None = None
    ) -> None:
        record["failed"] = why
        self._write(coll, lambda data: data["refusals"].append(record))
        raise codes.error(
            codes.D011, f"automatic recovery #{record['n']} at step {record['detected_at']} "
            f"failed: {why}", path=self.host.root
        ) from cause

    def _rewind(self, state: TrainState, restored: int) -> None:
        """Watch, emergency policy and Recorder window back to the restored step."""
        watch: StabilityWatch = self.host.watch
        saved = self._watch_copies.get(restored)
        if saved is not None:
            watch.load_state_dict(saved, where=f"this process's copy of step {restored}")
        for s in [s for s in self._watch_copies if s > restored]:
            del self._watch_copies[s]
        self._seen, self._streak = watch.last, 0
        if self.host.emergency is not None:
            self.host.emergency.rewind(restored)
        records = getattr(state.recorder, "records", None)
        if isinstance(records, deque):
            while records and int(records[-1].get("step", -1)) > restored:
                records.pop()

    def _act(
        self,
        state: TrainState,
        coll: Collective,
        *,
        n: int,
        detect: int,
        restored: int,
        first_warn: int,
        live: tuple[float, float, list[dict[str, Any]]],
        before: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The built-in actions on this rank (the same decisions on every rank)."""
        p = self.policy
        live_lr, live_clip, live_history = live
        ckpt_lr = self._from_ckpt.lr_scale if self._from_ckpt is not None else 1.0
        # The new scales are relative to what was in effect when the collapse came (so a
        # second recovery lowers further even when it restores the same checkpoint); the
        # restored state carries its own scale, so the optimizer gets the ratio.
        new_lr = live_lr * (p.lr_factor or 1.0)
        lr = scale_lr(state, new_lr / ckpt_lr)
        self.lr_scale = new_lr if lr["applied"] else ckpt_lr
        self.clip_scale = live_clip * (p.clip_factor or 1.0)
        # Every recovery whose factors are compounded into the scales stays in the history.
        self.history = [dict(r) for r in live_history]
        actions: dict[str, Any] = {
            "lr": {"factor": p.lr_factor, "scale": self.lr_scale, **lr},
            "clip": {
                "factor": p.clip_factor,
                "scale": self.clip_scale,
                "read_by_loop": self._clip_read,
            },
        }
        if p.clip_factor is not None and not self._clip_read:
            log.warning(
                "ckptkit: recovery: the loop never read mgr.recovery.clip_norm(base), so the "
                "tightened clip norm (x%g) has no effect", self.clip_scale
            )
        skip: dict[str, Any] = {"mode": p.skip, "status": "none"}
        self._pending = self._pending_all = None
        if p.skip != "none":
            at = restored if p.skip == "checkpoint" else max(first_warn - 1, restored)
            skip.update(at_step=at, from_step=at + 1, to_step=detect)
            cursors = coll.all_gather(_jsonable(before))
            if any(c is None for c in cursors):
                skip["status"] = "impossible"
                skip["why"] = (
                    "a rank's sampler has no JSON-able state_dict(), or the TrainState has no "
                    "sampler: the data cursor cannot jump"
                )
            else:
                self._arm({"n": n, "at_step": at, "to": dict(enumerate(cursors))}, coll)
                skip["status"] = "pending"
        actions["skip"] = skip
        return actions

    def _arm(self, pend: Mapping[str, Any], coll: Collective) -> None:
        """Schedule a data skip: at step ``at_step`` the cursor jumps to this rank's ``to``."""
        to = {str(k): v for k, v in dict(pend.get("to") or {}).items()}
        mine = to.get(str(coll.rank))
        if len(to) != coll.world_size:
            log.warning(
                "ckptkit: recovery #%s: a data skip was due at step %s, saved at world size %d; "
                "dropped at world size %d", pend.get("n"), pend.get("at_step"), len(to),
                coll.world_size,
            )
            return
        self._pending = {"n": pend.get("n"), "at_step": int(pend["at_step"]), "to": mine}
        self._pending_all = {**pend, "to": to}

    def _skip_now(self, state: TrainState, coll: Collective) -> RecoveryEvent:
        """The replay reached the first warning: jump the cursor over the window."""
        pend = self._pending
        assert pend is not None
        self._pending = self._pending_all = None
        start = _cursor(state)
        ids: list[tuple[int, int]] | None = None
        err: BaseException | None = None
        try:
            if pend["to"] is not None and state.sampler is not None:
                if isinstance(state.sampler, ResumableSampler) and start is not None:
                    ids = state.sampler.consumed_between(
                        start, pend["to"], limit=self.policy.max_recorded_ids
                    )
                state.sampler.load_state_dict(copy.deepcopy(pend["to"]))
        except BaseException as e:
            err = e
        consensus(coll, err, what=f"the data skip of recovery #{pend['n']}")
        per_rank = coll.all_gather(None if ids is None else [list(x) for x in ids])
        update = {
            "status": "applied",
            "applied_at_step": int(state.step),
            "samples": sum(len(x) for x in per_rank if x is not None),
            "ids": {str(r): x for r, x in enumerate(per_rank)},
            "ids_known": all(x is not None for x in per_rank),
        }
        rec = self._update(coll, int(pend["n"] or 0), update)
        log.warning(
            "ckptkit: recovery #%s: skipped %d samples (the batches seen from step %s to %s)",
            pend["n"], update["samples"], int(state.step) + 1,
            rec.get("detected_at") if rec else "?",
        )
        return RecoveryEvent("skipped", int(state.step), rec or update)

    def _update(self, coll: Collective, n: int, skip: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge ``skip`` into recovery ``n``'s record (history and log)."""
        out: dict[str, Any] | None = None
        for r in self.history:
            if r.get("n") == n:
                r.setdefault("actions", {}).setdefault("skip", {}).update(skip)
                out = r

        def edit(data: dict[str, Any]) -> None:
            for r in data["recoveries"]:
                if r.get("n") == n:
                    r.setdefault("actions", {}).setdefault("skip", {}).update(skip)

        self._write(coll, edit)
        return out

    def _guard_expects(self, result: RestoreResult, state: TrainState) -> None:
        """The resume guard checks the resumed run against what the recovery intended."""
        rg = result.guard
        if rg is None or not isinstance(getattr(rg, "saved", None), Mapping):
            return
        saved = dict(rg.saved)
        if state.optimizer is not None and "lr" in saved:
            saved["lr"] = [float(g["lr"]) for g in state.optimizer.param_groups]
        if "sample_ids" in saved and isinstance(state.sampler, ResumableSampler):
            saved["sample_ids"] = state.sampler.next_indices(len(saved["sample_ids"]))
        rg.saved = saved
        result.notes.append("automatic recovery: LR and data cursor changed on purpose")

    # --- the run's log --------------------------------------------------------------------

    def _write(self, coll: Collective, edit: Callable[[dict[str, Any]], None]) -> None:
        """Rank 0 edits the run's recoveries log under the run lock (others do nothing)."""
        if coll.rank != 0:
            return
        with self.host.run.may_record() as mine:
            if not mine:
                log.warning("ckptkit: recovery: another writer holds %s; log not written",
                            self.host.root)
                return
            data = read_log(self.host.root)
            edit(data)
            write_log(self.host.root, data)

    def _set_aside(self, restored: int, n: int) -> list[dict[str, Any]]:
        """Rank 0: move the checkpoints newer than ``restored`` out of the run."""
        where = f"recovery-{n:03d}"
        with self.host.run.may_record() as mine:
            if not mine:
                raise CkptkitError(
                    "another writer holds the run lock",
                    path=self.host.root,
                    hint="only the training process may recover its run",
                )
            moved = [c for c in self.host.run.checkpoints() if c.step > restored]
            self.host.run.set_aside(moved, self.host.root / ABANDONED / where)
        return [{**_brief(c), "moved_to": f"{ABANDONED}/{where}/{c.path.name}"} for c in moved]


# --- actions ------------------------------------------------------------------------------------

_GROUP_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
_SCHED_LR_LISTS = ("base_lrs", "max_lrs", "min_lrs", "_last_lr")


def scale_lr(state: TrainState, factor: float) -> dict[str, Any]:
    """Multiply the optimizer's learning rates by ``factor``, schedule included.

    Every param group's ``lr``, ``initial_lr``, ``max_lr`` and ``min_lr``, and the
    scheduler's ``base_lrs``, ``max_lrs``, ``min_lrs``, ``eta_min`` and last LRs (chained and
    sequential schedulers too), so the scheduler's next step keeps the scale and later
    checkpoints carry it. A loop that sets ``group["lr"]`` itself every step must multiply
    by ``mgr.recovery.lr_scale`` (or use the recovery ``callback``).

    Example:
        >>> import torch, ckptkit
        >>> m = torch.nn.Linear(1, 1); opt = torch.optim.SGD(m.parameters(), lr=1.0)
        >>> sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        >>> out = scale_lr(ckptkit.TrainState(model=m, optimizer=opt, scheduler=sched), 0.5)
        >>> out["lr_after"], sched.base_lrs
        ([0.5], [0.5])
    """
    opt = state.optimizer
    if opt is None:
        return {"applied": False, "why": "no optimizer in the TrainState"}
    before = [float(g["lr"]) for g in opt.param_groups]
    if factor != 1.0:
        for g in opt.param_groups:
            for k in _GROUP_LR_KEYS:
                if isinstance(g.get(k), (int, float)) and not isinstance(g.get(k), bool):
                    g[k] = g[k] * factor
                elif hasattr(g.get(k), "mul_"):
                    g[k].mul_(factor)  # a tensor LR (capturable optimizers)
        _scale_scheduler(state.scheduler, factor)
    return {
        "applied": True,
        "multiplier": factor,
        "lr_before": before,
        "lr_after": [float(g["lr"]) for g in opt.param_groups],
    }


def _scale_scheduler(sched: Any, factor: float, depth: int = 0) -> None:
    if sched is None or depth > 8:
        return
    for attr in _SCHED_LR_LISTS:
        v = getattr(sched, attr, None)
        if isinstance(v, list) and all(isinstance(x, (int, float)) for x in v):
            setattr(sched, attr, [x * factor for x in v])
    eta = getattr(sched, "eta_min", None)
    if isinstance(eta, (int, float)) and not isinstance(eta, bool):
        sched.eta_min = eta * factor
    for sub in getattr(sched, "_schedulers", None) or []:
        _scale_scheduler(sub, factor, depth + 1)


def _cursor(state: TrainState) -> dict[str, Any] | None:
    fn = getattr(state.sampler, "state_dict", None)
    return copy.deepcopy(dict(fn())) if callable(fn) else None


def _brief(c: CheckpointInfo) -> dict[str, Any]:
    return {"step": c.step, "name": c.path.name, "status": c.status, "health": c.health,
            "pins": list(c.pins)}


# --- helpers ------------------------------------------------------------------------------------


def _merged_signals(triggers: builtins.list[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in triggers:
        for name, s in t.get("signals", {}).items():
            out.setdefault(name, {**s, "ranks": []})["ranks"].append(t["rank"])
    return out


def _compact(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as a manifest carries it: skipped ids only when there are few."""
    r = copy.deepcopy(dict(record))
    skip = r.get("actions", {}).get("skip", {})
    ids = skip.get("ids")
    if isinstance(ids, Mapping) and sum(len(v or []) for v in ids.values()) > MANIFEST_IDS:
        skip["ids"] = None
        skip["ids_in"] = LOG
    return r


def _jsonable(x: Any) -> Any:
    try:
        json.dumps(x, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return x


__all__ = [
    "ABANDONED",
    "LOG",
    "LOG_VERSION",
    "AutoRecovery",
    "Host",
    "RecoveryContext",
    "RecoveryEvent",
    "RecoveryPolicy",
    "describe",
    "iter_records",
    "read_log",
    "scale_lr",
    "write_log",
]
