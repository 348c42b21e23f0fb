"""What the replica agreement check costs a multi-rank save (issue 26 item 3).

``--world`` ranks on gloo (CPU) hold the same replicated model + AdamW state (DDP). In one
run, after a barrier each time, every rank times (medians of ``--repeat``):

- ``hash_one``: rank 0 alone hashes its copy of the whole replicated state
  (:func:`ckptkit.checkpoint.replicas.digests`, xxh3-128 per tensor) while the others wait: what one
  hashing rank would cost;
- ``hash_all``: every rank hashes its copy at once (what the check does). On a cluster each
  rank has its own host memory bandwidth and this equals ``hash_one``; on one small
  machine the ranks share cores and memory, so it shows the worst case;
- ``gather``: the fixed-size gather to rank 0 alone (48 bytes per rank);
- ``check``: the whole check of agreeing copies (:func:`ckptkit.checkpoint.replicas.check`: hash,
  gather, compare);
- ``check_diverged``: the same when one rank's copy of one tensor differs (the per-tensor
  table travels too: an object gather to rank 0);
- ``save_checked`` / ``save_unchecked``: ``CheckpointManager.save`` with
  ``replica_check_every=1`` and ``0`` (the blocking part; the read-back verify runs in the
  background and is joined outside the timing), alternating round by round.

Usage::

    python benchmarks/replica_bench.py --mb 512 --dir /tmp/ckptkit-bench
    python benchmarks/replica_bench.py --quick          # 64 MB, 3 repeats
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
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

    import ckptkit
    from ckptkit.checkpoint import replicas
    from ckptkit.checkpoint.commit import SPREAD
    from ckptkit.collective import TorchGroup, gather_fixed
    from ckptkit.format import tree

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    numel = args.mb * (1 << 20) // 4 // 3  # model + 2 Adam moments = 3x the parameter bytes
    width = 1024
    layers = 8
    rows = max(1, numel // width // layers)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, rows, bias=True) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    ts = ckptkit.TrainState(model=model, optimizer=opt)
    tree_, _ = ts.capture()
    held = replicas.replicated(tree.encode(tree_).tensors, spread=SPREAD)
    nbytes = sum(t.numel() * t.element_size() for t in held.values())
    coll = TorchGroup()
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> None:
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        times.setdefault(name, []).append(time.perf_counter() - t)

    odd = dict(held)
    first = next(iter(odd))
    odd[first] = odd[first].clone()
    odd[first].view(-1)[:1].add_(1.0)
    root = Path(args.dir)
    managers = {
        name: ckptkit.CheckpointManager(root / name, keep_last=1, replica_check_every=every)
        for name, every in (("save_checked", 1), ("save_unchecked", 0))
    }
    for i in range(args.repeat + 1):  # round 0 warms up (first-call costs, page cache)
        timed("hash_one", lambda: replicas.digests(held) if rank == 0 else None)
        timed("hash_all", lambda: replicas.digests(held))
        timed("gather", lambda: gather_fixed(coll, bytes(replicas.RECORD.size)))
        timed("check", lambda: replicas.check(coll, held, policy="warn"))
        mine = odd if rank == world - 1 else held
        timed("check_diverged", lambda m=mine: replicas.check(coll, m, policy="warn"))
        order = list(managers) if i % 2 == 0 else list(reversed(managers))
        for name in order:
            ts.step = i + 1
            timed(name, lambda n=name: managers[n].save(ts))
            managers[name].wait()
        if i == 0:
            times.clear()
    for m in managers.values():
        m.close()
    if rank == 0:
        out = {k: statistics.median(v) for k, v in times.items()}
        out["bytes"] = nbytes
        out["tensors"] = len(held)
        print(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=256, help="replicated state size (MB)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="64 MB, 3 repeats")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.mb, args.repeat = 64, 3
    if args.rank is not None:
        worker(args.rank, args.world, args.port, args)
        return
    tmp = tempfile.mkdtemp(prefix="replica-bench-", dir=args.dir)
    try:
        port = _port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPTKIT_NO_PROGRESS": "1"}
        base = [sys.executable, __file__, "--mb", str(args.mb), "--world", str(args.world),
                "--repeat", str(args.repeat), "--dir", tmp, "--port", str(port)]
        procs = [
            subprocess.Popen([*base, "--rank", str(r)], env=env, stdout=subprocess.PIPE, text=True)
            for r in range(args.world)
        ]
        outs = [p.communicate(timeout=3600)[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
        res = json.loads(outs[0].strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = res["bytes"] / 1e6
    print(f"{args.world} ranks, replicated state {mb:.0f} MB in {res['tensors']} tensors, "
          f"medians of {args.repeat}")
    for k in ("hash_one", "hash_all", "gather", "check", "check_diverged", "save_unchecked", "save_checked"):
        rate = f"  ({mb / res[k] / 1e3:.2f} GB/s)" if k.startswith("hash") else ""
        print(f"  {k:<17} {res[k] * 1e3:9.1f} ms{rate}")
    extra = res["save_checked"] - res["save_unchecked"]
    print(f"  check adds {extra * 1e3:.1f} ms to a save "
          f"({res['save_checked'] / res['save_unchecked']:.3f}x); "
          f"hash_all / hash_one = {res['hash_all'] / res['hash_one']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"world": args.world, **res}, indent=1))


if __name__ == "__main__":
    main()
