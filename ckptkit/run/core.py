"""``Run``: one run directory of any layout, with everything that makes it safe.

A run owns, for every layout (:mod:`ckptkit.run.layout`):

* **the lock** (:func:`ckptkit.storage.lock.lock_for`: flock on a local disk, a lease on
  an object store). A writable run takes it when it opens (a
  :class:`~ckptkit.CheckpointManager` too: its :meth:`Run.tidy` at open). A run opened
  ``readonly`` can never delete, pin or record: :meth:`Run.fence` raises, always, also
  when no other process holds the lock.
* **the run index** (``.ckptkit-index.json``): verify outcomes, pins and intent records.
  The run is its only writer; it records only while it holds the lock (a writable run
  without it yet takes it for the moment, when nobody else holds it).
* **``latest``** (native runs), **pins** and **retention** (:func:`ckptkit.run.retain.apply`).
* **the settle step** after each save (:meth:`Run.settle`): verify, adopt and record,
  point ``latest``, rotate. A process killed anywhere in it leaves a run that the next
  :meth:`Run.resume_target` reads right: the crash points, in order, are

  ``settle.begin``
      the framework's (or the commit's) files are written, nothing adopted or recorded;
  ``settle.adopted``
      the adopted manifest is written beside the files (framework layouts), the run
      index does not record it yet;
  ``settle.verified``
      the outcome is recorded in the run index;
  ``settle.latest``
      ``latest`` points at the new checkpoint (native runs); rotation not started;
  ``rotate.deleted``
      rotation deleted one checkpoint (more may follow);

  then ``settle.done``.
* **the intent record** (:meth:`Run.intend`): before a framework writes a checkpoint whose
  name does not carry its step (Accelerate's ``checkpoint_I`` counts saves), the run
  records the step it will hold, so a kill before adoption still knows it.
* **resume selection** (:meth:`Run.resume_target`): the newest complete state, adopted on
  the spot when it is complete but was never adopted; every newer checkpoint passed over
  is named with why.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace

from ckptkit import codes, crashpoints
from ckptkit.checkpoint.catalog import UNUSABLE, Catalog, CheckpointInfo, Status
from ckptkit.codes import Finding
from ckptkit.collective import current
from ckptkit.errors import LockHeldError, NotWritableError
from ckptkit.format import signing
from ckptkit.run import retain, rotation
from ckptkit.run.layout import AdoptRequest, Checked, Layout, step_unknown
from ckptkit.signals.recovery import ABANDONED
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location
from ckptkit.storage.lock import Lock, lock_for
from ckptkit.verify.findings import ERROR
from ckptkit.verify.foreign.adopt import Adoption, Notes, recorded_step
from ckptkit.verify.foreign.adopted import adopted_path
from ckptkit.verify.view import Expect

log = logging.getLogger("ckptkit")


@dataclass
class Settled:
    """What :meth:`Run.settle` did with one new checkpoint."""

    path: Location
    step: int | None
    outcome: codes.Outcome | None = None
    """What its verify found; None when it was not verified (``verify=False``)."""
    errors: builtins.list[Finding] = field(default_factory=list)
    """The error findings of its verify (empty: good; it became ``latest`` and counted
    for retention)."""
    adoption: Adoption | None = None
    """The adoption (framework layouts)."""
    rotation: retain.Outcome | None = None
    """What rotation did (None: no policy, or the checkpoint failed its verify)."""
    verify_seconds: float = 0.0
    """How long its verify (and adoption) took."""

    @property
    def deleted(self) -> builtins.list[str]:
        """``"name: why"`` per checkpoint rotation deleted."""
        return list(self.rotation.deleted) if self.rotation is not None else []


@dataclass
class Resume:
    """What :meth:`Run.resume_target` chose."""

    info: CheckpointInfo | None
    """The checkpoint to resume from (None: a fresh start, none is usable)."""
    passed: builtins.list[str] = field(default_factory=list)
    """``"name: why"`` per newer checkpoint passed over (each logged at WARNING)."""
    adopted: bool = False
    """The chosen checkpoint was complete but never adopted, and was adopted just now."""

    @property
    def path(self) -> Location | None:
        return self.info.path if self.info is not None else None

    @property
    def step(self) -> int | None:
        return self.info.step if self.info is not None else None


class Run:
    """One run directory: its layout, lock, index, ``latest``, retention and settle step.

    Args:
        root: the directory holding the checkpoints (a Trainer ``output_dir``, an
            Accelerate ``checkpoints/``, a Lightning ``checkpoints/``, a native run).
        layout: the layout strategy (:mod:`ckptkit.run.layout`).
        readonly: list, verify and restore only; never delete, pin or record.
        key: the HMAC key (default: ``CKPTKIT_HMAC_KEY`` / ``_FILE``): adopted manifests
            are signed with it, and every manifest and index record must check under it.
        lock_timeout: seconds to wait for the run lock.
        lease_ttl: on an object store, the lease's time to live.
        lazy: a writable run takes its lock at its first write, not when it opens (a
            :class:`~ckptkit.CheckpointManager` takes it right after, in :meth:`tidy` on
            rank 0; ``ckptkit adopt`` and ``ls --verify`` only if they write).
        good: statuses that count as good (``committed`` too when the run does not verify).
        recheck: verify the newest kept good checkpoint from its bytes before rotation
            deletes anything (:func:`ckptkit.run.retain.apply`).

    Raises:
        LockHeldError: writable, not ``lazy``, and another live process holds the lock.

    Example:
        >>> import tempfile
        >>> from ckptkit.run.native import NativeLayout
        >>> with Run(tempfile.mkdtemp(), NativeLayout()) as run:
        ...     run.checkpoints(), run.layout
        ([], 'ckptkit')
    """

    def __init__(
        self,
        root: str | Location,
        layout: Layout,
        *,
        readonly: bool = True,
        key: signing.KeyLike | None = None,
        lock_timeout: float = 0.0,
        lease_ttl: float = 60.0,
        lazy: bool = False,
        good: tuple[Status, ...] = ("verified",),
        recheck: bool = True,
    ) -> None:
        self.root = fs.location(root)
        self.strategy = layout
        self.readonly = readonly
        self.key = signing.resolve_key(key)
        self.lock_timeout = lock_timeout
        self.lease_ttl = lease_ttl
        self.good = good
        self.recheck = recheck
        self.meta = layout.meta(self.root)
        """Where the run lock and the run index live."""
        self.catalog = Catalog(self.meta, key=self.key)
        """The run index's reader and (through this run only) writer."""
        self._lock: Lock | None = None
        self._fresh: set[str] = set()
        """Checkpoints verified from every byte by this run since it last rotated."""
        if not readonly and not lazy:
            fs.make_dirs(self.root)
            self.writer()

    # --- identity, lifecycle ---------------------------------------------------------------

    @property
    def layout(self) -> str:
        """The layout's name (``ckptkit`` for native runs, else the framework's)."""
        return self.strategy.name

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the run lock (if held)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def lock(self) -> Lock | None:
        """The writer lock while this run holds it."""
        return self._lock

    def check(self) -> None:
        """Raise if this run held the lock and lost it (a lease another writer took over);
        nothing while it holds none (a commit's fence on ranks that own no lock)."""
        if self._lock is not None:
            self._lock.check()

    def tidy(self) -> None:
        """On open (rank 0, which owns the run directory's housekeeping): a writable run
        takes the run lock now (waiting ``lock_timeout``), so another live writer is refused
        at open, before any training, not at the first save; taking it removes the
        leftovers of an interrupted save or deletion (temporary directories, half-written
        ``latest``/index replacements), with a warning naming them. A read-only run only
        reports them, and warns when it is signed but opened without a key. A committed
        checkpoint is never touched.

        Raises:
            LockHeldError: writable, and another live writer holds the run.
            SignatureError: ``CK-R012``, writable, and the run is signed with a key this
                run was not given.
        """
        if current().rank != 0:
            return
        if not self.readonly:
            self.writer()
            return
        note = self.signature_note()
        if note is not None:
            log.warning("ckptkit: %s", note)
        left = [p.name for p in self.leftovers()]
        if left:
            log.warning("ckptkit: %s (left in place: opened read-only)", _leftovers_note(self.root, left))

    def writer(self) -> None:
        """Become the run's single writer (once), then clean what interrupted saves and
        deletions left.

        Raises:
            NotWritableError: the run was opened read-only.
            LockHeldError: another live process holds the lock.
            SignatureError: ``CK-R012``, the run is signed with a key this run was not
                given (:meth:`_keep_signed`).
        """
        if self._lock is not None:
            return
        self._refuse_readonly()
        lock = lock_for(self.meta, timeout=self.lock_timeout, lease_ttl=self.lease_ttl)
        lock.acquire()
        try:
            self._keep_signed()
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        left = [p.name for p in self.leftovers()]
        if left:
            log.warning("ckptkit: %s; cleaning up", _leftovers_note(self.root, left))
        self._clean()

    def signed_by(self) -> str | None:
        """The id of the key this run is signed with (:meth:`Catalog.signed_by`), or None."""
        return self.catalog.signed_by()

    def signature_note(self) -> str | None:
        """What a command run without a key should say of a signed run, or None."""
        if self.key is not None:
            return None
        kid = self.signed_by()
        if kid is None:
            return None
        return (
            f"{self.root} is a signed run (key id {kid}); without its key, signatures are not "
            "checked and nothing here proves who wrote a checkpoint: pass --key-file (or set "
            f"{signing.ENV_KEY_FILE})"
        )

    def _keep_signed(self) -> None:
        """A run saved with a key stays signed (the caller just took the lock): a writer
        without the run's key, or with another, is refused before it writes or deletes
        anything (``CK-R012``); a writer with a key records that the run is signed."""
        kid = self.signed_by()
        mine = signing.key_id(self.key) if self.key is not None else None
        if kid is not None and kid != mine:
            given = "without a key" if mine is None else f"with another key (id {mine})"
            raise codes.error(
                codes.R012,
                f"this run is signed (key id {kid}) and was opened for writing {given}",
                path=self.root,
            )
        self.catalog.mark_signed()

    def fence(self) -> None:
        """Raise unless this run may delete: it was opened writable and holds the lock
        (taken now if it has not yet) and still holds it. Deleting needs the writer lock,
        always: a reader must never delete what a writer relies on."""
        self.writer()
        assert self._lock is not None
        self._lock.check()

    def _refuse_readonly(self) -> None:
        if self.readonly:
            raise NotWritableError(
                f"this run was opened read-only ({self.layout} layout): it never deletes, "
                "pins or records",
                path=self.root,
                hint="open it writable (readonly=False; it takes the run lock) to save, "
                "prune, pin or delete",
            )

    @contextlib.contextmanager
    def may_record(self) -> Iterator[bool]:
        """Yield True while this process may write the run index (it holds the lock, or
        takes it for the moment when it is writable and nobody else holds it).

        Readers (``ls``, a restore of a read-only manager) record nothing; a writable run
        whose lock another process holds reports what it found and leaves the records to
        that writer.
        """
        if self._lock is not None:
            yield True
            return
        if self.readonly or current().rank != 0:
            yield False
            return
        lock = lock_for(self.meta, timeout=0.0, lease_ttl=self.lease_ttl)
        try:
            lock.acquire()
        except (LockHeldError, OSError):
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def _clean(self) -> None:
        """Remove leftovers of interrupted saves and deletions (the caller holds the lock)."""
        self.strategy.clean_leftovers(self.root)
        if str(self.meta) != str(self.root):
            self.catalog.clean_leftovers()  # half-written index replacements

    # --- reading --------------------------------------------------------------------------

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """Every checkpoint with its status and real step, oldest first (no bytes read)."""
        return self.strategy.checkpoints(self.root, self.catalog, self.catalog.index())

    def listing(self, *, verify: bool = False) -> builtins.list[CheckpointInfo]:
        """Every checkpoint, oldest first (``ckptkit ls``).

        Args:
            verify: verify every checkpoint that is not incomplete from its bytes first
                (corrupt and unreadable ones too: a failure may have been transient) and
                record the outcome where this run may. The one re-verify rule of
                ``ckptkit ls --verify`` and ``CheckpointManager.list(verify=True)``.
        """
        if verify:
            for c in self.checkpoints():
                if c.status != "incomplete":
                    self.reverify(c)
        return sorted(self.checkpoints(), key=lambda c: c.step)

    def latest(self) -> CheckpointInfo | None:
        """The newest good checkpoint (what ``latest`` names on a native run)."""
        good = [c for c in self.checkpoints() if c.status in self.good]
        return good[-1] if good else None

    def leftovers(self) -> builtins.list[Location]:
        """What interrupted saves or deletions left behind (never checkpoints)."""
        return self.strategy.leftovers(self.root)

    def resume_hint(self, info: CheckpointInfo) -> str:
        """How to resume from ``info`` in the layout's own terms."""
        return self.strategy.resume_hint(info)

    def step_of(self, path: Location) -> int | None:
        """The real step of the checkpoint at ``path`` (:meth:`Layout.step_of`)."""
        return self.strategy.step_of(fs.location(path), self.catalog, self.catalog.index())

    # --- recording (the index's only writer) -------------------------------------------------

    def record(
        self, path: Location, outcome: codes.Outcome, *, why: str | None, ident: str | None = None
    ) -> bool:
        """Record a verify outcome of ``path`` in the run index, keyed by ``ident`` (default:
        :meth:`Layout.identity` of it now). Returns whether it was recorded."""
        path = fs.location(path)
        with self.may_record() as mine:
            if not mine:
                return False
            ident = ident or self.strategy.identity(path, self.catalog)
            if ident is None:
                return False
            self.catalog.note(path.name, ident, outcome, why=why)
            return True

    def pin(self, path: Location, label: str) -> None:
        """Pin a checkpoint (rotation never deletes it); needs the writer lock."""
        self.fence()
        self.catalog.pin(fs.location(path), label)

    def intend(self, name: str, step: int) -> None:
        """Record, before a framework writes checkpoint ``name``, that it will hold ``step``.

        The layout reads it back for a checkpoint whose files do not say their step (a
        kill between the framework's write and the adoption); signed with the run's key.

        An *incomplete* checkpoint of the same step under another name (a save of this step
        that a kill interrupted, which the restart passed over) is superseded by this one:
        it is set aside into ``.ckptkit-abandoned/interrupted-step-S/`` beside the run
        index (kept for a post-mortem, never resumed or rotated), so that one step is one
        checkpoint again. Only the writer gets here, so no live save owns it.
        """
        self.fence()
        stale = [
            c for c in self.checkpoints()
            if c.status == "incomplete" and c.step == step and c.path.name != name
        ]
        if stale:
            dest = self.meta / ABANDONED / f"interrupted-step-{step}"
            moved = self.set_aside(stale, dest)
            log.warning(
                "ckptkit: %s held an interrupted save of step %d; the new save of that step "
                "supersedes it: set aside into %s",
                ", ".join(moved), step, dest,
            )
        self.catalog.intend(name, step)

    def point_latest(self) -> str | None:
        """Point ``latest`` at the newest good checkpoint (native runs; the lock holder)."""
        if not self.strategy.keeps_latest:
            return None
        with self.may_record() as mine:
            if mine:
                return self.catalog.point_latest(self.checkpoints(), accept=self.good)
        return None

    def set_aside(self, infos: Collection[CheckpointInfo], dest: Location) -> builtins.list[str]:
        """Move checkpoints out of the run into ``dest``, whole, forget their records and
        re-point ``latest``; needs the writer lock. Returns the names moved.

        For a trajectory the run no longer continues: the one an automatic recovery
        abandons, or the one a save after restoring an older step supersedes. Set aside, a
        checkpoint is kept for a post-mortem but no longer listed, restored, rotated or
        rolled back to, and its step can be saved again. Each move is
        :func:`ckptkit.storage.atomic.move_tree`: one rename locally; on an object store
        (no rename) a copy, then the source removed through the layout (marker first), so a
        crash leaves the checkpoint where it was (maybe with a partial copy), never neither.
        Those moved before a failure are forgotten too.
        """
        self.fence()
        moved: builtins.list[str] = []
        try:
            for c in infos:
                atomic.move_tree(
                    c.path, dest / c.path.name, remove=lambda p: self.strategy.remove(self.root, p)
                )
                moved.append(c.path.name)
        finally:
            if moved:
                self.catalog.forget(moved)
                self.point_latest()
        return moved

    # --- verify, adopt ----------------------------------------------------------------------

    def verify(
        self, path: Location, *, scan_values: bool = True, ident: str | None = None
    ) -> builtins.list[Finding]:
        """Verify one checkpoint from its bytes, record the outcome, return its errors."""
        path = fs.location(path)
        chk = self.strategy.verify(path, self.catalog, key=self.key, scan_values=scan_values)
        self._record_check(path, chk, ident=ident)
        return chk.errors

    def scrub_one(self, info: CheckpointInfo) -> tuple[builtins.list[Finding], codes.Outcome, bool]:
        """:meth:`reverify`, saying also what it found and whether the outcome was recorded
        (``ckptkit scrub``: while a live writer holds the run lock, nothing is recorded and
        the scrub says so). Returns ``(errors, outcome, recorded)``."""
        chk = self.strategy.verify(info.path, self.catalog, key=self.key)
        outcome, recorded = self._record_check(info.path, chk, ident=None)
        return chk.errors, outcome, recorded

    def _record_check(
        self, path: Location, chk: Checked, *, ident: str | None
    ) -> tuple[codes.Outcome, bool]:
        """Record what a verify of ``path`` found (keyed by ``ident``, else what the verify
        read; nothing when neither is known: gone, or its manifest cannot be read) and
        return its outcome and whether it was recorded; a clean one counts as verified from
        every byte by this run."""
        outcome = codes.outcome(f.code for f in chk.errors)
        recorded = False
        if chk.ident is not None or ident is not None:
            why = "; ".join(f"{f.code} {f.message}" for f in chk.errors[:3]) or None
            recorded = self.record(path, outcome, why=why, ident=ident or chk.ident)
        if not chk.errors:
            self._fresh.add(path.name)
        return outcome, recorded

    def reverify(self, info: CheckpointInfo) -> builtins.list[Finding]:
        """Verify one checkpoint from its bytes and record it (for :mod:`ckptkit.run.retain`)."""
        return self.verify(info.path)

    def adopt(
        self,
        path: Location,
        *,
        step: int | None = None,
        notes: Notes | None = None,
        force: bool = False,
        expect: Expect | None = None,
    ) -> Adoption:
        """Adopt one checkpoint of this run at its real step, signed with the run's key,
        and record the outcome (``ckptkit adopt``, and a resume that finds a complete
        checkpoint nobody adopted).

        The step is never rewritten: an adopted manifest's step wins (a different ``step``
        is refused, ``Adoption.refused`` naming both); else ``step``; else what the files
        or the intent record say (:meth:`Layout.step_of`).

        It writes beside the run's checkpoints, so it needs the writer lock, always: a
        live training run that holds it refuses ``ckptkit adopt`` before anything is
        written (it adopts its own saves).

        Raises:
            NotWritableError, LockHeldError: this run may not write.
            CkptkitError: the layout needs a step (Accelerate) and nothing says it (the
                fix: ``ckptkit adopt --step N PATH``).
        """
        path = fs.location(path)
        a = self._adopt(path, step=step, notes=notes, force=force, expect=expect)
        self._record_adoption(path, a)
        return a

    def _adopt(
        self,
        path: Location,
        *,
        step: int | None,
        notes: Notes | None,
        force: bool,
        expect: Expect | None,
    ) -> Adoption:
        """:meth:`adopt` up to the adopted manifest written, nothing recorded yet (the
        settle step has a crash point in between). A recorded step counts only when its
        manifest checks under the run's key: a manifest signed with another key says
        nothing trustworthy, least of all the step to sign again."""
        self.fence()
        if step is None:
            local = fs.require_local(path, needs="adopting a checkpoint")
            step = recorded_step(local, key=self.key)
        if step is None:
            step = self.step_of(path)
        if step is None and getattr(self.strategy, "needs_step", False):
            raise step_unknown(path)
        return self.strategy.adopt(
            path,
            AdoptRequest(
                notes=replace(notes or Notes(), step=step), key=self.key, force=force, expect=expect,
            ),
        )

    def _record_adoption(self, path: Location, a: Adoption) -> codes.Outcome | None:
        """Record what an adoption found; nothing for a refusal that says nothing about
        the bytes (a step that differs from the adopted one)."""
        errors = [f for f in a.report.findings if f.severity is ERROR]
        if a.refused is not None and not errors:
            if a.refused.code is None:
                return None
            outcome = codes.outcome([a.refused.code])
            why: str | None = str(a.refused)
        else:
            outcome = codes.outcome(f.code for f in errors)
            why = f"{errors[0].code}: {errors[0].message}" if errors else None
        self.record(path, outcome, why=why)
        return outcome

    # --- settle ----------------------------------------------------------------------------

    def settle(
        self,
        path: Location,
        *,
        step: int | None,
        policy: retain.Policy | None = None,
        notes: Notes | None = None,
        verify: bool = True,
        scan_values: bool = True,
        ident: str | None = None,
        force: bool = False,
        expect: Expect | None = None,
    ) -> Settled:
        """After a save wrote ``path``: verify, adopt and record, point ``latest``, rotate.

        A checkpoint that fails its verify is recorded corrupt and is neither pointed at
        nor counted for retention (``Settled.errors`` says why). Crash points: see the
        module docstring.

        Args:
            step: the step it holds (framework layouts: the loop's optimizer step).
            policy: rotation after it verified (None: none).
            notes: what the loop knows that the files do not say (framework layouts).
            verify: False records nothing (``verify_after_save=False``).
            scan_values: native: scan tensor values too (False when the save scanned them).
            ident: native: the digest of the manifest the commit wrote.
            force, expect: as :func:`ckptkit.verify.foreign.adopt.adopt_checkpoint`.

        Raises:
            NotWritableError, LockHeldError: this run may not write.
        """
        path = fs.location(path)
        self.fence()
        crashpoints.reached("settle.begin")
        out = Settled(path=path, step=step)
        t0 = time.perf_counter()
        if self.strategy.adopts:
            # The framework just wrote these files: digests recorded for what was here
            # before describe other bytes.
            local = fs.require_local(path, needs="adopting a checkpoint")
            adopted_path(local).unlink(missing_ok=True)
            out.adoption = self._adopt(path, step=step, notes=notes, force=force, expect=expect)
            crashpoints.reached("settle.adopted")
            out.outcome = self._record_adoption(path, out.adoption)
            out.errors = [f for f in out.adoption.report.findings if f.severity is ERROR]
            refused = out.adoption.refused
            if refused is not None and not out.errors:
                out.errors = [codes.CODES[refused.code or codes.F003].finding(refused.what)]
        elif verify:
            chk = self.strategy.verify(path, self.catalog, key=self.key, scan_values=scan_values)
            crashpoints.reached("settle.adopted")
            out.errors = chk.errors
            out.outcome, _ = self._record_check(path, chk, ident=ident)
        out.verify_seconds = time.perf_counter() - t0
        if out.errors:
            if policy is not None and all(f.code == codes.F120 for f in out.errors):
                # Whole bytes of a state the replicas disagreed on: never latest, but
                # retention runs (it keeps this one as evidence, like a corrupt one).
                out.rotation = self.rotate(policy)
            return out
        self._fresh.add(path.name)
        crashpoints.reached("settle.verified")
        self.point_latest()
        crashpoints.reached("settle.latest")
        if policy is not None:
            out.rotation = self.rotate(policy)
        crashpoints.reached("settle.done")
        return out

    # --- retention ----------------------------------------------------------------------------

    def policy(
        self,
        *,
        keep_last: int,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        delete_corrupt: bool = False,
    ) -> retain.Policy:
        """A retention policy that counts this run's good statuses."""
        return retain.Policy(
            keep_last=keep_last, keep_every=keep_every, max_bytes=max_bytes,
            delete_corrupt=delete_corrupt, good=self.good,
        )

    def plan(self, policy: retain.Policy) -> rotation.RetentionPlan:
        """The retention plan as the run is now (nothing is read or deleted)."""
        return retain.plan(self, policy)

    def rotate(self, policy: retain.Policy) -> retain.Outcome:
        """Apply ``policy`` after a save (:func:`ckptkit.run.retain.apply`), then re-point
        ``latest``. A native checkpoint that committed but was never verified (its writer
        died in between) is verified first, so that retention counts it."""
        if "committed" not in self.good and not self.strategy.adopts and self.recheck:
            for c in self.checkpoints():
                if c.status == "committed":
                    self.verify(c.path)
        out = self.apply(policy)
        self._fresh.clear()
        return out

    def prune(self, policy: retain.Policy, *, dry_run: bool = False) -> retain.Outcome:
        """Apply ``policy`` by hand (``ckptkit prune``); ``dry_run`` deletes nothing.

        Before anything is deleted the newest checkpoint the plan keeps is verified again
        from its bytes. Needs the writer lock unless ``dry_run``.
        """
        if dry_run:
            return retain.apply(self, policy, recheck=False, dry_run=True)
        self.fence()
        self._fresh.clear()  # a hand prune re-checks from bytes, whatever was read before
        return self.apply(policy)

    def apply(self, policy: retain.Policy, *, fresh: Collection[int] = ()) -> retain.Outcome:
        """:func:`ckptkit.run.retain.apply` on this run, then re-point ``latest``."""
        mine = {c.step for c in self.checkpoints() if c.path.name in self._fresh}
        out = retain.apply(self, policy, recheck=self.recheck, fresh={*fresh, *mine})
        self.point_latest()
        return out

    def overwriting(self, path: Location) -> None:
        """A framework is about to write checkpoint ``path`` again in place (Lightning's
        ``last.ckpt`` at every save): its adopted digests describe the old bytes, so they
        go first, and a kill before the new bytes are settled leaves a checkpoint that is
        not adopted (verified from its bytes on resume), never old digests beside new bytes.
        Needs the writer lock.
        """
        self.fence()
        adopted_path(fs.require_local(path, needs="adopting a checkpoint")).unlink(missing_ok=True)

    def discard(self, path: Location) -> bool:
        """Delete the one checkpoint at ``path`` a framework asks to remove (Lightning's
        ``save_top_k``) under retention's rules (:attr:`ckptkit.run.retain.Policy.only`): never
        the newest good one, and the newest good one that stays is verified again first.
        A file the run does not list (a second file of a listed step: ``last.ckpt`` beside
        its named copy) is removed as asked. Returns whether it was deleted.
        """
        self.fence()
        loc = fs.location(path)
        listed = any(c.path == loc for c in self.checkpoints())
        if not listed:
            gone = self.strategy.remove(self.root, loc)
            self.catalog.forget([loc.name])
            return gone
        out = self.apply(replace(self.policy(keep_last=0), only=loc.name))
        return any(d.split(":", 1)[0] == loc.name for d in out.deleted)

    def remove(self, info: CheckpointInfo) -> bool:
        """Delete one checkpoint and its index records; needs the writer lock, always."""
        self.fence()
        gone = self.strategy.remove(self.root, info.path)
        with contextlib.suppress(OSError, ValueError):
            self.catalog.forget([info.path.name])
        return gone

    # --- resume -------------------------------------------------------------------------------

    def resume_target(
        self, reject: Callable[[CheckpointInfo], str | None] | None = None
    ) -> Resume:
        """The newest complete state to resume from, and what newer ones were passed over.

        Checkpoints are tried newest first (in the order they were written). Each is read
        again from its bytes (the index is a claim, not proof); one that fails is recorded
        and named with why. A complete checkpoint that was never adopted (a kill between
        the framework's write and its adoption) is adopted on the spot at its real step
        when this run is writable and its files check. Every checkpoint passed over is
        logged at WARNING and returned.

        ``reject``: the caller's own test, asked before a checkpoint's bytes are read: a
        reason it cannot resume from this one (e.g. a model-only save for a full-state
        resume), which passes it over like a damaged one; None to consider it.

        Raises:
            CkptkitError: the newest complete checkpoint's step is unknown (no adopted
                manifest, no intent record): it is never resumed with the step counter at
                0; the message names the fix (``ckptkit adopt --step N PATH``).
        """
        passed: builtins.list[str] = []
        chosen: CheckpointInfo | None = None
        adopted = False
        for c in sorted(self.checkpoints(), key=self.strategy.order, reverse=True):
            name = c.path.name
            if c.status in UNUSABLE:
                # Damaged, unfinished or replica-divergent is passed over whatever its step
                # (no bytes read again): only a complete checkpoint's unknown step stops the
                # resume.
                passed.append(f"{name}: {c.status}: {c.problem or 'verify failed'}")
                continue
            why_not = reject(c) if reject is not None else None
            if why_not:
                passed.append(f"{name}: {why_not}")
                continue
            if not c.step_known:
                # Its files are judged first: one that fails (a planted file that needs
                # code) is passed over like any damaged one; only a checkpoint that would
                # be resumed stops the resume for its unknown step.
                bad = self.reverify(c)
                if bad:
                    passed.append(f"{name}: {bad[0].code} {bad[0].message}")
                    continue
                raise step_unknown(c.path, resuming=True, passed=passed)
            if c.status == "committed" and self.strategy.adopts and not self.readonly:
                a = self.adopt(c.path, step=c.step)
                bad = [f for f in a.report.findings if f.severity is ERROR]
                if a.manifest is None or bad:
                    why = a.refused or (f"{bad[0].code} {bad[0].message}" if bad else "refused")
                    passed.append(f"{name}: not adopted: {why}")
                    continue
                adopted = True
                log.warning(
                    "ckptkit: %s (step %d) was complete but never adopted (a save "
                    "interrupted before its adoption): verified and adopted it now",
                    name, c.step,
                )
            else:
                bad = self.reverify(c)
                if bad:
                    passed.append(f"{name}: {bad[0].code} {bad[0].message}")
                    continue
            chosen = next((x for x in self.checkpoints() if x.path == c.path), c)
            break
        for why in passed:
            log.warning("ckptkit: not resuming from %s", why)
        if chosen is not None:
            log.info("ckptkit: resuming from %s at step %d (verified)", chosen.path, chosen.step)
        return Resume(chosen, passed, adopted)


def _leftovers_note(root: Location, left: builtins.list[str]) -> str:
    """What a warning says of the leftovers of interrupted saves in ``root``."""
    return (
        f"{len(left)} leftover temporary director{'y' if len(left) == 1 else 'ies'} in "
        f"{root} from an interrupted save: {', '.join(left)}"
    )


__all__ = ["Resume", "Run", "Settled"]
