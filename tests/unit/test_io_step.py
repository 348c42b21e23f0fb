"""A plain ``ckptkit.save`` records the step its state carries (docs/security.md asserts it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.describe import describe


def test_integer_top_level_step_is_recorded(tmp_path: Path) -> None:
    m = ckptkit.save({"model": {"w": torch.ones(2)}, "step": 1000}, tmp_path / "c")
    assert m.step == 1000
    assert describe(tmp_path / "c")["step"] == 1000
    assert ckptkit.load(tmp_path / "c")["step"] == 1000  # still in the state too


def test_explicit_step_argument_wins(tmp_path: Path) -> None:
    m = ckptkit.save({"w": torch.ones(2), "step": 1000}, tmp_path / "c", step=7)
    assert m.step == 7


@pytest.mark.parametrize(
    "state",
    [
        {"w": torch.ones(2)},
        {"w": torch.ones(2), "step": True},
        {"w": torch.ones(2), "step": -1},
        {"w": torch.ones(2), "step": 3.0},
        {"w": torch.ones(2), "step": "1000"},
        {"w": torch.ones(2), "step": torch.tensor(5)},
        {"w": torch.ones(2), "progress": {"step": 5}},  # only the top level counts
        [torch.ones(2), 5],
    ],
    ids=["absent", "bool", "negative", "float", "str", "tensor", "nested", "list"],
)
def test_no_step_unless_a_top_level_integer(tmp_path: Path, state: object) -> None:
    assert ckptkit.save(state, tmp_path / "c").step is None
