"""A Fabric loop whose DataLoader goes through ``fabric.setup_dataloaders`` (issue 24).

The documented ckptkit lines of ``fabric_tiny.py`` plus the standard
``fabric.setup_dataloaders(loader, use_distributed_sampler=False)``: Fabric wraps the loader
in a ``_FabricDataLoader`` that calls ``sampler.set_epoch(n)`` with ``n`` the number of
``iter()`` calls *of this process*, so a resumed process starts counting from 0 again.
Dropout, a shuffled ResumableSampler, Adam; 40 samples in batches of 4 (10 steps an
epoch). Driven by the drill contract (``CKPTKIT_DRILL_*``); writes the final weights to
``--final``.

``--loop batches`` iterates ``sampler.batches(loader)`` (the documented loop);
``--loop plain`` iterates ``for epoch ...: sampler.set_epoch(epoch); for b in loader``.
"""

from __future__ import annotations

import argparse
import os
import warnings

import lightning as L
import torch

import ckptkit
from ckptkit.integrations.lightning import FabricCheckpoints

warnings.filterwarnings("ignore")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="fabric_run")
    p.add_argument("--final", default=None)
    p.add_argument("--loop", choices=("batches", "plain"), default="batches")
    p.add_argument("--workers", type=int, default=0)
    a = p.parse_args()
    fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).tanh())
    sampler = ckptkit.ResumableSampler(data, seed=0)
    loader = torch.utils.data.DataLoader(
        data, batch_size=4, sampler=sampler, num_workers=a.workers
    )
    loader = fabric.setup_dataloaders(loader, use_distributed_sampler=False)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, opt = fabric.setup(model, opt)
    ck = FabricCheckpoints(fabric, os.path.join(a.out, "checkpoints"), sampler=sampler)
    rec = ckptkit.Recorder()
    ckptkit.TrainState(model=model, optimizer=opt, sampler=sampler, recorder=rec)
    state = {"model": model, "optimizer": opt, "step": 0}
    ck.resume(state)
    step = state["step"]
    total = ck.env.total_steps(a.steps)

    def train(xb: torch.Tensor, yb: torch.Tensor) -> bool:
        nonlocal step
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
        step += 1
        rec.log(step, loss=loss)
        if ck.should_save(step):
            state["step"] = step
            ck.save(step, state)
        return step >= total

    if a.loop == "batches":
        while step < total:
            for xb, yb in sampler.batches(loader):
                if train(xb, yb):
                    break
    else:
        epoch = sampler.epoch
        while step < total:
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                if train(xb, yb):
                    break
            epoch += 1
    ck.close()
    rec.close()
    if a.final:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.final)


if __name__ == "__main__":
    main()
