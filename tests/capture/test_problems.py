"""The component validators (``problems``) accept everything capture writes, and restore
refuses what they report before it changes anything.

A validator that refuses valid state would make verify fail and restore skip every good
checkpoint of a run, so each is run on real snapshots: straight from ``capture``, after a
JSON round trip, and as verify sees them (the manifest's tree with tensors as ``meta``
stand-ins), for the optimizers and schedulers people use.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler as lrs

import ckptkit
from ckptkit.capture import fp8, optim, progress, rng, sampler, scaler, scheduler
from ckptkit.capture.progress import Progress
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.capture.state import tree_problems
from ckptkit.errors import StateError

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "sgd-plain": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, centered=True, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    "adafactor": lambda ps: torch.optim.Adafactor(ps, lr=1e-2),
    "two-groups": lambda ps: torch.optim.AdamW(
        [{"params": ps[:1], "weight_decay": 0.0}, {"params": ps[1:], "lr": 1e-4}], lr=1e-3
    ),
}

SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "step": lambda o: lrs.StepLR(o, step_size=2),
    "lambda": lambda o: lrs.LambdaLR(o, lambda s: 0.9**s),
    "onecycle": lambda o: lrs.OneCycleLR(o, max_lr=0.5, total_steps=30),
    "sequential": lambda o: lrs.SequentialLR(
        o,
        [lrs.LinearLR(o, start_factor=0.1, total_iters=3), lrs.ExponentialLR(o, gamma=0.9)],
        milestones=[3],
    ),
    "chained": lambda o: lrs.ChainedScheduler(
        [lrs.ConstantLR(o, factor=0.5, total_iters=2), lrs.ExponentialLR(o, gamma=0.9)]
    ),
    "cyclic": lambda o: lrs.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3),
    "cosine-restarts": lambda o: lrs.CosineAnnealingWarmRestarts(o, T_0=3),
    "plateau": lambda o: lrs.ReduceLROnPlateau(o, patience=1),
}

BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))


def _stepped(make: Callable[[Any], torch.optim.Optimizer]) -> tuple[torch.nn.Module, Any]:
    model = _model()
    opt = make(list(model.parameters()))
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _json_round_trip(snap: dict[str, Any]) -> Any:
    """What a storage round trip of the non-tensor parts gives (tuples become lists...)."""

    def plain(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return f"tensor:{list(x.shape)}"
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return json.loads(json.dumps(plain(snap)))


def _verify_codes(tmp_path: Path, ts: ckptkit.TrainState) -> list[str]:
    with ckptkit.CheckpointManager(tmp_path / "run") as mgr:
        saved = mgr.save(ts)
    return [f.code for f in ckptkit.verify(saved).findings]


# --- validators accept what capture writes ------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_snapshots_are_valid(name: str, tmp_path: Path) -> None:
    model, opt = _stepped(OPTIMIZERS[name])
    snap = optim.capture(opt, model=model)
    assert optim.problems(snap) == []
    # The same snapshot restored into a fresh optimizer (restore runs problems first).
    fresh = OPTIMIZERS[name](list(model.parameters()))
    optim.restore(fresh, copy.deepcopy(snap))
    # And as verify sees it: the manifest's tree with meta stand-ins for the tensors.
    assert "CK-S013" not in _verify_codes(tmp_path, ckptkit.TrainState(model=model, optimizer=opt))


def test_adafactor_factored_moments_restore() -> None:
    """Adafactor's row/col moments are not shaped like their parameter; restore used to
    refuse every Adafactor checkpoint for it."""
    model, opt = _stepped(OPTIMIZERS["adafactor"])
    snap = optim.capture(opt, model=model)
    fresh = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    optim.restore(fresh, snap)
    assert fresh.state_dict()["state"][0]["row_var"].shape == (3, 1)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scheduler_snapshots_are_valid(name: str, tmp_path: Path) -> None:
    model, opt = _stepped(OPTIMIZERS["sgd-momentum"])
    sched = SCHEDULERS[name](opt)
    for _ in range(4):
        opt.step()
        sched.step(1.0) if isinstance(sched, lrs.ReduceLROnPlateau) else sched.step()
    snap = scheduler.capture(sched)
    assert scheduler.problems(snap) == []
    assert scheduler.problems(_json_round_trip(snap)) == []
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, step=4)
    assert "CK-S013" not in _verify_codes(tmp_path, ts)


@pytest.mark.parametrize("kind", BIT_GENERATORS)
def test_rng_snapshots_are_valid(kind: str, tmp_path: Path) -> None:
    gen = np.random.Generator(getattr(np.random, kind)(3))
    gen.random(5)
    snap = rng.capture(numpy_generators={"aug": gen}, cuda=False)
    assert "cuda" not in snap  # CUDA RNG absent: nothing to check, nothing refused
    assert rng.problems(snap) == []
    rng.restore(snap, numpy_generators={"aug": np.random.Generator(getattr(np.random, kind)())})
    ts = ckptkit.TrainState(model=_model(), numpy_generators={"aug": gen})
    assert "CK-S013" not in _verify_codes(tmp_path, ts)


def test_rng_meta_stand_ins_are_judged_by_shape() -> None:
    """Verify without the files sees meta tensors: the saved shapes decide."""
    snap = rng.capture(cuda=False)
    meta = {
        **snap,
        "torch_cpu": torch.empty(snap["torch_cpu"].shape, dtype=torch.uint8, device="meta"),
        "numpy": {**snap["numpy"], "keys": torch.empty(624, dtype=torch.int64, device="meta")},
    }
    assert rng.problems(meta) == []
    meta["torch_cpu"] = torch.empty(10, dtype=torch.uint8, device="meta")
    assert [p for p in rng.problems(meta) if p.startswith("torch_cpu")]


def test_other_components_accept_their_snapshots() -> None:
    s = ResumableSampler(50, seed=4, world_size=2, rank=1)
    next(iter(s))
    assert sampler.problems(sampler.capture(s)) == []
    assert progress.problems(progress.capture(Progress(step=9, micro_step=1, accum_steps=2))) == []
    assert scaler.problems(scaler.capture(torch.amp.GradScaler("cpu", init_scale=64.0))) == []
    assert scaler.problems(scaler.capture(torch.amp.GradScaler("cpu", enabled=False))) == []
    snap = fp8.capture({"fc.scale": torch.ones(1)}, recipe={"margin": 0, "fp8_format": "HYBRID"})
    assert fp8.problems(snap) == []


def test_full_train_state_tree_is_valid() -> None:
    model, opt = _stepped(OPTIMIZERS["adamw"])
    ts = ckptkit.TrainState(
        model=model,
        optimizer=opt,
        scheduler=lrs.StepLR(opt, 2),
        scaler=torch.amp.GradScaler("cpu"),
        fp8={"fc.scale": torch.ones(2)},
        sampler=ResumableSampler(10),
        numpy_generators={"a": np.random.default_rng(1)},
        step=2,
    )
    tree, _ = ts.capture()
    assert tree_problems(tree) == []


# --- validators refuse what restore cannot use ---------------------------------------------


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda s: s["state_dict"].__setitem__("param_groups", "x"), "param_groups is 'x'"),
        (lambda s: s["state_dict"]["param_groups"][0].__setitem__("params", [1, 0, 2, 3]),
         "not the parameter numbers"),
        (lambda s: s["param_shapes"][0].__setitem__(0, "x"), "param_shapes[0][0]"),
        (lambda s: s["state_dict"]["param_groups"][0].__setitem__("eps", 10**400),
         "eps is an int of"),
        (lambda s: s["state_dict"]["state"][0].__setitem__("step", "x"), "not a step count"),
        (lambda s: s["state_dict"]["state"][0].__setitem__("exp_avg", torch.zeros(7)),
         "has shape [7]"),
        (lambda s: s["state_dict"]["state"].__setitem__(9, {}), "parameter 9"),
    ],
)
def test_optimizer_problems_found(edit: Callable[[dict[str, Any]], None], words: str) -> None:
    model, opt = _stepped(OPTIMIZERS["adamw"])
    snap = copy.deepcopy(optim.capture(opt, model=model))
    edit(snap)
    assert any(words in p for p in optim.problems(snap)), optim.problems(snap)
    with pytest.raises(StateError) as info:
        optim.restore(torch.optim.AdamW(model.parameters()), snap)
    assert info.value.code == "CK-S013"


@pytest.mark.parametrize(
    ("key", "value"),
    [("base_lrs", "x"), ("last_epoch", 10**400), ("_last_lr", [[]]), ("optimizer", 1)],
)
def test_scheduler_problems_found(key: str, value: Any) -> None:
    _, opt = _stepped(OPTIMIZERS["sgd-plain"])
    snap = scheduler.capture(lrs.StepLR(opt, 2))
    snap["state_dict"][key] = value
    assert scheduler.problems(snap)
    with pytest.raises(StateError, match="CK-S013"):
        scheduler.restore(lrs.StepLR(opt, 2), snap)


def test_plateau_mode_is_checked() -> None:
    _, opt = _stepped(OPTIMIZERS["sgd-plain"])
    snap = scheduler.capture(lrs.ReduceLROnPlateau(opt))
    snap["state_dict"]["threshold_mode"] = "x"
    assert scheduler.problems(snap) == ["threshold_mode is 'x', not one of rel, abs"]


def test_progress_and_sampler_problems_found() -> None:
    assert progress.problems({**progress.capture(Progress()), "step": 2**64})
    state = sampler.capture(ResumableSampler(10))
    state["state"]["data_len"] = "x"
    assert sampler.problems(state) == ["state: data_len is 'x', not a non-negative int"]
    assert scaler.problems({"enabled": True, "state_dict": {"scale": []}})


# --- a failed RNG restore changes nothing ---------------------------------------------------


def test_failed_rng_restore_changes_no_generator() -> None:
    """The numpy state is refused; Python's must not have been set before that (it was)."""
    saved = rng.capture(cuda=False)
    random.random()
    saved["numpy"]["pos"] = "x"
    before = (random.getstate(), np.random.get_state()[2], torch.get_rng_state())
    with pytest.raises(StateError) as info:
        rng.restore(saved)
    assert info.value.code == "CK-S013"
    assert random.getstate() == before[0]
    assert np.random.get_state()[2] == before[1]
    assert torch.equal(torch.get_rng_state(), before[2])


def test_invalid_torch_rng_bytes_are_refused_before_anything_is_set() -> None:
    saved = rng.capture(cuda=False)
    saved["torch_cpu"] = torch.zeros_like(saved["torch_cpu"])  # "Invalid mt19937 state"
    random.random()
    before = random.getstate()
    with pytest.raises(StateError, match="torch_cpu"):
        rng.restore(saved)
    assert random.getstate() == before
