"""FP8 scaling-state capture."""

from __future__ import annotations

import copy
import enum
import json
import re
from typing import Any

import pytest
import torch

from ckptkit.capture import fp8
from ckptkit.errors import StateError


class Format(enum.Enum):
    E4M3 = 1
    HYBRID = 2


RECIPE = {"margin": 0, "amax_history_len": 4, "fp8_format": Format.HYBRID}


def live_state() -> dict[str, torch.Tensor]:
    return {
        "fc1.scale": torch.tensor([1.0, 2.0]),
        "fc1.amax_history": torch.tensor([[1.0, 3.0], [0.5, 2.0], [0.0, 0.0], [0.0, 0.0]]),
        "fc2.scale": torch.tensor([4.0]),
        "fc2.amax_history": torch.zeros(4, 1),
    }


def test_mapping_round_trip_in_place() -> None:
    live = live_state()
    held = live["fc1.scale"]  # a module keeps this reference
    snap = copy.deepcopy(fp8.capture(live, recipe=RECIPE))
    assert snap["recipe"]["fp8_format"] == "HYBRID"
    for t in live.values():
        t.mul_(3)
    fp8.restore(live, snap, recipe=RECIPE)
    assert torch.equal(held, torch.tensor([1.0, 2.0]))
    assert all(torch.equal(live[k], v) for k, v in live_state().items())


class Holder:
    def __init__(self) -> None:
        self.scale = torch.ones(3)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale.clone(), "meta": {"step": 5}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = state["scale"].clone()


def test_stateful_round_trip() -> None:
    h = Holder()
    h.scale.fill_(7)
    snap = fp8.capture(h)
    assert snap["kind"] == "stateful"
    h2 = Holder()
    fp8.restore(h2, snap)
    assert torch.equal(h2.scale, torch.full((3,), 7.0))


def test_summary_counts() -> None:
    live = live_state()
    live["fc2.scale"][0] = float("nan")
    live["fc1.scale"][1] = float("inf")
    s = fp8.summary(fp8.capture(live, recipe=RECIPE))
    json.dumps(s)
    assert s["nonfinite_scale"] == 2
    assert s["nonfinite_amax"] == 0
    assert s["num_scale_values"] == 3
    assert s["amax_history_len"] == 4
    assert s["amax_history_empty"] is False
    assert s["amax_history_all_zero"] is False
    zero = fp8.summary(fp8.capture({"x.amax_history": torch.zeros(8, 2)}))
    assert zero["amax_history_all_zero"] is True and zero["amax_history_len"] == 8


def test_errors() -> None:
    with pytest.raises(StateError, match="not a tensor"):
        fp8.capture({"fc.scale": 1.0})  # type: ignore[dict-item]
    with pytest.raises(StateError, match="cannot capture fp8 state"):
        fp8.capture(42)  # type: ignore[arg-type]
    snap = fp8.capture(live_state(), recipe=RECIPE)
    with pytest.raises(StateError, match="recipe changed"):
        fp8.restore(live_state(), snap, recipe={**RECIPE, "margin": 1})
    short = live_state()
    del short["fc2.scale"]
    with pytest.raises(StateError, match=re.escape("missing here ['fc2.scale']")):
        fp8.restore(short, snap)
    wrong = live_state()
    wrong["fc2.amax_history"] = torch.zeros(8, 1)
    with pytest.raises(StateError, match="amax_history_len"):
        fp8.restore(wrong, snap)
