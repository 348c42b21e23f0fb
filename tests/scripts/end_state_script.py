"""A hand-written PyTorch loop with an EMA and a MultiStepLR, drillable by the contract.

``--fault`` seeds, in the resumed run only, a resume bug whose effect stays out of every
step record inside the drill's window (the loss, LR, batches and RNG all agree):

* ``ema``: the EMA of the weights is kept in the ``TrainState`` (``extra={"ema": ...}``) but
  rebuilt from the current weights after the restore instead of taken from it;
* ``milestone``: the ``MultiStepLR`` is built afresh after the restore (its state is never
  loaded); its next milestone lies after the window, so the LR does not show it;
* ``nan-final``: after its last step the resumed run's weights turn NaN, so its final save
  raises (``on_inconsistent="raise"``) and the process exits with an error.

Usage: ``python end_state_script.py [--fault none|ema|milestone|nan-final]``.
"""

from __future__ import annotations

import argparse
import sys

import torch

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

SAMPLES, BATCH, MILESTONE = 32, 4, 1000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", choices=("none", "ema", "milestone", "nan-final"), default="none")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    env = DrillEnv.from_env()
    torch.manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[MILESTONE], gamma=0.1)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = ckptkit.ResumableSampler(data, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec = ckptkit.Recorder(env.metrics)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                            recorder=rec, extra={"ema": ema})
    mgr = ckptkit.CheckpointManager(env.ckpt_dir or "ckpt", keep_last=2)
    resumed = env.restore(ts, mgr) is not None
    ema = ts.extra["ema"]
    if resumed and args.fault == "ema":
        ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ts.extra["ema"] = ema
    if resumed and args.fault == "milestone":
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[MILESTONE], gamma=0.1)
        ts.scheduler = sched
    total = env.total_steps(args.steps)
    while ts.step < total:
        for xb, yb in sampler.batches(loader):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    ema[k].mul_(0.9).add_(v, alpha=0.1)
            ts.step += 1
            rec.log(ts.step, loss=loss.item())
            if resumed and args.fault == "nan-final" and ts.step == total:
                with torch.no_grad():
                    model[0].weight.fill_(float("nan"))
            if env.should_save(ts.step):
                mgr.save(ts)
            if ts.step >= total:
                break
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
