"""A third drill-ready training script, written the way a busy user writes one, for calibration.

It is deliberately unlike the bundled ``tiny_lm`` and ``aug_script``: a sequence classifier
(embedding, 1-D convolution, dropout, mean pool; ~400 parameters) over variable-length token
sequences, a config dict at the top, an epoch loop over a plain ``DataLoader`` on a
:class:`ckptkit.ResumableSampler` iterated with ``sampler.batches(loader)`` (the documented
recipe), token masking in the ``collate_fn`` on the *global* torch RNG (the number of draws
depends on the batch's longest sequence, so a different batch moves the RNG differently),
Adam with a warm-up then linear-decay ``LambdaLR`` stepped per step (the schedule helper
every fine-tuning tutorial copies), and a global step counter kept in the TrainState.

Logging levels (``--log``):

* ``minimal``: ``rec.log(step, loss=...)``; the Recorder bound to the TrainState fills the rest;
* ``busy``: loss, grad norm and LR, the Recorder bound (what a dashboard wants);
* ``full``: also the batch hash and ``[epoch, id, content hash]`` per sample (the loop's own),
  and the sampler built over the dataset so the Recorder can hash sample contents itself.

Faults (``--fault``, applied at or right after a restore):

=======================  ================================================  ===============
``sampler-left-out``     the sampler is not in the TrainState: after a     sampler
                         resume the data restarts at epoch 0
``sampler-drifted-seed`` the sampler is not in the TrainState; a fresh     sampler
                         one (seed drifted by one) is fast-forwarded to
                         the step by skipping batches
``reseed``               ``set_seed(seed)`` after the restore              rng
``scheduler-left-out``   the LR scheduler is not in the TrainState         scheduler
``optimizer-left-out``   the optimizer is not in the TrainState            optimizer
``data-changed``         the dataset regenerated: same ids, new content    data-version
``lr-from-flag``         the relaunch sets the LR from its ``--lr`` flag   hyperparameters
=======================  ================================================  ===============

Usage: ``python busy_trainer.py [--log minimal|busy|full] [--fault NAME] [--steps N]``.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import xxhash

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

FAULTS = {
    "none": "none",
    "sampler-left-out": "sampler",
    "sampler-drifted-seed": "sampler",
    "reseed": "rng",
    "scheduler-left-out": "scheduler",
    "optimizer-left-out": "optimizer",
    "data-changed": "data-version",
    "lr-from-flag": "hyperparameters",
}
"""Each fault and the component a drill should name for it."""

CONFIG: dict[str, Any] = {
    "n_seqs": 120,
    "vocab": 16,
    "min_len": 4,
    "max_len": 12,
    "classes": 4,
    "emb": 6,
    "channels": 8,
    "batch_size": 6,
    "epochs": 100,
    "warmup": 5,
    "mask_p": 0.15,
}


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class TokenSeqs(torch.utils.data.Dataset[tuple[torch.Tensor, int, int]]):
    """Random token sequences whose label is the most frequent token modulo ``classes``."""

    def __init__(self, version: str) -> None:
        gen = np.random.default_rng(xxhash.xxh3_64_intdigest(f"busy:{version}".encode()))
        lens = gen.integers(CONFIG["min_len"], CONFIG["max_len"] + 1, size=CONFIG["n_seqs"])
        self.seqs = [gen.integers(1, CONFIG["vocab"], size=int(n)) for n in lens]
        self.labels = [int(np.bincount(s).argmax()) % CONFIG["classes"] for s in self.seqs]

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return torch.as_tensor(self.seqs[i]), self.labels[i], i

    def sample_hash(self, i: int) -> str:
        return xxhash.xxh3_64_hexdigest(self.seqs[i].tobytes())[:8]


def collate(batch: list[tuple[torch.Tensor, int, int]]) -> dict[str, torch.Tensor]:
    """Pad, then mask random tokens (global torch RNG: one draw per padded position)."""
    longest = max(len(s) for s, _, _ in batch)
    x = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, (s, _, _) in enumerate(batch):
        x[row, : len(s)] = s
    drop = torch.rand(x.shape) < CONFIG["mask_p"]
    x = x.masked_fill(drop & (x > 0), 0)
    return {
        "x": x,
        "y": torch.tensor([y for _, y, _ in batch]),
        "idx": torch.tensor([i for _, _, i in batch]),
    }


class ConvClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(CONFIG["vocab"], CONFIG["emb"], padding_idx=0)
        self.conv = torch.nn.Conv1d(CONFIG["emb"], CONFIG["channels"], 3, padding=1)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(CONFIG["channels"], CONFIG["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(self.emb(x).transpose(1, 2)).relu()
        return self.head(self.drop(h.mean(dim=2)))


def warmup_then_linear(total: int) -> Any:
    """LR factor: linear warm-up over ``warmup`` steps, then linear decay to 10%."""

    def factor(step: int) -> float:
        if step < CONFIG["warmup"]:
            return (step + 1) / CONFIG["warmup"]
        return max(0.1, 1.0 - (step - CONFIG["warmup"]) / max(1, total))

    return factor


def make_loader(data: TokenSeqs, sampler: ckptkit.ResumableSampler) -> Any:
    return torch.utils.data.DataLoader(
        data, batch_size=CONFIG["batch_size"], sampler=sampler, collate_fn=collate
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", choices=("minimal", "busy", "full"), default="busy")
    ap.add_argument("--fault", choices=sorted(FAULTS), default="none")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--ckpt-dir", default="ckpt")
    args = ap.parse_args()
    env = DrillEnv.from_env()
    torch.set_num_threads(env.threads or 1)
    fault = args.fault
    set_seed(args.seed)

    data = TokenSeqs("v1")
    # At full logging the sampler knows the dataset, so the Recorder hashes sample contents.
    sampler = ckptkit.ResumableSampler(data if args.log == "full" else len(data), seed=args.seed)
    model = ConvClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_linear(args.steps))
    rec = ckptkit.Recorder(None)
    sampler_out = fault in ("sampler-left-out", "sampler-drifted-seed")
    state = ckptkit.TrainState(
        model=model,
        optimizer=None if fault == "optimizer-left-out" else opt,
        scheduler=None if fault == "scheduler-left-out" else sched,
        sampler=None if sampler_out else sampler,
        recorder=rec,
    )
    mgr = ckptkit.CheckpointManager(env.ckpt_dir or args.ckpt_dir, keep_last=2)
    skip = 0
    if env.restore(state, mgr) is not None:
        if fault == "reseed":
            set_seed(args.seed)
        elif fault == "lr-from-flag":
            # The relaunch passed --lr again (here a new value) and the loop applies it.
            for group in opt.param_groups:
                group["lr"] = args.lr * 1.5
        elif fault == "data-changed":
            data = TokenSeqs("v2")
        elif fault == "sampler-drifted-seed":
            # Rebuild the sampler and fast-forward by hand, with a seed that drifted.
            per_epoch = -(-len(data) // CONFIG["batch_size"])
            sampler = ckptkit.ResumableSampler(len(data), seed=args.seed + 1)
            sampler.set_epoch(state.step // per_epoch)
            skip = state.step % per_epoch
    loader = make_loader(data, sampler)

    stop = env.total_steps(args.steps)
    for epoch in range(sampler.epoch, CONFIG["epochs"]):
        sampler.set_epoch(epoch)
        for batch in sampler.batches(loader):
            if skip:
                skip -= 1
                continue
            model.train()
            logits = model(batch["x"])
            loss = F.cross_entropy(logits, batch["y"])
            opt.zero_grad()
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            cur_lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            state.step += 1
            metrics: dict[str, Any] = {"loss": loss.item()}
            if args.log in ("busy", "full"):
                metrics.update(grad_norm=float(gnorm), lr=cur_lr)
            if args.log == "full":
                metrics.update(
                    batch_hash=xxhash.xxh3_64_hexdigest(batch["x"].numpy().tobytes()),
                    sample_ids=[[epoch, int(i), data.sample_hash(int(i))]
                                for i in batch["idx"]],
                )
            rec.log(state.step, **metrics)
            if env.should_save(state.step):
                mgr.save(state)
            if state.step >= stop:
                break
        if state.step >= stop:
            break
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
