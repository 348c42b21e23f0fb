"""The save pipeline of one run: capture on every rank, commit, then settle.

:meth:`CheckpointManager.save <ckptkit.CheckpointManager.save>` decides what a manifest
records besides the state (pins, look-ahead, health, recoveries: the signals) and hands the
rest to :class:`SavePipeline`:

1. capture the state on every rank (:class:`ckptkit.checkpoint.commit.StateSave`); every rank has
   captured before any rank enters a collective write;
2. commit (:func:`ckptkit.checkpoint.commit.commit`): rank 0 first becomes the run's writer and
   branches its trajectory (:mod:`ckptkit.run.trajectory`), every rank compares its copies of
   the replicated state with the other ranks' (:mod:`ckptkit.checkpoint.replicas`), the consistency
   checks run before the manifest is written (:mod:`ckptkit.verify.atsave`), and the run
   lock is checked again right before the rename;
3. hand the committed checkpoint to the run's settle step (verify by reading back,
   record, point ``latest``, rotate) through the one hook the manager passes in
   (:data:`Settle`).

Step 3 runs in a background thread by default (``background_verify``); an async save runs
steps 2 and 3 there, from a host copy of the state. One job runs at a time: its error
stays until the next save or :meth:`SavePipeline.wait` raises it, and at interpreter exit
every unfinished job is joined, so a script that ends without ``close()`` still gets its
checkpoint settled.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ckptkit import codes
from ckptkit._repr import brief
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint import lookahead as lookahead_mod
from ckptkit.checkpoint import replicas
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.checkpoint.commit import SPREAD, Stager, StateSave, commit
from ckptkit.collective import Collective, TorchGroup, consensus, current
from ckptkit.errors import CkptkitError, CommittedError
from ckptkit.format import manifest as mf
from ckptkit.format import records
from ckptkit.run import Run, retain
from ckptkit.run.trajectory import Trajectory
from ckptkit.signals.recovery import AutoRecovery
from ckptkit.signals.stability import StabilityWatch
from ckptkit.storage import codec
from ckptkit.storage.fs import Location
from ckptkit.verify import atsave

log = logging.getLogger("ckptkit")


@dataclass
class SaveStats:
    """Timings of the last save (seconds): what the caller waited for, and each step."""

    step: int = -1
    blocked: float = 0.0
    """What the training loop waited for (capture and commit; staging for async)."""
    capture: float = 0.0
    write: float = 0.0
    """Commit: write, hash, manifest, rename."""
    verify: float = 0.0
    """The read-back verify (in the background unless ``background_verify=False``)."""
    total: float = 0.0
    """Until the checkpoint was verified, pointed at and rotation done."""
    deleted: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    """Consistency findings of the saved state (``CODE message``), recorded in its manifest."""
    values_scanned: bool = False
    """Every tensor's values were scanned in memory before the commit (one process, all
    tensors in the manifest): the read-back verify checks digests only, not values again."""
    replicas: records.Replicas | None = None
    """The replica agreement check of this save (None: one process, or not sampled)."""

    def __repr__(self) -> str:
        times = {k: round(getattr(self, k), 4) for k in ("blocked", "capture", "write", "verify", "total")}
        return brief(
            "SaveStats", step=self.step, **times, deleted=self.deleted, findings=self.findings
        )


Settle = Callable[[Location, mf.Manifest, SaveStats, float], None]
"""``settle(final, manifest, stats, t0)``: the run's step after a commit, on rank 0.

Verify ``final`` by reading it back, record the outcome, point ``latest``, rotate; fill in
``stats`` (``verify``, ``deleted``, ``total`` since ``t0``). Raises
:class:`~ckptkit.errors.CommittedError` when the checkpoint committed but this step failed.
"""


@dataclass
class _Job:
    thread: threading.Thread
    step: int
    error: BaseException | None = None


_LIVE: weakref.WeakSet[SavePipeline] = weakref.WeakSet()
"""Pipelines with possibly unfinished background work (joined at interpreter exit)."""


def _finish_background_work() -> None:
    """Join every pipeline's background job before the interpreter shuts thread pools down.

    A script that calls ``mgr.save()`` and ends without ``close()`` still gets its
    checkpoint verified, ``latest`` pointed and rotation done. Registered with the same
    hook ``concurrent.futures`` uses, later, so it runs first.
    """
    for pipeline in list(_LIVE):
        with contextlib.suppress(Exception):
            pipeline.join()


threading._register_atexit(_finish_background_work)  # type: ignore[attr-defined]


@dataclass(eq=False, repr=False)
class SavePipeline:
    """Capture, commit and settle the saves of one run directory, one job in flight at most.

    Args:
        root: the run directory (a checkpoint is ``root/step-NNNNNNNN``).
        trajectory: this process's line of checkpoints: branched before a commit, told of
            each one.
        writer: become the run's single writer (rank 0, before a commit); raises
            ``LockHeldError`` while another process holds the run.
        fence: raise unless this process still holds the run lock (right before the
            manifest is written).
        settle: the run's step after a commit (:data:`Settle`): the one way a committed
            checkpoint reaches the run's records.
        key: the HMAC key every manifest is signed with (None: unsigned).
        compress: ``"zstd"`` to compress every file.
        on_inconsistent: what a save does with consistency findings of the state it saves
            (:mod:`ckptkit.verify.atsave`).
        background_verify: settle in a background thread, joined by the next save; False
            settles inside :meth:`save`.
        on_divergence: what a multi-rank save does when the replicas of a tensor disagree
            (:mod:`ckptkit.checkpoint.replicas`); either way the checkpoint is recorded
            ``replica-divergent`` and ``watch`` hears of it. ``"raise"``: every rank raises
            :class:`~ckptkit.errors.ReplicaDivergenceError` once it is committed (an async
            save: at the next ``save``/``wait``). ``"warn"``: log it and go on.
        replica_check_every: compare the replicas at every N-th save (the first
            included); 0 never.
        watch: the stability watch told of a divergence.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> from pathlib import Path
        >>> from ckptkit.run import NativeLayout, Run
        >>> root, settled = Path(tempfile.mkdtemp()), []
        >>> saves = SavePipeline(
        ...     root, trajectory=Trajectory(Run(root, NativeLayout())), writer=lambda: None,
        ...     fence=lambda: None, settle=lambda final, *_: settled.append(final.name))
        >>> final = saves.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2)), 5, {})
        >>> saves.wait(); settled, saves.last.step
        (['step-00000005'], 5)
    """

    root: Location
    _: KW_ONLY
    trajectory: Trajectory
    writer: Callable[[], None]
    fence: Callable[[], None]
    settle: Settle
    key: bytes | None = None
    compress: codec.Compression | None = None
    on_inconsistent: atsave.Policy = "raise"
    background_verify: bool = True
    on_divergence: records.ReplicaPolicy = "raise"
    replica_check_every: int = 1
    watch: StabilityWatch | None = None
    _count: int = field(default=0, init=False)
    """Saves started by this pipeline (the same on every rank: saves are collective)."""
    _diverged: tuple[Location, int, records.Replicas] | None = field(default=None, init=False)
    """What an async save's replica check found, acted on by the training thread at the
    next :meth:`wait` (the watch is not thread-safe; the raise belongs to that thread)."""
    last: SaveStats = field(default_factory=SaveStats, init=False)
    """The timings of the last save that got past its capture (the background job
    fills in the rest of them)."""
    _job: _Job | None = field(default=None, init=False)
    _stager: Stager = field(default_factory=Stager, init=False)
    _bg_coll: Collective | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.on_inconsistent not in atsave.POLICIES:
            raise ValueError(
                f"on_inconsistent must be 'raise' or 'warn', not {self.on_inconsistent!r}"
            )
        if self.on_divergence not in records.REPLICA_POLICIES:
            raise ValueError(f"on_divergence must be 'raise' or 'warn', not {self.on_divergence!r}")
        every = self.replica_check_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"replica_check_every must be an int >= 0 (0: never), not {every!r}")

    # --- the background job ------------------------------------------------------------------

    def wait(self) -> None:
        """Join the background job and raise what it failed with (then forget it); then act
        on replicas an async save found divergent (``on_divergence``: raise or warn)."""
        self.join()
        job, self._job = self._job, None
        if job is not None and job.error is not None:
            raise job.error
        diverged, self._diverged = self._diverged, None
        if diverged is not None:
            self._on_replicas(*diverged)

    def idle(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the background job; True when none runs.

        Raises nothing and leaves the job (and its error) to the next :meth:`wait`: safe
        from another thread.
        """
        job = self._job
        if job is None:
            return True
        job.thread.join(timeout)
        return not job.thread.is_alive()

    def join(self) -> None:
        """Let the background job finish; its error stays for :meth:`wait`."""
        if self._job is not None:
            self._job.thread.join()

    # --- one save ------------------------------------------------------------------------------

    def save(
        self,
        state: TrainState,
        step: int,
        fields: Mapping[str, Any],
        *,
        async_: bool = False,
        overwrite: bool = False,
        t0: float | None = None,
    ) -> Location:
        """Capture ``state`` as ``step`` on every rank, commit it, and settle it (maybe later).

        The caller has checked ``step`` and joined the previous job (:meth:`wait`).

        Args:
            state: the state to capture.
            step: the step label (checked: ``mf.check_step``).
            fields: manifest fields besides the state (pins, look-ahead, health, recoveries).
            async_: copy the state to host memory now, commit and settle it in the
                background.
            overwrite: replace an existing checkpoint of the same step.
            t0: when the caller's save began (``time.perf_counter()``; default: now).

        Returns:
            The checkpoint directory; its timings are :attr:`last` from the commit on.
        """
        t0 = time.perf_counter() if t0 is None else t0
        coll = current()
        stats = SaveStats(step=step)
        err: BaseException | None = None
        snap: StateSave | None = None
        try:
            snap = StateSave.capture(
                state, coll, step=step, fields=dict(fields), compress=self.compress, key=self.key
            )
        except BaseException as e:
            err = e
        # Every rank captured before any rank enters a collective write (DCP's save).
        consensus(coll, err, what=f"capture for step {step}")
        assert snap is not None
        stats.capture = time.perf_counter() - t0
        final = self.root / step_dir_name(step)
        every = self.replica_check_every
        check = coll.world_size > 1 and every > 0 and self._count % every == 0
        self._count += 1
        if async_:
            bg = self._background(coll)
            snap = snap.staged(self._stager)
            snap.process_group = getattr(bg, "group", None)

            def commit_and_settle() -> None:
                man = self._commit(snap, bg, final, overwrite, stats, check)
                if man is not None:
                    self.settle(final, man, stats, t0)
                if stats.replicas is not None and not stats.replicas.agree:
                    self._diverged = (final, snap.step, stats.replicas)

            self._start(step, commit_and_settle)
            stats.blocked = time.perf_counter() - t0
            self.last = stats
            return final
        man = self._commit(snap, coll, final, overwrite, stats, check)
        stats.blocked = time.perf_counter() - t0
        self.last = stats
        if man is not None:  # rank 0
            if self.background_verify:
                self._start(step, lambda: self.settle(final, man, stats, t0))
            else:
                self.settle(final, man, stats, t0)
        self._on_replicas(final, step, stats.replicas)
        return final

    def _commit(
        self,
        snap: StateSave,
        coll: Collective,
        final: Location,
        overwrite: bool,
        stats: SaveStats,
        check: bool = False,
    ) -> mf.Manifest | None:
        tw = time.perf_counter()
        write, build = self._checked(snap, coll, stats, check)
        man = commit(
            final,
            coll,
            write=write,
            build=build,
            overwrite=overwrite,
            prepare=lambda: self._prepare(snap.step),
            fence=self.fence,
            key=self.key,
        )
        stats.write = time.perf_counter() - tw
        if man is not None:
            self.trajectory.committed(final.name, man.digest)
            self._on_findings(final, man, stats)
        return man

    def _prepare(self, step: int) -> None:
        """Rank 0, before a commit: the run lock, then a branch (:mod:`ckptkit.run.trajectory`)."""
        self.writer()
        self.trajectory.branch(step)

    def _checked(
        self, snap: StateSave, coll: Collective, stats: SaveStats, check: bool = False
    ) -> tuple[Callable[[Location], Any], Callable[[list[Any], Location], mf.Manifest]]:
        """The commit's write and build, with the replica check and the consistency checks
        before the manifest.

        With ``check``, every rank first compares its copies of the replicated state with
        the other ranks' (the same result on every rank, in ``stats.replicas``); rank 0
        records it in the manifest. Rank 0 checks the manifest it built against the files
        just written, the tensor values scanned in memory, and records the findings in it
        (with the policy).
        """

        def write(tmp: Location) -> Any:
            if check:
                def mine() -> Mapping[str, Any]:
                    return replicas.replicated(
                        snap.encoded.tensors,
                        spread=SPREAD,
                        dcp_state=snap.dcp_state,
                        buffers=snap.buffers,
                    )

                # The selection runs inside the check: a rank that fails there still joins
                # the collective, so the other ranks never wait for it.
                stats.replicas = replicas.check(coll, mine, policy=self.on_divergence)
            return snap.write(tmp, coll)

        def build(parts: list[Any], tmp: Location) -> mf.Manifest:
            if stats.replicas is not None:
                snap.fields["replicas"] = stats.replicas.to_dict()
            man = snap.build(parts, tmp)
            try:
                out = atsave.check_before_commit(
                    man, tmp, snap.encoded.tensors, policy=self.on_inconsistent
                )
                stats.values_scanned = (
                    coll.world_size == 1
                    and atsave.scans_in_memory(tmp)
                    and all(e.key in snap.encoded.tensors for e in man.tensors)
                )
                return out
            except Exception as e:  # a diagnostic must never cost the save
                log.error(
                    "ckptkit: the consistency checks before committing step %d failed (%s: %s);"
                    " saved without a findings record, its verify still checks it",
                    snap.step,
                    type(e).__name__,
                    e,
                )
                return man

        return write, build

    def _on_findings(self, final: Location, man: mf.Manifest, stats: SaveStats) -> None:
        """Note what the save recorded; under ``warn``, say aloud what was accepted."""
        found = atsave.recorded(man)
        stats.findings = [f"{f.code} {f.message}" for f in found]
        errors = [f for f in found if f.severity is codes.ERROR]
        if errors and self.on_inconsistent == "warn":
            log.warning(
                "ckptkit: %s saved with consistency errors, accepted (on_inconsistent='warn'): %s",
                final.name,
                "; ".join(f"{f.code} {f.message}" for f in errors[:3]),
            )

    def _on_replicas(self, final: Location, step: int, rec: records.Replicas | None) -> None:
        """Every rank, once the checkpoint is committed: act on replicas that disagreed.

        The manifest already records the divergence (the checkpoint lists as
        ``replica-divergent``); the watch hears of it, then ``on_divergence`` decides.

        Raises:
            ReplicaDivergenceError: ``on_divergence="raise"`` (``CK-F120``).
        """
        if rec is None or rec.agree:
            return
        if self.watch is not None:
            self.watch.alert(step, "replicas.divergent", rec.summary())
        what = f"{rec.summary()}; recorded replica-divergent (never latest, never restored)"
        if self.on_divergence == "warn":
            log.warning("ckptkit: %s: %s (on_divergence='warn': training goes on)", final.name, what)
            return
        log.error("ckptkit: %s: %s", final.name, what)
        raise codes.error(codes.F120, what, path=final)

    def _start(self, step: int, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # surfaced by wait(); logged now in case nobody waits
                job.error = e
                log.error("ckptkit: background work for step %d failed: %s", step, e)

        th = threading.Thread(target=run, name=f"ckptkit-save-{step}", daemon=False)
        job = _Job(thread=th, step=step)
        self._job = job
        _LIVE.add(self)
        th.start()

    def _background(self, coll: Collective) -> Collective:
        """The collective a background save uses: a dedicated group once multi-rank."""
        if coll.world_size == 1:
            return coll
        if self._bg_coll is None:
            assert isinstance(coll, TorchGroup)
            self._bg_coll = coll.dedicated()
        return self._bg_coll


def settle_in(run: Run, *, policy: Callable[[], retain.Policy], verify: bool) -> Settle:
    """The settle hook of a native run: once a checkpoint committed, :meth:`Run.settle
    <ckptkit.run.Run.settle>` verifies it by reading it back (unless ``verify`` is off),
    records it, points ``latest`` and rotates under ``policy()``.

    The hook raises :class:`~ckptkit.errors.CommittedError` when that step fails: the
    checkpoint is whole on disk, but not recorded good (its verify failed, or recording
    failed), so the caller must not save that step again as if nothing had been written.
    """

    def settle(final: Location, man: mf.Manifest, stats: SaveStats, t0: float) -> None:
        try:
            # Digests prove the bytes are what was scanned in memory before the commit.
            settled = run.settle(
                final,
                step=man.step,
                policy=policy(),
                verify=verify,
                scan_values=not stats.values_scanned,
                ident=man.digest,
            )
        except CommittedError:
            raise
        except (CkptkitError, OSError) as e:
            raise CommittedError(
                f"{final.name} committed, but recording it failed: {e}",
                committed=final,
                hint="the checkpoint is whole and restorable; do not save this step again. "
                "Fix the cause (disk space, permissions) and the next save records it",
            ) from e
        stats.verify = settled.verify_seconds
        # Replicas that disagreed (CK-F120) are whole bytes the save already acted on
        # (on_divergence); the run records the checkpoint replica-divergent.
        damage = [f for f in settled.errors if f.code != codes.F120]
        if damage:
            first = damage[0]
            raise CommittedError(
                f"{final.name} committed, but its read-back verify failed: "
                f"{first.code} {first.message}; it is recorded corrupt and never "
                "becomes latest or counts for retention",
                committed=final,
                path=final / first.path if first.path else final,
                code=first.code,
                hint=first.hint,
            )
        stats.deleted = settled.deleted
        stats.total = time.perf_counter() - t0

    return settle


def signal_fields(
    state: TrainState,
    step: int,
    *,
    watch: StabilityWatch | None,
    recovery: AutoRecovery | None,
    pin: str | Iterable[str] | None,
    health: Mapping[str, Any] | None,
    lookahead: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What a save records besides the state: pins, and what the signals say now.

    The watch's health (the worst of every rank's: healthy only if every rank's watch says
    so), the resume guard's look-ahead and the recovery history. Collective with several
    ranks.
    """
    coll = current()
    pins = (pin,) if isinstance(pin, str) else tuple(pin or ())
    if health is None and watch is not None:
        health = watch.snapshot()
        if coll.world_size > 1:
            # Rank 0 takes the worst and tells every rank (their recovery decides alike):
            # a rank's traffic does not grow with the world size, as in the commit.
            every = coll.gather(health)
            health = coll.broadcast(StabilityWatch.worst(every) if every is not None else None)
    fields: dict[str, Any] = {"pins": pins, "lookahead": lookahead_mod.lookahead(state, lookahead)}
    if health is not None:
        fields["health"] = dict(health)
    fields.update(recovery.on_save(step, health) if recovery is not None else {})
    return fields



__all__ = ["SavePipeline", "SaveStats", "Settle", "settle_in", "signal_fields"]
