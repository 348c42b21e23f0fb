"""Cost of capturing the non-tensor state at save time, next to the tensor write.

    python benchmarks/capture_cost.py [--params-m 25]

Prints per-component capture times (median of 20) and the time of a full
CheckpointManager.save of the same TrainState, whose tensors are model + AdamW moments.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

import ckptkit
from ckptkit.capture import env, optim, rng, sampler
from ckptkit.signals import guard


def median_ms(fn: Callable[[], object], n: int = 20) -> float:
    fn()  # warm-up (imports, caches)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params-m", type=float, default=25.0, help="model size, millions of params")
    args = ap.parse_args()
    dim = 1024
    layers = max(1, int(args.params_m * 1e6 / (dim * dim * 2)))
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers * 2)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, dim)).sum().backward()
    opt.step()
    smp = ckptkit.ResumableSampler(1_000_000, seed=0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 1000)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=smp, step=1)
    env.capture()  # the first call runs git once per process (cached after)
    rows = {
        "rng (python, numpy, torch)": median_ms(lambda: rng.capture()),
        "sampler cursor": median_ms(lambda: sampler.capture(smp)),
        "env (cached git)": median_ms(lambda: env.capture()),
        "optimizer (state_dict refs)": median_ms(lambda: optim.capture(opt, model=model)),
        "resume-guard look-ahead": median_ms(lambda: guard.compute(ts)),
        "TrainState.capture (all)": median_ms(lambda: ts.capture()),
    }
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    with tempfile.TemporaryDirectory(dir=".") as d:
        mgr = ckptkit.CheckpointManager(d, keep_last=1)
        saves = []
        for i in range(3):
            ts.step = i + 1
            t0 = time.perf_counter()
            mgr.save(ts)
            saves.append(time.perf_counter() - t0)
        st = mgr.last_save
        mgr.close()
    print(f"state: {nbytes / 2**20:.0f} MiB of tensors ({args.params_m:.0f}M params + AdamW)")
    for k, v in rows.items():
        print(f"  {k:32s} {v:8.2f} ms")
    print(f"  {'tensor write (last save)':32s} {st.write * 1e3:8.1f} ms")
    print(f"  {'verify after save':32s} {st.verify * 1e3:8.1f} ms")
    print(f"  {'whole save (median of 3)':32s} {statistics.median(saves) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
