"""One rank of the two-rank torchtitan test: ``python _titan_worker.py SPEC_JSON``.

torchtitan's real checkpointer with the ckptkit integration (the containers of
``interop/scripts/titan_train.py``), on gloo: train 4 steps saving step 2 with the spec's
``async_mode`` and step 4 (the last, full) synchronously; rank 0 then truncates the shard
rank 1 wrote of step 4, and every rank builds a fresh manager and loads. Writes
what this rank saw to ``out/result-<rank>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from titan_train import build, digest

from ckptkit.collective import leave


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    rank, world = spec["rank"], spec["world"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    dump = spec["dump"]
    out: dict[str, Any] = {"saved": {}}
    try:
        model, opt, sched, loader, state, ck = build(
            "ckptkit", dump, interval=2, full_last=True, steps=4, async_mode=spec["async_mode"]
        )
        ck.load()
        batches = iter(loader)
        while state.should_continue_training():
            state.step += 1
            model(next(batches)).pow(2).mean().backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            if ck.save(state.step, last_step=state.step == state.config.training.steps):
                out["saved"][state.step] = digest(model)
        ck.close()
        dist.barrier()
        if rank == 0:
            shard = Path(dump) / "checkpoint" / "step-4" / "__1_0.distcp"
            data = shard.read_bytes()
            shard.write_bytes(data[: len(data) // 2])  # rank 1's shard, cut short
        dist.barrier()
        model, opt, sched, loader, state, ck = build("ckptkit", dump, interval=2, full_last=True)
        out["chosen"] = ck._find_load_step()
        ck.load()
        out["loaded"], out["digest"] = state.step, digest(model)
        ck.close()
    except BaseException:
        dist.destroy_process_group()  # a failing rank: its traceback and status count
        raise
    (Path(spec["out"]) / f"result-{rank}.json").write_text(json.dumps(out))
    leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
