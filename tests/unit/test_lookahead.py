"""Every save path records the look-ahead of the next step, through one computation."""

from __future__ import annotations

from pathlib import Path

import torch

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint import lookahead, manifest_io


def _state(step: int = 0, *, scheduler: bool = True) -> ckptkit.TrainState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if scheduler else None
    return ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched,
                              sampler=ckptkit.ResumableSampler(8, seed=1), step=step)


def _train(ts: ckptkit.TrainState, steps: int) -> None:
    for _ in range(steps):
        ts.model(torch.ones(2, 3)).sum().backward()
        assert ts.optimizer is not None
        ts.optimizer.step()
        if ts.scheduler is not None:
            ts.scheduler.step()
        ts.step += 1


def test_ckptkit_save_of_a_train_state_records_the_look_ahead_and_a_resume_checks_it(
    tmp_path: Path,
) -> None:
    ts = _state()
    _train(ts, 2)
    path = tmp_path / "run" / "step-00000002"
    man = ckptkit.save(ts, path)
    guard = man.lookahead["guard"]
    assert (guard["next_step"], guard["sched_epoch"], guard["opt_step"]) == (3, 2, 2)
    assert guard["sample_ids"] == ts.sampler.next_indices(guard["k"])
    assert manifest_io.read(path).lookahead == man.lookahead
    resumed = _state(scheduler=False)  # the scheduler left out: its position is lost
    with ckptkit.CheckpointManager(tmp_path / "run") as mgr:
        result = mgr.restore(resumed)
    assert result is not None and result.guard is not None
    assert [f.code for f in result.guard.findings] == [codes.D003]
    result.guard.close()


def test_a_writer_without_a_train_state_records_what_its_objects_give() -> None:
    # What the DCP writer calls with a state dict's objects (no TrainState, no model).
    ts = _state()
    _train(ts, 3)
    la = lookahead.record(step=3, optimizer=ts.optimizer, scheduler=ts.scheduler)
    assert la is not None
    assert la["guard"]["next_step"] == 4 and la["guard"]["sched_epoch"] == 3
    assert la["guard"]["lr"] == [g["lr"] for g in ts.optimizer.param_groups]  # type: ignore[union-attr]
    assert "sample_ids" not in la["guard"]
    full = lookahead.record(ts)  # the whole TrainState: the same facts, and the sampler's
    assert full is not None
    assert {k: full["guard"][k] for k in la["guard"]} == la["guard"]
    assert "sample_ids" in full["guard"]
