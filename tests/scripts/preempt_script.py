"""A training loop under a PreemptionGuard, for the pre-emption tests (run as a subprocess).

Prints one line per event on stdout (``step N DIGEST``, ``saving N``, ``saved N``,
``stopping N``, ``stalling N``, ``waiting N``, ``exiting``) so a test can send its signal at
a chosen moment: mid-step, mid-save (sync), while an async save writes, during the guard's
own save, at a chosen step boundary (``--signal-at``), while the process exits
(``--hold-exit``). Resumes from the run directory when it holds a checkpoint (from
``--restore-step`` when given). With ``--rank/--world/--port`` it is one rank of a gloo
job.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import hashlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import torch

import ckptkit
from ckptkit.collective import leave


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


HOLD_SECONDS = 60.0
"""How long ``--hold-exit`` waits for its file at most (a test that died leaves no hung job)."""


def wait_for(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` until it is true (a marker file, a received signal), with a deadline."""
    deadline = time.monotonic() + HOLD_SECONDS
    while not check():
        if time.monotonic() > deadline:
            print(f"gave up waiting for {what}", file=sys.stderr, flush=True)
            return
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--mode", choices=["sync", "async"], default="sync")
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--stall-at", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None)
    ap.add_argument("--requeue", action="store_true")
    ap.add_argument("--width", type=int, default=64, help="hidden width: 1024 -> ~50 MB of state")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--data-seed", type=int, default=0, help="another data order: another trajectory")
    ap.add_argument("--restore-step", type=int, default=None, help="restore this step, not the newest")
    ap.add_argument("--signal-at", type=int, default=None,
                    help="at this step, wait for the pre-emption signal before the boundary")
    ap.add_argument("--hold-exit", default=None,
                    help="when the process exits, print 'exiting' and wait until this file exists")
    a = ap.parse_args()
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # a hung job shows its stacks
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    torch.set_num_threads(1)
    if a.world > 1:
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world
        )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(a.width, a.width), torch.nn.Tanh(), torch.nn.Linear(a.width, a.width)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ts = ckptkit.TrainState(model=model, optimizer=opt, step=0)
    mgr = ckptkit.CheckpointManager(a.run, keep_last=3)
    res = mgr.restore(ts, step=a.restore_step)
    print(f"resumed {res.step if res is not None else 0} {digest(model)}", flush=True)
    guard = ckptkit.PreemptionGuard(mgr, ts, deadline=a.deadline, requeue=a.requeue)
    if a.hold_exit is not None:
        # Runs after the guard raised SystemExit, as interpreter teardown would (threads
        # joined, a logger flushing): a second signal landing here must change nothing.
        hold = a.hold_exit

        def held() -> None:
            print("exiting", flush=True)
            wait_for(lambda: os.path.exists(hold), hold)

        atexit.register(held)
    with guard:
        while ts.step < a.steps:
            g = torch.Generator().manual_seed(ts.step + a.data_seed)
            x = torch.randn(8, a.width, generator=g)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            ts.step += 1
            print(f"step {ts.step} {digest(model)}", flush=True)
            if a.stall_at == ts.step:
                print(f"stalling {ts.step}", flush=True)
                time.sleep(3600)  # a step that never ends (a hung collective, a slow eval)
            if a.signal_at == ts.step:
                print(f"waiting {ts.step}", flush=True)
                wait_for(lambda: guard.requested, "the pre-emption signal")
            if ts.step % a.save_every == 0:
                print(f"saving {ts.step}", flush=True)
                mgr.save(ts, async_=a.mode == "async")
                print(f"saved {ts.step}", flush=True)
            if guard.should_stop():
                print(f"stopping {ts.step}", flush=True)
                guard.stop()
            time.sleep(a.step_sleep)
    mgr.close()
    print("finished", flush=True)
    if a.world > 1:
        leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
