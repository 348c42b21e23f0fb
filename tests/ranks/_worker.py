"""One rank of a multi-process gloo test: ``python _worker.py SPEC_JSON``.

The spec says the scenario, rank, world size, port and directories; the rank writes what it
saw to ``out/result-<rank>.json`` for the test to compare.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import xxhash

import ckptkit
from ckptkit import collective, crashpoints
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.checkpoint import manifest_io

N = 96
"""Samples in the synthetic dataset (``spec["samples"]`` for more: 8 ranks need 160)."""
BATCH = 4
"""Per-rank batch."""


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.drop = torch.nn.Dropout(0.2)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.drop(torch.relu(self.a(x))))


def data(n: int = N) -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    return torch.randn(n, 8, generator=g)


def param_hash(model: torch.nn.Module) -> str:
    h = xxhash.xxh3_64()
    for k, v in sorted(model.state_dict().items()):
        t = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(k.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def opt_hash(opt: torch.optim.Optimizer) -> str:
    """Digest of this rank's optimizer state (local shards for FSDP)."""
    h = xxhash.xxh3_64()
    for i, st in sorted(opt.state_dict()["state"].items()):
        for k, v in sorted(st.items()):
            t = v.to_local() if hasattr(v, "to_local") else v
            h.update(f"{i}/{k}".encode())
            h.update(t.detach().contiguous().numpy().tobytes() if torch.is_tensor(t) else repr(t).encode())
    return h.hexdigest()


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    rank, world = int(spec["rank"]), int(spec["world"])
    out = Path(spec["out"])
    torch.set_num_threads(1)
    use_pg = world > 1 or bool(spec.get("pg"))
    if use_pg:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{spec['port']}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=float(spec.get("pg_timeout", 30))),
        )
    seed = 7 if spec.get("same_seed") else 7 + rank
    torch.manual_seed(0)  # same initial weights on every rank
    model: torch.nn.Module = Net()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    fsdp = bool(spec.get("fsdp")) and use_pg
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.a)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    n = int(spec.get("samples", N))
    sampler = ResumableSampler(n, seed=1, rank=rank, world_size=world)
    ddp: torch.nn.Module = model
    if world > 1 and not fsdp:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    ts = ckptkit.TrainState(
        model=model,
        optimizer=None if spec.get("model_only") else opt,
        sampler=sampler,
        storage=spec.get("storage", "auto"),
        parallel=ckptkit.ParallelConfig.from_env(**spec.get("parallel", {})),
    )
    mgr = ckptkit.CheckpointManager(spec["ckpt"], keep_last=5)
    xs = data(n)
    it = iter(sampler)
    result: dict[str, Any] = {"rank": rank, "world": world}

    def train(steps: int) -> list[int]:
        nonlocal it
        seen: list[int] = []
        for _ in range(steps):
            ids = [next(it) for _ in range(BATCH)]
            seen += ids
            loss = ddp(xs[ids]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ts.step += 1
        return seen

    scenario = spec["scenario"]
    if scenario == "save":
        result["before"] = train(3)
        with collective.metered() as traffic:  # the bytes this rank exchanged in the save
            mgr.save(ts, async_=bool(spec.get("async")))
        result["traffic"] = traffic.as_dict()
        result["hash_at_save"] = param_hash(model)
        result["opt_at_save"] = opt_hash(opt)
        result["after"] = train(2)
        result["hash_after"] = param_hash(model)
        result["rand_after"] = torch.rand(3).tolist()
    elif scenario == "refused":
        # A restore every rank must refuse together (a damaged file only some ranks read).
        manifest_io.rank_reads.clear()
        try:
            mgr.restore(ts, step=int(spec["step"]))
            result["raised"] = None
        except ckptkit.CkptkitError as e:
            result["raised"] = f"{type(e).__name__}: {e}"
        result["read"] = sorted(manifest_io.rank_reads)
    elif scenario == "restore":
        # Count the rank manifests the restore reads (rank 0's listing of the run reads
        # roots alone, so its count is its restore's too).
        manifest_io.rank_reads.clear()
        res = mgr.restore(ts, step=int(spec["step"]))
        assert res is not None
        result["read"] = sorted(manifest_io.rank_reads)
        result["proven"] = res.proven
        it = iter(sampler)
        result["notes"] = res.notes
        result["restored"] = list(res.restored)
        result["hash_at_restore"] = param_hash(model)
        result["opt_at_restore"] = opt_hash(opt)
        result["after"] = train(2)
        result["hash_after"] = param_hash(model)
        result["rand_after"] = torch.rand(3).tolist()
    elif scenario == "kill":
        train(1)
        mgr.save(ts)  # a good checkpoint to fall back on
        mgr.wait()  # its settle step (verify, latest, rotate) may run in the background
        train(1)
        if rank == int(spec["victim"]):  # this rank dies at that point of the next save
            os.environ[crashpoints.ENV] = spec["point"]
        try:
            mgr.save(ts)
            result["raised"] = None
        except Exception as e:
            result["raised"] = f"{type(e).__name__}: {e}"
        result["steps"] = [(c.step, c.status) for c in mgr.list()]
    elif scenario == "fail":
        # A capture failure on one rank (a sampler state that cannot be saved).
        train(1)
        if rank == int(spec["victim"]):
            sampler.state_dict = lambda: {"bad": object()}  # type: ignore[method-assign]
        try:
            mgr.save(ts)
            result["raised"] = None
        except Exception as e:
            result["raised"] = f"{type(e).__name__}: {e}"
        result["steps"] = [(c.step, c.status) for c in mgr.list()]
    if scenario in ("save", "restore"):
        mgr.close()  # joins an async save and the background verify
        result["listed"] = [(c.step, c.status) for c in mgr.list()]
    (out / f"result-{rank}.json").write_text(json.dumps(result))
    if use_pg and scenario != "kill":  # a killed peer leaves nothing to meet
        dist.barrier()
        collective.leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
    # Everything is written and the process group destroyed. Skip the interpreter's
    # teardown: once in five fresh-clone runs both ranks of a 2-rank FSDP2 restore aborted
    # there ("terminate called without an active exception", SIGABRT) after writing their
    # results, a C++ thread of torch's destroyed at exit, not anything the test checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
