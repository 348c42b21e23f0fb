"""Optimizer capture: a restored optimizer continues bitwise identically."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable

import pytest
import torch

from ckptkit.capture import optim
from ckptkit.errors import StateError


def make_model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_resume_is_bitwise_identical(name: str) -> None:
    factory = OPTIMIZERS[name]
    model = make_model()
    opt = factory(model.parameters())
    train(model, opt, 3, seed=1)
    snap = copy.deepcopy(optim.capture(opt, model=model))
    model_state = copy.deepcopy(model.state_dict())

    train(model, opt, 3, seed=2)  # uninterrupted run

    resumed = make_model(seed=99)
    resumed.load_state_dict(model_state)
    opt2 = factory(resumed.parameters())
    optim.restore(opt2, snap)
    train(resumed, opt2, 3, seed=2)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_capture_names_shapes_and_summary() -> None:
    model = make_model()
    opt = torch.optim.Adam(
        [
            {"params": [model[0].weight, model[0].bias], "lr": 1e-3},
            {"params": [model[2].weight], "lr": 1e-4, "weight_decay": 0.5},
        ]
    )
    snap = optim.capture(opt, model=model)
    assert snap["type"] == "Adam"
    assert snap["param_names"] == [["0.weight", "0.bias"], ["2.weight"]]
    assert snap["param_shapes"] == [[[8, 4], [8]], [[2, 8]]]
    s = optim.summary(snap)
    assert s["num_params_with_state"] == 0 and s["step_min"] is None
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4, generator=gen)).sum().backward()
        opt.step()
    s = optim.summary(optim.capture(opt, model=model))
    json.dumps(s)
    assert s == {
        "type": "Adam",
        "num_param_groups": 2,
        "lrs": [1e-3, 1e-4],
        "betas": [[0.9, 0.999], [0.9, 0.999]],
        "weight_decays": [0.0, 0.5],
        "num_params": 3,
        "num_params_with_state": 3,
        "num_params_without_state": 0,
        "step_min": 2,
        "step_max": 2,
    }


def test_shape_mismatch_names_the_parameter() -> None:
    model = make_model()
    opt = torch.optim.Adam(model.parameters())
    train(model, opt, 1, seed=0)
    snap = optim.capture(opt, model=model)
    other = torch.nn.Sequential(torch.nn.Linear(4, 9), torch.nn.ReLU(), torch.nn.Linear(9, 2))
    with pytest.raises(StateError, match=re.escape("'0.weight' had shape [8, 4], now [9, 4]")):
        optim.restore(torch.optim.Adam(other.parameters()), snap)


def test_count_and_type_mismatch() -> None:
    model = make_model()
    snap = optim.capture(torch.optim.Adam(model.parameters()))
    with pytest.raises(StateError, match="from a Adam"):
        optim.restore(torch.optim.SGD(model.parameters(), lr=0.1), snap)
    with pytest.raises(StateError, match="had 4 parameter"):
        optim.restore(torch.optim.Adam(list(model.parameters())[:3]), snap)


def test_corrupt_moment_shape_is_caught() -> None:
    model = make_model()
    opt = torch.optim.Adam(model.parameters())
    train(model, opt, 1, seed=0)
    snap = copy.deepcopy(optim.capture(opt, model=model))
    snap["state_dict"]["state"][1]["exp_avg"] = torch.zeros(3)
    with pytest.raises(StateError, match=re.escape("'exp_avg' of parameter '0.bias'")):
        optim.restore(torch.optim.Adam(model.parameters()), snap)


def test_foreign_parameter_and_unsupported_group_value() -> None:
    model = make_model()
    stray = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([*model.parameters(), stray], lr=0.1)
    with pytest.raises(StateError, match="not a parameter of the given Sequential"):
        optim.capture(opt, model=model)
    opt.param_groups[0]["tag"] = object()
    with pytest.raises(StateError, match=re.escape("param_groups[0].tag")):
        optim.capture(opt)
