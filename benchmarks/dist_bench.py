"""Multi-rank save/load throughput: ckptkit vs plain ``torch.distributed.checkpoint``.

Two ranks on gloo (CPU) hold the same replicated model + AdamW state (DDP). In one run, each
rank times, after a barrier:

- ``ckptkit`` (safetensors): ``CheckpointManager.save`` (every rank writes its share, digests
  computed while writing, rank 0 commits and verifies) and ``restore``;
- ``ckptkit`` (DCP storage): the same with ``TrainState(storage="dcp")`` (DCP writes the
  tensors, ckptkit hashes them and writes the manifest);
- plain DCP: ``dcp.save`` / ``dcp.load`` of the same model and optimizer state dicts.

Prints MB/s and the ratio ckptkit/DCP (target >= 0.9x with digests on).

Usage::

    python benchmarks/dist_bench.py --mb 512 --dir /tmp/ckptkit-bench [--no-verify]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckptkit

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    # model + 2 Adam moments = 3x the parameter bytes
    numel = args.mb * (1 << 20) // 4 // 3
    width = 4096
    rows = max(1, numel // width // 8)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, rows, bias=False) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    nbytes = sum(p.numel() * 4 * 3 for p in model.parameters())
    root = Path(args.dir)
    results: dict[str, float] = {}

    def timed(name: str, fn: Any) -> None:
        best = float("inf")
        for _ in range(args.repeat):
            dist.barrier()
            t = time.perf_counter()
            fn()
            dist.barrier()
            best = min(best, time.perf_counter() - t)
        results[name] = best

    for storage in ("tensors", "dcp"):
        ts = ckptkit.TrainState(model=model, optimizer=opt, storage=storage)  # type: ignore[arg-type]
        run = root / f"ckptkit-{storage}"
        mgr = ckptkit.CheckpointManager(run, keep_last=1, verify_after_save=not args.no_verify)

        def save(ts: Any = ts, mgr: Any = mgr, step: list[int] = [0]) -> None:  # noqa: B006
            step[0] += 1
            ts.step = step[0]
            mgr.save(ts)

        timed(f"ckptkit[{storage}] save", save)
        timed(f"ckptkit[{storage}] load", lambda ts=ts, mgr=mgr: mgr.restore(ts))
        mgr.close()

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    n = [0]

    def dcp_save() -> None:
        n[0] += 1
        msd, osd = get_state_dict(model, opt)
        d = root / f"dcp-{n[0]}"
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(d))
        if rank == 0 and n[0] > 1:
            shutil.rmtree(root / f"dcp-{n[0] - 1}", ignore_errors=True)

    def dcp_load() -> None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optimizer": osd}
        dcp.load(state, checkpoint_id=str(root / f"dcp-{n[0]}"))
        set_state_dict(
            model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )

    timed("dcp save", dcp_save)
    timed("dcp load", dcp_load)
    if rank == 0:
        mbs = {k: nbytes / v / 1e6 for k, v in results.items()}
        out = {"bytes": nbytes, "seconds": results, "MB/s": mbs}
        for storage in ("tensors", "dcp"):
            for op in ("save", "load"):
                out[f"ratio ckptkit[{storage}]/dcp {op}"] = (
                    results[f"dcp {op}"] / results[f"ckptkit[{storage}] {op}"]
                )
        print(json.dumps(out, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=512, help="state size in MiB (model + moments)")
    p.add_argument("--dir", default="/tmp/ckptkit-dist-bench")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="take the best of N")
    p.add_argument("--no-verify", action="store_true", help="verify_after_save=False")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        worker(args.rank, args.world, args.port, args)
        return
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPTKIT_NO_PROGRESS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:], "--rank", str(r), "--port", str(port)],
            env=env,
        )
        for r in range(args.world)
    ]
    codes = [pr.wait() for pr in procs]
    shutil.rmtree(args.dir, ignore_errors=True)
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
