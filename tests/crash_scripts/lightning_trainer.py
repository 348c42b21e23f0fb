"""The crash matrix's Lightning Trainer run: docs/lightning.md's lines (``##``) around a tiny
LightningModule with dropout, a ResumableSampler over synthetic data, Adam with a step
schedule, CPU. ROOT is the ``ModelCheckpoint`` directory (``s3://`` is an fsspec path
Lightning itself writes to).

``python lightning_trainer.py ROOT OUT_JSON [KILL_POINT]`` (see ``_harness.py``).
"""

from __future__ import annotations

import warnings
from typing import Any

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
from lightning.pytorch.callbacks import ModelCheckpoint

import ckptkit  ##
from ckptkit.integrations.lightning import CkptkitCallback, CkptkitIO  ##

warnings.filterwarnings("ignore")
h = Harness.from_argv()
wrap_framework_writes()


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = tiny_mlp()

    def training_step(self, batch: list[torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        h.batch(self.global_step + 1, x, y)
        return torch.nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Matrix(L.Callback):
    """The harness's calls: the resumed step, the kill before a save, the final state."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        h.resumed(trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        h.arm(trainer.global_step)  # ModelCheckpoint's hook runs after the other callbacks

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sched = trainer.lr_scheduler_configs[0].scheduler
        h.finish(trainer.global_step, model=pl_module, optimizer=trainer.optimizers[0],
                 lr=sched.get_last_lr())


L.seed_everything(0, verbose=False)
data = synthetic_data()
sampler = ckptkit.ResumableSampler(data, seed=0)  ## (was: shuffle=True)
loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
cb = CkptkitCallback(sampler=sampler)  ##
trainer = L.Trainer(
    max_steps=STEPS,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    plugins=[CkptkitIO(keep_last=KEEP)],  ##
    callbacks=[
        cb,  ##
        Matrix(),
        ModelCheckpoint(dirpath=cb.dirpath(h.root), every_n_train_steps=SAVE_EVERY,  ##
                        save_top_k=-1, save_last=True),
    ],
)
trainer.fit(Net(), loader, ckpt_path=cb.ckpt_path("last"))  ##
