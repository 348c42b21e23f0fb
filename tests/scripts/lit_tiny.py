"""A tiny Lightning Trainer script, drillable with the documented ckptkit lines (marked ##).

Dropout, a shuffled ResumableSampler, an LR schedule, Adam; 40 samples in batches of 4
(10 steps an epoch). ``--fault`` seeds a resume fault in the resumed run only;
``--fault plain-shuffle`` is a variant of every run instead: the newcomer's
``DataLoader(shuffle=True)`` and no sampler given to the callback (a mid-epoch resume
restarts the epoch's order).
"""

from __future__ import annotations

import argparse
import os
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import ckptkit  ##
from ckptkit.integrations.lightning import CkptkitCallback, CkptkitIO  ##

warnings.filterwarnings("ignore")  # Lightning's tips about workers and loggers
FAULTS = ("none", "no-rng", "no-sampler", "fresh-optimizer", "lr-changed", "data-version",
          "plain-shuffle")


class Net(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> dict:
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--out", default="lit_run")
    a = p.parse_args()
    resumed = bool(os.environ.get("CKPTKIT_DRILL_RESUME_FROM"))
    plain = a.fault == "plain-shuffle"
    fault = a.fault if resumed and not plain else "none"
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(7 if fault != "data-version" else 8)
    x = torch.randn(40, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).tanh())
    sampler = ckptkit.ResumableSampler(data, seed=0)  ## (was: shuffle=True)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    if plain:
        loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    cb = CkptkitCallback(  ##
        sampler=None if fault == "no-sampler" or plain else sampler,
        restore_rng=fault != "no-rng",
    )
    model = Net(lr=1e-2)
    if fault == "no-sampler":
        sampler.set_epoch(0)  # nothing restores it: the epoch's order starts again

    class Fault(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            opt = trainer.optimizers[0]
            if fault == "fresh-optimizer":
                opt.state.clear()
            if fault == "lr-changed":
                for group in opt.param_groups:
                    group["lr"] *= 3

    trainer = L.Trainer(
        max_steps=cb.env.total_steps(a.steps),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        plugins=[CkptkitIO(keep_last=3)],  ##
        callbacks=[
            cb,  ##
            Fault(),
            ModelCheckpoint(
                dirpath=cb.dirpath(os.path.join(a.out, "checkpoints")),  ##
                every_n_train_steps=5,
                save_top_k=-1,
                save_last=True,
            ),
        ],
    )
    trainer.fit(model, loader, ckpt_path=cb.ckpt_path())  ##


if __name__ == "__main__":
    main()
