"""A second, differently written Lightning script: a LightningDataModule with a torchdata
StatefulDataLoader (shuffle=True), a validation loop every epoch, a StabilityWatch, and
gradient clipping. Only the documented ckptkit lines are added (marked ##).
"""

from __future__ import annotations

import os
import sys
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

import ckptkit  ##
from ckptkit.integrations.lightning import CkptkitCallback, CkptkitIO  ##

warnings.filterwarnings("ignore")


class Data(L.LightningDataModule):
    def __init__(self, version: int, stateful: bool = True) -> None:
        super().__init__()
        self.stateful = stateful
        g = torch.Generator().manual_seed(version)
        x = torch.randn(48, 6, generator=g)
        self.train = torch.utils.data.TensorDataset(x[:40], (x[:40] ** 2).sum(1, keepdim=True))
        self.val = torch.utils.data.TensorDataset(x[40:], (x[40:] ** 2).sum(1, keepdim=True))
        self.loader: torch.utils.data.DataLoader | None = None

    def train_dataloader(self) -> StatefulDataLoader:
        if self.loader is None:
            kind = StatefulDataLoader if self.stateful else torch.utils.data.DataLoader
            self.loader = kind(self.train, batch_size=4, shuffle=True)
        return self.loader

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.val, batch_size=4)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: list[torch.Tensor], idx: int) -> dict:
        x, y = batch
        return {"loss": torch.nn.functional.smooth_l1_loss(self(x), y)}

    def validation_step(self, batch: list[torch.Tensor], idx: int) -> None:
        x, y = batch
        self.log("val", torch.nn.functional.l1_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=5e-3, weight_decay=0.01)


if __name__ == "__main__":
    fault = sys.argv[sys.argv.index("--fault") + 1] if "--fault" in sys.argv else "none"
    if not os.environ.get("CKPTKIT_DRILL_RESUME_FROM"):
        fault = "none"
    L.seed_everything(1, verbose=False)
    # no-sampler: a plain DataLoader(shuffle=True) in the resumed run (no position to restore)
    dm = Data(version=2 if fault == "data-version" else 1, stateful=fault != "no-sampler")
    dm.train_dataloader()
    cb = CkptkitCallback(  ##
        sampler=dm.loader if fault != "no-sampler" else None,
        watch=ckptkit.StabilityWatch(), restore_rng=fault != "no-rng",
    )
    trainer = L.Trainer(
        max_steps=cb.env.total_steps(40), accelerator="cpu", logger=False,
        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
        plugins=[CkptkitIO(keep_last=2)],  ##
        callbacks=[cb, ModelCheckpoint(dirpath=cb.dirpath("dm_run"), every_n_train_steps=4)],  ##
    )
    trainer.fit(Regressor(), datamodule=dm, ckpt_path=cb.ckpt_path())  ##
