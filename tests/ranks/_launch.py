"""Start the ranks of a gloo test as real processes: ``launch(world, out, **spec)``."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zygote import Zygote

WORKER = Path(__file__).with_name("_worker.py")
TIMEOUT = 90.0
"""Seconds a whole launch may take: a hang fails the test instead of blocking the suite."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_ZYGOTE: Zygote | None = None
"""This pytest process's warmed interpreter that forks the ranks (made at the first launch)."""


def _zygote() -> Zygote:
    global _ZYGOTE
    if _ZYGOTE is None:
        _ZYGOTE = Zygote(Path(tempfile.mkdtemp(prefix="ranks-zygote-")))
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE


def launch(
    world: int, out: Path, *, worker: Path = WORKER, timeout: float = TIMEOUT, **spec: Any
) -> tuple[list[int], list[dict[str, Any] | None]]:
    """Start ``world`` worker processes (``worker``); return their exit codes and results
    (``timeout``: seconds the whole launch may take).

    Each rank is a new process forked from a warmed interpreter (``tests/zygote.py``, the
    mechanism ``ckptkit drill`` starts its runs with): nothing saved or restored before it,
    without paying torch's import once per rank. A rank that fails prints its stderr here.
    """
    out.mkdir(parents=True, exist_ok=True)
    port = _port()
    env = {"OMP_NUM_THREADS": "1", "CKPTKIT_NO_PROGRESS": "1"}
    zygote = _zygote()
    children = [
        zygote.start_argv(
            [
                sys.executable,
                str(worker),
                json.dumps({**spec, "rank": r, "world": world, "port": port, "out": str(out)}),
            ],
            env=env,
            cwd=Path.cwd(),
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + timeout
    codes = []
    for rank, child in enumerate(children):
        try:
            res = child.wait(max(1.0, deadline - time.monotonic()))
        except TimeoutError as e:
            for other in children[rank + 1:]:  # the world cannot finish without this rank
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(other.pid, signal.SIGKILL)
            print(f"rank {rank}: {e}", file=sys.stderr)
            codes.append(-signal.SIGKILL)
            continue
        if res.returncode != 0:
            print(f"rank {rank} exited {res.returncode}:\n{res.stderr[-3000:]}", file=sys.stderr)
        codes.append(res.returncode)
    results = []
    for r in range(world):
        f = out / f"result-{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    return codes, results
