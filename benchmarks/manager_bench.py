"""What a synchronous ``CheckpointManager.save`` costs the training loop, and its read-back.

One bf16 model + AdamW state (``--gb``, default 0.6 GB), in one run:

- ``ckptkit.save`` of the same state (model + optimizer state dicts): the anchor;
- ``mgr.save(ts)`` with the default background verify: ``stall`` is what the training
  loop waits for (capture + commit), ``settled`` the time until the checkpoint is
  verified, ``latest`` and rotation done (``mgr.wait()``);
- the same with ``background_verify=False`` (v0.1's behaviour: verify inside ``save``);
- the read-back verify of the committed checkpoint, cold (files evicted from the page
  cache first), against a plain cold sequential read of the same files (8 MiB reads, one
  thread: what ``cat`` does) and against parallel ``pread`` of them (the disk's limit).

Targets (issue 11): stall <= 1.3x ``ckptkit.save``; read-back verify >= 0.9x a plain cold
read. Rounds alternate the order of the ops; medians are reported. Each op also runs once
in a fresh process (``--fresh``), where new memory is touched for the first time (on these
VMs ~15x slower than warm memory), which the in-process numbers hide.

Usage::

    python benchmarks/manager_bench.py --gb 0.6 --repeat 3 --dir /tmp/ckptkit-mbench [--fresh]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from io_bench import evict, files_under

import ckptkit
from ckptkit.verify.runner import verify_one

CHUNK = 8 << 20


def build(gb: float) -> ckptkit.TrainState:
    """A bf16 MLP stack + AdamW (bf16 moments): params + 2 moments = ``gb`` GB."""
    torch.manual_seed(0)
    numel = int(gb * 1e9 / 2 / 3)
    width = 4096
    rows = max(1, numel // width // 8)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, rows, bias=False, dtype=torch.bfloat16) for _ in range(8)]
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return ckptkit.TrainState(model=model, optimizer=opt, step=0, guard_k=0)


def plain_read(path: Path) -> int:
    """Cold sequential read of every file, 8 MiB at a time, one thread."""
    buf = bytearray(CHUNK)
    n = 0
    for fn in files_under(str(path)):
        with open(fn, "rb", buffering=0) as f:
            while k := f.readinto(buf):  # type: ignore[attr-defined]
                n += k
    return n


def parallel_read(path: Path, streams: int = 4) -> int:
    """Cold read of every file by ``streams`` threads issuing preads (the disk's limit)."""
    jobs = []
    for fn in files_under(str(path)):
        size = os.path.getsize(fn)
        jobs += [(fn, off, min(CHUNK, size - off)) for off in range(0, size, CHUNK)]
    fds = {fn: os.open(fn, os.O_RDONLY) for fn, _, _ in jobs}
    bufs = {}

    def one(job: tuple[str, int, int]) -> int:
        fn, off, n = job
        import threading

        b = bufs.setdefault(threading.get_ident(), bytearray(CHUNK))
        return os.preadv(fds[fn], [memoryview(b)[:n]], off)

    try:
        with ThreadPoolExecutor(streams) as pool:
            return sum(pool.map(one, jobs))
    finally:
        for fd in fds.values():
            os.close(fd)


def run_ops(args: argparse.Namespace, only: str | None = None) -> dict[str, list[float]]:
    root = Path(args.dir)
    ts = build(args.gb)
    tree = {"model": ts.model.state_dict(), "optimizer": ts.optimizer.state_dict()}  # type: ignore[union-attr]
    samples: dict[str, list[float]] = {}
    step = [0]

    def add(k: str, v: float) -> None:
        samples.setdefault(k, []).append(v)

    def op_save() -> None:
        t = time.perf_counter()
        ckptkit.save(tree, root / "plain", overwrite=True, progress=False)
        add("ckptkit.save", time.perf_counter() - t)

    def op_mgr(background: bool) -> None:
        name = "mgr.save" if background else "mgr.save(background_verify=False)"
        mgr = ckptkit.CheckpointManager(
            root / ("run-bg" if background else "run-fg"), keep_last=1,
            background_verify=background,
        )
        step[0] += 1
        ts.step = step[0]
        t = time.perf_counter()
        mgr.save(ts)
        stall = time.perf_counter() - t
        mgr.wait()
        add(f"{name} stall", stall)
        add(f"{name} settled", time.perf_counter() - t)
        mgr.close()

    def op_reads() -> None:
        mgr = ckptkit.CheckpointManager(root / "run-bg", readonly=True)
        latest = mgr.latest()
        assert latest is not None
        ck = latest.path
        for name, fn in (
            ("plain cold read", lambda: plain_read(ck)),
            ("parallel cold read", lambda: parallel_read(ck)),
            ("read-back verify", lambda: verify_one(ck, progress=False)),
        ):
            evict(str(ck))
            t = time.perf_counter()
            fn()
            add(name, time.perf_counter() - t)

    ops = {
        "save": op_save,
        "mgr": lambda: op_mgr(True),
        "mgr_fg": lambda: op_mgr(False),
        "reads": op_reads,
    }
    if only is not None:
        ops["mgr"]()  # a checkpoint to read back
        samples.clear()
        ops[only]()
        return samples
    ops["save"]()  # warm-up: allocations, imports, the first directory
    ops["mgr"]()
    samples.clear()
    names = list(ops)
    for r in range(args.repeat):
        for name in names if r % 2 == 0 else list(reversed(names)):
            ops[name]()
    return samples


def med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=0.6)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default="/tmp/ckptkit-mbench")
    p.add_argument("--fresh", action="store_true", help="also run each op in a fresh process")
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("CKPTKIT_NO_PROGRESS", "1")
    if args.one:
        print(json.dumps(run_ops(args, only=args.one)))
        return
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    warm = {k: med(v) for k, v in run_ops(args).items()}
    out: dict[str, Any] = {"gb": args.gb, "in_process": warm}
    if args.fresh:
        fresh: dict[str, float] = {}
        for op in ("save", "mgr", "mgr_fg", "reads"):
            proc = subprocess.run(
                [sys.executable, __file__, "--gb", str(args.gb), "--dir", args.dir, "--one", op],
                capture_output=True, text=True, check=True,
            )
            fresh.update({k: med(v) for k, v in json.loads(proc.stdout.splitlines()[-1]).items()})
        out["fresh_process"] = fresh
    for where in ("in_process", "fresh_process"):
        r = out.get(where)
        if not r:
            continue
        out[f"{where} ratios"] = {
            "stall / ckptkit.save (target <= 1.3)": r["mgr.save stall"] / r["ckptkit.save"],
            "v0.1 in-save verify / ckptkit.save": r["mgr.save(background_verify=False) stall"]
            / r["ckptkit.save"],
            "read-back verify speed / plain cold read (target >= 0.9)": r["plain cold read"]
            / r["read-back verify"],
            "read-back verify speed / parallel cold read": r["parallel cold read"]
            / r["read-back verify"],
        }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
