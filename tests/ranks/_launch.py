"""Start the ranks of a gloo test as real processes: ``launch(world, out, **spec)``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_worker.py")
TIMEOUT = 90.0
"""Seconds a whole launch may take: a hang fails the test instead of blocking the suite."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    world: int, out: Path, *, worker: Path = WORKER, timeout: float = TIMEOUT, **spec: Any
) -> tuple[list[int], list[dict[str, Any] | None]]:
    """Start ``world`` worker processes (``worker``); return their exit codes and results
    (``timeout``: seconds the whole launch may take)."""
    out.mkdir(parents=True, exist_ok=True)
    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPTKIT_NO_PROGRESS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(worker),
                json.dumps({**spec, "rank": r, "world": world, "port": port, "out": str(out)}),
            ],
            env=env,
        )
        for r in range(world)
    ]
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r in range(world):
        f = out / f"result-{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    return codes, results


