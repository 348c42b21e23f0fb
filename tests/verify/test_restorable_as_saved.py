"""Issue 23: verify and restore agree on hostile values inside the saved state components.

A run with every component a TrainState restores (optimizer, scheduler, GradScaler, fp8
tensors, a ResumableSampler, Python/NumPy/torch RNG with a named NumPy generator, progress)
saves two checkpoints; one value somewhere inside a component of the newest one's tree is
replaced by a hostile one and the manifest digest recomputed, as an attacker who knows the
format would. Then ``ckptkit.verify(newest).ok`` must be True exactly when
``CheckpointManager.restore`` restores the newest (CK-S013 is the rule both run).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.format import manifest as mf

pytestmark = pytest.mark.integration

STEPS = (1, 2)
NEWEST = step_dir_name(STEPS[-1])
COMPONENTS = ("optimizer", "scheduler", "scaler", "fp8", "sampler", "rng", "progress")

HOSTILE = [10**400, -(10**400), [], {}, "x", None, True, -1, 0.5, 2**64]
"""Wrong containers, wrong scalars, numbers past every range, and plausible-but-wrong ones."""


def full_state(seed: int) -> ckptkit.TrainState:
    """A state with every component a restore puts back."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched.step()
    sampler = ResumableSampler(64, seed=7)
    it = iter(sampler)
    next(it)
    return ckptkit.TrainState(
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=torch.amp.GradScaler("cpu", init_scale=1024.0),
        fp8={"fc.scale": torch.ones(2), "fc.amax_history": torch.ones(4, 2)},
        sampler=sampler,
        numpy_generators={"aug": np.random.default_rng(seed)},
        step=0,
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("full-state") / "run"
    ts = full_state(0)
    with ckptkit.CheckpointManager(run) as mgr:
        for s in STEPS:
            ts.step = s
            mgr.save(ts)
    report = ckptkit.verify(run / NEWEST)
    assert report.ok, report
    return run


def _paths(node: Any, at: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*at, i))


@pytest.fixture(scope="module")
def places(template: Path) -> list[tuple[Any, ...]]:
    """Every place inside a state component of the newest manifest's tree."""
    tree = json.loads((template / NEWEST / "manifest.json").read_text())["tree"]
    out = [p for name in COMPONENTS for p in _paths(tree[name], (name,))]
    assert len(out) > 100, "the template lost components"
    return out


def _agree(template: Path, place: tuple[Any, ...], value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(template, run)
        path = run / NEWEST / "manifest.json"
        obj = json.loads(path.read_text())
        parent = obj["tree"]
        for key in place[:-1]:
            parent = parent[key]
        parent[place[-1]] = value
        obj["manifest_digest"] = mf.content_digest(obj)
        path.write_text(json.dumps(obj))

        report = ckptkit.verify(run / NEWEST)
        with ckptkit.CheckpointManager(run) as mgr:
            result = mgr.restore(full_state(5))
        took = result is not None and result.path is not None and result.path.name == NEWEST
        assert report.ok == took, (
            f"tree/{'/'.join(map(str, place))} = {value!r:.40}: verify says "
            f"{'good' if report.ok else 'bad'} ({[f.code for f in report.findings]}), restore "
            f"{'took' if took else 'skipped'} it ({result.notes[:1] if result else None})"
        )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_verify_is_good_exactly_when_restore_takes_it(
    template: Path, places: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    place = data.draw(st.sampled_from(places), label="place")
    value = data.draw(st.sampled_from(HOSTILE), label="value")
    logging.disable(logging.WARNING)  # each fallback logs; the assertion says what matters
    try:
        _agree(template, place, value)
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize(
    ("place", "value"),
    [
        (("rng", "rank00000", "python", "state", 0), 10**400),
        (("rng", "rank00000", "numpy", "pos"), "x"),
        (("rng", "rank00000", "numpy_generators", "aug", "state", "state"), []),
        (("optimizer", "state_dict", "param_groups"), "x"),
        (("optimizer", "param_shapes", 0, 0), "x"),
        (("scheduler", "state_dict", "base_lrs"), "x"),
        (("scaler", "state_dict", "scale"), []),
        (("sampler", "state", "position"), "x"),
        (("fp8", "state"), []),
        (("progress", "step"), []),
        # Well-typed but not what was saved: the recorded summary tells (restore would
        # refuse each as not fitting the run it restores into).
        (("sampler", "state", "seed"), -1),
        (("sampler", "state", "drop_last"), True),
        (("fp8", "state"), {}),
        (("rng", "rank00000", "numpy_generators"), {}),
    ],
)
def test_known_disagreements_now_agree(
    template: Path, place: tuple[Any, ...], value: Any
) -> None:
    """Values a probe found verify calling good and restore refusing (CK-F024 and others)."""
    _agree(template, place, value)
