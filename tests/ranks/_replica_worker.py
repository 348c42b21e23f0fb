"""One rank of a replica-agreement test: ``python _replica_worker.py SPEC_JSON``.

DDP training with a checkpoint after every step; ``flips`` flip one bit of one rank's
parameter or Adam moment between two steps (what a faulty accelerator does). The rank
writes what each save did to ``out/result-<rank>.json``.
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
from ckptkit.signals.stability import StabilityWatch

BIT = 20
"""The float32 bit flipped: high in the mantissa, so the copies still differ after Adam's
next update (a flip of the lowest bits could round away)."""


class Net(torch.nn.Module):
    """A small MLP with a BatchNorm: its running statistics differ between DDP ranks
    (each rank's forward updates them from its own batch), legitimately."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.norm = torch.nn.BatchNorm1d(32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.norm(self.a(x))))


def flip(t: torch.Tensor) -> None:
    """Flip bit :data:`BIT` of the first element of float32 tensor ``t`` (this rank's
    shard of a DTensor), in place."""
    local = t.to_local() if hasattr(t, "to_local") else t
    with torch.no_grad():
        local.data.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << BIT)


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
    torch.manual_seed(0)
    model = Net()
    torch.manual_seed(7 + rank)
    ddp: torch.nn.Module
    if spec.get("hsdp"):  # 2 replicas x 2 shards: ranks 0/2 and 1/3 hold the same shards
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        ddp = fully_shard(model, mesh=mesh)
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ts = ckptkit.TrainState(model=model, optimizer=opt)
    watch = StabilityWatch()
    mgr = ckptkit.CheckpointManager(
        spec["ckpt"],
        keep_last=5,
        watch=watch,
        on_divergence=spec["on_divergence"],
        replica_check_every=int(spec.get("every", 1)),
    )
    xs = data()
    flips = {int(f["at"]): f for f in spec.get("flips", [])}
    saves: list[dict[str, Any]] = []
    for i in range(int(spec["saves"])):
        f = flips.get(i)
        if f is not None and int(f["rank"]) == rank:
            if f["what"] == "param":
                flip(model.a.weight)
            else:
                flip(opt.state[model.a.weight]["exp_avg"])
        ids = [(4 * (i * world + rank) + j) % len(xs) for j in range(4)]
        loss = ddp(xs[ids]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ts.step += 1
        seen: dict[str, Any] = {"step": ts.step, "raised": None}
        try:
            mgr.save(ts, async_=bool(spec.get("async")))
            if spec.get("async"):
                mgr.wait()
        except ckptkit.ReplicaDivergenceError as e:
            seen["raised"] = {"code": e.code, "message": str(e)}
        rec = mgr.last_save.replicas
        seen["replicas"] = rec.to_dict() if rec is not None else None
        saves.append(seen)
    mgr.close()
    result: dict[str, Any] = {
        "rank": rank,
        "saves": saves,
        "listed": [(c.step, c.status, c.problem) for c in mgr.list()],
        "latest": (mgr.latest().step if mgr.latest() is not None else None),  # type: ignore[union-attr]
        "watch": {"level": watch.level, "signals": sorted(watch.health().signals)},
    }
    if spec.get("restore"):
        res = ckptkit.CheckpointManager(spec["ckpt"], readonly=True).restore(ts)
        result["restored"] = {"step": res.step if res else None, "notes": res.notes if res else []}
    (out / f"result-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as _worker.py: skip a teardown abort of torch's C++ threads
