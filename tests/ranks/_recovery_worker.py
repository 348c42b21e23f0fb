"""One rank of the multi-rank automatic-recovery test: ``python _recovery_worker.py SPEC``.

A DDP model on gloo; each rank feeds its own watch its own (rank-local) loss. Only rank
``bad_rank`` degrades: its loss climbs from step ``warn_from`` and turns NaN at
``nan_at``, in the first pass through those steps only; with ``again_at`` it turns NaN
once more later (the limit must then stop every rank). Each rank writes what it saw to
``out/result-<rank>.json``.
"""

from __future__ import annotations

import datetime
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import xxhash

import ckptkit
from ckptkit.collective import leave
from ckptkit.errors import RecoveryError
from ckptkit.signals.recovery import RecoveryPolicy
from ckptkit.signals.stability import StabilityWatch

N = 4096
BATCH = 4


def param_hash(model: torch.nn.Module) -> str:
    h = xxhash.xxh3_64()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


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
        timeout=datetime.timedelta(seconds=60),
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    sampler = ckptkit.ResumableSampler(N, seed=5, rank=rank, world_size=world)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    watch = StabilityWatch(
        window=16, recent=8, warmup=24, min_history=8, trigger_count=1, trigger_window=1,
        z_critical=1e9, std_ratio_warn=1e8, std_ratio_critical=1e9, regress_warn=None,
        regress_critical=None, drift_warn=None, spread_warn=None, clear_after=1000,
    )
    policy = RecoveryPolicy(
        lr_factor=0.5, clip_factor=0.5, skip="warning", max_recoveries=1, min_steps_between=5
    )
    mgr = ckptkit.CheckpointManager(
        spec["ckpt"], keep_last=10, watch=watch, recovery=policy, background_verify=False
    )
    g = torch.Generator().manual_seed(100 + rank)
    xs = torch.randn(N, 8, generator=g)
    bad, warn_from, nan_at = int(spec["bad_rank"]), int(spec["warn_from"]), int(spec["nan_at"])
    again = spec.get("again_at")
    res: dict[str, Any] = {"rank": rank, "events": [], "trained": [], "error": None}
    passes: dict[int, int] = {}
    try:
        while ts.step < int(spec["steps"]):
            ids = [int(i) for i in itertools.islice(iter(sampler), BATCH)]
            loss = ddp(xs[ids]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), mgr.recovery.clip_norm(1.0))
            opt.step()
            sched.step()
            ts.step += 1
            step = ts.step
            passes[step] = passes.get(step, 0) + 1
            res["trained"].append([step, ids])
            value = 1.0 + 0.01 * (step % 5)  # this rank's own metric
            if rank == bad and passes[step] == 1:
                if warn_from <= step < nan_at:
                    value = 5.0
                elif step in (nan_at, again):
                    value = float("nan")
            watch.update(step, loss=value)
            if spec.get("observe"):
                mgr.observe(ts)  # collective when due on any rank: must not hang
            if step % 10 == 0:
                mgr.save(ts)
            ev = mgr.recover(ts)
            if ev is not None:
                res["events"].append(
                    {
                        "kind": ev.kind,
                        "step": ev.step,
                        "hash": param_hash(model),
                        "lr": opt.param_groups[0]["lr"],
                        "record": ev.record,
                    }
                )
    except RecoveryError as e:
        res["error"] = {"code": e.code, "text": str(e), "step": ts.step}
    res["final_step"] = ts.step
    res["final_hash"] = param_hash(model)
    res["lr"] = opt.param_groups[0]["lr"]
    res["clip"] = mgr.recovery.clip_norm(1.0)
    mgr.close()
    (out / f"result-{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
