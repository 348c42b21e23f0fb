"""A catalogue of real-world resume mistakes, each run as a real resume without a drill.

Each case is an ordinary PyTorch loop (an MLP with dropout, AdamW, an LR schedule, a
``ResumableSampler`` under a plain ``DataLoader``, iterated ``for x, y in loader``, no
``Recorder``) that saves mid-epoch through a ``CheckpointManager``, as a user writes it.
The uninterrupted run goes on to the stop step; the resumed run builds everything again,
makes one mistake people make (each seen in public bug reports and forum threads: a
scheduler left out, an optimizer rebuilt after the restore, a seed call after it, an
epoch counter recomputed off by one...), restores, and trains to the same stop step.

Two verdicts per case:

* **guard**: the codes the resume guard reported on its own (the restore-time look-ahead
  check plus its one-shot hooks on the first resumed step: :meth:`ResumeGuard.watch`);
* **twin**: whether the resumed final state (weights, and the EMA where there is one)
  differs from the uninterrupted run's: the drill's own comparison, made in-process
  (cheap: no subprocess, no statistics).

The table in ``docs/drills.md`` ("What the guard catches on a real resume") lists the same
verdicts; :func:`test_the_docs_table_matches` keeps the two in step.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit import codes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BATCH, N = 4, 24
"""6 batches per epoch."""
SAVE_AT, STOP = 3, 9
"""Mid-epoch save; the run crosses one epoch boundary after it."""


class Augmented(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Noise augmentation on the global torch RNG in ``__getitem__`` (the README's habit)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn_like(self.x[i]), self.y[i]


@dataclass(frozen=True)
class Loop:
    """How the training script is written (the uninterrupted run and the resumed one)."""

    scaler: bool = False
    ema: bool = False
    accum: int = 1
    workers: int = 0
    aug: bool = False
    batches: bool = False
    """Iterate ``sampler.batches(loader)`` (the README's loop) instead of the loader."""


@dataclass
class Run:
    """The objects of one process of the script."""

    loop: Loop
    ds: Any
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    sched: Any
    scaler: Any
    sampler: ckptkit.ResumableSampler
    ema: dict[str, torch.Tensor] | None
    data_version: int
    micro: int = 0
    """The gradient-accumulation counter (a local variable of the loop)."""

    def train_state(self, leave_out: frozenset[str] = frozenset()) -> ckptkit.TrainState:
        parts: dict[str, Any] = {
            "optimizer": self.opt,
            "scheduler": self.sched,
            "scaler": self.scaler,
            "sampler": self.sampler,
        }
        return ckptkit.TrainState(
            model=self.model,
            **{k: v for k, v in parts.items() if k not in leave_out},
            data={"snapshot": f"synthetic-v{self.data_version}"},
        )


def build(loop: Loop, *, data_version: int = 1) -> Run:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(data_version)
    x, y = torch.randn(N, 8, generator=g), torch.randn(N, 1, generator=g)
    ds = Augmented(x, y) if loop.aug else torch.utils.data.TensorDataset(x, y)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + 0.05 * s))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2) if loop.scaler else None
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()} if loop.ema else None
    sampler = ckptkit.ResumableSampler(ds, seed=0)
    return Run(loop, ds, model, opt, sched, scaler, sampler, ema, data_version)


def train(run: Run, ts: ckptkit.TrainState, mgr: ckptkit.CheckpointManager | None, *,
          sampler: Any = None, start_epoch: int | None = None) -> None:
    """The script's loop from ``ts.step`` to :data:`STOP`, saving at :data:`SAVE_AT`."""
    loader = torch.utils.data.DataLoader(run.ds, batch_size=BATCH, sampler=sampler or run.sampler,
                                         num_workers=run.loop.workers)
    first = run.sampler.epoch if start_epoch is None else start_epoch
    for epoch in range(first, 100):
        run.sampler.set_epoch(epoch)
        for x, y in run.sampler.batches(loader) if run.loop.batches else loader:
            loss = torch.nn.functional.mse_loss(run.model(x), y) / run.loop.accum
            if run.scaler is not None:
                run.scaler.scale(loss).backward()
            else:
                loss.backward()
            run.micro += 1
            if run.micro % run.loop.accum == 0:
                if run.scaler is not None:
                    run.scaler.step(run.opt)
                    run.scaler.update()
                else:
                    run.opt.step()
                run.sched.step()
                run.opt.zero_grad()
                if run.ema is not None:
                    with torch.no_grad():
                        for k, v in run.model.state_dict().items():
                            run.ema[k].mul_(0.9).add_(v, alpha=0.1)
            ts.step += 1
            if ts.step == SAVE_AT and mgr is not None:
                mgr.save(ts)
            if ts.step == STOP:
                return


def final_state(run: Run) -> str:
    """A digest of every component's final state (the drill's end-state comparison)."""
    h = hashlib.sha256()
    tensors = [*run.model.state_dict().values(), *(run.ema or {}).values()]
    for st in run.opt.state.values():
        tensors += [v for v in st.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        h.update(t.detach().numpy().tobytes())
    h.update(repr(run.sched.last_epoch).encode())
    if run.scaler is not None:
        h.update(repr(sorted(run.scaler.state_dict().items())).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Mistake:
    """One real-world resume mistake."""

    loop: Loop = Loop()
    leave_out: frozenset[str] = frozenset()
    """Components the resumed script leaves out of its TrainState."""
    after_restore: Callable[[Run], None] | None = None
    """What the resumed script does between ``mgr.restore`` and its loop."""
    loader_sampler: bool = False
    """The resumed loop builds its DataLoader on a new sampler, not the restored one."""
    start_epoch: Callable[[ckptkit.TrainState], int] | None = None
    data_version: int = 1
    guard: frozenset[str] = field(default_factory=frozenset)
    """The codes the guard reports (empty: it says nothing)."""
    twin: bool = True
    """The resumed final state differs from the uninterrupted run's."""


def _rebuild_optimizer(run: Run) -> None:
    run.opt = torch.optim.AdamW(run.model.parameters(), lr=1e-2)
    run.sched = torch.optim.lr_scheduler.LambdaLR(run.opt, lambda s: 1 / (1 + 0.05 * s))


def _rebuild_model(run: Run) -> None:
    run.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    _rebuild_optimizer(run)


def _halve_lr(run: Run) -> None:
    for g in run.opt.param_groups:
        g["lr"] *= 0.5


def _load_pretrained(run: Run) -> None:
    """A fine-tuning script's habit: the pretrained weights loaded after the restore."""
    g = torch.Generator().manual_seed(99)  # the pretrained file's values; no global draw
    pretrained = {k: torch.randn(v.shape, generator=g) for k, v in run.model.state_dict().items()}
    run.model.load_state_dict(pretrained)


def _through_bf16(run: Run) -> None:
    """The weights rounded through bfloat16 (cast to save memory, cast back for precision)."""
    with torch.no_grad():
        for p in run.model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def _sanity_forward(run: Run) -> None:
    run.model(torch.zeros(2, 8))  # a quick check in train mode: dropout draws


CATALOGUE: dict[str, Mistake] = {
    "scheduler left out of the TrainState": Mistake(
        leave_out=frozenset({"scheduler"}), guard=frozenset({codes.D003})),
    "optimizer left out of the TrainState": Mistake(
        leave_out=frozenset({"optimizer"}), guard=frozenset({codes.D005, codes.D003})),
    "sampler left out of the TrainState": Mistake(
        leave_out=frozenset({"sampler"}), guard=frozenset({codes.D002})),
    "GradScaler left out of the TrainState": Mistake(
        loop=Loop(scaler=True), leave_out=frozenset({"scaler"}), guard=frozenset({codes.D004})),
    "optimizer (and scheduler) rebuilt after the restore": Mistake(
        after_restore=_rebuild_optimizer, guard=frozenset({codes.D005})),
    "model and optimizer rebuilt after the restore": Mistake(
        after_restore=_rebuild_model, guard=frozenset({codes.D091, codes.D008})),
    "LR changed by hand after the restore": Mistake(
        after_restore=_halve_lr, guard=frozenset({codes.D003})),
    "torch.manual_seed after the restore": Mistake(
        after_restore=lambda run: torch.manual_seed(0), guard=frozenset({codes.D008})),
    "pretrained weights loaded after the restore": Mistake(
        after_restore=_load_pretrained, guard=frozenset({codes.D092})),
    "weights rounded through bfloat16 after the restore": Mistake(
        after_restore=_through_bf16, guard=frozenset({codes.D092})),
    "a train-mode forward between restore and loop": Mistake(
        after_restore=_sanity_forward, guard=frozenset({codes.D008})),
    "DataLoader on a new sampler after the restore": Mistake(
        loader_sampler=True, guard=frozenset({codes.D002})),
    "epoch counter recomputed off by one": Mistake(
        start_epoch=lambda ts: ts.step // (N // BATCH) + 1, guard=frozenset({codes.D002})),
    "dataset regenerated (identity declared)": Mistake(
        data_version=2, guard=frozenset({codes.R003})),
    "augmentation on the global RNG, num_workers=2": Mistake(
        loop=Loop(aug=True, workers=2, batches=True), guard=frozenset({codes.D090})),
    "num_workers=2 iterated directly (prefetch runs the cursor ahead)": Mistake(
        loop=Loop(workers=2), guard=frozenset({codes.D002})),
    "EMA kept outside the TrainState": Mistake(loop=Loop(ema=True)),
    "grad-accumulation counter reset (saved mid-accumulation)": Mistake(
        loop=Loop(accum=2)),
    "DataLoader built after the restore, iterated directly": Mistake(twin=False),
}
"""Mistake -> what the guard and the twin comparison say. The last one was a silent
non-bitwise resume before the guard put the loader's base-seed draw back; it is exact now."""


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[Loop, tuple[Path, str]]:
    """Per loop variant: the uninterrupted run's checkpoint directory and final state."""
    out: dict[Loop, tuple[Path, str]] = {}
    for loop in dict.fromkeys(m.loop for m in CATALOGUE.values()):
        run = build(loop)
        ts = run.train_state()
        root = tmp_path_factory.mktemp("ref") / "ckpt"
        with ckptkit.CheckpointManager(root, keep_last=2) as mgr:
            assert mgr.restore(ts) is None
            train(run, ts, mgr)
        out[loop] = (root, final_state(run))
    return out


def resume(m: Mistake, root: Path, caplog: pytest.LogCaptureFixture) -> tuple[set[str], str]:
    """The resumed process: build, (mistake), restore, (mistake), train to STOP.

    Its gradient-accumulation counter starts at 0, as a local variable of a new process
    does (harmless unless the checkpoint was saved mid-accumulation).
    """
    torch.manual_seed(12345)  # a fresh process's streams are not the saving run's
    run = build(m.loop, data_version=m.data_version)
    ts = run.train_state(m.leave_out)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ckptkit"), \
            ckptkit.CheckpointManager(root, keep_last=2) as mgr:
        result = mgr.restore(ts)
        assert result is not None and result.guard is not None
        if m.after_restore is not None:
            m.after_restore(run)
        fresh = ckptkit.ResumableSampler(run.ds, seed=0) if m.loader_sampler else None
        start = m.start_epoch(ts) if m.start_epoch is not None else None
        train(run, ts, None, sampler=fresh, start_epoch=start)
        result.guard.close()
    found = {f.code for f in result.guard.findings}
    # Every finding is also a WARNING in the log, with its fix: what a user sees.
    logged = set(re.findall(r"CK-[A-Z]\d{3}", caplog.text))
    assert found <= logged, (found, caplog.text)
    return found, final_state(run)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_resume_mistake(name: str, references: dict[Loop, tuple[Path, str]],
                        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    m = CATALOGUE[name]
    src, reference = references[m.loop]
    root = tmp_path / "ckpt"
    shutil.copytree(src, root)  # each case resumes its own copy of the saved run
    found, state = resume(m, root, caplog)
    assert found == set(m.guard), (name, found)
    assert (state != reference) == m.twin, name


def docs_table() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "drills.md").read_text()
    section = text.split("### What the guard catches on a real resume", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", section, flags=re.M)
    return {a.strip(): (b.strip(), c.strip()) for a, b, c in rows[1:] if not a.startswith("-")}


def test_the_docs_table_matches() -> None:
    table = docs_table()
    want = {
        name: (", ".join(sorted(m.guard)) or "—", "differs" if m.twin else "bitwise")
        for name, m in CATALOGUE.items()
    }
    assert table == want
    caught = sum(1 for m in CATALOGUE.values() if m.guard)
    text = (ROOT / "docs" / "drills.md").read_text()
    assert f"the guard alone reports {caught} of {len(CATALOGUE)}" in text
