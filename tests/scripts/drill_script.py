"""A tiny drill-ready training script for the drill tests (honours the env-var contract).

It stands in for ``python -m ckptkit.examples.tiny_lm`` where that is not available and adds
faults of its own, each simulating one classic resume bug:

* ``no-rng``: the RNG is not restored (re-seeded on resume);
* ``no-sampler``: the sampler cursor is not restored (the epoch restarts);
* ``no-scheduler``: the LR scheduler is not saved or restored (a fresh one on resume);
* ``no-moments``: the optimizer state is not restored (fresh Adam moments);
* ``lr-changed``: the resumed run uses twice the learning rate (a changed hyper-parameter);
* ``step-reset``: the step counter is not restored (labels restart at 1);
* ``crash``: the resumed process raises after its first step;
* ``no-save``: the save at ``CKPTKIT_DRILL_SAVE_AT`` never happens;
* ``exit-abort``: the reference aborts (SIGABRT) after its last step and its close, as a
  torchrun process whose process group is left to the interpreter's shutdown can;
* ``refuse``: the resumed run passes a GradScaler the checkpoint has no state for, and
  restores strictly: ckptkit refuses the resume (a ``StateError``).

Usage: ``python drill_script.py [--fault NAME] [--ckpt-dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np
import torch
import xxhash

import ckptkit
from ckptkit.capture import rng as rng_capture

N_SAMPLES, SEQ, VOCAB, BATCH = 64, 8, 32, 4


def _hash(t: torch.Tensor) -> str:
    return xxhash.xxh3_64_hexdigest(t.contiguous().numpy().tobytes())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", default="none")
    ap.add_argument("--ckpt-dir", default="ckpt")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    fault = args.fault
    env = os.environ
    ckpt_dir = env.get("CKPTKIT_CKPT_DIR") or args.ckpt_dir
    save_at = int(env.get("CKPTKIT_DRILL_SAVE_AT", "0") or 0)
    stop_at = int(env.get("CKPTKIT_DRILL_STOP_AT", "30") or 30)
    resume_from = env.get("CKPTKIT_DRILL_RESUME_FROM")

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    gen = torch.Generator().manual_seed(1234)
    data = torch.randint(0, VOCAB, (N_SAMPLES, SEQ), generator=gen)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 16),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(16, VOCAB),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.1 * s))
    sampler = ckptkit.ResumableSampler(N_SAMPLES, seed=7)
    rec = ckptkit.Recorder(None)
    state = ckptkit.TrainState(
        model=model,
        optimizer=opt,
        sampler=sampler,
        recorder=rec,
        scheduler=None if fault == "no-scheduler" else sched,
    )
    mgr = ckptkit.CheckpointManager(ckpt_dir, keep_last=2)

    if resume_from:
        if fault == "refuse":
            state.scaler = torch.amp.GradScaler("cpu")
        state.restore_tree(ckptkit.load(resume_from), strict=fault == "refuse")
        if fault == "no-moments":
            opt.state.clear()
        if fault == "no-rng":
            torch.manual_seed(0)
        if fault == "no-sampler":
            sampler = ckptkit.ResumableSampler(N_SAMPLES, seed=7)  # rebuilt: epoch restarts
        if fault == "step-reset":
            state.progress.step = 0
        if fault == "lr-changed":
            sched.base_lrs = [2 * b for b in sched.base_lrs]
            for g in opt.param_groups:
                g["lr"] *= 2

    it = iter(sampler)
    while state.step < stop_at:
        step = state.step + 1
        rng_fp = rng_capture.fingerprint(rng_capture.capture())
        ids: list[int] = []
        while len(ids) < BATCH:
            try:
                ids.append(next(it))
            except StopIteration:
                sampler.set_epoch(sampler.epoch + 1)
                it = iter(sampler)
        batch = data[ids]
        lr = opt.param_groups[0]["lr"]
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        opt.zero_grad()
        sched.step()
        state.step = step
        opt_step = int(next(iter(opt.state.values()))["step"])
        fields = {}
        if step == stop_at:
            fields["param_hash"] = xxhash.xxh3_64_hexdigest(
                b"".join(p.detach().numpy().tobytes() for p in model.parameters())
            )
        rec.log(
            step,
            loss=loss,
            grad_norm=gnorm,
            lr=lr,
            opt_step=opt_step,
            rng=rng_fp,
            batch_hash=_hash(batch),
            seq_lens=[SEQ] * BATCH,
            sample_ids=[[sampler.epoch, i, _hash(data[i])] for i in ids],
            **fields,
        )
        if fault == "crash" and resume_from:
            print("boom: simulated crash in the training loop", file=sys.stderr)
            return 3
        if step == save_at and fault != "no-save":
            mgr.save(state)
    mgr.close()
    rec.close()
    print(f"done at step {state.step}")
    if fault == "exit-abort" and not resume_from:
        sys.stdout.flush()
        os.abort()
    return 0


if __name__ == "__main__":
    sys.exit(main())
