"""Data-path resume mistakes of hand-written loops that log the loss only (no sample ids).

Each ``--case`` is a small loop the way a user writes one, with ``TrainState(...,
recorder=rec)`` and ``rec.log(step, loss=...)``: the bound Recorder fills the rest (rows,
RNG, batch hash, cursor, ``num_workers``). A dataset of 24 vectors, 6 batches of 4 an epoch.

============  ===================================================================  ==========
``shuffle``   ``DataLoader(shuffle=True)``, the epoch restarts after a mid-epoch   order
              resume (a new permutation from the restored global RNG)
``retrain``   the epoch counter is saved at an epoch-end checkpoint before it is   order
              advanced: the resumed loop trains the finished epoch again
``chained``   one generator shuffles every epoch (each epoch's order depends on    order
              the previous ones); it is not saved, so the resumed run's next
              epoch is shuffled like the first
``content``   the resumed run regenerates the dataset (same ids, other values)     content
``workers``   the README loop (``ResumableSampler.batches``) with ``num_workers=2``  workers'
              and noise added in ``Dataset.__getitem__`` from the global RNG: a      RNG
              resume mid-epoch gives the workers another base seed
============  ===================================================================  ==========

Usage: ``python rows_script.py --case NAME [--workers N]`` (under ``ckptkit drill``).
"""

from __future__ import annotations

import argparse
import sys

import torch

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

N, BATCH = 24, 4
PER_EPOCH = N // BATCH


class Vectors(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed random vectors (``version`` picks them); ``noise`` adds global-RNG noise."""

    def __init__(self, version: int = 1, *, noise: bool = False) -> None:
        g = torch.Generator().manual_seed(version)
        self.x = torch.randn(N, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True)
        self.noise = noise

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        if self.noise:
            x = x + 0.1 * torch.randn(4)  # augmentation on the global RNG (in a worker)
        return x, self.y[i]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True,
                    choices=("shuffle", "retrain", "chained", "content", "workers"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    env = DrillEnv.from_env()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    case = args.case

    data = Vectors(noise=case == "workers")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = ckptkit.ResumableSampler(data, seed=0) if case == "workers" else None
    rec = ckptkit.Recorder(None)
    ts = ckptkit.TrainState(model=model, optimizer=opt, sampler=sampler, recorder=rec)
    mgr = ckptkit.CheckpointManager(env.ckpt_dir or "ckpt", keep_last=2)
    resumed = env.restore(ts, mgr) is not None
    if resumed and case == "content":
        data = Vectors(version=2)
    chain = torch.Generator().manual_seed(7)  # "chained": seeded once, never saved
    stop = env.total_steps(args.steps)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ts.step += 1
        rec.log(ts.step, loss=loss.item())
        if env.should_save(ts.step):
            mgr.save(ts)

    if case == "workers":
        assert sampler is not None
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler,
                                             num_workers=args.workers)
        while ts.step < stop:
            for x, y in sampler.batches(loader):
                step(x, y)
                if ts.step >= stop:
                    break
    elif case == "shuffle":
        while ts.step < stop:
            for x, y in torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True):
                step(x, y)
                if ts.step >= stop:
                    break
    else:
        for epoch in range(ts.progress.epoch, 1000):
            gen = chain if case == "chained" else torch.Generator().manual_seed(100 + epoch)
            loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                                 generator=gen)
            for i, (x, y) in enumerate(loader):
                if case != "retrain" and i == PER_EPOCH - 1:
                    ts.progress.epoch = epoch + 1  # the last batch: a save now resumes next
                step(x, y)
                if ts.step >= stop:
                    break
            ts.progress.epoch = epoch + 1
            if ts.step >= stop:
                break
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
