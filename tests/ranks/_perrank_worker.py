"""One rank of a per-rank state test: ``python _perrank_worker.py SPEC_JSON``.

DDP with ``broadcast_buffers=False`` over a model with a BatchNorm: each rank's forward
moves its running statistics its own way. The rank saves, then restores into a fresh model
and reports its buffers at the save and after the restore. Then it saves a model that
holds an extra parameter on rank 0 only (the save must be refused on every rank, naming
it). It writes what it saw to ``out/result-<rank>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _worker import data

import ckptkit
from ckptkit.collective import leave


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.norm(self.a(x))))


def fresh() -> Net:
    torch.manual_seed(0)  # the same initial weights on every rank
    return Net()


def buffers(model: torch.nn.Module) -> dict[str, str]:
    """Every buffer's exact bytes (hex), by name."""
    return {n: b.detach().contiguous().numpy().tobytes().hex() for n, b in model.named_buffers()}


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    rank, world = int(spec["rank"]), int(spec["world"])
    out = Path(spec["out"])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )
    model = fresh()
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ts = ckptkit.TrainState(model=model, optimizer=opt)
    xs = data()
    for i in range(2):
        ids = [(8 * (i * world + rank) + j) % len(xs) for j in range(8)]
        loss = ddp(xs[ids]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ts.step += 1
    result: dict[str, Any] = {"rank": rank, "saved": buffers(model)}
    mgr = ckptkit.CheckpointManager(spec["ckpt"], keep_last=2)
    mgr.save(ts)
    mgr.close()

    again = fresh()
    ts2 = ckptkit.TrainState(model=again, optimizer=torch.optim.AdamW(again.parameters(), lr=1e-2))
    res = ckptkit.CheckpointManager(spec["ckpt"], readonly=True).restore(ts2)
    assert res is not None
    result["restored"] = buffers(again)
    result["params_equal"] = all(
        torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True)
    )
    result["notes"] = res.notes

    # A parameter only rank 0 holds (no DDP: it would refuse the model itself).
    odd = fresh()
    if rank == 0:
        odd.register_parameter("extra", torch.nn.Parameter(torch.ones(3)))
    odd_opt = torch.optim.AdamW(odd.parameters(), lr=1e-2)
    odd(xs[:4]).pow(2).mean().backward()
    odd_opt.step()
    try:
        ckptkit.CheckpointManager(spec["odd"], keep_last=2).save(
            ckptkit.TrainState(model=odd, optimizer=odd_opt, step=1)
        )
        result["odd"] = None
    except ckptkit.CkptkitError as e:
        result["odd"] = {"type": type(e).__name__, "code": e.code, "message": str(e)}
    (out / f"result-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as _worker.py: skip a teardown abort of torch's C++ threads
