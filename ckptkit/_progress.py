"""A rich progress bar for saves, loads and verifies that take more than a moment."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
        transient=True,
    ) as p:
        task = p.add_task(label, total=total)

        def on_bytes(n: int) -> None:
            with lock:
                p.advance(task, n)

        yield on_bytes
