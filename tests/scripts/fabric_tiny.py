"""A tiny Fabric loop, drillable with the documented ckptkit lines (marked ##).

Dropout, a shuffled ResumableSampler, an LR schedule, Adam; 40 samples in batches of 4
(10 steps an epoch). ``--fault`` seeds a resume fault in the resumed run only.
"""

from __future__ import annotations

import argparse
import os
import warnings

import lightning as L
import torch

import ckptkit  ##
from ckptkit.integrations.lightning import FabricCheckpoints  ##

warnings.filterwarnings("ignore")
FAULTS = ("none", "no-rng", "no-sampler", "fresh-optimizer", "lr-changed", "data-version")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--out", default="fabric_run")
    a = p.parse_args()
    resumed = bool(os.environ.get("CKPTKIT_DRILL_RESUME_FROM"))
    fault = a.fault if resumed else "none"
    fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(7 if fault != "data-version" else 8)
    x = torch.randn(40, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).tanh())
    sampler = ckptkit.ResumableSampler(data, seed=0)  ## (was: shuffle=True)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    model, opt = fabric.setup(model, opt)
    rec = ckptkit.Recorder()  ##
    ckptkit.TrainState(model=model, optimizer=opt, sampler=sampler, recorder=rec)  ##
    ck = FabricCheckpoints(  ##
        fabric, os.path.join(a.out, "checkpoints"), keep_last=3, recorder=rec,
        sampler=None if fault == "no-sampler" else sampler, restore_rng=fault != "no-rng",
    )
    state = {"model": model, "optimizer": opt, "scheduler": sched, "step": 0}
    ck.resume(state)  ## (restores state["step"] too)
    step = state["step"]
    if fault == "fresh-optimizer":
        opt.state.clear()
    if fault == "lr-changed":
        for group in opt.param_groups:
            group["lr"] *= 3
    total = ck.env.total_steps(a.steps)
    while step < total:
        for xb, yb in sampler.batches(loader):  ## (was: for xb, yb in loader)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            fabric.backward(loss)
            opt.step()
            sched.step()
            step += 1
            rec.log(step, loss=loss)  ##
            if step % 5 == 0 or ck.should_save(step):
                state["step"] = step
                ck.save(step, state)  ## (was: fabric.save(path, state))
            if step >= total:
                break
    ck.close()


if __name__ == "__main__":
    main()
