"""A tiny transformers.Trainer fine-tuning script, as a user writes it, plus ckptkit's two lines.

A 2-layer GPT-2 built from a config (dropout on), a map-style synthetic dataset the Trainer
shuffles, AdamW with linear warmup/decay, CPU. The lines marked ``# ckptkit`` are all that
``ckptkit drill -- python hf_trainer_train.py`` needs (docs/hf.md).

``--fault`` seeds a resume bug through the framework (applied only when resuming):
``no-optimizer`` / ``no-scheduler`` / ``no-rng`` delete that file from the checkpoint before
the Trainer loads it; ``data-version`` trains on another snapshot of the data; ``lr-changed``
multiplies the learning rate by 1.1 after the Trainer restored it. ``--unverified`` passes
the checkpoint to the Trainer without ckptkit's verify (what a script without the second
line does).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import torch
import xxhash
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from ckptkit.collective import leave  # ckptkit
from ckptkit.integrations.hf import CkptkitCallback, resume_checkpoint  # ckptkit

warnings.filterwarnings("ignore")


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Synthetic token sequences (a map-style dataset; the Trainer shuffles it)."""

    def __init__(self, n: int, length: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class ScaleLR(TrainerCallback):  # the lr-changed fault: a user "tweaking" the LR on resume
    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):  # type: ignore[no-untyped-def]
        for g in optimizer.param_groups:
            g["lr"] *= 1.1
        lr_scheduler.base_lrs = [b * 1.1 for b in lr_scheduler.base_lrs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-dir", default="out")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--samples", type=int, default=44)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--save-steps", type=int, default=100)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--fault", default="none",
                    choices=["none", "no-optimizer", "no-scheduler", "no-rng", "data-version",
                             "lr-changed"])
    ap.add_argument("--unverified", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)

    resume = os.environ.get("CKPTKIT_DRILL_RESUME_FROM")
    if resume and args.fault in ("no-optimizer", "no-scheduler", "no-rng"):
        name = {"no-optimizer": "optimizer.pt", "no-scheduler": "scheduler.pt",
                "no-rng": "rng_state.pth"}[args.fault]
        (Path(resume) / name).unlink()
    data_seed = args.data_seed + (1 if resume and args.fault == "data-version" else 0)

    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        save_steps=args.save_steps, logging_steps=1, learning_rate=1e-3, warmup_steps=5, seed=0,
        report_to=[], use_cpu=True, disable_tqdm=True, save_total_limit=3,
    )
    callbacks: list[TrainerCallback] = [CkptkitCallback()]  # ckptkit
    if resume and args.fault == "lr-changed":
        callbacks.append(ScaleLR())
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(args.samples, 16, data_seed),
                      callbacks=callbacks)
    ckpt = resume if args.unverified else resume_checkpoint(targs.output_dir)  # ckptkit
    trainer.train(resume_from_checkpoint=ckpt)
    h = xxhash.xxh3_64()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"final_step": trainer.state.global_step, "param_hash": h.hexdigest()}))
    if torch.distributed.is_initialized():
        # The Trainer's DDP model holds its gloo process group until the interpreter frees
        # it, and that teardown can hang or abort a rank after its last step
        # (pytorch/pytorch#179291). Everything is written: end without it.
        leave(0)  # ckptkit


if __name__ == "__main__":
    main()
