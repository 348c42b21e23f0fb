"""A rich progress bar for saves, loads and verifies that take more than a moment."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

MIN_BYTES = 256 << 20
"""Below this, work finishes too fast for a bar to help."""


def enabled(progress: bool | None, total: int) -> bool:
    """Decide whether to show a bar: forced on/off, else only on a terminal for big jobs."""
    if progress is not None:
        return progress
    if os.environ.get("CKPTKIT_NO_PROGRESS") or os.environ.get("CI"):
        return False
    return total >= MIN_BYTES and sys.stderr.isatty()


@contextmanager
def bar(label: str, total: int, progress: bool | None) -> Iterator[Callable[[int], None] | None]:
    """Yield a thread-safe ``on_bytes(n)`` callback driving a bar, or None when off."""
    if not enabled(progress, total):
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    lock = threading.Lock()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),  # stdout may be a report piped elsewhere
        transient=True,
    ) as p:
        task = p.add_task(label, total=total)

        def on_bytes(n: int) -> None:
            with lock:
                p.advance(task, n)

        yield on_bytes


def bytes_under(path: str | os.PathLike[str]) -> int:
    """Bytes of a file, or of every regular file under a directory (symlinks not followed).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a").write_bytes(b"abc")
        >>> bytes_under(d), bytes_under(d / "a")
        (3, 3)
    """
    p = Path(path)
    if not p.is_dir():
        return p.stat().st_size if p.is_file() else 0
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def _bytes_read() -> int | None:
    """Bytes this process has read so far (Linux ``/proc/self/io`` rchar), None elsewhere."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@contextmanager
def activity(label: str, total: int, progress: bool | None) -> Iterator[None]:
    """Show a spinner, the elapsed time and the bytes read so far while a long call runs.

    For work whose readers report no bytes themselves (a ``torch.load`` of a foreign
    checkpoint, its CRC pass, a NaN scan): the count is what the process really read
    (``/proc/self/io``), so it moves while the work moves, whatever does the reading.
    Shown on a terminal for inputs of :data:`MIN_BYTES` or more (see :func:`enabled`).

    Example:
        >>> with activity("verifying x.pt", 10, None):
        ...     pass
    """
    if not enabled(progress, total):
        yield
        return
    from rich.console import Console
    from rich.filesize import decimal
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    start = _bytes_read()
    done = threading.Event()
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.fields[read]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),  # stdout may be a report piped elsewhere
        transient=True,
    ) as p:
        task = p.add_task(f"{label} ({decimal(total)})", total=None, read="")

        def tick() -> None:
            while not done.wait(0.25):
                now = _bytes_read()
                if start is not None and now is not None:
                    p.update(task, read=f"{decimal(now - start)} read")

        th = threading.Thread(target=tick, name="ckptkit-activity", daemon=True)
        th.start()
        try:
            yield
        finally:
            done.set()
            th.join()
