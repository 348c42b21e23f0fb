"""TrainState + CheckpointManager restore paths, in process (fast twins of the subprocess tests)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptkit
from ckptkit.integrations.drill_env import DrillEnv

pytestmark = pytest.mark.integration

STEPS = 4


class Trainer:
    """A tiny training loop with every resume-critical component (dropout, AdamW, LambdaLR,
    ResumableSampler, a numpy draw per step)."""

    def __init__(
        self,
        make_model: Callable[..., torch.nn.Module],
        *,
        seed: int = 0,
        scheduler: bool = True,
        sampler: bool = True,
    ) -> None:
        self.model = make_model(seed=seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, _decay)
        self.sampler = ckptkit.ResumableSampler(64, seed=0)
        self.data = torch.randint(0, 32, (64, 9), generator=torch.Generator().manual_seed(1))
        self.ts = ckptkit.TrainState(
            model=self.model,
            optimizer=self.opt,
            scheduler=self.sched if scheduler else None,
            sampler=self.sampler if sampler else None,
        )
        self.losses: list[float] = []

    def train(self, steps: int) -> None:
        it = iter(self.sampler)
        for _ in range(steps):
            ids = [next(it) for _ in range(4)]
            x = self.data[ids]
            # numpy and python draws too: their generators must come back as well.
            x = x.roll(int(np.random.randint(0, 3)) + random.randint(0, 1), dims=1)
            logits = self.model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.sched.step()
            self.ts.step += 1
            self.losses.append(loss.item())

    def params(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


def _decay(step: int) -> float:
    return 0.9**step


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def seeded() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_save_restore_continue_is_bitwise_exact(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path, seeded: None, async_: bool
) -> None:
    ref = Trainer(tiny_model)
    ref.train(STEPS)
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(ref.ts, async_=async_)
        if async_:
            # Training goes on while the write is in flight; the checkpoint holds step 4.
            ref.train(STEPS)
            mgr.wait()
        else:
            ref.train(STEPS)

    torch.manual_seed(123)  # the resumed process starts from other RNG states
    np.random.seed(123)
    resumed = Trainer(tiny_model, seed=1)
    result = ckptkit.CheckpointManager(tmp_path).restore(resumed.ts)
    assert result is not None and result.step == STEPS
    assert {"model", "optimizer", "scheduler", "sampler", "rng", "progress"} <= set(result.restored)
    resumed.train(STEPS)
    assert resumed.losses == ref.losses[STEPS:]
    assert _same(resumed.params(), ref.params())
    assert resumed.ts.step == ref.ts.step == 2 * STEPS
    assert resumed.sched.state_dict() == ref.sched.state_dict()
    assert resumed.sampler.state_dict() == ref.sampler.state_dict()


def test_async_save_snapshot_is_taken_at_call_time(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path, seeded: None
) -> None:
    tr = Trainer(tiny_model)
    tr.train(2)
    at_save = tr.params()
    opt_at_save = {k: v.clone() for k, v in tr.opt.state[next(iter(tr.model.parameters()))].items()}
    mgr = ckptkit.CheckpointManager(tmp_path)
    mgr.save(tr.ts, async_=True)
    tr.train(3)  # mutates parameters and moments in place while the write may run
    mgr.close()

    other = Trainer(tiny_model, seed=5)
    result = ckptkit.CheckpointManager(tmp_path).restore(other.ts)
    assert result is not None and result.step == 2
    assert _same(other.params(), at_save)
    restored_opt = other.opt.state[next(iter(other.model.parameters()))]
    assert _same(dict(restored_opt), opt_at_save)


def test_restore_on_empty_dir_is_a_fresh_start(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    tr = Trainer(tiny_model)
    before = tr.params()
    assert ckptkit.CheckpointManager(tmp_path / "new").restore(tr.ts) is None
    assert _same(tr.params(), before)
    assert tr.ts.step == 0
    assert DrillEnv().restore(tr.ts, ckptkit.CheckpointManager(tmp_path / "new2")) is None


def _saved(root: Path, ts: ckptkit.TrainState) -> Path:
    """Save and close: the read-back verify runs in the background, and a manager opened
    next must find it recorded, not still running."""
    with ckptkit.CheckpointManager(root) as mgr:
        return Path(mgr.save(ts))


@pytest.mark.parametrize("component", ["scheduler", "sampler"])
def test_strict_restore_raises_when_checkpoint_lacks_a_passed_component(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path, component: str
) -> None:
    saver = Trainer(tiny_model, **{component: False})
    saver.train(2)
    _saved(tmp_path, saver.ts)

    loader = Trainer(tiny_model, seed=3)
    with pytest.raises(ckptkit.StateError, match=f"no {component} state"):
        ckptkit.CheckpointManager(tmp_path).restore(loader.ts, step=2)


@pytest.mark.parametrize("component", ["scheduler", "sampler"])
def test_non_strict_restore_notes_the_missing_component(
    tiny_model: Callable[..., torch.nn.Module],
    tmp_path: Path,
    component: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    saver = Trainer(tiny_model, **{component: False})
    saver.train(2)
    _saved(tmp_path, saver.ts)

    loader = Trainer(tiny_model, seed=3)
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        result = ckptkit.CheckpointManager(tmp_path).restore(loader.ts, strict=False)
    assert result is not None and result.step == 2
    assert component not in result.restored
    assert any(f"no {component} state" in n for n in result.notes)
    assert f"no {component} state" in caplog.text
    assert _same(loader.params(), saver.params())


def test_strict_restore_raises_when_checkpoint_lacks_the_scaler(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    model = tiny_model()
    _saved(tmp_path, ckptkit.TrainState(model=model, step=1))
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    ts = ckptkit.TrainState(model=tiny_model(seed=2), scaler=scaler)
    with pytest.raises(ckptkit.CkptkitError, match="no scaler state"):
        ckptkit.CheckpointManager(tmp_path).restore(ts)
    assert scaler.get_scale() == 8.0


def test_strict_mismatch_is_not_corruption(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    saver = Trainer(tiny_model, scheduler=False)
    saver.train(2)
    _saved(tmp_path, saver.ts)

    loader = Trainer(tiny_model, seed=3)
    with pytest.raises(ckptkit.StateError, match="no scheduler state"):
        ckptkit.CheckpointManager(tmp_path, readonly=True).restore(loader.ts)
    mgr = ckptkit.CheckpointManager(tmp_path)
    assert [c.status for c in mgr.list()] == ["verified"]
    result = mgr.restore(loader.ts, strict=False)
    assert result is not None and result.step == 2


def test_restore_a_named_step_and_a_missing_one(
    tiny_model: Callable[..., torch.nn.Module], tmp_path: Path, seeded: None
) -> None:
    tr = Trainer(tiny_model)
    mgr = ckptkit.CheckpointManager(tmp_path, keep_last=5)
    snaps = {}
    for _ in range(3):
        tr.train(1)
        mgr.save(tr.ts)
        snaps[tr.ts.step] = tr.params()
    mgr.close()

    other = Trainer(tiny_model, seed=9)
    assert ckptkit.CheckpointManager(tmp_path).restore(other.ts, step=2).step == 2
    assert _same(other.params(), snaps[2])
    with pytest.raises(ckptkit.IncompleteCheckpointError, match="step 7"):
        ckptkit.CheckpointManager(tmp_path, readonly=True).restore(other.ts, step=7)
    # The drill's CKPTKIT_DRILL_RESUME_FROM: a step directory, or a run directory (newest).
    own = ckptkit.CheckpointManager(tmp_path / "own")  # the run's writer: one, held from open
    env = DrillEnv(resume_from=tmp_path / "step-00000001")
    assert env.restore(other.ts, own).step == 1
    assert _same(other.params(), snaps[1])
    env = DrillEnv(resume_from=tmp_path)
    assert env.restore(other.ts, own).step == 3
    assert _same(other.params(), snaps[3])
    with pytest.raises(ckptkit.DrillError, match="not a directory"):
        DrillEnv(resume_from=tmp_path / "nope").restore(other.ts, mgr)
