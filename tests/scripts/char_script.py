"""A fourth drill-ready script, written from the issue's description of a new user's own
trainer (issue 37), not from the bundled ones: evidence cases for the diagnosis.

A character-level language model (embedding, causal convolution, dropout, linear head) over
variable-length lines of text, written the way a new user writes one:

* length bucketing: its own ``BucketBatches`` batch sampler (lines of similar length
  together, buckets shuffled per epoch by a generator of its own; ``state_dict`` with the
  epoch and the position), passed as ``batch_sampler=``, so ckptkit sees no sampler of its own;
* augmentation in ``Dataset.__getitem__`` on the *global* generators: random token noise
  from ``torch.rand`` (one draw per character, so the draws depend on the batch) and a
  random crop start from Python's ``random``;
* gradient accumulation over ``ACCUM`` micro-batches; the counter and the gradients
  accumulated so far are kept in the TrainState's ``extra`` (the drill saves mid-window);
* a ``DataLoader`` with ``generator=`` (its ``iter()`` draws nothing from the global RNG);
* AdamW and a warm-up-then-constant ``LambdaLR`` stepped per optimizer step; no GradScaler.

Logging levels (``--log``): ``minimal`` (loss), ``busy`` (loss, grad norm, LR), ``full``
(also ``[epoch, id, content hash]`` per sample and the batch hash); the Recorder is bound
to the TrainState in all three and fills the rest (RNG at step start, optimizer step count).

Faults (``--fault``, or ``CHAR_FAULT`` in the environment; applied at or after a restore):

==================  =========================================================  ===========
``reseed``          ``random``/``np.random``/``torch`` re-seeded after restore  rng
``manual-seed``     ``torch.manual_seed(seed)`` after the restore               rng
``rng-late``        the RNG restored only after the first resumed batch is      rng
                    fetched (its augmentation draws from the fresh stream)
``workers2``        the loader (built after the restore) runs 2 workers: the    rng
                    augmentation in ``__getitem__`` restarts from a base seed
``accum-reset``     the gradient-accumulation counter reset on resume           progress
``sched-rebuilt``   a new ``LambdaLR`` constructed after the restore            scheduler
==================  =========================================================  ===========

``CHAR_LINES`` sets the dataset size (32 lines: 8 batches an epoch, so the drill's save at
step 6 is mid-epoch).

Usage: ``python char_script.py [--log minimal|busy|full] [--fault NAME] [--steps N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import xxhash

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

FAULTS = {
    "none": "none",
    "reseed": "rng",
    "manual-seed": "rng",
    "rng-late": "rng",
    "workers2": "rng",
    "accum-reset": "progress",
    "sched-rebuilt": "scheduler",
}
"""Each fault and the component a drill should name for it."""

_WORDS = ("the quick brown fox jumps over the lazy dog while a resumed run must see the same "
          "lines in the same order with the same noise as the run that never stopped")
TEXT = _WORDS.split()
VOCAB = 28  # 0 pad, 1..26 letters, 27 noise
ACCUM = 4
BATCH = 4
WARMUP = 1
NOISE_P = 0.1


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Lines(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Lines of 2-6 words from ``TEXT``; noise and a crop drawn from the global RNGs."""

    def __init__(self, n: int = 64) -> None:
        g = np.random.default_rng(11)
        self.lines = [" ".join(g.choice(TEXT, size=int(g.integers(2, 7)))) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.lines)

    def content_hash(self, i: int) -> str:
        return xxhash.xxh3_64_hexdigest(self.lines[i].encode())[:8]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        codes = [ord(c) - 96 if c != " " else 27 for c in self.lines[i]]
        start = random.randint(0, 2)  # a random crop: Python's global RNG
        x = torch.tensor(codes[start:], dtype=torch.long)
        noise = torch.rand(len(x)) < NOISE_P  # token noise: torch's global RNG
        return x.masked_fill(noise, 27), i


def pad(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, list[int]]:
    longest = max(len(x) for x, _ in batch)
    out = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, (x, _) in enumerate(batch):
        out[row, : len(x)] = x
    return out, [i for _, i in batch]


class BucketBatches(torch.utils.data.Sampler[list[int]]):
    """Batches of lines of similar length; bucket order shuffled per epoch; resumable.

    The position counts the batches the loop *received* (``delivered``), not the ones the
    loader's workers prefetched; the loop moves to the next epoch itself.
    """

    def __init__(self, lengths: list[int], seed: int) -> None:
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        self.batches = [order[k : k + BATCH] for k in range(0, len(order), BATCH)]
        self.seed, self.epoch, self.pos = seed, 0, 0

    def __len__(self) -> int:
        return len(self.batches) - self.pos

    def __iter__(self) -> Iterator[list[int]]:
        g = torch.Generator().manual_seed(self.seed + 7919 * self.epoch)
        perm = torch.randperm(len(self.batches), generator=g).tolist()
        yield from (self.batches[k] for k in perm[self.pos :])

    def delivered(self) -> None:
        self.pos += 1

    def next_epoch(self) -> None:
        self.epoch, self.pos = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.pos = state["seed"], state["epoch"], state["pos"]


class CharLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 12, padding_idx=0)
        self.conv = torch.nn.Conv1d(12, 16, 3, padding=2)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(self.emb(x).transpose(1, 2))[..., : x.shape[1]].relu()
        return self.head(self.drop(h.transpose(1, 2)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", choices=("minimal", "busy", "full"), default="full")
    ap.add_argument("--fault", choices=sorted(FAULTS), default=os.environ.get("CHAR_FAULT", "none"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--ckpt-dir", default="ckpt")
    args = ap.parse_args()
    env = DrillEnv.from_env()
    torch.set_num_threads(env.threads or 1)
    fault = args.fault
    seed_all(args.seed)

    data = Lines(int(os.environ.get("CHAR_LINES", "32")))
    batches = BucketBatches([len(s) for s in data.lines], seed=args.seed)
    model = CharLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def warmup(k: int) -> float:
        return min(1.0, (k + 1) / (WARMUP + 1))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    rec = ckptkit.Recorder(None)
    state = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=batches,
                               extra={"count": 0}, recorder=rec)
    accum: dict[str, Any] = state.extra  # type: ignore[assignment]  # restored in place
    mgr = ckptkit.CheckpointManager(env.ckpt_dir or args.ckpt_dir, keep_last=2)
    resumed = env.restore(state, mgr) is not None
    for name, p in model.named_parameters():  # the gradients accumulated before the save
        g = accum.get(f"grad.{name}")
        p.grad = g.clone() if isinstance(g, torch.Tensor) else None
    late: tuple[Any, ...] | None = None
    if resumed:
        if fault == "reseed":
            seed_all(args.seed)
        elif fault == "manual-seed":
            torch.manual_seed(args.seed)
        elif fault == "rng-late":
            late = (torch.get_rng_state(), np.random.get_state(), random.getstate())
            seed_all(args.seed)  # the stream the process started with, until restored
        elif fault == "accum-reset":
            accum["count"] = 0
        elif fault == "sched-rebuilt":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    loader = torch.utils.data.DataLoader(data, batch_sampler=batches, collate_fn=pad,
                                         generator=torch.Generator(),
                                         num_workers=2 if fault == "workers2" else 0)

    stop = env.total_steps(args.steps)
    while state.step < stop:
        for x, idx in loader:
            if late is not None:  # the RNG restored after the first batch was fetched
                torch.set_rng_state(late[0])
                np.random.set_state(late[1])
                random.setstate(late[2])
                late = None
            lr = opt.param_groups[0]["lr"]
            logits = model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1), ignore_index=0)
            (loss / ACCUM).backward()
            accum["count"] += 1
            gnorm = float("nan")
            if accum["count"] == ACCUM:
                gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
                opt.step()
                opt.zero_grad()
                sched.step()
                accum["count"] = 0
            batches.delivered()
            state.step += 1
            fields: dict[str, Any] = {}
            if args.log in ("busy", "full"):
                fields = {"lr": lr, **({"grad_norm": gnorm} if gnorm == gnorm else {})}
            if args.log == "full":
                fields["batch_hash"] = xxhash.xxh3_64_hexdigest(x.numpy().tobytes())
                fields["sample_ids"] = [[batches.epoch, i, data.content_hash(i)] for i in idx]
            rec.log(state.step, loss=loss.item(), **fields)
            if env.should_save(state.step):
                for name, p in model.named_parameters():
                    if p.grad is not None:
                        accum[f"grad.{name}"] = p.grad.detach().clone()
                    else:
                        accum.pop(f"grad.{name}", None)
                mgr.save(state)
            if state.step >= stop:
                break
        else:
            batches.next_epoch()
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
