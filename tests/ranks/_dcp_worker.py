"""One rank of the ``ckptkit.dcp`` gloo test: ``python _dcp_worker.py SPEC_JSON``.

Plain DCP calls with ckptkit's writer and reader, as a user with their own ``dcp.save``
loop writes them: a sync save, an async save, loads of both into fresh state, then rank 0
flips one byte of a shard rank 1 wrote and every rank loads again. The rank writes what it
saw to ``out/result-<rank>.json``.
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
import torch.distributed.checkpoint as dcp

import ckptkit.checkpoint.dcp
from ckptkit.collective import leave
from ckptkit.errors import CkptkitError


def state(rank: int, seed: int) -> dict[str, Any]:
    """A small model and optimizer (replicated: DCP spreads the items over the ranks),
    each rank's own tensor, and a plain value."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        f"own{rank}": torch.full((5,), float(rank + seed)),
        "step": seed,
    }


def blank(rank: int) -> dict[str, Any]:
    sd = state(rank, 99)
    sd["step"] = -1
    return sd


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not same(x, y):
                return False
        elif isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif isinstance(x, list):
            if json.dumps(x, default=str) != json.dumps(y, default=str):
                return False
        elif x != y:
            return False
    return True


def main() -> None:
    spec = json.loads(sys.argv[1])
    rank, world, out = spec["rank"], spec["world"], Path(spec["out"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    res: dict[str, Any] = {}
    sync_dir, async_dir = spec["ckpt"] + "/step-1", spec["ckpt"] + "/step-2"

    src1 = state(rank, 1)
    dcp.save(src1, storage_writer=ckptkit.dcp.Writer(sync_dir, step=1))
    src2 = state(rank, 2)
    ckptkit.dcp.async_save(src2, async_dir, step=2).result()
    dist.barrier()

    got1 = blank(rank)
    dcp.load(got1, storage_reader=ckptkit.dcp.Reader(sync_dir))
    res["sync_equal"] = same(got1, src1)
    got2 = blank(rank)
    man = ckptkit.dcp.load(got2, async_dir)
    res["async_equal"] = same(got2, src2)
    res["async_step"] = man.step

    dist.barrier()
    if rank == 0:
        victim = Path(sync_dir) / "__1_0.distcp"
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    dist.barrier()
    try:
        ckptkit.dcp.load(blank(rank), sync_dir)
        res["damaged"] = None
    except CkptkitError as e:
        res["damaged"] = {"code": e.code, "path": str(e.path)}
    (out / f"result-{rank}.json").write_text(json.dumps(res))
    leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
