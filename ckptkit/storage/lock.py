"""One writer per run directory: the ``.ckptkit.lock`` file.

Design. The lock is an ``fcntl.flock`` on ``ROOT/.ckptkit.lock``. The kernel drops a
flock when its holder dies, however it dies (``kill -9``, OOM killer, node reboot on
a local disk), so a crashed writer can never wedge the run and there is no pid
guessing on the common path. The file's JSON content ``{pid, host, created, token}``
is informational: it names the holder in errors and in the takeover warning.

Two details make flock-on-a-path safe:

* Release unlinks the file *while still holding the flock*. A waiter that opened
  the old file may then win the flock on an unlinked inode, so after every
  successful flock we check that the path still names the inode we locked, and
  start over if not.
* The JSON is written in place (truncate + write), never via rename, because a
  rename would swap the inode under the flock.

Fallback. Where flock is unavailable (no ``fcntl``, or a filesystem that answers
``ENOLCK``/``EOPNOTSUPP``, e.g. NFS without a lock daemon), the lock is the file's
existence: created with ``O_CREAT | O_EXCL``. A lock whose holder ran on this host
and whose pid is gone is stale and is taken over: the new lock is written to a
temporary name, the stale content is re-read to check nobody else took it over
meanwhile, then ``os.replace`` installs ours and a re-read confirms our token won.
A holder on another host cannot be checked from here: the error says so and how to
remove the file by hand.

Limits, documented rather than hidden: a filesystem whose flock is local to each
host (some Lustre/CIFS mounts) cannot exclude a writer on another host; when the
lock file names another host we log that in the takeover warning. A process forked
(without exec) from the holder shares the flock and keeps the run locked until it
exits too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from ckptkit import codes
from ckptkit.errors import LockHeldError, UnsafeInputError
from ckptkit.storage import files, fs
from ckptkit.storage.fs import Location
from ckptkit.storage.held import Held
from ckptkit.storage.lease import SAME_PROCESS_FIX, LeaseLock
from ckptkit.storage.proc import collect_own_garbage, note_waiting
from ckptkit.storage.proc import pid_alive as _pid_alive

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".ckptkit.lock"
"""File name of the lock inside a run directory."""

logger = logging.getLogger("ckptkit")

_LOCK_FIX = (
    "the run lock is a regular file that ckptkit creates and removes; remove this one once "
    "no ckptkit process writes to the run (the next writer creates the lock again)"
)


# flock errors that mean "this filesystem cannot do flock", not "somebody holds it".
_NO_FLOCK_ERRNOS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


@dataclass(frozen=True)
class LockInfo:
    """Who holds (or held) a run-directory lock, as recorded in the lock file."""

    pid: int
    """Process id of the holder, on ``host``."""
    host: str
    """Host name of the holder (``socket.gethostname()``)."""
    created: float
    """When the lock was taken (Unix seconds)."""
    token: str
    """Random id of this acquisition; release removes the file only if it still holds this token."""

    def describe(self) -> str:
        """Return ``pid 123 on host gpu-7 since 2024-05-01 12:00:00``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
        return f"pid {self.pid} on host {self.host} since {when}"


def read_lock_info(root: str | os.PathLike[str]) -> LockInfo | None:
    """Return who the lock file of a run directory names, or None if absent or unreadable.

    The file can outlive its holder (a crashed writer under flock), so this says
    who took the lock last, not that it is held now.

    Example:
        >>> read_lock_info("/nonexistent") is None
        True
    """
    try:
        return _parse(_read_text(Path(root) / LOCK_NAME))
    except UnsafeInputError:
        return None  # not a regular file: it names nobody


class RunLock(Held):
    """Exclusive lock on a run directory: one writer at a time.

    Args:
        root: the run directory (created if missing).
        timeout: seconds to wait for a held lock before raising; 0 tries once.
        poll: seconds between attempts while waiting.
        use_flock: force (True) or disable (False) flock; None picks flock where it works.
        progress_every: while waiting, log who holds the lock and the time left this often.

    Raises:
        LockHeldError: from ``acquire``/``__enter__`` when a live writer holds the lock.

    Example:
        >>> import tempfile
        >>> with RunLock(tempfile.mkdtemp()) as lock:
        ...     lock.locked
        True
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        timeout: float = 0.0,
        poll: float = 0.1,
        use_flock: bool | None = None,
        progress_every: float = 10.0,
    ) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self.timeout = timeout
        self.poll = poll
        self.use_flock = (fcntl is not None) if use_flock is None else use_flock
        self.progress_every = progress_every
        self.info: LockInfo | None = None
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        """True while this object holds the lock."""
        return self.info is not None

    def check(self) -> None:
        """Raise unless this object still holds the lock (a flock cannot be lost while held).

        Raises:
            LockHeldError: the lock was released.
        """
        if self.info is None:
            raise LockHeldError("this process does not hold the run lock", path=self.path)

    def acquire(self) -> LockInfo:
        """Take the lock, waiting up to ``timeout`` seconds.

        Returns:
            The :class:`LockInfo` written to the lock file.

        Raises:
            LockHeldError: another live writer holds it; the message names it.
            RuntimeError: this object already holds the lock.

        Example:
            >>> import tempfile
            >>> lock = RunLock(tempfile.mkdtemp())
            >>> lock.acquire().pid == os.getpid()
            True
            >>> lock.release()
        """
        if self.info is not None:
            raise RuntimeError(f"{self.path}: this RunLock already holds the lock")
        self.root.mkdir(parents=True, exist_ok=True)
        mine = LockInfo(
            pid=os.getpid(), host=socket.gethostname(), created=time.time(), token=uuid.uuid4().hex
        )
        deadline = time.monotonic() + self.timeout
        next_note: float | None = None
        quick_retries = 0
        collected = False
        while True:
            if self.use_flock:
                got, holder = self._try_flock(mine)
            else:
                got, holder = self._try_exclusive(mine)
            if got:
                self.info = mine
                return mine
            if got is None and quick_retries < 50:
                # The file changed under us (released or replaced mid-attempt): that is
                # progress by someone else, so look again at once rather than report "held".
                # Bounded, in case a filesystem reports unstable inode numbers.
                quick_retries += 1
                continue
            quick_retries = 0
            ours = holder is not None and (holder.pid, holder.host) == (mine.pid, mine.host)
            if ours and not collected:
                collected = True  # held by this process: maybe by a dropped, unclosed manager
                collect_own_garbage()
                continue
            now = time.monotonic()
            # A wait is never silent: noted when it starts (even if the deadline passed
            # during this first attempt: a slow disk or a loaded machine), then at intervals.
            if self.timeout > 0 and (next_note is None or (now >= next_note and now < deadline)):
                who = holder.describe() if holder else "another process (lock file being written)"
                note_waiting(str(self.path), who, left=deadline - now, timeout=self.timeout)
                next_note = now + self.progress_every
            if now >= deadline:
                raise self._held_error(holder)
            time.sleep(max(0.0, min(self.poll, deadline - now)))

    def release(self) -> None:
        """Release the lock; remove the file only if it is still ours. Idempotent.

        Example:
            >>> import tempfile
            >>> lock = RunLock(tempfile.mkdtemp()); _ = lock.acquire()
            >>> lock.release(); lock.locked
            False
        """
        if self.info is None:
            return
        try:
            try:
                current = _parse(_read_text(self.path))
            except UnsafeInputError:  # replaced by a FIFO or a directory while held
                current = None
            ours = current is not None and current.token == self.info.token
            if self._fd is not None:
                # Same inode too: a stale-lock takeover by someone else replaces the file.
                ours = ours and _same_file(self._fd, self.path)
            if ours:
                # Unlink before dropping the flock, so no newcomer can lock this inode
                # and believe it owns the path (waiters re-check the inode after locking).
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            else:
                logger.warning(
                    "%s: lock file no longer ours (now: %s); leaving it in place",
                    self.path,
                    current.describe() if current else "missing or unreadable",
                )
        finally:
            if self._fd is not None:
                os.close(self._fd)  # drops the flock
                self._fd = None
            self.info = None

    # ------------------------------------------------------------------ flock

    # The _try_* methods return (True, None) when we got the lock, (False, holder) when it
    # is held, and (None, None) when the file changed mid-attempt and a retry may succeed.

    def _try_flock(self, mine: LockInfo) -> tuple[bool | None, LockInfo | None]:
        assert fcntl is not None
        created = True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            created = False
            try:
                # A regular file only: a FIFO or device put here is refused, never locked.
                fd = files.open_fd(self.path, os.O_RDWR, code=codes.F022, hint=_LOCK_FIX)
            except FileNotFoundError:
                return None, None  # released in between
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False, _parse(_read_text(self.path))
        except OSError as e:
            if created and _same_file(fd, self.path):
                # Leave no empty file behind: the exclusive-create lock would read it as held.
                self.path.unlink()
            os.close(fd)
            if e.errno not in _NO_FLOCK_ERRNOS:
                raise
            logger.warning(
                "%s: filesystem does not support flock (%s); falling back to an exclusive-create lock",
                self.path,
                os.strerror(e.errno or 0),
            )
            self.use_flock = False
            return self._try_exclusive(mine)
        if not _same_file(fd, self.path):
            # We locked a file the previous holder unlinked on release: try again.
            os.close(fd)
            return None, None
        previous = _parse(os.pread(fd, 1 << 16, 0).decode("utf-8", "replace"))
        if previous is not None:
            # A clean release removes the file, so leftover content means the holder
            # died without releasing; the kernel already dropped its flock.
            other_host = previous.host != mine.host
            logger.warning(
                "%s: took over stale lock held by %s (the process is gone: its flock was released)%s",
                self.path,
                previous.describe(),
                "; it ran on another host: if it is still running there, this filesystem "
                "does not share flocks between hosts, stop one of the writers"
                if other_host
                else "",
            )
        data = _dump(mine)
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self._fd = fd
        return True, None

    # ------------------------------------------------------- exclusive create

    def _try_exclusive(self, mine: LockInfo) -> tuple[bool | None, LockInfo | None]:
        data = _dump(mine)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            pass
        else:
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True, None

        stale_text = _read_text(self.path)
        holder = _parse(stale_text)
        if stale_text is None:
            return None, None  # released between our create and read
        if holder is None:
            # Empty or partial JSON: a creator between O_EXCL and write, or one that died
            # right there. Only age tells these apart.
            if _age(self.path) < 10.0:
                return False, None
            logger.warning("%s: lock file unreadable for 10 s, taking it over", self.path)
        elif holder.host != mine.host or _pid_alive(holder.pid):
            return False, holder
        else:
            logger.warning(
                "%s: took over stale lock held by %s (that process no longer exists)",
                self.path,
                holder.describe(),
            )

        tmp = self.path.with_name(f"{LOCK_NAME}.{mine.token}.tmp")
        try:
            tmp.write_bytes(data)
            # Someone may have taken over (or released and re-taken) since we read it.
            if _read_text(self.path) != stale_text:
                return None, None
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        # Two takers may pass the re-read together; the last replace wins, so the
        # loser sees the winner's token here and backs off.
        now = _parse(_read_text(self.path))
        return (now is not None and now.token == mine.token), now

    # ----------------------------------------------------------------- errors

    def _held_error(self, holder: LockInfo | None) -> LockHeldError:
        waited = f" after waiting {self.timeout:g} s" if self.timeout > 0 else ""
        if holder is None:
            who = "another process (lock file being written)"
            hint = f"retry, or pass a timeout; if no writer runs, delete {self.path}"
        else:
            who = holder.describe()
            if holder.pid == os.getpid() and holder.host == socket.gethostname():
                who += " (this process: a second writable run on the same directory?)"
                hint = SAME_PROCESS_FIX
            elif self.use_flock or holder.host == socket.gethostname():
                hint = (
                    f"wait for pid {holder.pid} to finish or stop it (kill {holder.pid} on "
                    f"{holder.host}); two writers on one run directory corrupt its rotation"
                )
            else:
                hint = (
                    f"stop pid {holder.pid} on host {holder.host}; if it is no longer "
                    f"running, delete {self.path} by hand (liveness cannot be checked from "
                    f"{socket.gethostname()})"
                )
        return LockHeldError(f"run directory is locked by {who}{waited}", path=self.path, hint=hint)


# ---------------------------------------------------------------- helpers


def _dump(info: LockInfo) -> bytes:
    return (json.dumps(asdict(info), sort_keys=True) + "\n").encode()


def _read_text(path: Path) -> str | None:
    """The lock file's text, None when it is gone.

    Raises:
        UnsafeInputError: ``CK-F022``, it is a FIFO, directory, device or symlink (never
            opened: a FIFO would block the reader).
    """
    try:
        data = fs.read_small(path, 64 << 10, hint=_LOCK_FIX)
    except FileNotFoundError:
        return None
    return data.decode("utf-8", errors="replace")


def _parse(text: str | None) -> LockInfo | None:
    if not text:
        return None
    try:
        d = json.loads(text)
        return LockInfo(
            pid=int(d["pid"]),
            host=str(d["host"]),
            created=float(d["created"]),
            token=str(d["token"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino)


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


class Lock(Protocol):
    """What the manager needs of a run lock: a flock locally, a lease on an object store."""

    @property
    def locked(self) -> bool: ...

    def acquire(self) -> object: ...

    def release(self) -> None: ...

    def check(self) -> None:
        """Raise :class:`LockHeldError` unless the lock is still held (fencing)."""
        ...


def lock_for(
    root: Location, *, timeout: float = 0.0, lease_ttl: float = 60.0, job: str | None = None
) -> Lock:
    """The run lock for ``root``: :class:`RunLock` (flock) locally, a lease elsewhere.

    ``job``: the writer's job identity for the lease's takeover rule (default: from the
    environment, :func:`ckptkit.storage.lease.current_job`); a flock needs none (the kernel
    drops a dead holder's flock at once).

    Example:
        >>> import tempfile
        >>> type(lock_for(fs.location(tempfile.mkdtemp()))).__name__
        'RunLock'
        >>> type(lock_for(fs.location("memory://b/run"))).__name__
        'LeaseLock'
    """
    if fs.is_local(root):
        return RunLock(str(root), timeout=timeout)
    return LeaseLock(root, timeout=timeout, ttl=lease_ttl, job=job)


__all__ = ["LOCK_NAME", "Lock", "LockInfo", "RunLock", "lock_for", "read_lock_info"]
