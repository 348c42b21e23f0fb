"""A tiny transformers.Trainer script with an EMA kept by a callback, plus ckptkit's two lines.

The EMA callback writes ``ema.pt`` into every ``checkpoint-N`` (before ckptkit adopts the
folder). ``--fault ema`` (resumed run only): it does not load ``ema.pt`` back and restarts
the EMA from the current weights: every step record agrees, only the final state shows it.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from ckptkit.integrations.hf import CkptkitCallback, resume_checkpoint  # ckptkit

warnings.filterwarnings("ignore")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.2), torch.nn.Linear(12, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.body(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(1))
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class EMA(TrainerCallback):
    def __init__(self, resume_from: str | None) -> None:
        self.resume_from = resume_from
        self.shadow: dict[str, torch.Tensor] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        if self.resume_from is not None:
            self.shadow = torch.load(Path(self.resume_from) / "ema.pt", weights_only=True)
        else:
            self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        assert self.shadow is not None
        with torch.no_grad():
            for k, v in model.state_dict().items():
                self.shadow[k].mul_(0.9).add_(v, alpha=0.1)

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        torch.save(self.shadow, Path(args.output_dir) / f"checkpoint-{state.global_step}" / "ema.pt")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-dir", default="out")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--fault", choices=["none", "ema"], default="none")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4,
        save_steps=100, logging_steps=1, learning_rate=1e-2, seed=0, report_to=[],
        use_cpu=True, disable_tqdm=True, lr_scheduler_type="constant",
    )
    ckpt = resume_checkpoint(targs.output_dir)  # ckptkit
    faulty = ckpt is not None and args.fault == "ema"
    ema = EMA(None if faulty else ckpt)
    trainer = Trainer(model=Net(), args=targs, train_dataset=Rows(32),
                      callbacks=[ema, CkptkitCallback()])  # ckptkit: after the EMA's on_save
    trainer.train(resume_from_checkpoint=ckpt)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
