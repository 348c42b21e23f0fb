"""A drill-ready script whose runs are not bitwise: GPU-like noise on every gradient.

Written apart from the bundled tiny LM (a two-layer MLP on a fixed token table, an EMA of
the weights kept in the state, Python's ``random`` drawing a token mask every step) so the
statistical mode of the drill is tried on code that was not tuned with it.

Environment:

* ``NOISY_EPS`` (default ``1e-5``): each gradient element gets ``eps * |g| * z`` added, z
  drawn from a NumPy generator seeded by the OS (like the order of a GPU's atomic adds, it
  is not part of any state a checkpoint could hold, and differs in every process);
* ``NOISY_SEED`` ``all`` (default) or ``torch``: the latter seeds torch only, so Python's
  ``random`` differs between fresh starts (a resume restores it: the resume is exact);
* ``NOISY_FAULT`` (or ``--fault``): ``stale-layer``, the resumed run restores the first
  layer one step stale (its weights from step W-1, which the state keeps for the purpose);
  ``bf16-weights``, the resumed run rounds every weight through bfloat16 after the restore
  (a cast for memory, undone for precision). Both are weight-only faults.

``--log minimal|busy|full`` (the diagnosis table's logging levels): ``loss``; ``loss``,
``grad_norm`` and the LR (the default; full: the same, the Recorder records the
ResumableSampler's sample ids at every level).

Usage: ``python noisy_script.py [--eps E] [--fault NAME] [--log LEVEL]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import numpy as np
import torch

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

N_SAMPLES, SEQ, VOCAB, DIM, BATCH = 96, 6, 24, 24, 8
FAULTS = {"none": "none", "stale-layer": "model", "bf16-weights": "model"}
"""Fault -> the component a drill should name (tools/diagnosis_table.py)."""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eps", type=float, default=float(os.environ.get("NOISY_EPS", "1e-5")))
    ap.add_argument("--fault", choices=tuple(FAULTS),
                    default=os.environ.get("NOISY_FAULT") or "none")
    ap.add_argument("--log", choices=("minimal", "busy", "full"), default="busy")
    args = ap.parse_args()
    eps, fault = args.eps, args.fault
    torch.manual_seed(0)
    if os.environ.get("NOISY_SEED", "all") != "torch":
        random.seed(0)
        np.random.seed(0)
    noise = np.random.default_rng()  # OS entropy: never the same in two processes
    drill = DrillEnv.from_env()

    table = torch.randint(0, VOCAB, (N_SAMPLES, SEQ), generator=torch.Generator().manual_seed(5))
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, DIM), torch.nn.Flatten(),
        torch.nn.Linear(DIM * (SEQ - 1), DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, VOCAB),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
    sampler = ckptkit.ResumableSampler(N_SAMPLES, seed=3)
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    before = {"w": model[2].weight.detach().clone(), "b": model[2].bias.detach().clone()}
    rec = ckptkit.Recorder(None)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                            recorder=rec, extra={"ema": ema, "before": before})
    mgr = ckptkit.CheckpointManager(drill.ckpt_dir or "ckpt", keep_last=3)
    restored = drill.restore(ts, mgr)
    assert ts.extra is not None
    ema, before = ts.extra["ema"], ts.extra["before"]  # the restore replaces the entries
    if restored is not None and fault == "stale-layer":
        with torch.no_grad():
            model[2].weight.copy_(before["w"])
            model[2].bias.copy_(before["b"])
    if restored is not None and fault == "bf16-weights":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    stop = drill.total_steps(30)
    it = iter(sampler)
    while ts.step < stop:
        ids = []
        while len(ids) < BATCH:
            try:
                ids.append(next(it))
            except StopIteration:
                sampler.set_epoch(sampler.epoch + 1)
                it = iter(sampler)
        x = table[ids].clone()
        mask = [random.random() < 0.1 for _ in range(x.numel())]  # Python's random draws
        x.view(-1)[torch.tensor(mask)] = 0
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits, x[:, -1])
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            if p.grad is not None and eps > 0:
                z = torch.from_numpy(noise.standard_normal(p.grad.shape).astype(np.float32))
                p.grad.add_(eps * p.grad.abs() * z)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        with torch.no_grad():
            before["w"].copy_(model[2].weight)
            before["b"].copy_(model[2].bias)
        opt.step()
        sched.step()
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].mul_(0.9).add_(v, alpha=0.1)
        ts.step += 1
        fields: dict[str, object] = {}
        if args.log != "minimal":
            fields.update(grad_norm=float(gnorm), lr=opt.param_groups[0]["lr"])
        rec.log(ts.step, loss=float(loss), **fields)
        if drill.should_save(ts.step):
            mgr.save(ts)
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
