"""The crash matrix's Accelerate run: a small MLP with dropout, a shuffled synthetic dataset
through a stateful, seedable data loader (docs/hf.md's exact-resume recipe), AdamW with a
step schedule, CPU, and the three documented ckptkit lines (``# ckptkit``). Accelerate
writes ``project_dir/checkpoints/checkpoint_I`` to a local directory only.

``python accelerate_loop.py ROOT OUT_JSON [KILL_POINT]`` (see ``_harness.py``).
"""

from __future__ import annotations

import math
import warnings

import torch
from _harness import (
    BATCH,
    KEEP,
    SAMPLES,
    SAVE_EVERY,
    STEPS,
    Harness,
    synthetic_data,
    tiny_mlp,
    wrap_framework_writes,
)
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration, set_seed

from ckptkit.integrations.hf import AccelerateCheckpoints  # ckptkit

warnings.filterwarnings("ignore")
h = Harness.from_argv()
wrap_framework_writes()
accelerator = Accelerator(
    cpu=True,
    project_config=ProjectConfiguration(project_dir=h.root, automatic_checkpoint_naming=True,
                                        total_limit=KEEP),
    dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True,
                                              use_seedable_sampler=True),
)
set_seed(0)
data = synthetic_data()
model = tiny_mlp()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
dl = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                 generator=torch.Generator().manual_seed(0))
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)

ck = AccelerateCheckpoints(accelerator, model, opt, sched, dl, save_every=SAVE_EVERY)  # ckptkit
step = ck.resume()  # ckptkit
h.resumed(step)
epoch = step // math.ceil(SAMPLES / BATCH)
model.train()
while step < STEPS:
    dl.set_epoch(epoch)
    for x, y in dl:
        h.batch(step + 1, x, y)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        h.arm(step)
        if ck.step_end(step, loss=loss) or step >= STEPS:  # ckptkit (saves every SAVE_EVERY)
            break
    epoch += 1
ck.close()
h.finish(step, model=accelerator.unwrap_model(model), optimizer=opt, lr=sched.get_last_lr())
