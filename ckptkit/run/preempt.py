"""Pre-emption: when the scheduler says the job must go, save at a step boundary and exit.

SLURM (``--signal=USR1@120``, or SIGTERM at the time limit), Kubernetes (SIGTERM, then
SIGKILL after ``terminationGracePeriodSeconds``), spot and preemptible VMs (SIGTERM from
the node agent) and ``torchrun`` (which forwards SIGTERM to its workers) all give a
signal and a grace period. :class:`PreemptionGuard` turns that signal into a clean stop:

1. the signal handler only records the signal (nothing is saved mid-step: the state of
   a half-done step is not a state worth resuming from);
2. :meth:`PreemptionGuard.should_stop`, called once per step, reports it at the next
   step boundary, agreed by every rank (a signal that reached one rank stops all of
   them at the same step);
3. :meth:`PreemptionGuard.stop` waits for the save in flight (an async save and the
   background verify the manager runs after each save), saves the current step unless
   this state is saved already (``manager.trajectory.holds``) or no longer fits in the
   ``deadline``, verifies it by reading it
   back, optionally asks SLURM to requeue the job, releases the run lock and exits with
   a requeue-friendly code (``128 + signal``: 143 for SIGTERM, 138 for SIGUSR1).

With a ``deadline``, a watchdog also covers steps too long to wait for: if no step
boundary comes within ``deadline`` seconds of the signal, it lets the save in flight
finish and exits the process with the same code, so the job ends cleanly before the
hard kill and resumes from the newest verified checkpoint. Whatever the timing, a
signal (or the SIGKILL after it) never leaves a damaged checkpoint: commits are atomic,
and a checkpoint counts only once its read-back verify passed.

Example:
    >>> import tempfile, torch, ckptkit
    >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp())
    >>> with ckptkit.PreemptionGuard(mgr, ts) as guard:
    ...     for step in range(3):
    ...         ts.step = step + 1          # one training step
    ...         if guard.should_stop():     # a signal arrived: save, verify, exit 143
    ...             guard.stop()
    >>> guard.requested
    False

See docs/preemption.md for SLURM, Kubernetes and spot-instance setups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn

import torch

from ckptkit.capture.state import TrainState
from ckptkit.errors import CkptkitError
from ckptkit.run.manager import CheckpointManager

log = logging.getLogger("ckptkit")

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
"""What schedulers send before they kill: SIGTERM (Kubernetes, spot agents, torchrun,
SLURM at the time limit) and SIGUSR1 (SLURM ``--signal=USR1@SECONDS``)."""
SAFETY = 1.2
"""A save is started only when the time left exceeds this many times the last save took."""


@dataclass(frozen=True)
class Preempted:
    """What :meth:`PreemptionGuard.checkpoint` did: where the job resumes, and why."""

    signal: str
    """The signal received (``SIGTERM``)."""
    step: int | None
    """Step of the newest verified checkpoint (what the requeued job resumes from)."""
    path: Any
    """That checkpoint's directory (None when the run has none)."""
    saved: bool
    """True when this stop saved it; False when it existed or no save fitted."""
    reason: str
    """One line: what was done and why."""
    exit_code: int
    """The exit status the process ends with."""
    seconds: float
    """From the signal to the end of the save and its verify."""


class PreemptionGuard:
    """Save at the next step boundary after SIGTERM/SIGUSR1, then exit for a requeue.

    Args:
        manager: the run's :class:`~ckptkit.CheckpointManager`.
        state: the :class:`~ckptkit.TrainState` to save (None: save nothing, only let
            the save in flight finish and exit).
        signals: the signals that mean "you are being pre-empted".
        deadline: seconds after the signal by which the process must have exited
            (keep it below the grace period: SLURM's ``@SECONDS``, Kubernetes'
            ``terminationGracePeriodSeconds``, the spot notice). A save is skipped when
            the last save took longer than the time left (x1.2); a step boundary that
            does not come in time is not waited for (see the module docs). None: wait
            for the boundary, however long.
        exit_code: the exit status (default ``128 + signal``: 143 for SIGTERM, 138 for
            SIGUSR1; non-zero so that Kubernetes restarts the pod and a Job's
            ``podFailurePolicy`` can match it).
        requeue: on SLURM, run ``scontrol requeue $SLURM_JOB_ID`` (rank 0) before
            exiting, as Lightning's auto-requeue does (the job needs ``--requeue``).
        sync_every: with several ranks, agree on the stop every this many
            :meth:`should_stop` calls (one all-reduce of one integer over a gloo group);
            1 stops at the very next boundary.

    Install the handlers by entering the guard (``with``) or with :meth:`install`, in
    the main thread. Call :meth:`should_stop` once per step on every rank.

    Raises:
        CkptkitError: installed outside the main thread (Python delivers signals there).
    """

    def __init__(
        self,
        manager: CheckpointManager,
        state: TrainState | None,
        *,
        signals: Iterable[int] = DEFAULT_SIGNALS,
        deadline: float | None = None,
        exit_code: int | None = None,
        requeue: bool = False,
        sync_every: int = 1,
    ) -> None:
        if deadline is not None and deadline <= 0:
            raise ValueError("deadline must be a positive number of seconds (or None)")
        if sync_every < 1:
            raise ValueError("sync_every must be >= 1")
        self.manager = manager
        self.state = state
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.deadline = deadline
        self.requeue = requeue
        self.sync_every = sync_every
        self._exit_code = exit_code
        self.signum: int | None = None
        """The first pre-emption signal received (None until one arrives)."""
        self.received_at: float | None = None
        """``time.monotonic()`` when it arrived."""
        self._received = threading.Event()
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self._previous: dict[int, Any] = {}
        self._calls = 0
        self._agreed = False
        self._group = _agreement_group()
        self._watchdog: threading.Thread | None = None
        self._exiting = False

    # --- handlers ----------------------------------------------------------------------------

    def install(self) -> PreemptionGuard:
        """Install the signal handlers (the previous ones come back on :meth:`uninstall`)."""
        if threading.current_thread() is not threading.main_thread():
            raise CkptkitError(
                "a PreemptionGuard can only be installed from the main thread",
                hint="create and enter the guard in the main thread: Python runs signal "
                "handlers there",
            )
        for s in self.signals:
            if s not in self._previous:
                self._previous[s] = signal.signal(s, self._on_signal)
        if self.deadline is not None and self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name="ckptkit-preemption-watchdog", daemon=True
            )
            self._watchdog.start()
        return self

    def uninstall(self) -> None:
        """Put the previous signal handlers back and stop the watchdog."""
        self._closed.set()
        for s, h in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is SystemExit and self._exiting:
            # The guard's own exit is leaving the block: the process ends with its code.
            # Putting SIG_DFL back now would let a second notice end it by the signal
            # during teardown (-15, not 143); the signals stay ignored until it is gone.
            self._closed.set()
            return
        self.uninstall()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler runs between two bytecodes of the main thread: record, no I/O.
        if self.signum is None:
            self.signum = signum
            self.received_at = time.monotonic()
        self._received.set()

    # --- the training loop's side ------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """True once this process received a pre-emption signal."""
        return self._received.is_set()

    @property
    def exit_code(self) -> int:
        """The exit status :meth:`stop` ends the process with."""
        if self._exit_code is not None:
            return self._exit_code
        return 128 + int(self.signum if self.signum is not None else signal.SIGTERM)

    def should_stop(self) -> bool:
        """Return True at the first step boundary after a pre-emption signal.

        Call it once per step on every rank. With several ranks the answer is agreed
        (any rank's signal stops every rank, at the same call), every ``sync_every``
        calls; once True it stays True.
        """
        if self._agreed:
            return True
        self._calls += 1
        local = self._received.is_set()
        if self._group is None:
            self._agreed = local
        elif self._calls % self.sync_every == 0:
            flag = torch.tensor([1 if local else 0], dtype=torch.int64)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=self._group)
            self._agreed = bool(flag.item())
        if self._agreed:
            self._stopping.set()  # the watchdog stands down: the boundary came
            if self.signum is None:
                self.signum = _signal_of_peers(self._group, None) or signal.SIGTERM
                self.received_at = time.monotonic()
            elif self._group is not None:
                _signal_of_peers(self._group, self.signum)
            step = self.state.step if self.state is not None else "?"
            log.warning(
                "ckptkit: %s received; stopping at step %s to save and exit",
                signal.Signals(self.signum).name,
                step,
            )
        return self._agreed

    def checkpoint(self) -> Preempted:
        """Wait for the save in flight, save this step unless saved or out of time, verify.

        Collective with several ranks (every rank calls it after :meth:`should_stop`).
        Never raises for a failed save: the outcome says what the job resumes from.
        """
        self._stopping.set()
        t0 = self.received_at if self.received_at is not None else time.monotonic()
        name = signal.Signals(self.signum or signal.SIGTERM).name
        mgr = self.manager
        notes: list[str] = []
        try:
            mgr.wait()  # the async save in flight and the verify after the last save
        except (CkptkitError, OSError) as e:
            notes.append(f"the save in flight failed ({e})")
        saved = False
        plan = self._plan(t0)
        if plan is None:
            assert self.state is not None
            try:
                mgr.save(self.state)
                mgr.wait()  # its read-back verify: it counts only once verified
                saved = True
            except (CkptkitError, OSError) as e:
                notes.append(f"saving step {self.state.step} failed ({e})")
        else:
            notes.append(plan)
        newest = mgr.latest()
        took = time.monotonic() - t0
        if newest is not None:
            what = (
                f"saved and verified {newest.path.name}" if saved and newest.step == self._step()
                else f"resume from {newest.path.name}"
            )
        else:
            what = "no verified checkpoint to resume from"
        reason = "; ".join([what, *notes])
        log.warning(
            "ckptkit: pre-empted by %s: %s (%.1fs after the signal); exiting with %d",
            name,
            reason,
            took,
            self.exit_code,
        )
        return Preempted(
            signal=name,
            step=newest.step if newest is not None else None,
            path=newest.path if newest is not None else None,
            saved=saved,
            reason=reason,
            exit_code=self.exit_code,
            seconds=took,
        )

    def exit(self, outcome: Preempted | None = None) -> NoReturn:
        """Requeue (if asked), release the run lock, and exit with the guard's code.

        From here on the pre-emption signals are ignored (``SIG_IGN``, which Python keeps
        through interpreter teardown): a second SIGTERM while the process exits (an
        impatient operator, a second notice) cannot turn the requeue-friendly 143 into a
        death by the signal. Leaving the guard's ``with`` block with this ``SystemExit``
        keeps them ignored; catching it inside the block (a test) and leaving normally
        puts the previous handlers back.
        """
        code = outcome.exit_code if outcome is not None else self.exit_code
        if self.requeue:
            _requeue_slurm()
        with contextlib.suppress(CkptkitError, OSError):
            self.manager.close()
        self._exiting = True
        self._closed.set()  # the watchdog stands down
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                signal.signal(s, signal.SIG_IGN)
        raise SystemExit(code)

    def stop(self) -> NoReturn:
        """:meth:`checkpoint`, then :meth:`exit`: what to call when :meth:`should_stop` is True."""
        self.exit(self.checkpoint())

    # --- helpers -----------------------------------------------------------------------------

    def _step(self) -> int | None:
        return self.state.step if self.state is not None else None

    def _plan(self, t0: float) -> str | None:
        """None to save now; else why not (agreed by every rank: rank 0 decides)."""
        why: str | None = None
        if self.state is None:
            why = "no state to save (state=None)"
        elif self.manager.trajectory.holds(self.state.step):
            # This very state, verified: not merely a directory of this step, which may
            # hold another trajectory's state (the run restored an older step).
            why = f"step {self.state.step} is saved already"
        elif self.deadline is not None:
            left = self.deadline - (time.monotonic() - t0)
            need = _save_seconds(self.manager)
            if need is not None and need * SAFETY > left:
                why = (
                    f"no time to save step {self.state.step}: {left:.1f}s left of the "
                    f"{self.deadline:g}s deadline, the last save took {need:.1f}s"
                )
        if self._group is not None:
            box = [why]
            torch.distributed.broadcast_object_list(box, src=0, group=self._group)
            why = box[0]
        return why

    def _watch(self) -> None:
        """The deadline, when the step boundary does not come: finish the save in flight, exit."""
        while not self._received.wait(0.5):
            if self._closed.is_set():
                return
        assert self.deadline is not None
        t0 = self.received_at if self.received_at is not None else time.monotonic()
        name = signal.Signals(self.signum or signal.SIGTERM).name
        log.warning(
            "ckptkit: %s received; saving at the next step boundary (deadline %gs)",
            name,
            self.deadline,
        )
        left = self.deadline - (time.monotonic() - t0)
        if self._stopping.wait(max(0.0, left)) or self._closed.is_set():
            return
        log.error(
            "ckptkit: no step boundary within the %gs deadline after %s: letting the save in "
            "flight finish, then exiting with %d without saving the current step; the job "
            "resumes from the newest verified checkpoint",
            self.deadline,
            name,
            self.exit_code,
        )
        self.manager.idle()
        if self.requeue:
            _requeue_slurm()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(self.exit_code)


def _agreement_group() -> Any:
    """A gloo group over every rank for the stop agreement (None for a world of one)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo")  # CPU tensors: no device sync per step


def _signal_of_peers(group: Any, mine: int | None) -> int | None:
    """The signal some rank received (every rank learns one, for the exit code and logs)."""
    got: list[Any] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(got, mine, group=group)
    return next((s for s in got if s is not None), None)


def _save_seconds(mgr: CheckpointManager) -> float | None:
    """How long a save and its verify took last time in this process (None: no save yet)."""
    last = mgr.last_save
    if last.step < 0:
        return None
    return last.total if last.total > 0 else last.blocked + last.verify


def _requeue_slurm() -> None:
    """``scontrol requeue`` this SLURM job (rank 0 only); log, never raise."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    job = os.environ.get("SLURM_JOB_ID")
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array is not None and os.environ.get("SLURM_ARRAY_TASK_ID") is not None:
        job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if not job:
        log.warning("ckptkit: requeue=True but this is not a SLURM job (no SLURM_JOB_ID)")
        return
    exe = shutil.which("scontrol")
    if exe is None:
        log.warning("ckptkit: requeue=True but scontrol is not on PATH; job %s not requeued", job)
        return
    try:
        r = subprocess.run([exe, "requeue", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("ckptkit: scontrol requeue %s failed: %s", job, e)
        return
    if r.returncode == 0:
        log.warning("ckptkit: requeued SLURM job %s", job)
    else:
        log.warning(
            "ckptkit: scontrol requeue %s failed (exit %d): %s",
            job,
            r.returncode,
            (r.stderr or r.stdout).strip(),
        )


__all__ = ["DEFAULT_SIGNALS", "Preempted", "PreemptionGuard"]
