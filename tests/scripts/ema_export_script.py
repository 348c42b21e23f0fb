"""A small regression loop that keeps an EMA model and exports it when training ends.

Written as a user would who knows ckptkit only from the README: the EMA is a second
``nn.Module`` updated after every optimizer step, and at the end the script writes an export
into its checkpoint directory (``export/ema.safetensors``, the EMA's weights, and
``export/final.pt``, ``{"model": ..., "ema": ...}`` through ``torch.save``). It also saves
every third step on its own schedule (intermediate checkpoints the drill compares too).

``--fault`` seeds, in the resumed run only:

* ``none``: the EMA is part of the ``TrainState`` (``extra={"ema": ...}``), restored exactly;
* ``ema-unsaved``: the EMA is never saved: it stays outside the ``TrainState`` and, after a
  resume, restarts from the current weights. No step record shows it (the EMA does not feed
  back into training) and the final checkpoint does not hold it: only the export differs.

``--log minimal|busy|full`` (the diagnosis table's logging levels): ``loss``; ``loss``,
``grad_norm`` and the LR (full: the same; the Recorder records the ResumableSampler's sample
ids at every level).

Usage: ``python ema_export_script.py [--fault none|ema-unsaved] [--log LEVEL]``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

FAULTS = {"none": "none", "ema-unsaved": "ema"}
"""Fault -> the component a drill should name (tools/diagnosis_table.py)."""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", choices=tuple(FAULTS), default="none")
    ap.add_argument("--log", choices=("minimal", "busy", "full"), default="minimal")
    args = ap.parse_args()
    env = DrillEnv.from_env()
    torch.manual_seed(7)
    feats = torch.randn(24, 6, generator=torch.Generator().manual_seed(2))
    target = feats @ torch.linspace(-1, 1, 6).unsqueeze(1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 1))
    ema_net = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(feats, target)
    sampler = ckptkit.ResumableSampler(data, seed=5)
    loader = torch.utils.data.DataLoader(data, batch_size=6, sampler=sampler)
    rec = ckptkit.Recorder(env.metrics)
    extra = {} if args.fault == "ema-unsaved" else {"ema": ema_net.state_dict()}
    state = ckptkit.TrainState(model=net, optimizer=opt, sampler=sampler, recorder=rec,
                               extra=extra)
    out = Path(env.ckpt_dir or "ckpt")
    mgr = ckptkit.CheckpointManager(out, keep_last=3)
    if env.restore(state, mgr) is not None:
        if args.fault == "ema-unsaved":
            ema_net.load_state_dict(net.state_dict())  # nothing saved it: start over
        else:
            ema_net.load_state_dict(state.extra["ema"])
            state.extra["ema"] = ema_net.state_dict()  # saves see the live EMA again
    last = env.total_steps(9)
    while state.step < last:
        for xb, yb in sampler.batches(loader):
            loss = torch.nn.functional.smooth_l1_loss(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1e9)
            opt.step()
            with torch.no_grad():
                for e, p in zip(ema_net.parameters(), net.parameters(), strict=True):
                    e.lerp_(p, 0.2)
            state.step += 1
            fields: dict[str, object] = {}
            if args.log != "minimal":
                fields.update(grad_norm=float(gnorm), lr=opt.param_groups[0]["lr"])
            rec.log(state.step, loss=loss.item(), **fields)
            if env.should_save(state.step) or state.step % 3 == 0:
                mgr.save(state)
            if state.step >= last:
                break
    (out / "export").mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in ema_net.state_dict().items()},
              str(out / "export" / "ema.safetensors"))
    torch.save({"model": net.state_dict(), "ema": ema_net.state_dict()},
               out / "export" / "final.pt")
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
