"""A small Accelerate loop with ckptkit's lines, for the run-layer crash tests.

A linear model, SGD with a linear schedule over ``--steps``, and batches drawn from a
generator seeded by the optimizer step (so a resume at the right step is bitwise the
uninterrupted run, and one at the wrong step is not). Saves every ``--save-every`` steps
through :class:`ckptkit.integrations.hf.AccelerateCheckpoints`; prints one JSON line:
the step it resumed at, the step it ended at, and a digest of the final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import warnings

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

from ckptkit.integrations.hf import AccelerateCheckpoints

warnings.filterwarnings("ignore")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--project-dir", required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--save-every", type=int, default=40)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    acc = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=args.project_dir,
                                            automatic_checkpoint_naming=True),
    )
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / args.steps))
    model, opt, sched = acc.prepare(model, opt, sched)
    ck = AccelerateCheckpoints(acc, model, opt, sched, keep=3, save_every=args.save_every)
    start = ck.resume()
    for step in range(start + 1, args.steps + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        ck.step_end(step, loss=loss)
    ck.close()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    print(json.dumps({"resumed": start, "final": args.steps, "weights": digest.hexdigest()}))


if __name__ == "__main__":
    main()
