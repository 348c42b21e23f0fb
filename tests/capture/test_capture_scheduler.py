"""Scheduler capture: the restored scheduler gives the same next learning rates."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import pytest
import torch
from torch.optim import lr_scheduler as lrs

from ckptkit.capture import scheduler
from ckptkit.errors import StateError

Factory = Callable[[torch.optim.Optimizer], lrs.LRScheduler | lrs.ReduceLROnPlateau]


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / 4)


FACTORIES: dict[str, Factory] = {
    "step": lambda o: lrs.StepLR(o, step_size=2, gamma=0.5),
    "lambda": lambda o: lrs.LambdaLR(o, warmup),
    "lambda_inline": lambda o: lrs.LambdaLR(o, lambda s: 0.9**s),
    "multiplicative": lambda o: lrs.MultiplicativeLR(o, lambda s: 0.95),
    "cosine": lambda o: lrs.CosineAnnealingLR(o, T_max=7, eta_min=1e-4),
    "cosine_restarts": lambda o: lrs.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2),
    "onecycle": lambda o: lrs.OneCycleLR(o, max_lr=0.5, total_steps=30),
    "cyclic": lambda o: lrs.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3),
    "sequential": lambda o: lrs.SequentialLR(
        o,
        [lrs.LinearLR(o, start_factor=0.1, total_iters=3), lrs.ExponentialLR(o, gamma=0.9)],
        milestones=[3],
    ),
    "plateau": lambda o: lrs.ReduceLROnPlateau(o, patience=1, factor=0.5),
}


def make_opt() -> torch.optim.Optimizer:
    p = torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([p], lr=0.1, momentum=0.9)


def advance(
    sched: lrs.LRScheduler | lrs.ReduceLROnPlateau, opt: torch.optim.Optimizer, n: int
) -> list[float]:
    lrs_seen = []
    for i in range(n):
        opt.step()
        if isinstance(sched, lrs.ReduceLROnPlateau):
            sched.step(1.0 + (i % 3 == 0))  # a loss that stops improving
        else:
            sched.step()
        lrs_seen.append(opt.param_groups[0]["lr"])
    return lrs_seen


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_resume_gives_same_lrs(name: str) -> None:
    opt = make_opt()
    sched = FACTORIES[name](opt)
    advance(sched, opt, 5)
    snap = copy.deepcopy(scheduler.capture(sched))
    opt_state = copy.deepcopy(opt.state_dict())
    expected = advance(sched, opt, 6)

    opt2 = make_opt()
    sched2 = FACTORIES[name](opt2)
    opt2.load_state_dict(opt_state)
    pristine = copy.deepcopy(snap)
    scheduler.restore(sched2, snap)
    assert advance(sched2, opt2, 6) == expected
    # restore must not have tied the live scheduler to the snapshot.
    assert snap == pristine


def test_summary() -> None:
    opt = make_opt()
    sched = lrs.StepLR(opt, step_size=2, gamma=0.5)
    advance(sched, opt, 3)
    s = scheduler.summary(scheduler.capture(sched))
    json.dumps(s)
    assert s == {"type": "StepLR", "last_epoch": 3, "last_lr": [0.05], "base_lrs": [0.1]}
    plateau = scheduler.summary(scheduler.capture(lrs.ReduceLROnPlateau(make_opt())))
    assert plateau["type"] == "ReduceLROnPlateau" and "num_bad_epochs" in plateau


class StatefulLambda:
    """A callable object: PyTorch stores its __dict__ in the state dict."""

    def __init__(self) -> None:
        self.factor = 0.5
        self.helper = object()

    def __call__(self, step: int) -> float:
        return self.factor


def test_unsupported_value_raises_with_key_path_and_hint() -> None:
    sched = lrs.LambdaLR(make_opt(), StatefulLambda())
    with pytest.raises(StateError) as err:
        scheduler.capture(sched)
    assert "lr_lambdas[0].helper" in str(err.value)
    assert err.value.hint and "recreate it in code" in err.value.hint


def test_type_mismatch() -> None:
    snap = scheduler.capture(lrs.StepLR(make_opt(), step_size=2))
    with pytest.raises(StateError, match="from a StepLR"):
        scheduler.restore(lrs.ExponentialLR(make_opt(), gamma=0.9), snap)
