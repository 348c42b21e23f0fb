"""``CheckpointManager``: lock -> capture -> commit -> verify -> point ``latest`` -> rotate; restore.

The public methods keep the guard and order (as torchtitan's ``BaseCheckpointManager.save``
does); every step lives in its own module:

1. take the run lock (:mod:`ckptkit.storage.lock`: one writer per run directory);
2. capture the state on every rank (:class:`ckptkit.commit.StateSave`);
3. commit (:func:`ckptkit.commit.commit`: the one protocol for every world size, shards
   through safetensors or DCP, manifest last, rename into place);
4. verify the new checkpoint by reading it back (:mod:`ckptkit.verify`) and record the
   outcome (:class:`ckptkit.catalog.Catalog`);
5. point ``latest`` at the newest verified checkpoint;
6. rotate (:mod:`ckptkit.rotation` decides, after re-checking the newest kept one).

Steps 4-6 run in the background by default, off the training loop's critical path: a
checkpoint becomes ``latest`` and counts for retention only after its read-back verify, and
the next save (or :meth:`wait`, :meth:`close`, any listing) joins them first. Restore takes
the newest checkpoint that verifies while it is read and falls back past any that fails.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ckptkit import codes, crashpoints, retain, rotation, signing, trajectory
from ckptkit import guard as guard_mod
from ckptkit import manifest as mf
from ckptkit._repr import brief
from ckptkit.capture.state import RestoreResult, TrainState
from ckptkit.catalog import Catalog, CheckpointInfo, step_dir_name
from ckptkit.collective import Collective, TorchGroup, any_true, consensus, current
from ckptkit.commit import Stager, StateSave, commit
from ckptkit.errors import (
    CkptkitError,
    CommittedError,
    LockHeldError,
    opening_run_writable,
)
from ckptkit.recovery import AutoRecovery, RecoveryEvent, RecoveryPolicy
from ckptkit.restore import candidates, newest_restorable
from ckptkit.stability import EmergencyPolicy, StabilityWatch
from ckptkit.storage import codec, fs
from ckptkit.storage.fs import Location
from ckptkit.storage.lock import Lock, lock_for
from ckptkit.verify import atsave
from ckptkit.verify.runner import verify_one

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

    def __repr__(self) -> str:
        times = {k: round(getattr(self, k), 4) for k in ("blocked", "capture", "write", "verify", "total")}
        return brief(
            "SaveStats", step=self.step, **times, deleted=self.deleted, findings=self.findings
        )


@dataclass
class _Job:
    thread: threading.Thread
    step: int
    error: BaseException | None = None


_LIVE: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()
"""Managers with possibly unfinished background work (joined at interpreter exit)."""


def _finish_background_work() -> None:
    """Join every manager's background job before the interpreter shuts thread pools down.

    A script that calls ``mgr.save()`` and ends without ``close()`` still gets its
    checkpoint verified, ``latest`` pointed and rotation done. Registered with the same
    hook ``concurrent.futures`` uses, later, so it runs first.
    """
    for mgr in list(_LIVE):
        with contextlib.suppress(Exception):
            mgr._join()


threading._register_atexit(_finish_background_work)  # type: ignore[attr-defined]


def _leftovers_note(root: Location, left: builtins.list[str]) -> str:
    return (
        f"{len(left)} leftover temporary director{'y' if len(left) == 1 else 'ies'} in "
        f"{root} from an interrupted save: {', '.join(left)}"
    )


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
        recovery: automatic recovery (:mod:`ckptkit.recovery`, :meth:`recover`), needs ``watch``.

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
    ) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1: the newest checkpoint is always kept")
        self.root = fs.location(root)
        self.key = signing.resolve_key(key)
        self.catalog = Catalog(self.root, key=self.key)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.max_bytes = max_bytes
        self.compress = compress
        self.lock_timeout = lock_timeout
        self.verify_after_save = verify_after_save
        self.background_verify = background_verify
        self.lease_ttl = lease_ttl
        self.readonly = readonly
        self.watch = watch
        self.emergency = emergency if emergency is not None or watch is None else EmergencyPolicy()
        if on_inconsistent not in atsave.POLICIES:
            raise ValueError(f"on_inconsistent must be 'raise' or 'warn', not {on_inconsistent!r}")
        self.on_inconsistent: atsave.Policy = on_inconsistent
        self.recovery = AutoRecovery(recovery, self) if recovery is not None else None
        self.last_save = SaveStats()
        self._lock: Lock | None = None
        self._job: _Job | None = None
        self._stager = Stager()
        self._bg_coll: Collective | None = None
        self._fresh: set[str] = set()
        """Checkpoints this process verified by reading every byte since it last saved."""
        self.trajectory = trajectory.Trajectory(self.catalog, self._good_statuses, join=self._join)
        with opening_run_writable(self.root, readonly=readonly):
            if not readonly and fs.is_local(self.root):  # object stores have no directories
                self.root.mkdir(parents=True, exist_ok=True)
            self._clean_on_open()  # a writer takes the lock here: it creates the lock file

    # --- lifecycle ---------------------------------------------------------------------------

    def wait(self) -> None:
        """Join the background job (an async save, or a save's verify and rotation).

        Raises:
            CkptkitError: what the job failed with (a save that committed but failed a
                later step raises :class:`~ckptkit.errors.CommittedError`).
        """
        self._join()
        job, self._job = self._job, None
        if job is not None and job.error is not None:
            raise job.error

    def idle(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the background job; True when none runs.

        Unlike :meth:`wait` it raises nothing and leaves the job (and its error) to the
        next ``save``/``wait``: safe to call from another thread (the pre-emption
        watchdog lets an async save finish before the process exits).
        """
        job = self._job
        if job is None:
            return True
        job.thread.join(timeout)
        return not job.thread.is_alive()

    def _join(self) -> None:
        """Let the background job finish; its error stays for :meth:`wait` (or the next save)."""
        if self._job is not None:
            self._job.thread.join()

    def close(self) -> None:
        """Wait for the background job, then release the writer lock."""
        try:
            self.wait()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._lock is not None:
                self._lock.release()

    def _writer(self) -> None:
        """Become the run's single writer (once), then clean leftovers nobody else owns."""
        if self._lock is not None:
            return
        if self.readonly:
            raise CkptkitError(
                "this CheckpointManager was opened read-only",
                path=self.root,
                hint="open it without readonly=True to save or prune",
            )
        lock = lock_for(self.root, timeout=self.lock_timeout, lease_ttl=self.lease_ttl)
        lock.acquire()
        self._lock = lock
        left = [p.name for p in self.catalog.leftovers()]
        if left:
            log.warning("ckptkit: %s; cleaning up", _leftovers_note(self.root, left))
        self.catalog.clean_leftovers()

    def _fence(self) -> None:
        """Raise unless this manager still holds the run lock (before a commit or delete)."""
        if self._lock is not None:
            self._lock.check()

    @contextlib.contextmanager
    def _maybe_writer(self) -> Iterator[bool]:
        """Yield True while this process may update the run's records (it holds the lock).

        Readers (restore, ``ls --verify``) record what they found only when no other
        writer runs; otherwise they report it and leave the records to the writer.
        """
        if self._lock is not None:
            yield True
            return
        if self.readonly or current().rank != 0:
            yield False
            return
        lock = lock_for(self.root, timeout=0.0, lease_ttl=self.lease_ttl)
        try:
            lock.acquire()
        except LockHeldError:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def _clean_on_open(self) -> None:
        """A writer takes the run lock now (waiting ``lock_timeout``), so another live writer
        is refused at open, before any training, and leftovers of an interrupted save are
        removed; a reader reports them."""
        if current().rank != 0:
            return  # rank 0 owns the run directory's housekeeping
        if not self.readonly:
            self._writer()
            return
        left = [p.name for p in self.catalog.leftovers()]
        if left:
            note = _leftovers_note(self.root, left)
            log.warning("ckptkit: %s (left in place: opened read-only)", note)

    # --- listing -----------------------------------------------------------------------------

    def list(self, *, verify: bool = False) -> builtins.list[CheckpointInfo]:
        """Every checkpoint directory of the run, oldest first, with its status.

        See :mod:`ckptkit.catalog` for the statuses. The listing first joins this
        manager's background job, so it sees the outcome of its own last save.

        Args:
            verify: re-verify every committed checkpoint now (reads every byte) and
                record the outcome when no other writer holds the run.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp())
            >>> _ = mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=3))
            >>> [(c.step, c.status) for c in mgr.list()]
            [(3, 'verified')]
        """
        self._join()
        if verify:
            for c in self.catalog.list():
                if c.status in ("verified", "committed", "corrupt", "unreadable"):
                    self._verify(c.path)
        return self._noted(self.catalog.list())

    def _noted(self, infos: builtins.list[CheckpointInfo]) -> builtins.list[CheckpointInfo]:
        """Say, as the ``problem`` of a good checkpoint, what its saver accepted (``warn``)."""
        out = []
        for c in infos:
            if c.status in ("verified", "committed") and c.problem is None:
                with contextlib.suppress(CkptkitError, OSError):
                    note = atsave.summary(self.catalog.manifest(c.path)[0])
                    if note is not None:
                        c = replace(c, problem=note)
            out.append(c)
        return out

    def latest(self) -> CheckpointInfo | None:
        """The checkpoint ``latest`` names: the newest verified one (None when there is none).

        With ``verify_after_save=False``, the newest committed one, as the file says.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> ckptkit.CheckpointManager(tempfile.mkdtemp()).latest() is None
            True
        """
        good = [c for c in self.list() if c.status in self._good_statuses]
        return good[-1] if good else None

    def leftovers(self) -> builtins.list[Location]:
        """Temporary directories of unfinished saves or deletions (never checkpoints)."""
        return self.catalog.leftovers()

    @property
    def _good_statuses(self) -> tuple[str, ...]:
        return ("verified",) if self.verify_after_save else ("verified", "committed")

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
        step = mf.check_step(state.step if step is None else step)  # before anything is written
        self.wait()  # one save in flight at most; surfaces a failed background job
        coll = current()
        pins = (pin,) if isinstance(pin, str) else tuple(pin or ())
        if health is None and self.watch is not None:
            health = self.watch.snapshot()  # healthy only if every rank's watch says so:
            health = StabilityWatch.worst(coll.all_gather(health)) if coll.world_size > 1 else health
        fields: dict[str, Any] = {"pins": pins, "lookahead": guard_mod.lookahead(state, lookahead)}
        if health is not None:
            fields["health"] = dict(health)
        fields.update(self.recovery.on_save(step, health) if self.recovery is not None else {})
        stats = SaveStats(step=step)
        err: BaseException | None = None
        snap: StateSave | None = None
        try:
            snap = StateSave.capture(state, coll, step=step, fields=fields, compress=self.compress)
        except BaseException as e:
            err = e
        # Every rank captured before any rank enters a collective write (DCP's save).
        consensus(coll, err, what=f"capture for step {step}")
        assert snap is not None
        stats.capture = time.perf_counter() - t0
        final = self.root / step_dir_name(step)
        if async_:
            bg = self._background(coll)
            snap = snap.staged(self._stager)
            snap.process_group = getattr(bg, "group", None)
            self._start(
                step, lambda: self._commit_and_settle(snap, bg, final, overwrite, stats, t0)
            )
            stats.blocked = time.perf_counter() - t0
            self.last_save = stats
            return final
        man = self._commit(snap, coll, final, overwrite, stats)
        stats.blocked = time.perf_counter() - t0
        self.last_save = stats
        if man is not None:  # rank 0
            if self.background_verify:
                self._start(step, lambda: self._settle(final, man, stats, t0))
            else:
                self._settle(final, man, stats, t0)
        return final

    def _commit(
        self, snap: StateSave, coll: Collective, final: Location, overwrite: bool, stats: SaveStats
    ) -> mf.Manifest | None:
        tw = time.perf_counter()
        write, build = self._checked(snap, coll, stats)
        man = commit(
            final,
            coll,
            write=write,
            build=build,
            overwrite=overwrite,
            prepare=lambda: self._prepare(snap.step),
            fence=self._fence,
            key=self.key,
        )
        stats.write = time.perf_counter() - tw
        if man is not None:
            self.trajectory.committed(final.name, man.digest)
            self._on_findings(final, man, stats)
        return man

    def _prepare(self, step: int) -> None:
        """Rank 0, before a commit: the run lock, then a branch (:mod:`ckptkit.trajectory`)."""
        self._writer()
        self.trajectory.branch(step)

    def _checked(
        self, snap: StateSave, coll: Collective, stats: SaveStats
    ) -> tuple[Callable[[Location], Any], Callable[[builtins.list[Any]], mf.Manifest]]:
        """The commit's write and build, with the consistency checks before the manifest.

        Rank 0 checks the manifest it built against the files just written, the tensor
        values scanned in memory, and records the findings in it (with the policy).
        """
        written: builtins.list[Location] = []

        def write(tmp: Location) -> Any:
            written.append(tmp)
            return snap.write(tmp, coll)

        def build(parts: builtins.list[Any]) -> mf.Manifest:
            man = snap.build(parts)
            try:
                out = atsave.check_before_commit(
                    man, written[0], snap.encoded.tensors, policy=self.on_inconsistent
                )
                stats.values_scanned = (
                    coll.world_size == 1
                    and fs.is_local(written[0])
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

    def _commit_and_settle(
        self,
        snap: StateSave,
        coll: Collective,
        final: Location,
        overwrite: bool,
        stats: SaveStats,
        t0: float,
    ) -> None:
        man = self._commit(snap, coll, final, overwrite, stats)
        if man is not None:
            self._settle(final, man, stats, t0)

    def _settle(self, final: Location, man: mf.Manifest, stats: SaveStats, t0: float) -> None:
        """After the commit: verify by reading back, record, point ``latest``, rotate.

        Raises:
            CommittedError: the checkpoint committed, but this step failed.
        """
        tv = time.perf_counter()
        try:
            if self.verify_after_save:
                # Digests prove the bytes are what was scanned in memory before the commit.
                bad = self._verify(final, man=man, scan_values=not stats.values_scanned)
                if bad:
                    first = bad[0]
                    raise CommittedError(
                        f"{final.name} committed, but its read-back verify failed: "
                        f"{first.code} {first.message}; it is recorded corrupt and never "
                        "becomes latest or counts for retention",
                        committed=final,
                        path=final / first.path if first.path else final,
                        code=first.code,
                        hint=first.hint,
                    )
            stats.verify = time.perf_counter() - tv
            crashpoints.reached("settle.verified")
            self.catalog.point_latest(accept=self._good_statuses)  # type: ignore[arg-type]
            crashpoints.reached("settle.latest")
            stats.deleted = self._rotate()
            crashpoints.reached("settle.done")
        except CommittedError:
            raise
        except (CkptkitError, OSError) as e:
            raise CommittedError(
                f"{final.name} committed, but recording it failed: {e}",
                committed=final,
                hint="the checkpoint is whole and restorable; do not save this step again. "
                "Fix the cause (disk space, permissions) and the next save records it",
            ) from e
        stats.total = time.perf_counter() - t0

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

    def observe(self, state: TrainState, verdict: Any = None) -> Location | None:
        """Act on a stability verdict: save and pin an emergency checkpoint when due.

        Call once per step after feeding the watch (``verdict`` defaults to
        ``self.watch.last``); with a process group on every rank (they agree to save). On the first ``warn`` of an episode (see
        :class:`ckptkit.stability.EmergencyPolicy`) the current state is saved and
        pinned, with the watch's snapshot as its health. If this state is saved already
        (``trajectory.holds``), that checkpoint is pinned instead.

        Returns:
            The emergency checkpoint's directory, or None when nothing was saved.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> from ckptkit.stability import StabilityWatch
            >>> w = StabilityWatch()
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), watch=w)
            >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=7)
            >>> _ = w.update(7, loss=float("nan"))
            >>> mgr.observe(ts).name, mgr.list()[0].pins
            ('step-00000007', ('emergency',))
        """
        v = verdict if verdict is not None else (self.watch.last if self.watch else None)
        policy = self.emergency
        due = v is not None and policy is not None and policy.should_save(v)
        if policy is None or not any_true(current(), due):  # agreed: one rank may degrade alone
            return None
        self.wait()  # a save of this very step may still be settling
        existing = self.root / step_dir_name(state.step)
        if self.trajectory.holds(state.step):
            self._writer()
            self.catalog.pin(existing, policy.pin)
            path = existing
        else:
            path = self.save(state, pin=policy.pin)
        policy.saved(state.step)
        log.warning("ckptkit: emergency checkpoint %s (%s)", path.name,
                    v.summary() if v is not None else "another rank's watch warned")
        return path

    def recover(self, state: TrainState) -> RecoveryEvent | None:
        """Act on the watch's verdict with ``recovery=`` (:meth:`.AutoRecovery.check`)."""
        return self.recovery.check(state) if self.recovery is not None else None

    # --- verify, retention -------------------------------------------------------------------

    def _verify(
        self, path: Location, *, man: mf.Manifest | None = None, scan_values: bool = True
    ) -> builtins.list[codes.Finding]:
        """Verify one checkpoint by reading every byte; record the outcome if we may."""
        rep = verify_one(path, progress=False, options={"scan_values": scan_values}, key=self.key)
        if rep.gone:
            return []
        bad = rep.errors
        why = "; ".join(f"{f.code} {f.message}" for f in bad[:3]) or None
        with self._maybe_writer() as mine:
            if mine:
                m = man or rep.manifest
                if m is not None:
                    self.catalog.record(path, m, codes.outcome(f.code for f in bad), why=why)
        if not bad:
            self._fresh.add(path.name)
        return bad

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
        return retain.plan(self, self._policy(keep_last, keep_every, max_bytes, delete_corrupt))

    def prune(self, *, dry_run: bool = False, **policy: Any) -> rotation.RetentionPlan:
        """Apply the retention plan (or only return it with ``dry_run``).

        Takes the writer lock first (``LockHeldError`` while a training run holds it), so
        the plan is made and applied with no save in between. Before anything is deleted,
        the newest checkpoint the plan keeps is verified again by reading every byte: if
        it fails, it is recorded corrupt, the plan is made again and nothing it justified
        is deleted (:mod:`ckptkit.retain`).

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
        self._writer()
        self._fresh.clear()  # a hand prune re-checks from bytes, whatever was read before
        return self._apply(self._policy(**policy)).plan

    def _rotate(self) -> builtins.list[str]:
        if self.verify_after_save:
            # A checkpoint that committed but was never verified (its writer died in
            # between) is verified now, so keep_last counts it instead of deleting it.
            for c in self.catalog.list():
                if c.status == "committed":
                    self._verify(c.path)
        deleted = self._apply(self._policy()).deleted
        self._fresh.clear()
        return deleted

    def _apply(self, policy: retain.Policy) -> retain.Outcome:
        out = retain.apply(
            self,
            policy,
            recheck=self.verify_after_save,
            fresh={c.step for c in self.catalog.list() if c.path.name in self._fresh},
        )
        if out.deleted:
            self.catalog.forget(d.split(":", 1)[0] for d in out.deleted)
        self.catalog.point_latest(accept=self._good_statuses)  # type: ignore[arg-type]
        return out

    def _policy(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        delete_corrupt: bool = False,
    ) -> retain.Policy:
        return retain.Policy(
            keep_last=self.keep_last if keep_last is None else keep_last,
            keep_every=self.keep_every if keep_every is None else keep_every,
            max_bytes=self.max_bytes if max_bytes is None else max_bytes,
            delete_corrupt=delete_corrupt,
            good=self._good_statuses,
        )

    # the RunStore side of ckptkit.retain

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """Every checkpoint of the run with its recorded status (for :mod:`ckptkit.retain`)."""
        return self.catalog.list()

    def reverify(self, info: CheckpointInfo) -> builtins.list[codes.Finding]:
        """Verify one checkpoint from its bytes and record it (for :mod:`ckptkit.retain`)."""
        return self._verify(info.path)

    def remove(self, info: CheckpointInfo) -> bool:
        """Delete one checkpoint, manifest-safe, as the run's writer (for :mod:`ckptkit.retain`)."""
        self.fence()
        return self.catalog.remove(info.path)

    def fence(self) -> None:
        """Be the run's writer before a delete (for :mod:`ckptkit.retain`): a read-only
        manager raises, a writer takes the run lock if it has not yet (``LockHeldError``
        while another process holds it) and checks that it still holds it. Deleting
        needs the writer lock, always: a reader must never delete what a writer relies on."""
        self._writer()
        self._fence()

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
        coll = current()
        infos = coll.broadcast(self.catalog.list() if coll.rank == 0 else None)
        if not infos and step is None and not healthy:
            return None  # a fresh start: the run has no checkpoint at all
        infos, notes = candidates(infos, step=step, healthy=healthy, root=self.root)
        if healthy and self.watch is not None:
            self.watch.reset()  # its windows describe the run we roll back from
        c, result, skipped = newest_restorable(
            state,
            infos,
            exact=step is not None,
            strict=strict,
            coll=coll,
            key=self.key,
            note=lambda path, outcome, why: self._note(path, outcome, why=why),
        )
        if c.status != "verified":
            self._note(c.path, "verified", why=None)  # every byte was verified while read
        else:
            with self._maybe_writer() as mine:
                if mine:  # a kill may have left latest behind what is really newest
                    self.catalog.point_latest(accept=self._good_statuses)  # type: ignore[arg-type]
        result.notes[:0] = [*notes, *(f"skipped {s}" for s in skipped)]
        self.trajectory.restored(c.path.name, result.manifest, c.step)
        if self.recovery is not None:
            self.recovery.on_restore(result)  # the run's recovery history continues
        return result

    def _note(self, path: Location, outcome: codes.Outcome, *, why: str | None) -> None:
        """Record what a restore found and re-point ``latest``, if no other writer runs."""
        try:
            man, _ = self.catalog.manifest(path)
        except CkptkitError:
            return  # an invalid manifest is listed as corrupt without a record
        with self._maybe_writer() as mine:
            if mine:
                self.catalog.record(path, man, outcome, why=why)
                self.catalog.point_latest(accept=self._good_statuses)  # type: ignore[arg-type]


__all__ = ["CheckpointManager", "SaveStats"]
