"""The crash matrix's native run: the README's DataLoader loop (CheckpointManager, TrainState,
ResumableSampler), tiny model with dropout, synthetic data, CPU. ROOT may be ``s3://``.

``python native.py ROOT OUT_JSON [KILL_POINT]`` (see ``_harness.py``).
"""

from __future__ import annotations

import random

import numpy as np
import torch
from _harness import BATCH, KEEP, SAVE_EVERY, STEPS, Harness, synthetic_data, tiny_mlp

import ckptkit

h = Harness.from_argv()
random.seed(0)  # every global generator seeded: the RNG a restart restores is comparable
np.random.seed(0)
torch.manual_seed(0)
data = synthetic_data()
model = tiny_mlp()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
sampler = ckptkit.ResumableSampler(data, seed=0)
loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler)
mgr = ckptkit.CheckpointManager(h.root, keep_last=KEEP)
mgr.restore(ts)  # newest restorable checkpoint; None: a fresh start
h.resumed(ts.step)
while ts.step < STEPS:
    for x, y in sampler.batches(loader):
        h.batch(ts.step + 1, x, y)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        ts.step += 1
        if ts.step % SAVE_EVERY == 0:
            # The previous save's settle step (verify, latest, rotation) runs in a background
            # thread until this save joins it: join it first, so that the armed kill lands in
            # the save of step ARM_AT, not in the tail of the one before.
            mgr.wait()
            h.arm(ts.step)
            mgr.save(ts)
        if ts.step >= STEPS:
            break
mgr.close()
h.finish(ts.step, model=model, optimizer=opt, sampler=sampler.state_dict())
