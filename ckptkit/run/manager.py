"""``CheckpointManager``: lock -> capture -> commit -> verify -> point ``latest`` -> rotate; restore.

The public methods keep the guard and order (as torchtitan's ``BaseCheckpointManager.save``
does); every step lives in its own module, and the save pipeline (steps 2-3, and running
4-6 in the background) in :mod:`ckptkit.run.saving`:

1. take the run lock (:mod:`ckptkit.storage.lock`: one writer per run directory);
2. capture the state on every rank (:class:`ckptkit.checkpoint.commit.StateSave`);
3. commit (:func:`ckptkit.checkpoint.commit.commit`: the one protocol for every world size, shards
   through safetensors or DCP, manifest last, rename into place);
4. verify the new checkpoint by reading it back (:mod:`ckptkit.verify`) and record the
   outcome in the run index;
5. point ``latest`` at the newest verified checkpoint;
6. rotate (:mod:`ckptkit.run.rotation` decides, after re-checking the newest kept one).

Steps 4-6 run in the background by default, off the training loop's critical path: a
checkpoint becomes ``latest`` and counts for retention only after its read-back verify, and
the next save (or :meth:`wait`, :meth:`close`, any listing) joins them first. Restore takes
the newest checkpoint that verifies while it is read and falls back past any that fails
(:func:`ckptkit.run.restore.restore_run`). The manager wires the signals in: what the stability
watch, the resume guard and the recovery add to each manifest, the emergency checkpoint
and the automatic recovery (:mod:`ckptkit.signals.recovery`, through its public ``Host`` protocol).
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ckptkit import codes
from ckptkit.capture.state import RestoreResult, TrainState, expect_train_state
from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.errors import opening_run_writable
from ckptkit.format import manifest as mf
from ckptkit.format import records, signing
from ckptkit.run import NativeLayout, Run, retain, rotation, saving, trajectory
from ckptkit.run.restore import restore_run
from ckptkit.run.saving import SavePipeline, SaveStats
from ckptkit.signals.emergency import EmergencyPolicy, emergency_checkpoint
from ckptkit.signals.recovery import AutoRecovery, RecoveryEvent, RecoveryPolicy
from ckptkit.storage import codec, fs
from ckptkit.storage.fs import Location
from ckptkit.verify import atsave

log = logging.getLogger("ckptkit")


class CheckpointManager:
    """Save, verify, restore and rotate the checkpoints of one run directory.

    Args:
        root: the run's checkpoint directory (``runs/exp1/ckpt``).
        keep_last: keep the newest K good checkpoints.
        keep_every: also keep every checkpoint whose step is a multiple of this.
        max_bytes: drop the oldest unprotected checkpoints to stay under this many bytes.
        compress: ``"zstd"`` to compress every file.
        lock_timeout: seconds opening a writer waits for another writer's lock before
            failing (logging who holds it and the time left, at intervals).
        verify_after_save: verify each new checkpoint (a read-back of every byte) before it
            becomes ``latest`` and counts for retention (turn off only if you verify
            elsewhere: ``latest`` then follows the newest committed checkpoint).
        background_verify: run the read-back verify, ``latest`` and rotation in a
            background thread, joined by the next save; False runs them inside ``save``.
        lease_ttl: on an object store, the run lock is a lease renewed every third of this
            many seconds; a writer that died is taken over once it expired, at once when it
            is proven dead or a restart of the same job (``docs/storage.md``).
        key: an HMAC key (bytes, or text; default: ``CKPTKIT_HMAC_KEY`` /
            ``CKPTKIT_HMAC_KEY_FILE``): every manifest is signed with it, and listing,
            verify and restore refuse a checkpoint that is unsigned or signed with another
            key (``docs/security.md``).
        readonly: open for listing and restoring only: create nothing, clean nothing,
            refuse ``save``/``prune`` (what ``ckptkit ls`` uses).
        watch: a :class:`~ckptkit.StabilityWatch` whose snapshot goes into every manifest.
        emergency: when :meth:`observe` saves a pinned emergency checkpoint.
        on_inconsistent: what a save does with consistency findings of the state it saves
            (NaN weights, an unusable loss scale, an optimizer without state at step 500).
            Either way they are recorded in the manifest (``findings``) and listed in
            ``last_save.findings``. ``"raise"`` (default): the checkpoint is recorded
            corrupt by its verify, never becomes ``latest``, and the next ``save``/
            :meth:`wait` raises :class:`~ckptkit.errors.CommittedError`. ``"warn"``: the
            state is intended (an optimizer reset): a warning is logged, and the checkpoint
            is verified, becomes ``latest`` and counts for retention like any other; later
            verifies report the findings as warnings, and ``ls`` and the restore notes say
            what was accepted (see :mod:`ckptkit.verify.atsave`).
        recovery: automatic recovery (:mod:`ckptkit.signals.recovery`, :meth:`recover`), needs ``watch``.
        on_divergence: what a multi-rank save does when the replicas of a tensor held
            different bytes (one rank's parameters or optimizer moments changed silently:
            see ``docs/distributed.md``). Either way the checkpoint is committed, recorded
            ``replica-divergent`` (never ``latest``, never restored, kept as evidence),
            ``watch`` hears of it and ``last_save.replicas`` names the tensors and ranks.
            ``"raise"`` (default): every rank raises
            :class:`~ckptkit.errors.ReplicaDivergenceError` (``CK-F120``) from that
            ``save`` (an async one: from the next ``save``/:meth:`wait`). ``"warn"``: a
            warning is logged and training goes on.
        replica_check_every: compare the replicas at every N-th save of this manager (the
            first included; 1: every save; 0: never). Each rank hashes its copy of the
            replicated state once per checked save (``benchmarks/replica_bench.py``).

    A writer (not ``readonly``) takes the run lock when it opens, so another live writer
    is refused before any training, not at the first save; it then removes leftovers of an
    interrupted save (temporary directories, half-written ``latest``/index replacements)
    and reports them; a committed checkpoint is never touched. A reader only reports them.

    Raises:
        NotWritableError: not ``readonly``, and ``root`` cannot be created or written.
        LockHeldError: not ``readonly``, and another live writer holds the run (after
            ``lock_timeout``); the message names it.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> model = torch.nn.Linear(2, 2)
        >>> ts = ckptkit.TrainState(model=model, step=10)
        >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), keep_last=2)
        >>> mgr.save(ts).name
        'step-00000010'
        >>> mgr.restore(ts).step
        10
    """

    def __init__(
        self,
        root: str | Location,
        *,
        keep_last: int = 3,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        compress: codec.Compression | None = None,
        lock_timeout: float = 0.0,
        verify_after_save: bool = True,
        background_verify: bool = True,
        lease_ttl: float = 60.0,
        key: signing.KeyLike | None = None,
        readonly: bool = False,
        watch: Any = None,
        emergency: EmergencyPolicy | None = None,
        on_inconsistent: atsave.Policy = "raise",
        recovery: RecoveryPolicy | None = None,
        on_divergence: records.ReplicaPolicy = "raise",
        replica_check_every: int = 1,
    ) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1: the newest checkpoint is always kept")
        self.root = fs.location(root)
        self.key = signing.resolve_key(key)
        self.run = Run(
            self.root,
            NativeLayout(),
            readonly=readonly,
            key=self.key,
            lock_timeout=lock_timeout,
            lease_ttl=lease_ttl,
            lazy=True,  # rank 0 takes the lock at open (Run.tidy below), not every rank
            good=("verified",) if verify_after_save else ("verified", "committed"),
            recheck=verify_after_save,
        )
        """The run: its lock, index, ``latest``, retention and settle step."""
        self.catalog = self.run.catalog
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.max_bytes = max_bytes
        self.lock_timeout = lock_timeout
        self.verify_after_save = verify_after_save
        self.lease_ttl = lease_ttl
        self.readonly = readonly
        self.watch = watch
        self.emergency = emergency if emergency is not None or watch is None else EmergencyPolicy()
        self.recovery = AutoRecovery(recovery, self) if recovery is not None else None
        self.trajectory = trajectory.Trajectory(self.run, join=self._join)
        self._saves = SavePipeline(
            self.root,
            trajectory=self.trajectory,
            writer=self.run.writer,
            fence=self.run.check,
            settle=saving.settle_in(self.run, policy=self._policy, verify=verify_after_save),
            key=self.key,
            compress=compress,
            on_inconsistent=on_inconsistent,
            background_verify=background_verify,
            on_divergence=on_divergence,
            replica_check_every=replica_check_every,
            watch=watch,
        )
        with opening_run_writable(self.root, readonly=readonly):
            if not readonly:
                fs.make_dirs(self.root)
            self.run.tidy()

    # --- lifecycle ---------------------------------------------------------------------------

    def wait(self) -> None:
        """Join the background job (an async save, or a save's verify and rotation).

        Raises:
            CkptkitError: what the job failed with (a save that committed but failed a
                later step raises :class:`~ckptkit.errors.CommittedError`).
        """
        self._saves.wait()

    def idle(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the background job; True when none runs.

        Unlike :meth:`wait` it raises nothing and leaves the job (and its error) to the
        next ``save``/``wait``: safe to call from another thread (the pre-emption
        watchdog lets an async save finish before the process exits).
        """
        return self._saves.idle(timeout)

    def _join(self) -> None:
        """Let the background job finish; its error stays for :meth:`wait` (or the next save)."""
        self._saves.join()

    @property
    def last_save(self) -> SaveStats:
        """Timings and findings of the last save (:class:`~ckptkit.run.saving.SaveStats`)."""
        return self._saves.last

    def close(self) -> None:
        """Wait for the background job, then release the writer lock."""
        try:
            self.wait()
        finally:
            self.run.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.run.close()

    # --- listing -----------------------------------------------------------------------------

    def list(self, *, verify: bool = False) -> builtins.list[CheckpointInfo]:
        """Every checkpoint directory of the run, oldest first, with its status.

        See :mod:`ckptkit.checkpoint.catalog` for the statuses. The listing first joins this
        manager's background job, so it sees the outcome of its own last save.

        Args:
            verify: re-verify every checkpoint that is not incomplete now (reads every
                byte; corrupt and unreadable ones too: a failure may have been transient)
                and record the outcome when no other writer holds the run
                (:meth:`ckptkit.run.Run.listing`, as ``ckptkit ls --verify``).

        Example:
            >>> import tempfile, torch, ckptkit
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp())
            >>> _ = mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=3))
            >>> [(c.step, c.status) for c in mgr.list()]
            [(3, 'verified')]
        """
        self._join()
        return self.run.listing(verify=verify)

    def latest(self) -> CheckpointInfo | None:
        """The checkpoint ``latest`` names: the newest verified one (None when there is none).

        With ``verify_after_save=False``, the newest committed one, as the file says.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> ckptkit.CheckpointManager(tempfile.mkdtemp()).latest() is None
            True
        """
        self._join()
        return self.run.latest()

    def leftovers(self) -> builtins.list[Location]:
        """Temporary directories of unfinished saves or deletions (never checkpoints)."""
        return self.run.leftovers()

    # --- save --------------------------------------------------------------------------------

    def save(
        self,
        state: TrainState,
        step: int | None = None,
        *,
        pin: str | Iterable[str] | None = None,
        async_: bool = False,
        health: Mapping[str, Any] | None = None,
        lookahead: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Location:
        """Save ``state`` as ``step-NNNNNNNN``: commit, verify, point ``latest``, rotate.

        With a process group initialised, ``save`` is collective: call it on every rank.
        Every rank writes its own files (its RNG state, a share of the replicated
        model/optimizer shards, its DCP shards); rank 0 writes the manifest last and
        commits. A failure on any rank commits nothing and raises on every rank.

        Args:
            state: the :class:`TrainState` to capture.
            step: the step label, an int with ``0 <= step < 2**53`` (default: ``state.step``).
            pin: label(s) that protect this checkpoint from rotation (``"best"``).
            async_: copy the state to host memory now (a consistent snapshot), write it
                in a background thread and return; the next save, :meth:`wait` or
                :meth:`close` joins it and raises its error if it failed.
            health: stability level and window statistics recorded in the manifest
                (default: the attached watch's snapshot).
            lookahead: what the run will do next (resume guard), recorded in the manifest.
            overwrite: replace an existing checkpoint of the same step.

        Returns:
            The checkpoint directory (committed when ``save`` returns; for an async save,
            after :meth:`wait`).

        Raises:
            StateError: the step is not a valid step (nothing is written).
            LockHeldError: another live writer holds the run directory.
            CkptkitError: the capture or write failed; older checkpoints are intact.
            CommittedError: (from the next call that joins the background job) the
                checkpoint committed but its verify, record or rotation failed.
            DistributedError: the save failed on another rank.
        """
        t0 = time.perf_counter()
        expect_train_state(state, "CheckpointManager.save")
        step = mf.check_step(state.step if step is None else step)  # before anything is written
        self.wait()  # one save in flight at most; surfaces a failed background job
        fields = saving.signal_fields(
            state, step, watch=self.watch, recovery=self.recovery, pin=pin, health=health,
            lookahead=lookahead,
        )
        return self._saves.save(state, step, fields, async_=async_, overwrite=overwrite, t0=t0)

    def observe(self, state: TrainState, verdict: Any = None) -> Location | None:
        """Act on a stability verdict: save and pin an emergency checkpoint when due.

        Call once per step after feeding the watch (``verdict`` defaults to
        ``self.watch.last``); with a process group on every rank (they agree to save). On the first ``warn`` of an episode (see
        :class:`ckptkit.signals.emergency.EmergencyPolicy`) the current state is saved and
        pinned, with the watch's snapshot as its health. If this state is saved already
        (``trajectory.holds``), that checkpoint is pinned instead.

        Returns:
            The emergency checkpoint's directory, or None when nothing was saved.

        Example:
            The one of :func:`~ckptkit.signals.emergency.emergency_checkpoint`, which this
            method is.
        """
        return emergency_checkpoint(self, state, verdict)

    def recover(self, state: TrainState) -> RecoveryEvent | None:
        """Act on the watch's verdict with ``recovery=`` (:meth:`.AutoRecovery.check`)."""
        return self.recovery.check(state) if self.recovery is not None else None

    # --- verify, retention -------------------------------------------------------------------

    def plan(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        delete_corrupt: bool = False,
    ) -> rotation.RetentionPlan:
        """The retention plan for the run as it is now (nothing is deleted)."""
        self._join()
        return self.run.plan(
            self._policy(
                keep_last=keep_last, keep_every=keep_every, max_bytes=max_bytes,
                delete_corrupt=delete_corrupt,
            )
        )

    def prune(self, *, dry_run: bool = False, **policy: Any) -> rotation.RetentionPlan:
        """Apply the retention plan (or only return it with ``dry_run``).

        Takes the writer lock first (``LockHeldError`` while a training run holds it), so
        the plan is made and applied with no save in between. Before anything is deleted,
        the newest checkpoint the plan keeps is verified again by reading every byte: if
        it fails, it is recorded corrupt, the plan is made again and nothing it justified
        is deleted (:mod:`ckptkit.run.retain`).

        Example:
            >>> import tempfile, torch, ckptkit
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), keep_last=5)
            >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
            >>> for s in (1, 2, 3):
            ...     ts.step = s; _ = mgr.save(ts)
            >>> [d.reason for d in mgr.prune(keep_last=1).decisions if not d.keep]
            ['delete: beyond keep_last=1', 'delete: beyond keep_last=1']
        """
        if dry_run:
            return self.plan(**policy)
        self.wait()
        inspect.signature(self.plan).bind(**policy)  # plan's keywords only, as a dry run takes
        return self.run.prune(self._policy(**policy)).plan

    def _policy(self, **given: Any) -> retain.Policy:
        """The run's policy under this manager's settings, those :meth:`plan` was given
        (not None) winning."""
        mine = self.run.policy(
            keep_last=self.keep_last, keep_every=self.keep_every, max_bytes=self.max_bytes
        )
        return replace(mine, **{k: v for k, v in given.items() if v is not None})

    # deleting by hand: only as the run's writer (the run itself is ``self.run``)

    def remove(self, info: CheckpointInfo) -> bool:
        """Delete one checkpoint, manifest-safe; needs the writer lock (:meth:`ckptkit.run.Run.remove`)."""
        return self.run.remove(info)

    def fence(self) -> None:
        """Be the run's writer before a delete (:meth:`ckptkit.run.Run.fence`): a read-only
        manager raises, always; a writer takes the run lock if it has not yet
        (``LockHeldError`` while another process holds it) and checks that it still holds
        it. A reader must never delete what a writer relies on."""
        self.run.fence()

    # --- restore -----------------------------------------------------------------------------

    def restore(
        self,
        state: TrainState,
        step: int | None = None,
        *,
        strict: bool = True,
        healthy: bool = False,
    ) -> RestoreResult | None:
        """Restore the newest checkpoint that verifies (or exactly ``step``).

        Candidates are tried newest first. One that fails while it is read (digest,
        size, header, a malformed tree, a file of the wrong kind, a DCP checkpoint for a
        run that does not use DCP) is skipped with a warning saying why, recorded corrupt
        when the fault is in its bytes, and the next older one is tried. One that cannot
        be read now for a reason that is not damage (a permission, an I/O error, the store
        unreachable: ``CK-F025``) is skipped the same way but recorded ``unreadable``,
        never corrupt, and tried again by the next restore. One recorded corrupt or
        unreadable before is read again too (the index is a claim, not proof): if it now
        verifies, that is recorded and it is used. ``latest`` is re-pointed to what is
        really newest and verified. Returns None when the run has no checkpoint (a fresh
        start).

        A checkpoint that is whole but does not fit the run (``strict``: the run passes
        state it lacks; the model's keys, shapes or dtypes differ, ``CK-R010``) is passed
        over only for an older checkpoint that does fit (an edited or foreign newest one),
        with a warning; when none fits, that error is raised: the run differs from the one
        that saved, and no fallback would hide it.

        With ``healthy=True`` only checkpoints whose recorded health is ``ok`` are
        candidates (the rollback after an instability); an attached watch is reset.

        Raises:
            IncompleteCheckpointError: checkpoints exist but none could be restored
                (each reason listed), or ``step`` does not exist.
            StateError: the run does not fit the checkpoint (see above).
            CkptkitError: ``step`` was given and that checkpoint fails.
        """
        self._join()
        found = restore_run(
            state,
            self.catalog.list,
            root=self.root,
            key=self.key,
            note=lambda path, outcome, why: self._note(path, outcome, why=why),
            step=step,
            strict=strict,
            healthy=healthy,
            watch=self.watch,
        )
        if found is None:
            return None  # a fresh start: the run has no checkpoint at all
        c, result = found
        if c.status != "verified" and result.proven:
            self._note(c.path, "verified", why=None)  # every byte was verified while read
        elif c.status == "verified":
            self.run.point_latest()  # a kill may have left latest behind what is really newest
        self.trajectory.restored(c.path.name, result.manifest, c.step)
        if self.recovery is not None:
            self.recovery.on_restore(result)  # the run's recovery history continues
        return result

    def _note(self, path: Location, outcome: codes.Outcome, *, why: str | None) -> None:
        """Record what a restore found and re-point ``latest``, if no other writer runs."""
        if self.run.record(path, outcome, why=why):
            self.run.point_latest()


__all__ = ["CheckpointManager", "SaveStats"]
