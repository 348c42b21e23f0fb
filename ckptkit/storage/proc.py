"""Who a run-lock holder is, and whether it can be proven dead from here.

Both run locks name their holder (pid, host); both take over a holder *proven* dead: the
exclusive-create fallback of :mod:`ckptkit.storage.lock` and the object-store lease of
:mod:`ckptkit.storage.lease`. Proof needs more than "no process has that pid":

* a pid is only meaningful in its own pid namespace (two containers of one pod share a
  host name, not their pids), so the holder's namespace is recorded and compared;
* a pid is reused, so the holder's start time is recorded and compared: a live process
  with the holder's pid but another start time is not the holder;
* a host name survives a reboot, so the host's boot id is recorded: a holder that ran
  before the last boot is gone.

Where a fact is unavailable (no ``/proc``: macOS), its field is None and the check falls
back to what is known (host and pid), like the local lock always did.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ckptkit")


@dataclass(frozen=True)
class Process:
    """One process, as a lock holder records itself."""

    pid: int
    host: str
    """``socket.gethostname()``."""
    boot: str | None
    """The host's boot id (``/proc/sys/kernel/random/boot_id``): a new one after a reboot."""
    pidns: str | None
    """The pid namespace the pid belongs to (``/proc/self/ns/pid``, e.g. ``pid:[4026531836]``)."""
    started: int | None
    """Start time of the process, in clock ticks since boot (``/proc/PID/stat`` field 22)."""


def this_process() -> Process:
    """The calling process.

    Example:
        >>> this_process().pid == os.getpid()
        True
    """
    pid = os.getpid()
    return Process(
        pid=pid,
        host=socket.gethostname(),
        boot=boot_id(),
        pidns=pid_namespace(),
        started=start_time(pid),
    )


def boot_id() -> str | None:
    """This host's boot id, None where the kernel does not expose one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """The calling process's pid namespace, None where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); None if gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after
    # the last ')'. What follows starts at field 3, so field 22 is at index 19.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Return whether a process with this pid exists on this host (zombies count as dead).

    Example:
        >>> pid_alive(os.getpid()), pid_alive(0)
        (True, False)
    """
    if os.name == "nt":  # pragma: no cover - os.kill(pid, 0) would send CTRL_C there
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    # A killed process whose parent has not reaped it yet still answers kill(0).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _comparable(holder: Process, me: Process) -> bool:
    """Whether ``holder``'s pid can be looked up from ``me``: same machine, same pid namespace."""
    return (
        holder.host == me.host
        and not (holder.boot and me.boot and holder.boot != me.boot)
        and not (holder.pidns and me.pidns and holder.pidns != me.pidns)
    )


def alive_here(holder: Process, me: Process) -> bool:
    """Whether ``holder`` is provably running: on this machine, in this pid namespace, and
    its pid still names the process that started when it recorded (``me`` counts).

    Example:
        >>> me = this_process()
        >>> alive_here(me, me)
        True
    """
    return _comparable(holder, me) and why_dead(holder, me) is None


def why_dead(holder: Process, me: Process) -> str | None:
    """Why ``holder`` is proven dead as seen from ``me``; None when it may be alive.

    Proof needs the same machine (host name, and boot id where both are known) and the
    same pid namespace (where both are known); the holder is then dead when its pid is gone
    or now names a process that started at another time. A host rebooted since the holder
    recorded itself proves it dead too. ``me`` itself is never dead.

    Example:
        >>> me = this_process()
        >>> why_dead(me, me) is None
        True
        >>> import dataclasses
        >>> other = dataclasses.replace(me, pid=2**22 + 1, started=None)
        >>> why_dead(other, me)
        'its process (pid 4194305 on this host) no longer exists'
    """
    if holder.host != me.host:
        return None  # another machine: nothing to ask from here
    if holder.boot and me.boot and holder.boot != me.boot:
        return f"host {holder.host} rebooted since it took the lock"
    if holder.pidns and me.pidns and holder.pidns != me.pidns:
        return None  # another container on this machine: its pids are not ours to look up
    if holder.pid == me.pid:
        if holder.started is None or me.started is None or holder.started == me.started:
            return None  # this very process
        return f"its pid {holder.pid} is now this process (started later)"
    if not pid_alive(holder.pid):
        return f"its process (pid {holder.pid} on this host) no longer exists"
    now = start_time(holder.pid)
    if holder.started is not None and now is not None and now != holder.started:
        return f"its pid {holder.pid} now names another process (started later)"
    return None


def collect_own_garbage() -> None:
    """Finalize this process's unreachable objects, once, when a run lock is held by this
    very process.

    A writer holds its run's lock from open until ``close()``; one that was dropped without
    ``close()`` (a notebook cell run again, a manager used for one call) holds it until the
    garbage collector finalizes it, and a manager sits in reference cycles, so that waits
    for the next collection. Collecting now releases such a lock at once; a manager still
    referenced somewhere keeps it, and the caller's error names the fix.
    """
    gc.collect()


def note_waiting(where: str, who: str, *, left: float, timeout: float) -> None:
    """Log that a lock acquisition waits on ``who``, and for how much longer: both run
    locks call this at intervals while they wait, so a wait is never silent."""
    log.warning(
        "ckptkit: %s: waiting for the run lock held by %s; giving up in %.0f s (lock_timeout %g s)",
        where,
        who,
        max(0.0, left),
        timeout,
    )


__all__ = [
    "Process",
    "alive_here",
    "boot_id",
    "collect_own_garbage",
    "note_waiting",
    "pid_alive",
    "pid_namespace",
    "start_time",
    "this_process",
    "why_dead",
]
