"""A second drill-ready training script, written unlike the bundled tiny LM, for calibration.

An image-style classifier (an MLP with dropout on 8x8 synthetic "images"), written the way
a user ports a script to ckptkit from the docs alone:

* augmentation in ``Dataset.__getitem__`` on the *global* generators: a flip from Python's
  ``random``, a brightness jitter from ``np.random``, pixel noise from ``torch.randn``;
* its own stateful sampler (``EpochShuffler``: not ckptkit's), driven by a plain
  ``torch.utils.data.DataLoader`` with a ``generator=`` (so ``iter()`` draws nothing from
  the global RNG), epochs looped with ``for x, y, idx in loader`` then ``next_epoch()``;
* SGD with Nesterov momentum (no step counter in its state), a cosine LR per step;
* fp16 autocast on CPU with a ``GradScaler("cpu")`` of short growth interval.

``--log minimal`` logs only the loss; ``--log busy`` the loss, grad norm and LR (what a busy
user logs); ``--log full`` logs every field docs/drills.md lists
(its own RNG fingerprint, batch hash, sample ids with content hashes, LR, grad norm, loss
scale) and a look-ahead.

Faults (``--fault``, applied right after a restore; ``loader-no-generator`` builds the loader
without ``generator=`` in every run, which only a mid-epoch resume exposes):

=======================  ================================================  ===============
``reseed``               ``seed_everything(seed)`` after the restore       rng
``loader-no-generator``  ``iter(DataLoader)`` draws from the global RNG    rng
``sampler-reset``        the loop calls ``sampler.set_epoch(epoch)``       sampler
                         after the restore (this sampler resets there)
``data-version``         the dataset regenerated (same ids, new content)   data-version
``fresh-scaler``         a new GradScaler after the restore (the saved     scaler
                         scale has not moved yet: only the tracker differs)
``opt-state-reset``      the optimizer's state (momentum) dropped          optimizer
``sched-rebuilt``        a new CosineAnnealingLR after the restore         scheduler
``lr-rescaled``          LR and base LRs x0.5 after the restore            hyperparameters
``step-from-epoch``      the step counter recomputed from the epoch        progress
=======================  ================================================  ===============

Usage: ``python aug_script.py [--log minimal|busy|full] [--fault NAME] [--steps N]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from typing import Any

import numpy as np
import torch
import xxhash

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

FAULTS = {
    "none": "none",
    "reseed": "rng",
    "loader-no-generator": "rng",
    "sampler-reset": "sampler",
    "data-version": "data-version",
    "fresh-scaler": "scaler",
    "opt-state-reset": "optimizer",
    "sched-rebuilt": "scheduler",
    "lr-rescaled": "hyperparameters",
    "step-from-epoch": "progress",
}
"""Each fault and the component it breaks."""

N, DIM, CLASSES, BATCH = 64, 64, 10, 8


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Shapes(torch.utils.data.Dataset[tuple[torch.Tensor, int, int]]):
    """Synthetic 8x8 images of ``CLASSES`` prototypes plus noise; augmented on the fly."""

    def __init__(self, version: str) -> None:
        gen = np.random.default_rng(xxhash.xxh3_64_intdigest(f"shapes:{version}".encode()))
        protos = gen.normal(size=(CLASSES, DIM))
        self.labels = gen.integers(0, CLASSES, size=N)
        self.images = (protos[self.labels] + 0.5 * gen.normal(size=(N, DIM))).astype(np.float32)

    def __len__(self) -> int:
        return N

    def content_hash(self, i: int) -> str:
        return xxhash.xxh3_64_hexdigest(self.images[i].tobytes())[:8]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        img = torch.from_numpy(self.images[i].copy()).view(8, 8)
        if random.random() < 0.5:  # flip: Python's global RNG
            img = img.flip(1)
        img = img * float(np.random.uniform(0.9, 1.1))  # brightness: NumPy's global RNG
        img = img + 0.05 * torch.randn_like(img)  # pixel noise: torch's global RNG
        return img.reshape(-1), int(self.labels[i]), i


class EpochShuffler(torch.utils.data.Sampler[int]):
    """A user's own resumable shuffler: a permutation per (seed, epoch), and a position."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0

    def __len__(self) -> int:
        return self.n - self.pos

    def __iter__(self):  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        perm = torch.randperm(self.n, generator=g).tolist()
        while self.pos < self.n:
            self.pos += 1
            yield perm[self.pos - 1]

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.pos = epoch, 0

    def next_epoch(self) -> None:
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.pos = state["seed"], state["epoch"], state["pos"]


def rng_fp() -> str:
    h = xxhash.xxh3_64()
    h.update(torch.get_rng_state().numpy().tobytes())
    h.update(np.random.get_state()[1].tobytes())  # type: ignore[index]
    h.update(repr(random.getstate()).encode())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", choices=("minimal", "busy", "full"), default="full")
    ap.add_argument("--fault", choices=sorted(FAULTS), default="none")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--growth-interval", type=int, default=8)
    ap.add_argument("--ckpt-dir", default="ckpt")
    args = ap.parse_args()
    env = DrillEnv.from_env()
    torch.set_num_threads(env.threads or 1)
    seed_everything(args.seed)
    fault = args.fault

    data = Shapes("v1")
    sampler = EpochShuffler(N, seed=args.seed)
    gen = None if fault == "loader-no-generator" else torch.Generator()
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler, generator=gen)
    model = torch.nn.Sequential(
        torch.nn.Linear(DIM, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
        torch.nn.Linear(64, CLASSES),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=args.growth_interval)
    rec = ckptkit.Recorder(None)
    state = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                               sampler=sampler, recorder=rec)
    mgr = ckptkit.CheckpointManager(env.ckpt_dir or args.ckpt_dir, keep_last=2)
    resumed = env.restore(state, mgr) is not None
    if resumed:
        if fault == "reseed":
            seed_everything(args.seed)
        elif fault == "sampler-reset":
            sampler.set_epoch(sampler.epoch)
        elif fault == "data-version":
            loader = torch.utils.data.DataLoader(Shapes("v2"), batch_size=BATCH, sampler=sampler,
                                                 generator=gen)
        elif fault == "fresh-scaler":
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8,
                                          growth_interval=args.growth_interval)
        elif fault == "opt-state-reset":
            opt.state = defaultdict(dict)
        elif fault == "sched-rebuilt":
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
        elif fault == "lr-rescaled":
            for g in opt.param_groups:
                g["lr"] *= 0.5
                g["initial_lr"] *= 0.5
            sched.base_lrs = [b * 0.5 for b in sched.base_lrs]
        elif fault == "step-from-epoch":
            state.step = sampler.epoch * (N // BATCH)

    stop = env.total_steps(args.steps)
    while state.step < stop:
        for x, y, idx in loader:
            fp = rng_fp() if args.log == "full" else None
            lr = opt.param_groups[0]["lr"]
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            scaler.step(opt)
            scaler.update()
            sched.step()
            state.step += 1
            if args.log == "minimal":
                rec.log(state.step, loss=loss.item())
            elif args.log == "busy":
                rec.log(state.step, loss=loss.item(), grad_norm=float(gnorm), lr=lr)
            else:
                fields: dict[str, Any] = {
                    "grad_norm": float(gnorm),
                    "lr": lr,
                    "loss_scale": scaler.get_scale(),
                    "rng": fp,
                    "batch_hash": xxhash.xxh3_64_hexdigest(x.numpy().tobytes()),
                    "sample_ids": [[sampler.epoch, int(i), loader.dataset.content_hash(int(i))]
                                   for i in idx],
                }
                rec.log(state.step, loss=loss.item(), **fields)
            if env.should_save(state.step):
                la = None
                if args.log == "full":
                    la = {"next_step": state.step + 1, "lr": opt.param_groups[0]["lr"],
                          "epoch": sampler.epoch}
                mgr.save(state, lookahead=la)
            if state.step >= stop:
                break
        else:
            sampler.next_epoch()
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
