"""A tiny torchtitan training loop with torchtitan's real checkpointer and containers.

torchtitan's ``Trainer`` and model zoo need ``triton``; its ``CheckpointManager``,
``OptimizersContainer``, ``LRSchedulersContainer`` and ``ParallelAwareDataloader`` do not,
so this script wires those to a small ``nn.Module`` the way ``Trainer`` does (the
``Trainer`` itself is the ``train_state``, with ``config.training.steps``;
``checkpointer.load()`` before the loop, which runs while ``step < training.steps``;
``save(step, last_step=step == training.steps)`` after each step) on a gloo world of one.
Nothing else of ckptkit is added: under ``ckptkit drill`` the integration alone honours the
drill contract.

Usage::

    titan_train.py --manager {ckptkit,torchtitan} train DUMP --steps 4 --interval 2 [--full-last] [--probe-prune]
    titan_train.py --manager {ckptkit,torchtitan} load DUMP [DUMP ...]

Prints one JSON object per line: ``{"saved": N, "digest": ...}`` after each save;
``{"prune_rc": ..., "prune_err": ...}`` with ``--probe-prune`` (``ckptkit prune`` run
while the run trains, after its first save);
``{"dump": ..., "chosen": N, "loaded": N|null, "digest": ..., "rng_moved": bool, "error":
...}`` per load (``rng_moved``: the load drew from torch's global generator).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
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
    """What torchtitan's ``Trainer`` checkpoints as ``train_state``: the Trainer itself
    (its step, and the config whose ``training.steps`` bounds its loop)."""

    def __init__(self, steps: int) -> None:
        self.step = 0
        self.config = SimpleNamespace(training=SimpleNamespace(steps=steps))

    def should_continue_training(self) -> bool:
        return self.step < self.config.training.steps

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


def build(
    manager: str, dump: str, *, interval: int, full_last: bool, steps: int = 0,
    async_mode: str = "disabled",
) -> tuple[Any, ...]:
    """The model, the containers and the checkpointer, as torchtitan's ``Trainer`` wires
    them (each data-parallel rank its own share of the data)."""
    # torchtitan's debug.seed seeds torch only; the drill's RNG check also sees Python's and
    # NumPy's global generators, so a drillable script seeds them too.
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})]
    opt = OptimizersContainer.Config(implementation="for-loop", param_groups=groups).build(
        model_parts=[model]
    )
    sched = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=opt, training_steps=100)
    loader = ParallelAwareDataloader(
        Numbers(), dp_rank=dist.get_rank(), dp_world_size=dist.get_world_size(), batch_size=2
    )
    if manager == "ckptkit":
        from ckptkit.integrations.torchtitan import CheckpointManager
    else:
        from torchtitan.components.checkpoint import CheckpointManager
    state = TrainState(steps)
    cfg = CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=interval, keep_latest_k=0,
        last_save_model_only=not full_last, async_mode=async_mode,
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
    ap.add_argument("--probe-prune", action="store_true")
    ap.add_argument("--set-lr", nargs=2, metavar=("N", "LR"),
                    help="load: set every LR by hand after loading the N-th dump (from 0)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        if args.command == "train":
            model, opt, sched, loader, state, ck = build(
                args.manager, args.dumps[0], interval=args.interval, full_last=args.full_last,
                steps=args.steps,
            )
            ck.load()
            batches = iter(loader)
            while state.should_continue_training():
                state.step += 1
                loss = model(next(batches)).pow(2).mean()
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                if ck.save(state.step, last_step=state.step == state.config.training.steps):
                    lr = [g["lr"] for g in opt.optimizers[0].param_groups]
                    print(json.dumps({"saved": state.step, "digest": digest(model), "lr": lr}), flush=True)
                    if args.probe_prune:
                        args.probe_prune = False
                        p = subprocess.run(
                            [sys.executable, "-m", "ckptkit", "prune", args.dumps[0], "--keep-last", "1"],
                            capture_output=True, text=True, timeout=120,
                        )
                        print(json.dumps({"prune_rc": p.returncode, "prune_err": p.stderr}), flush=True)
            ck.close()
            print(json.dumps({"final_step": state.step, "param_hash": digest(model)}), flush=True)
            return
        for n, dump in enumerate(args.dumps):
            model, opt, sched, loader, state, ck = build(args.manager, dump, interval=2, full_last=True)
            out: dict[str, Any] = {"dump": dump, "chosen": None, "loaded": None, "error": None}
            try:
                out["chosen"] = ck._find_load_step()
                before = torch.random.get_rng_state()
                ck.load()
                out["loaded"], out["digest"] = state.step, digest(model)
                out["rng_moved"] = not torch.equal(before, torch.random.get_rng_state())
                if args.set_lr is not None and int(args.set_lr[0]) == n:
                    for g in opt.optimizers[0].param_groups:
                        g["lr"] = float(args.set_lr[1])
                # One resumed step: the resume guard checks the load and this step.
                model(next(iter(loader))).pow(2).mean().backward()
                opt.step()
                sched.step()
                guard = getattr(ck, "guard", None)
                out["guard"] = [f.code for f in guard.findings] if guard is not None else None
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
