"""The crash matrix's Fabric run: docs/lightning.md's Fabric lines (``##``) around a tiny MLP
with dropout, a ResumableSampler over synthetic data, Adam with a step schedule, CPU. ROOT is
the checkpoint directory given to ``FabricCheckpoints`` (``s3://`` is an fsspec path
``fabric.save`` itself writes to).

``python fabric_loop.py ROOT OUT_JSON [KILL_POINT]`` (see ``_harness.py``).
"""

from __future__ import annotations

import warnings

import lightning as L
import torch
from _harness import (
    BATCH,
    KEEP,
    SAVE_EVERY,
    STEPS,
    Harness,
    synthetic_data,
    tiny_mlp,
    wrap_framework_writes,
)

import ckptkit  ##
from ckptkit.integrations.lightning import FabricCheckpoints  ##

warnings.filterwarnings("ignore")
h = Harness.from_argv()
wrap_framework_writes()
fabric = L.Fabric(accelerator="cpu", devices=1)
fabric.seed_everything(0, verbose=False)
data = synthetic_data()
sampler = ckptkit.ResumableSampler(data, seed=0)  ## (was: shuffle=True)
loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
model = tiny_mlp()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
model, opt = fabric.setup(model, opt)
ck = FabricCheckpoints(fabric, h.root, sampler=sampler, keep_last=KEEP)  ##
state = {"model": model, "optimizer": opt, "scheduler": sched, "step": 0}
ck.resume(state)  ## (restores state["step"] too)
step = state["step"]
h.resumed(step)
while step < STEPS:
    for x, y in sampler.batches(loader):  ## (was: for x, y in loader)
        h.batch(step + 1, x, y)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
        sched.step()
        step += 1
        if step % SAVE_EVERY == 0:
            state["step"] = step
            h.arm(step)
            ck.save(step, state)  ## (was: fabric.save(path, state))
        if step >= STEPS:
            break
ck.close()
h.finish(step, model=model, optimizer=opt, lr=sched.get_last_lr())
