"""Named points of a save where a crash test can stop the process dead.

A save moves through phases (the commit, then the settle step: verify, record, point
``latest``, rotate; on an object store, each file's upload in parts). Crash tests need to stop a
writer *at* a chosen phase, not at a moment on a clock that a slow or a warm machine moves:
with ``CKPTKIT_CRASH_AT=NAME`` in its environment, a process calls ``os._exit`` the first
time it reaches the point ``NAME`` (no ``finally``, no ``atexit``, no flush: what a SIGKILL or
a power loss leaves). ``NAME@K`` stops at the K-th time the point is reached (1-based), for
points a save passes several times (one per file, one per deletion).

With ``CKPTKIT_CRASH_TRACE=FILE``, every point reached is appended to ``FILE`` as a line
``NAME MONOTONIC_SECONDS`` (written straight through, nothing buffered in the process), so a
test that kills a writer at a random moment can say which phase the kill landed in, and how
long each phase takes on this machine.

This is the way SQLite's crash tests stop at chosen points. Outside those tests neither
variable is set and a point costs one environment lookup.
"""

from __future__ import annotations

import os
import threading
import time

ENV = "CKPTKIT_CRASH_AT"
TRACE_ENV = "CKPTKIT_CRASH_TRACE"
EXIT_CODE = 86
"""The exit status of a process stopped at a crash point (a test tells it from a failure)."""

POINTS: dict[str, str] = {
    "commit.tmp_created": "rank 0 created the temporary sibling directory; nothing written",
    "commit.file_written": "one data file is fully written (not yet the manifest)",
    "commit.files_written": "every file of this rank is written, before the ranks' results meet",
    "commit.manifest_written": "the manifest is written in the temporary directory, not renamed",
    "commit.renamed": "the directory is renamed into place, the parent not yet fsynced",
    "commit.done": "the commit returned; nothing of the settle step has run",
    "framework.files": "a framework (Trainer, Accelerate, Lightning, Fabric) is about to write one "
    "file of its checkpoint; the files before it are written (reached by the crash-matrix "
    "scripts' wrapper around torch.save / safetensors, tests/crash_scripts/)",
    "settle.begin": "the settle step began: the checkpoint's files are written (a framework's "
    "save, or the commit), nothing adopted, verified or recorded",
    "settle.adopted": "verified from its bytes; a framework checkpoint's adopted manifest is "
    "written beside its files; the run index does not record it yet",
    "settle.verified": "the read-back verify passed and was recorded in the run index",
    "settle.latest": "``latest`` points at the new checkpoint; rotation not started",
    "rotate.deleted": "rotation (after a save, or a prune) deleted one checkpoint; more may follow",
    "settle.done": "the save is complete: verified, recorded, pointed, rotated",
    "index.tmp_written": "a replacement of ``latest`` or the run index is written, not renamed",
    "upload.part": "an object-store multipart upload sent one part; the object is not complete",
}
"""Every point, with what is on disk when a process stops there (docs/rotation.md)."""

_hits: dict[str, int] = {}
_lock = threading.Lock()  # a save's writer threads pass the same point concurrently


def reached(name: str) -> None:
    """Mark that this process reached point ``name``; stop dead here if a test asked to.

    Example:
        >>> reached("commit.done")  # no CKPTKIT_CRASH_AT in the environment: nothing happens
    """
    trace = os.environ.get(TRACE_ENV)
    target = os.environ.get(ENV)
    if not trace and not target:
        return
    if name not in POINTS:  # a typo in a call site would make a crash test pass vacuously
        raise KeyError(f"unknown crash point {name!r}")
    with _lock:
        count = _hits[name] = _hits.get(name, 0) + 1
        if trace:
            fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{name} {time.monotonic():.6f}\n".encode())
            finally:
                os.close(fd)
        if target:
            point, _, nth = target.partition("@")
            if point == name and count == (int(nth) if nth else 1):
                os._exit(EXIT_CODE)
