"""A tiny torchtitan training loop with torchtitan's real checkpointer and containers.

torchtitan's ``Trainer`` and model zoo need ``triton``; its ``CheckpointManager``,
``OptimizersContainer``, ``LRSchedulersContainer`` and ``ParallelAwareDataloader`` do not,
so this script wires those to a small ``nn.Module`` the way ``Trainer`` does (the states
``{"train_state": ...}``, ``checkpointer.load()`` before the loop, ``save(step,
last_step=...)`` after each step) on a gloo world of one.

Usage::

    titan_train.py --manager {ckptkit,torchtitan} train DUMP --steps 4 --interval 2 [--full-last]
    titan_train.py --manager {ckptkit,torchtitan} load DUMP [DUMP ...]

Prints one JSON object per line: ``{"saved": N, "digest": ...}`` after each save;
``{"dump": ..., "chosen": N, "loaded": N|null, "digest": ..., "error": ...}`` per load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig


class Numbers(IterableDataset):  # type: ignore[type-arg]
    """A deterministic endless stream of 4-vectors."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(4, generator=g)


class TrainState:
    """What torchtitan's ``Trainer`` checkpoints as ``train_state`` (its step)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": torch.tensor(self.step, dtype=torch.int32)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step = int(sd["step"].item())


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def build(manager: str, dump: str, *, interval: int, full_last: bool) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})]
    opt = OptimizersContainer.Config(implementation="for-loop", param_groups=groups).build(
        model_parts=[model]
    )
    sched = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=opt, training_steps=100)
    loader = ParallelAwareDataloader(Numbers(), dp_rank=0, dp_world_size=1, batch_size=2)
    if manager == "ckptkit":
        from ckptkit.integrations.torchtitan import CheckpointManager
    else:
        from torchtitan.components.checkpoint import CheckpointManager
    state = TrainState()
    cfg = CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=interval, keep_latest_k=0,
        last_save_model_only=not full_last,
    )
    ck = cfg.build(
        dataloader=loader, model_parts=[model], optimizers=opt, lr_schedulers=sched,
        states={"train_state": state}, sd_adapter=None, base_folder=dump,
    )
    return model, opt, sched, loader, state, ck


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manager", choices=("ckptkit", "torchtitan"), required=True)
    ap.add_argument("command", choices=("train", "load"))
    ap.add_argument("dumps", nargs="+")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--interval", type=int, default=2)
    ap.add_argument("--full-last", action="store_true")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        if args.command == "train":
            model, opt, sched, loader, state, ck = build(
                args.manager, args.dumps[0], interval=args.interval, full_last=args.full_last
            )
            batches = iter(loader)
            for step in range(1, args.steps + 1):
                loss = model(next(batches)).pow(2).mean()
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                state.step = step
                if ck.save(step, last_step=step == args.steps):
                    print(json.dumps({"saved": step, "digest": digest(model)}), flush=True)
            ck.close()
            return
        for dump in args.dumps:
            model, opt, sched, loader, state, ck = build(args.manager, dump, interval=2, full_last=True)
            out: dict[str, Any] = {"dump": dump, "chosen": None, "loaded": None, "error": None}
            try:
                out["chosen"] = ck._find_load_step()
                ck.load()
                out["loaded"], out["digest"] = state.step, digest(model)
            except BaseException as e:  # DCP's CheckpointException is a BaseException
                if isinstance(e, KeyboardInterrupt):
                    raise
                out["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
            ck.close()
            print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
