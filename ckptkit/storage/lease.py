"""One writer per run on an object store: a lease object with an expiry and a fencing token.

Object stores have no ``flock`` and no process to ask whether a holder is alive, so the
run lock there is a *lease*: ``RUN/.ckptkit.lock`` holds JSON ``{holder, pid, host,
token, fence, acquired, expires}``.

* **Acquire** is a conditional create (``If-None-Match: *`` on S3, see
  :func:`ckptkit.storage.fs.put_if_absent`): the store decides, so two writers racing
  cannot both win. A second writer waits (``timeout``) or fails naming the holder.
* **Renew.** The holder rewrites the lease every ``ttl / 3`` seconds from a daemon thread,
  pushing ``expires`` forward. A holder that dies stops renewing.
* **Takeover.** A lease past its ``expires`` (plus ``grace`` for clock skew) is taken over
  with a warning naming the dead holder: delete, then conditional create with
  ``fence = old fence + 1``. If another writer took it over first, the create fails and
  this one waits or fails like any second writer.
* **Fencing.** Before committing (writing a manifest) and before deleting anything, the
  holder re-reads the lease and checks it still names *this* acquisition
  (:meth:`LeaseLock.check`). A holder that was paused longer than its lease (a GC pause, a
  frozen VM) and lost it to another writer therefore never commits or deletes on top of
  the new holder's work: it raises :class:`~ckptkit.errors.LockHeldError` instead.

What this does not give, stated plainly: exclusion is as good as the store's conditional
create and the holders' clocks (``grace`` absorbs skew up to that much). A holder paused
past its lease may still have uploaded shard files of its in-flight save into the new
holder's step directory; it never writes the manifest (fenced), so those files are never
part of a committed checkpoint, and verify flags any file a manifest does not list.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

from ckptkit.errors import LockHeldError
from ckptkit.storage import fs

LOCK_NAME = ".ckptkit.lock"
log = logging.getLogger("ckptkit")


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

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        left = self.expires - time.time()
        state = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
        return f"pid {self.pid} on host {self.host} since {when} (lease {state})"


class LeaseLock:
    """The run lock of a remote run directory (see the module docstring).

    Args:
        root: the run's location (a remote :class:`upath.UPath`).
        timeout: seconds to wait for a held lease before raising; 0 tries once.
        ttl: lease duration; renewed every ``ttl / 3`` seconds while held.
        grace: extra seconds past expiry before a takeover (clock skew between hosts).
        poll: seconds between attempts while waiting.

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
    ) -> None:
        self.root = root
        self.path = root / LOCK_NAME
        self.timeout = timeout
        self.ttl = ttl
        self.grace = grace
        self.poll = poll
        self.lease: Lease | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._mu = threading.Lock()

    @property
    def locked(self) -> bool:
        return self.lease is not None

    def __enter__(self) -> LeaseLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def acquire(self) -> Lease:
        """Take the lease, waiting up to ``timeout`` seconds; take over an expired one.

        Raises:
            LockHeldError: a live holder has it (the message names it and its expiry).
        """
        if self.lease is not None:
            raise RuntimeError(f"{self.path}: this LeaseLock already holds the lease")
        deadline = time.monotonic() + self.timeout
        while True:
            held = read_lease(self.root)
            if held is None:
                mine = self._new(fence=1)
                if fs.put_if_absent(self.path, _dump(mine)):
                    return self._won(mine)
            elif time.time() > held.expires + self.grace:
                log.warning(
                    "ckptkit: %s: taking over the run lock of %s: it stopped renewing its "
                    "lease (the process died or hung)",
                    fs.url(self.path),
                    held.describe(),
                )
                fs.remove_file(self.path)
                mine = self._new(fence=held.fence + 1)
                if fs.put_if_absent(self.path, _dump(mine)):
                    return self._won(mine)
            if time.monotonic() >= deadline:
                raise _held_error(self, read_lease(self.root))
            time.sleep(max(0.0, min(self.poll, deadline - time.monotonic())))

    def check(self) -> None:
        """Raise unless the stored lease is still this acquisition (the fence).

        Raises:
            LockHeldError: the lease was lost (taken over after it expired).
        """
        if self.lease is None:
            raise LockHeldError("this process does not hold the run lock", path=fs.url(self.path))
        now = read_lease(self.root)
        if now is None or now.holder != self.lease.holder:
            raise LockHeldError(
                "the run lock was lost: "
                + (f"now held by {now.describe()}" if now else "the lease object is gone"),
                path=fs.url(self.path),
                hint="this process stopped renewing its lease for longer than its ttl (a "
                "pause or a network partition) and another writer took the run over; it "
                "commits and deletes nothing more. Restart it once the other writer is done",
            )

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours. Idempotent."""
        if self.lease is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._mu:
            now = read_lease(self.root)
            if now is not None and now.holder == self.lease.holder:
                fs.remove_file(self.path)
            self.lease = None

    # ------------------------------------------------------------------ internals

    def _new(self, *, fence: int) -> Lease:
        t = time.time()
        return Lease(
            holder=uuid.uuid4().hex,
            pid=os.getpid(),
            host=socket.gethostname(),
            fence=fence,
            acquired=t,
            expires=t + self.ttl,
        )

    def _won(self, mine: Lease) -> Lease:
        # A racing takeover can delete what we just created before its own create: read
        # back to be sure the store holds our lease.
        now = read_lease(self.root)
        if now is None or now.holder != mine.holder:
            raise _held_error(self, now)
        self.lease = mine
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="ckptkit-lease", daemon=True)
        self._renewer.start()
        return mine

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            with self._mu:
                if self.lease is None:
                    return
                now = read_lease(self.root)
                if now is None or now.holder != self.lease.holder:
                    log.error(
                        "ckptkit: %s: the run lock was lost (%s); this writer is fenced off",
                        fs.url(self.path),
                        now.describe() if now else "lease object gone",
                    )
                    return
                renewed = Lease(**{**asdict(self.lease), "expires": time.time() + self.ttl})
                try:
                    fs.replace_bytes(self.path, _dump(renewed))
                    self.lease = renewed
                except Exception as e:  # a transient store error: try again next round
                    log.warning("ckptkit: renewing the run lease failed: %s", e)


def read_lease(root: fs.Location) -> Lease | None:
    """The lease stored in a run's lock object (None when absent or unreadable)."""
    try:
        data = fs.read_small(root / LOCK_NAME, 64 << 10)
    except (FileNotFoundError, OSError):
        return None
    try:
        d: dict[str, Any] = json.loads(data)
        return Lease(
            holder=str(d["holder"]),
            pid=int(d["pid"]),
            host=str(d["host"]),
            fence=int(d["fence"]),
            acquired=float(d["acquired"]),
            expires=float(d["expires"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _dump(lease: Lease) -> bytes:
    return (json.dumps(asdict(lease), sort_keys=True) + "\n").encode()


def _held_error(lock: LeaseLock, holder: Lease | None) -> LockHeldError:
    waited = f" after waiting {lock.timeout:g} s" if lock.timeout > 0 else ""
    who = holder.describe() if holder else "another writer (lease being written)"
    return LockHeldError(
        f"run is locked by {who}{waited}",
        path=fs.url(lock.path),
        hint="wait for that writer to finish (pass lock_timeout= to wait), or stop it; a "
        f"holder that died is taken over once its lease expires (ttl {lock.ttl:g} s)",
    )


__all__ = ["LOCK_NAME", "Lease", "LeaseLock", "read_lease"]
