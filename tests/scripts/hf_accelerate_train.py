"""A tiny Accelerate training loop, as a user writes it, plus ckptkit's three lines.

A 2-layer GPT-2 from a config (dropout on), a shuffled map-style synthetic dataset, AdamW
with linear warmup/decay, CPU. ``--loader stateful`` uses
``DataLoaderConfiguration(use_stateful_dataloader=True)`` (the loader's position is saved
by ``save_state``); ``--loader plain`` a plain ``DataLoader`` whose position the loop
re-creates with ``accelerator.skip_first_batches``; ``--grad-accum K`` accumulates over K
micro-batches (``accelerator.accumulate``), counting optimizer steps. The lines marked ``# ckptkit`` are all
``ckptkit drill -- python hf_accelerate_train.py`` needs; the lines marked ``# exact`` are
the exact-resume recipe of docs/hf.md.

``--fault`` seeds a resume bug through the framework (applied only when resuming):
``no-optimizer`` / ``no-scheduler`` / ``no-rng`` delete that file from the checkpoint;
``data-version`` trains on another snapshot of the data; ``lr-changed`` multiplies the
learning rate by 1.1 after ``load_state``; ``no-skip`` (plain loader) forgets to skip the
batches already seen; ``unseeded-loader`` leaves out the loader's own generator;
``not-seedable`` (in every run, not only the resumed one) leaves out
``use_seedable_sampler=True``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import warnings
from pathlib import Path

import torch
import xxhash
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration, set_seed
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

from ckptkit.integrations.hf import AccelerateCheckpoints  # ckptkit

warnings.filterwarnings("ignore")

RNG_FILE = "random_states_0.pkl"


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, length: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project-dir", default="proj")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--samples", type=int, default=44)
    ap.add_argument("--loader", choices=["stateful", "plain"], default="stateful")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--fault", default="none",
                    choices=["none", "no-optimizer", "no-scheduler", "no-rng", "data-version",
                             "lr-changed", "no-skip", "unseeded-loader", "not-seedable"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    resume = os.environ.get("CKPTKIT_DRILL_RESUME_FROM")
    fault = args.fault if resume else "none"
    if fault in ("no-optimizer", "no-scheduler", "no-rng"):
        name = {"no-optimizer": "optimizer.bin", "no-scheduler": "scheduler.bin",
                "no-rng": RNG_FILE}[fault]
        (Path(resume) / name).unlink()

    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=args.grad_accum,
        project_config=ProjectConfiguration(project_dir=args.project_dir,
                                            automatic_checkpoint_naming=True, total_limit=3),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=args.loader == "stateful",
                                                  use_seedable_sampler=args.fault != "not-seedable"),  # exact
    )
    set_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = get_linear_schedule_with_warmup(opt, 5, args.steps)
    ds = Tokens(args.samples, 16, 1 if fault == "data-version" else 0)
    gen = None if fault == "unseeded-loader" else torch.Generator().manual_seed(0)  # exact
    dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, generator=gen)
    model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)

    ck = AccelerateCheckpoints(accelerator, model, opt, sched, dl)  # ckptkit
    step = ck.resume()  # ckptkit
    if fault == "lr-changed":
        for g in opt.param_groups:
            g["lr"] *= 1.1
        sched.scheduler.base_lrs = [b * 1.1 for b in sched.scheduler.base_lrs]
    per_epoch = math.ceil(len(dl) / args.grad_accum)  # optimizer steps an epoch
    epoch, done_in_epoch = divmod(step, per_epoch)
    model.train()
    stop = False
    while step < args.steps and not stop:
        dl.set_epoch(epoch)  # exact
        batches = dl
        if args.loader == "plain" and done_in_epoch and fault != "no-skip":
            batches = accelerator.skip_first_batches(dl, done_in_epoch * args.grad_accum)  # exact
        for batch in batches:
            with accelerator.accumulate(model):
                out = model(**batch)
                accelerator.backward(out.loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            if not accelerator.sync_gradients:
                continue  # a micro-batch: the optimizer did not step
            step += 1
            stop = ck.step_end(step, loss=out.loss) or step >= args.steps  # ckptkit
            if stop:
                break
        epoch, done_in_epoch = epoch + 1, 0
    ck.close()
    h = xxhash.xxh3_64()
    for p in accelerator.unwrap_model(model).parameters():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"final_step": step, "param_hash": h.hexdigest()}))


if __name__ == "__main__":
    main()
