"""Train with each data-loader recipe, save at several steps, or resume from one of them.

Used by ``test_dataloader_resume.py``: one process runs every configuration uninterrupted
(``reference``), a second, fresh process restores each configuration at each save step and
runs on (``resumed``). Each run's step records (filled by the Recorder bound to the
TrainState: loss, RNG at step start, batch hash, sample ids, cursor ...) go to
``OUT/<config>-<role>-<W>.jsonl``.

Configurations (``CONFIGS``): a plain ``torch.utils.data.DataLoader`` over a
``ckptkit.ResumableSampler`` iterated with ``for batch in loader`` (``num_workers=0``) or with ``sampler.batches(loader)`` (any workers, any generator), and
torchdata's ``StatefulDataLoader`` (its ``RandomSampler`` with a generator of its own, and
another ``generator=`` for the loader: torchdata 0.11 saves the sampler generator's state
but the loader draws its base seed from the same generator when they are shared, so the
epoch after a mid-epoch resume would be shuffled differently).

Usage: ``python loader_script.py OUT reference|resumed [CONFIG ...]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import xxhash

import ckptkit

CONFIGS: dict[str, dict[str, object]] = {
    "loop-gen-w0": {"loader": "plain", "gen": True, "workers": 0, "iterate": "loop"},
    "batches-w0": {"loader": "plain", "gen": False, "workers": 0, "iterate": "batches"},
    "batches-gen-w0": {"loader": "plain", "gen": True, "workers": 0, "iterate": "batches"},
    "batches-w2": {"loader": "plain", "gen": False, "workers": 2, "iterate": "batches"},
    "batches-gen-w2": {"loader": "plain", "gen": True, "workers": 2, "iterate": "batches"},
    "stateful-gen-w0": {"loader": "stateful", "gen": True, "workers": 0, "iterate": "loop"},
    "stateful-gen-w2": {"loader": "stateful", "gen": True, "workers": 2, "iterate": "loop"},
    # iter() draws the workers' base seed from the global RNG; the resume guard sees the
    # restored ResumableSampler's first pass and puts exactly that draw back: exact.
    "loop-w0": {"loader": "plain", "gen": False, "workers": 0, "iterate": "loop"},
    # Not exact (the guard says so): the same draw, by a loader ckptkit does not see into.
    "stateful-w0": {"loader": "stateful", "gen": False, "workers": 0, "iterate": "loop"},
}
EXACT = [k for k in CONFIGS if k != "stateful-w0"]
N, BATCH, TOTAL = 48, 8, 14
SAVES = (4, 6, 9)
"""Save steps: mid-epoch 0, the end of epoch 0 (6 batches per epoch), mid-epoch 1."""


class Points(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Noisy 2-D points; the augmentation is a function of the sample (exact in workers)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(N, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True) + 0.1 * torch.randn(N, 1, generator=g)

    def __len__(self) -> int:
        return N

    def sample_hash(self, i: int) -> str:
        return xxhash.xxh3_64_hexdigest(self.x[i].numpy().tobytes())[:8]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        # A worker restarts its RNG streams at every iter(): augmentation that must resume
        # exactly draws from a generator seeded by the sample, not from the worker's RNG.
        jitter = torch.randn(4, generator=torch.Generator().manual_seed(1000 + i))
        return self.x[i] + 0.01 * jitter, self.y[i]


def run(name: str, out: Path, role: str, resume_at: int | None) -> None:
    cfg = CONFIGS[name]
    torch.manual_seed(0)
    ds = Points()
    gen = torch.Generator().manual_seed(7) if cfg["gen"] else None
    workers = int(cfg["workers"])  # type: ignore[call-overload]
    if cfg["loader"] == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        from torchdata.stateful_dataloader.sampler import RandomSampler

        order = RandomSampler(ds, generator=torch.Generator().manual_seed(11)) if gen else None
        loader = StatefulDataLoader(ds, batch_size=BATCH, shuffle=order is None, sampler=order,
                                    generator=gen, num_workers=workers)
        cursor: object = loader
        sampler = None
    else:
        sampler = ckptkit.ResumableSampler(ds, seed=3)
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, sampler=sampler, generator=gen,
                                             num_workers=workers)
        cursor = sampler
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tag = f"{name}-{role}-{resume_at or 0}"
    rec = ckptkit.Recorder(out / f"{tag}.jsonl")
    ts = ckptkit.TrainState(model=model, optimizer=opt, sampler=cursor, recorder=rec)
    mgr = ckptkit.CheckpointManager(out / f"ckpt-{name}", keep_last=10)
    if resume_at is not None:
        mgr.restore(ts, resume_at)
    done = False
    epoch = sampler.epoch if sampler is not None else 0
    while not done:
        if cfg["iterate"] == "batches":
            assert sampler is not None
            batches = sampler.batches(loader)
        else:
            if sampler is not None:
                sampler.set_epoch(epoch)  # keeps a restored mid-epoch cursor
            batches = iter(loader)
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ts.step += 1
            rec.log(ts.step, loss=loss.item())
            if role == "reference" and ts.step in SAVES:
                mgr.save(ts)
            if ts.step >= TOTAL:
                done = True
                break
        epoch += 1
    h = xxhash.xxh3_64()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    rec.log(ts.step + 1, param_hash=h.hexdigest())  # one extra record: the final weights
    rec.close()
    mgr.close()


def main() -> int:
    out, role, *names = sys.argv[1:]
    torch.set_num_threads(1)
    for name in names or list(CONFIGS):
        if role == "reference":
            run(name, Path(out), role, None)
        else:
            for w in SAVES:
                run(name, Path(out), role, w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
