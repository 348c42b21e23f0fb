"""One writer per run on an object store: a lease object with an expiry and a fencing token.

Object stores have no ``flock`` and no process to ask whether a holder is alive, so the
run lock there is a *lease*: ``RUN/.ckptkit.lock`` holds JSON ``{holder, pid, host, boot,
pidns, started, job, attempt, fence, acquired, expires}``: the acquisition's random id,
who holds it (:mod:`ckptkit.storage.proc`), which job it belongs to (:func:`current_job`),
the fencing token and the expiry. Every field after ``host`` that older versions did not
write is optional when read, and older readers ignore it.

* **Acquire** is a conditional create (``If-None-Match: *`` on S3, see
  :func:`ckptkit.storage.fs.put_if_absent`): the store decides, so two writers racing
  cannot both win. A second writer waits (``timeout``, logging who holds the lease and the
  time left at intervals) or fails naming the holder and its expiry.
* **Takeover** (:func:`why_take_over`) replaces the holder's lease at once when

  - its lease expired (plus ``grace`` for clock skew): it stopped renewing;
  - it is proven dead: it ran on this machine, in this pid namespace, and its process is
    gone (or its host rebooted since), the same proof the local lock's fallback uses;
  - it is an earlier incarnation of this process's job: the same job identity (a SLURM
    job id, a Kubernetes pod, a torchelastic run id, or ``CKPTKIT_JOB_ID``) and an older
    attempt (``SLURM_RESTART_COUNT``, ``TORCHELASTIC_RESTART_COUNT``), or no attempt
    number to compare (the job identity alone says "this restarts that job"). A requeued
    job therefore saves at once instead of crash-looping until the lease expires.

  Anything else waits for the expiry. A takeover is a conditional replace of the exact
  lease version that was judged (``If-Match: <etag>``, :func:`ckptkit.storage.fs.
  replace_if_match`) with ``fence = old fence + 1``; when another writer changed the lease
  first, it fails and this one looks again. Every takeover is logged, naming the old
  holder and why.
* **Renew.** The holder rewrites the lease every ``ttl / 3`` seconds from a daemon thread,
  pushing ``expires`` forward, as a conditional write of the version it wrote last: a renew
  can never overwrite a lease someone else took over. A renew whose condition fails marks
  the lock *lost* (logged at ERROR), and the next :meth:`LeaseLock.check` raises.
* **Fencing.** Before committing (writing a manifest) and before deleting anything, the
  holder re-reads the lease and checks it still names *this* acquisition
  (:meth:`LeaseLock.check`). A holder that was paused longer than its lease (a GC pause, a
  frozen VM), or whose job was requeued while it still ran, therefore never commits or
  deletes on top of the new holder's work: it raises :class:`~ckptkit.errors.LockHeldError`
  instead.

What this does not give, stated plainly: exclusion is as good as the store's conditional
writes and the holders' clocks (``grace`` absorbs skew up to that much). Stores without
``If-Match`` (and memory://, local paths) get a generation check instead: re-read,
compare, write, which leaves a window of one round trip in which a renew can overwrite a
takeover; the takeover's read-back and every fence check still catch it afterwards. The
job rule trusts the job identity: two live processes that claim the same job and no
attempt number take the lease from each other (each loser is fenced, loudly). A holder
paused past its lease may still have uploaded shard files of its in-flight save into the
new holder's step directory; it never writes the manifest (fenced), so those files are
never part of a committed checkpoint, and verify flags any file a manifest does not list.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ckptkit.errors import LockHeldError
from ckptkit.storage import fs, proc
from ckptkit.storage.held import Held

LOCK_NAME = ".ckptkit.lock"
log = logging.getLogger("ckptkit")

SAME_PROCESS_FIX = (
    "a writable run holds the run lock from the moment it opens until it closes (a "
    "CheckpointManager, or the run of a Trainer callback, AccelerateCheckpoints, a Lightning "
    "callback or FabricCheckpoints): use one writer per run directory (or 'with "
    "CheckpointManager(...) as mgr:'), close the first before opening another, and open "
    "managers that only list or restore with readonly=True"
)
"""The fix named when this very process already holds the run lock (flock and lease alike)."""

_LEASE_FIX = (
    "the lease object is written by ckptkit only; remove it once no ckptkit process writes "
    "to the run (the next writer creates it again)"
)


@dataclass(frozen=True)
class Job:
    """The job a process belongs to: what a requeue or restart of it keeps."""

    name: str
    """``slurm:1234``, ``slurm:1234_7`` (array task), ``k8s-pod:NAME``, ``torchelastic:ID``,
    or the value of ``CKPTKIT_JOB_ID``/an explicit argument."""
    attempt: int | None
    """Which incarnation of the job this is, where the scheduler numbers them (SLURM's and
    torchelastic's restart counts); None when unknown."""
    source: str
    """Where the identity came from (an environment variable, or ``argument``)."""


def current_job(
    environ: Mapping[str, str] | None = None, *, explicit: str | None = None
) -> Job | None:
    """The job identity of this process, None when it runs outside any known scheduler.

    In order: ``explicit``, ``CKPTKIT_JOB_ID``, SLURM (``SLURM_ARRAY_JOB_ID`` +
    ``SLURM_ARRAY_TASK_ID``, else ``SLURM_JOB_ID``; attempt ``SLURM_RESTART_COUNT``, 0 when
    unset), torchelastic (``TORCHELASTIC_RUN_ID`` unless ``none``; attempt
    ``TORCHELASTIC_RESTART_COUNT``), Kubernetes (the pod name: ``HOSTNAME`` in a pod; a
    container restarted in its pod keeps it; a Job's replacement pod does not, so set
    ``CKPTKIT_JOB_ID`` from the Job name there, see docs/storage.md).

    Example:
        >>> current_job({"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"})
        Job(name='slurm:4242', attempt=2, source='SLURM_JOB_ID')
        >>> current_job({}) is None
        True
    """
    env = os.environ if environ is None else environ
    if explicit:
        return Job(explicit, None, "argument")
    if env.get("CKPTKIT_JOB_ID"):
        return Job(env["CKPTKIT_JOB_ID"], None, "CKPTKIT_JOB_ID")
    restarts = _int(env.get("SLURM_RESTART_COUNT")) or 0
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        name = f"slurm:{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
        return Job(name, restarts, "SLURM_ARRAY_JOB_ID")
    if env.get("SLURM_JOB_ID"):
        return Job(f"slurm:{env['SLURM_JOB_ID']}", restarts, "SLURM_JOB_ID")
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":  # torchrun's default id, shared by unrelated runs
        attempt = _int(env.get("TORCHELASTIC_RESTART_COUNT"))
        return Job(f"torchelastic:{run_id}", attempt, "TORCHELASTIC_RUN_ID")
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("HOSTNAME"):
        return Job(f"k8s-pod:{env['HOSTNAME']}", None, "HOSTNAME (Kubernetes pod)")
    return None


@dataclass(frozen=True)
class Lease:
    """A lease as stored in the lock object."""

    holder: str
    """Random id of this acquisition."""
    pid: int
    host: str
    fence: int
    """Fencing token: grows by one at every takeover."""
    acquired: float
    expires: float
    boot: str | None = None
    """The holder's host boot id (see :class:`ckptkit.storage.proc.Process`)."""
    pidns: str | None = None
    """The holder's pid namespace."""
    started: int | None = None
    """The holder process's start time (clock ticks since boot)."""
    job: str | None = None
    """The holder's job identity (:attr:`Job.name`), None outside a scheduler."""
    attempt: int | None = None
    """The holder's job attempt (:attr:`Job.attempt`)."""

    @property
    def process(self) -> proc.Process:
        """The holder process, for the liveness proofs of :mod:`ckptkit.storage.proc`."""
        return proc.Process(
            pid=self.pid, host=self.host, boot=self.boot, pidns=self.pidns, started=self.started
        )

    def describe(self) -> str:
        """Return ``pid 12 on host gpu-7 (job slurm:42) since ... (lease expires in 54 s)``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        left = self.expires - time.time()
        state = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
        job = ""
        if self.job is not None:
            job = f" (job {self.job}" + (
                f", attempt {self.attempt})" if self.attempt is not None else ")"
            )
        return f"pid {self.pid} on host {self.host}{job} since {when} (lease {state})"


def why_take_over(
    held: Lease, *, me: proc.Process, job: Job | None, now: float, grace: float
) -> str | None:
    """Why this process may take ``held`` over now; None when it must wait (module docstring).

    Example:
        >>> me = proc.this_process()
        >>> old = Lease("x", 1, "gpu-node-3", 1, 0.0, time.time() + 60, job="slurm:42", attempt=0)
        >>> requeued = Job("slurm:42", 1, "SLURM_JOB_ID")
        >>> print(why_take_over(old, me=me, job=requeued, now=time.time(), grace=5))
        it is attempt 0 of job slurm:42 and this process is attempt 1 of it (SLURM_JOB_ID): the job was requeued
        >>> other = Job("slurm:43", 0, "SLURM_JOB_ID")
        >>> why_take_over(old, me=me, job=other, now=time.time(), grace=5) is None
        True
    """
    if now > held.expires + grace:
        return "it stopped renewing its lease (the process died or hung)"
    dead = proc.why_dead(held.process, me)
    if dead is not None:
        return dead
    if job is None or held.job != job.name or proc.alive_here(held.process, me):
        return None
    if held.attempt is not None and job.attempt is not None:
        if held.attempt < job.attempt:
            return (
                f"it is attempt {held.attempt} of job {job.name} and this process is attempt "
                f"{job.attempt} of it ({job.source}): the job was requeued"
            )
        return None  # the same attempt: another live process of this job (another node)
    return f"it belongs to job {job.name}, which this process restarts (same {job.source})"


class LeaseLock(Held):
    """The run lock of a remote run directory (see the module docstring).

    Args:
        root: the run's location (a remote :class:`upath.UPath`).
        timeout: seconds to wait for a held lease before raising; 0 tries once.
        ttl: lease duration; renewed every ``ttl / 3`` seconds while held.
        grace: extra seconds past expiry before a takeover (clock skew between hosts).
        poll: seconds between attempts while waiting.
        job: this process's job identity; default: :func:`current_job` from the environment.
        progress_every: while waiting, log who holds the lease and the time left this often.

    Example:
        >>> from ckptkit.storage.fs import location
        >>> lock = LeaseLock(location("memory://doc-bucket/run"), ttl=30)
        >>> lock.acquire().fence, lock.locked
        (1, True)
        >>> lock.release(); lock.locked
        False
    """

    def __init__(
        self,
        root: fs.Location,
        *,
        timeout: float = 0.0,
        ttl: float = 60.0,
        grace: float = 5.0,
        poll: float = 0.5,
        job: str | None = None,
        progress_every: float = 10.0,
    ) -> None:
        self.root = root
        self.path = root / LOCK_NAME
        self.timeout = timeout
        self.ttl = ttl
        self.grace = grace
        self.poll = poll
        self.job = current_job(explicit=job)
        self.progress_every = progress_every
        self.lease: Lease | None = None
        self._tag: str | None = None
        """The stored version of our lease (S3: its ETag): what a renew or release names."""
        self._lost: str | None = None
        """Why the lease was lost, once a renew found another holder's lease in its place."""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._mu = threading.Lock()

    @property
    def locked(self) -> bool:
        return self.lease is not None

    def acquire(self) -> Lease:
        """Take the lease, waiting up to ``timeout`` seconds; take over one that may be
        (:func:`why_take_over`).

        Raises:
            LockHeldError: a live holder has it (the message names it and its expiry).
        """
        if self.lease is not None:
            raise RuntimeError(f"{self.path}: this LeaseLock already holds the lease")
        me = proc.this_process()
        start = time.monotonic()
        deadline = start + self.timeout
        next_note: float | None = None
        collected = False
        while True:
            held, tag = read_lease_tagged(self.root)
            if tag is None:
                mine = self._new(me, fence=1)
                if fs.put_if_absent(self.path, _dump(mine)):
                    return self._won(mine)
                continue  # another writer created it since we read: judge its lease now
            elif held is not None:
                why = why_take_over(held, me=me, job=self.job, now=time.time(), grace=self.grace)
                if why is not None:
                    mine = self._new(me, fence=held.fence + 1)
                    if fs.replace_if_match(self.path, _dump(mine), tag) is not None:
                        log.warning(
                            "ckptkit: %s: took over the run lock of %s: %s",
                            fs.url(self.path),
                            held.describe(),
                            why,
                        )
                        return self._won(mine)
                    continue  # the lease changed since we read it: judge the new one
                if not collected and held.pid == me.pid and proc.alive_here(held.process, me):
                    collected = True  # held by this process: maybe by a dropped, unclosed manager
                    proc.collect_own_garbage()
                    continue
            now = time.monotonic()
            # A wait is never silent: noted when it starts (even if the deadline passed
            # during this first attempt: a slow store or a loaded machine), then at intervals.
            if self.timeout > 0 and (next_note is None or (now >= next_note and now < deadline)):
                who = held.describe() if held is not None else "an object that is not a lease"
                proc.note_waiting(fs.url(self.path), who, left=deadline - now, timeout=self.timeout)
                next_note = now + self.progress_every
            if now >= deadline:
                raise _held_error(self, read_lease(self.root))
            time.sleep(max(0.0, min(self.poll, deadline - now)))

    def check(self) -> None:
        """Raise unless the stored lease is still this acquisition (the fence).

        Raises:
            LockHeldError: the lease was lost (taken over, or a renew found another
                holder's lease in its place).
        """
        if self.lease is None:
            raise LockHeldError("this process does not hold the run lock", path=fs.url(self.path))
        now = read_lease(self.root)
        if self._lost is not None or now is None or now.holder != self.lease.holder:
            what = (
                f"now held by {now.describe()}"
                if now is not None and now.holder != self.lease.holder
                else self._lost or "the lease object is gone"
            )
            raise LockHeldError(
                f"the run lock was lost: {what}",
                path=fs.url(self.path),
                hint="another writer took the run over (this process stopped renewing its "
                "lease for longer than its ttl, or a restart of the same job took it); this "
                "process commits and deletes nothing more. Restart it once the other writer "
                "is done",
            )

    def renew(self) -> bool:
        """Push the lease's expiry forward now; False (and the lock marked lost) when the
        stored lease is no longer the version this process wrote last.

        The write is conditional (:func:`ckptkit.storage.fs.replace_if_match`), so it never
        overwrites a lease another writer took over.

        Raises:
            OSError: the store failed (a transient error: the renewer tries again).
        """
        with self._mu:
            if self.lease is None or self._tag is None or self._lost is not None:
                return False
            renewed = replace(self.lease, expires=time.time() + self.ttl)
            tag = fs.replace_if_match(self.path, _dump(renewed), self._tag)
            if tag is None:
                # Our own previous renew may have landed with its answer lost (a timeout):
                # the store then holds our lease under a tag we never saw. Adopt it.
                held, stored = read_lease_tagged(self.root)
                if held is not None and stored is not None and held.holder == self.lease.holder:
                    self._tag = stored
                    self.lease = held
                    return True
                self._lost = (
                    "now held by " + held.describe() if held else "the lease object is gone"
                )
                log.error(
                    "ckptkit: %s: the run lock was lost (%s); this writer is fenced off: it "
                    "commits and deletes nothing more",
                    fs.url(self.path),
                    self._lost,
                )
                return False
            self._tag = tag
            self.lease = renewed
            return True

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours. Idempotent."""
        if self.lease is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._mu:
            held, stored = read_lease_tagged(self.root)
            if held is not None and stored is not None and held.holder == self.lease.holder:
                # Conditional: a takeover between this read and the delete keeps its lease.
                fs.remove_if_match(self.path, stored)
            self.lease = None
            self._tag = None

    # ------------------------------------------------------------------ internals

    def _new(self, me: proc.Process, *, fence: int) -> Lease:
        t = time.time()
        return Lease(
            holder=uuid.uuid4().hex,
            pid=me.pid,
            host=me.host,
            boot=me.boot,
            pidns=me.pidns,
            started=me.started,
            job=self.job.name if self.job else None,
            attempt=self.job.attempt if self.job else None,
            fence=fence,
            acquired=t,
            expires=t + self.ttl,
        )

    def _won(self, mine: Lease) -> Lease:
        # Where the store has no conditional replace, a racing takeover can overwrite what
        # we just wrote: read back to be sure the store holds our lease (and learn its tag).
        held, tag = read_lease_tagged(self.root)
        if held is None or tag is None or held.holder != mine.holder:
            raise _held_error(self, held)
        self.lease = mine
        self._tag = tag
        self._lost = None
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="ckptkit-lease", daemon=True)
        self._renewer.start()
        return mine

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.renew():
                    return
            except Exception as e:  # a transient store error: try again next round
                log.warning("ckptkit: renewing the run lease failed: %s", e)


def read_lease(root: fs.Location) -> Lease | None:
    """The lease stored in a run's lock object (None when absent or unreadable)."""
    return read_lease_tagged(root)[0]


def read_lease_tagged(root: fs.Location) -> tuple[Lease | None, str | None]:
    """The stored lease and the tag of its version (:func:`ckptkit.storage.fs.read_tagged`).

    ``(None, None)``: no lease object; ``(None, tag)``: an object that is not a lease.
    """
    try:
        got = fs.read_tagged(root / LOCK_NAME, 64 << 10)
    except OSError:
        return None, None
    if got is None:
        return None, None
    data, tag = got
    try:
        d: dict[str, Any] = json.loads(data)
        return (
            Lease(
                holder=str(d["holder"]),
                pid=int(d["pid"]),
                host=str(d["host"]),
                fence=int(d["fence"]),
                acquired=float(d["acquired"]),
                expires=float(d["expires"]),
                boot=_str(d.get("boot")),
                pidns=_str(d.get("pidns")),
                started=_int(d.get("started")),
                job=_str(d.get("job")),
                attempt=_int(d.get("attempt")),
            ),
            tag,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, tag


def _str(x: object) -> str | None:
    return None if x is None else str(x)


def _int(x: object) -> int | None:
    try:
        return None if x is None or x == "" else int(x)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _dump(lease: Lease) -> bytes:
    return (json.dumps(asdict(lease), sort_keys=True) + "\n").encode()


def _held_error(lock: LeaseLock, holder: Lease | None) -> LockHeldError:
    waited = f" after waiting {lock.timeout:g} s" if lock.timeout > 0 else ""
    if holder is None:
        return LockHeldError(
            f"run is locked by an object that is not a ckptkit lease{waited}",
            path=fs.url(lock.path),
            hint=_LEASE_FIX,
        )
    if proc.alive_here(holder.process, proc.this_process()) and holder.pid == os.getpid():
        return LockHeldError(
            f"run is locked by {holder.describe()} (this process: a second writable run on "
            f"the same directory?){waited}",
            path=fs.url(lock.path),
            hint=SAME_PROCESS_FIX,
        )
    if lock.job is not None and holder.job == lock.job.name:
        rule = (
            f"it belongs to this job ({lock.job.name}) and is alive, or its attempt is not older "
            "than this one"
        )
    else:
        mine = f"this process is {'job ' + lock.job.name if lock.job else 'in no known job'}"
        rule = f"{mine}, so only its expiry or proof that it died frees the lease"
    return LockHeldError(
        f"run is locked by {holder.describe()}{waited}",
        path=fs.url(lock.path),
        hint=f"{rule}. Wait for that writer to finish (pass lock_timeout= to wait), or stop "
        "it; a restart of the same job (same SLURM job, Kubernetes pod, torchelastic run "
        "or CKPTKIT_JOB_ID) takes over at once, any other writer once the lease expires "
        f"(ttl {lock.ttl:g} s)",
    )


__all__ = [
    "LOCK_NAME",
    "SAME_PROCESS_FIX",
    "Job",
    "Lease",
    "LeaseLock",
    "current_job",
    "read_lease",
    "read_lease_tagged",
    "why_take_over",
]
