"""How `ckptkit verify --workers N` scales, and why its workers are threads.

Saves a checkpoint of ``--mb`` MB in ``--files`` shard files (or reuses ``--path``), then
times, cold (page cache evicted with posix_fadvise DONTNEED) and warm:

* ``verify(path, workers=N)`` for each N of ``--workers`` (threads: what ships);
* the same per-file scan (``ckptkit.storage.tensors_scan.scan_file``, what a worker runs) on a
  process pool of the largest N: the alternative the threads were chosen over;
* with ``--torchrun K``, ``torchrun --nproc-per-node K -m ckptkit verify --torchrun``
  (the report's own seconds, so the launch and the imports are not counted).

Prints one line per configuration: median seconds of ``--reps`` and MB/s. Results and the
machine they were taken on: docs/performance.md, "Parallel verify".

    python benchmarks/verify_workers.py --mb 320 --files 8 --workers 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

import ckptkit
from ckptkit.storage import tensors_scan


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def evict(path: Path) -> None:
    """Drop ``path``'s files from the page cache (what "cold" means here)."""
    for p in _files(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make(path: Path, mb: int, files: int) -> None:
    """A checkpoint of ``mb`` MB of float32 model weights in ``files`` shards."""
    per = mb * 1_000_000 // files // 4
    torch.manual_seed(0)
    model = {f"layer{i}.w": torch.randn(per) for i in range(files)}
    ckptkit.save({"model": model}, path, shard_bytes=per * 4)


def _scan(p: Path) -> str:
    return tensors_scan.scan_file(p, compression=None, raw_size=None, rel=p.name, values=True)[0]


def timed(fn: Callable[[], object], path: Path, *, cold: bool, reps: int) -> float:
    out = []
    for _ in range(reps):
        if cold:
            evict(path)
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _torchrun(path: Path, k: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(k),
         "--master-port", str(port), "-m", "ckptkit", "verify", str(path), "--torchrun",
         "--json"],
        capture_output=True, text=True, timeout=600, check=True,
    )
    return float(json.loads(p.stdout)["reports"][0]["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", type=Path, help="an existing checkpoint (else one is saved)")
    ap.add_argument("--mb", type=int, default=320)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torchrun", type=int, default=0, help="also K torchrun ranks")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        path = args.path or Path(tmp) / "ckpt"
        if args.path is None:
            make(path, args.mb, args.files)
        mb = sum(p.stat().st_size for p in _files(path)) / 1e6
        shards = [p for p in _files(path) if p.suffix == ".safetensors"]
        print(f"{mb:.0f} MB in {len(shards)} shards; load average {os.getloadavg()[0]:.1f}")
        for cold in (True, False):
            temp = "cold" if cold else "warm"
            for n in args.workers:
                s = timed(lambda n=n: ckptkit.verify(path, workers=n), path, cold=cold,
                          reps=args.reps)
                print(f"{temp} verify threads={n:<3} {s:6.2f} s {mb / s:7.0f} MB/s")
            n = max(args.workers)
            with ProcessPoolExecutor(n) as pool:
                list(pool.map(_scan, shards))  # start the workers and import torch first
                s = timed(lambda: list(pool.map(_scan, shards)), path, cold=cold, reps=args.reps)
            print(f"{temp} scan processes={n:<3} {s:6.2f} s {mb / s:7.0f} MB/s (files only)")
            if args.torchrun:
                runs = []
                for _ in range(args.reps):
                    if cold:
                        evict(path)
                    runs.append(_torchrun(path, args.torchrun))
                s = statistics.median(runs)
                print(f"{temp} torchrun ranks={args.torchrun:<3} {s:6.2f} s {mb / s:7.0f} MB/s")


if __name__ == "__main__":
    main()
