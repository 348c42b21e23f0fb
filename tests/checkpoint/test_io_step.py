"""A plain ``ckptkit.save`` records the step its state carries (docs/security.md asserts it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.format import manifest as mf
from ckptkit.verify.describe import describe

ROOT = Path(__file__).resolve().parents[2]


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


BAD_STEPS = [-1, 2**53, 2**64, True, False, 3.0, "1000"]
BAD_IDS = ["negative", "2**53", "2**64", "True", "False", "float", "str"]


@pytest.mark.parametrize("step", BAD_STEPS, ids=BAD_IDS)
def test_explicit_step_no_reader_accepts_is_refused_before_writing(
    tmp_path: Path, step: object
) -> None:
    """Issue 23 item 12: ``save(step=-1)`` (or >= 2**53, or True) committed a manifest every
    reader refuses (CK-M003/CK-M006). Now: a ValueError naming the range, nothing written."""
    with pytest.raises(ckptkit.StateError) as ei:
        ckptkit.save({"w": torch.ones(2)}, tmp_path / "c", step=step)  # type: ignore[arg-type]
    assert isinstance(ei.value, ValueError)
    assert "0 <= step < 2**53" in str(ei.value) and "not a bool" in str(ei.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("step", [-1, 2**53, True], ids=["negative", "2**53", "True"])
def test_manager_save_refuses_the_same_steps_before_writing(tmp_path: Path, step: object) -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=5)
    with ckptkit.CheckpointManager(tmp_path / "run") as mgr:
        with pytest.raises(ckptkit.StateError, match=r"0 <= step < 2\*\*53"):
            mgr.save(ts, step=step)  # type: ignore[arg-type]
        ts.step = -3  # the state's own step goes through the same check
        with pytest.raises(ckptkit.StateError, match=r"step -3 \(int\)"):
            mgr.save(ts)
        assert mgr.list() == []
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("step")) == []


def test_largest_step_round_trips(tmp_path: Path) -> None:
    last = mf.STEP_LIMIT - 1
    ckptkit.save({"w": torch.ones(2)}, tmp_path / "c", step=last)
    assert describe(tmp_path / "c")["step"] == last and ckptkit.verify(tmp_path / "c").ok
    assert ckptkit.save({"w": torch.ones(2), "step": mf.STEP_LIMIT}, tmp_path / "d").step is None


@pytest.mark.parametrize("where", ["schemas", "ckptkit/_schemas"])
def test_schema_step_bound_is_the_one_constant(where: str) -> None:
    """The schema and the save-time check agree: one bound, STEP_LIMIT."""
    schema = json.loads((ROOT / where / "manifest.schema.json").read_text())
    step = schema["properties"]["step"]
    assert (step["minimum"], step["maximum"]) == (0, mf.STEP_LIMIT - 1)
