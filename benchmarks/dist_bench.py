"""Multi-rank save/load throughput: ckptkit vs plain ``torch.distributed.checkpoint``.

Two ranks on gloo (CPU) hold the same replicated model + AdamW state (DDP). In one run, each
rank times, after a barrier:

- ``ckptkit`` (safetensors): ``CheckpointManager.save`` (every rank writes its share, digests
  computed while writing, rank 0 commits and verifies) and ``restore``;
- ``ckptkit`` (DCP storage): the same with ``TrainState(storage="dcp")`` (DCP writes the
  tensors, ckptkit hashes them and writes the manifest);
- plain DCP: ``dcp.save`` / ``dcp.load`` of the same model and optimizer state dicts.

Saves report what the training loop waits for (``save``: the commit; the read-back
verify, ``latest`` and rotation run in the background) and the whole of it
(``save+verify``: joined). Loads alternate ckptkit and plain DCP round by round, warm
(files in the page cache, as right after a save) and cold (every file evicted with
``posix_fadvise(DONTNEED)``, plus ``drop_caches`` when root), and report medians. A
ckptkit restore checks every byte against the manifest (DCP storage: ``.metadata``
before it is unpickled, each shard in the one pass that loads it); plain DCP checks
nothing. Ratios are plain DCP time / ckptkit time (> 1: ckptkit faster).

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

    def once(fn: Any) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t

    def evict() -> None:
        dist.barrier()
        if rank == 0:
            for f in root.rglob("*"):
                if f.is_file():
                    fd = os.open(f, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)
            try:
                with open("/proc/sys/vm/drop_caches", "w") as fh:
                    fh.write("1\n")
            except OSError:
                pass
        dist.barrier()

    samples: dict[str, list[float]] = {}
    managers: dict[str, Any] = {}
    states: dict[str, Any] = {}
    for storage in ("tensors", "dcp"):
        ts = ckptkit.TrainState(model=model, optimizer=opt, storage=storage)  # type: ignore[arg-type]
        mgr = ckptkit.CheckpointManager(
            root / f"ckptkit-{storage}", keep_last=1, verify_after_save=not args.no_verify
        )
        managers[storage], states[storage] = mgr, ts
        for r in range(args.repeat):
            ts.step = r + 1
            blocked = once(lambda ts=ts, mgr=mgr: mgr.save(ts))
            total = blocked + once(mgr.wait)
            samples.setdefault(f"ckptkit[{storage}] save", []).append(blocked)
            samples.setdefault(f"ckptkit[{storage}] save+verify", []).append(total)

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

    for _ in range(args.repeat):
        samples.setdefault("dcp save", []).append(once(dcp_save))
    loads = {
        "ckptkit[tensors] load": lambda: managers["tensors"].restore(states["tensors"]),
        "ckptkit[dcp] load": lambda: managers["dcp"].restore(states["dcp"]),
        "dcp load": dcp_load,
    }
    for r in range(args.repeat):
        order = list(loads) if r % 2 == 0 else list(reversed(loads))
        for name in order:  # warm: files in the page cache, as right after a save
            samples.setdefault(f"{name} warm", []).append(once(loads[name]))
        for name in order:  # cold: evicted first
            evict()
            samples.setdefault(f"{name} cold", []).append(once(loads[name]))
    for mgr in managers.values():
        mgr.close()
    results = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    if rank == 0:
        mbs = {k: nbytes / v / 1e6 for k, v in results.items()}
        out = {"bytes": nbytes, "seconds": results, "MB/s": mbs}
        for storage in ("tensors", "dcp"):
            for op, ref in (("save", "save"), ("save+verify", "save"), ("load warm", "load warm"),
                            ("load cold", "load cold")):
                out[f"ratio dcp {ref} / ckptkit[{storage}] {op}"] = (
                    results[f"dcp {ref}"] / results[f"ckptkit[{storage}] {op}"]
                )
        print(json.dumps(out, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=512, help="state size in MiB (model + moments)")
    p.add_argument("--dir", default="/tmp/ckptkit-dist-bench")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="report the median of N")
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
