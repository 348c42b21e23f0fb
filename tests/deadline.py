"""Calls that must return by a deadline: one helper for every test that proves something
does not block (a FIFO where a file should be, a retention loop that must end).

A test never waits on a wall-clock sleep for this: it runs the call in a daemon thread,
joins it with a generous deadline (a busy CI machine must not fail it) and, past the
deadline, wakes a reader blocked on a FIFO by opening the FIFO for writing, then fails.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def within(seconds: float, fn: Callable[[], Any], *fifos: Path) -> Any:
    """Return ``fn()``, or raise what it raised; fail the test if it has not returned
    within ``seconds`` (a reader blocked in ``open()`` of one of ``fifos`` is woken first,
    so the thread does not outlive the test)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed back to the test thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for f in fifos:  # a reader blocked in open() wakes once a writer appears
            with contextlib.suppress(OSError):
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail(f"{fn} blocked for more than {seconds}s")
    if "error" in out:
        raise out["error"]
    return out.get("value")
