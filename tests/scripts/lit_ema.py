"""A tiny Lightning Trainer script with an EMA kept by a callback and a ``MultiStepLR``
whose milestone lies beyond the run, drillable (lines marked ##).

The EMA callback saves its shadow weights with every checkpoint (``state_dict``).
``--fault ema`` (resumed run only): its ``load_state_dict`` does not take them back, so the
EMA restarts from the current weights. ``--fault milestone`` (resumed run only): the
module's ``on_load_checkpoint`` drops the scheduler's saved state, so it restarts at step 0
(its LR stays the same until the milestone). Either way every step record agrees, and only
the final state shows it.
"""

from __future__ import annotations

import argparse
import os
import warnings
from typing import Any

import lightning as L
import torch

import ckptkit  ##
from ckptkit.integrations.lightning import CkptkitCallback, CkptkitIO  ##

warnings.filterwarnings("ignore")  # Lightning's tips about workers and loggers


class Net(L.LightningModule):
    def __init__(self, drop_scheduler: bool = False) -> None:
        super().__init__()
        self.drop_scheduler = drop_scheduler
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.2), torch.nn.Linear(12, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=1e-2, momentum=0.9)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1000], gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.drop_scheduler:
            checkpoint["lr_schedulers"] = []  # Lightning restores none: the scheduler restarts


class EMA(L.Callback):
    def __init__(self, restore: bool) -> None:
        self.restore = restore
        self.shadow: dict[str, torch.Tensor] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.shadow is None:
            self.shadow = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *a: Any) -> None:
        assert self.shadow is not None
        with torch.no_grad():
            for k, v in pl_module.state_dict().items():
                self.shadow[k].mul_(0.9).add_(v, alpha=0.1)

    def state_dict(self) -> dict[str, Any]:
        return {"shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.restore:
            self.shadow = {k: v.clone() for k, v in state["shadow"].items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fault", choices=("none", "ema", "milestone"), default="none")
    a = p.parse_args()
    resumed = bool(os.environ.get("CKPTKIT_DRILL_RESUME_FROM"))
    L.seed_everything(0, verbose=False)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(7))
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    sampler = ckptkit.ResumableSampler(data, seed=0)  ##
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    cb = CkptkitCallback(sampler=sampler)  ##
    trainer = L.Trainer(
        max_steps=cb.env.total_steps(a.steps), accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0,
        plugins=[CkptkitIO(keep_last=3)],  ##
        # The EMA first: its update of a step is in the checkpoint ckptkit's callback saves
        # at that step's end.
        callbacks=[EMA(restore=not (resumed and a.fault == "ema")), cb],  ##
    )
    trainer.fit(Net(drop_scheduler=resumed and a.fault == "milestone"), loader,
                ckpt_path=cb.ckpt_path())  ##


if __name__ == "__main__":
    main()
