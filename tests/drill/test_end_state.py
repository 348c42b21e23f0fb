"""The drill's end-state check: resume bugs whose effect stays out of every step record
inside the window fail the drill, named, with ordinary PyTorch, the Trainer and Lightning.

* an EMA kept in the state but rebuilt from the current weights after the restore;
* a ``MultiStepLR`` built afresh after the restore (or, under Lightning, its saved state
  dropped at load), its next milestone after the window.

Both runs save after the stop step (``CKPTKIT_DRILL_SAVE_FINAL``); every step record agrees
(the twin check passes), and only the comparison of the final checkpoints sees it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.report import DrillReport
from ckptkit.drill.runner import run_drill

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parents[1] / "scripts"
PLAIN = SCRIPTS / "end_state_script.py"


def drill(script: Path, fault: str, tmp_path: Path, *, isolate: bool = False) -> DrillReport:
    cmd = [sys.executable, str(script), "--fault", fault]
    return run_drill(DrillConfig(command=cmd, steps_before=4, steps_after=4,
                                 workdir=tmp_path / "drill", isolate=isolate, timeout=240))


@pytest.mark.parametrize(
    ("fault", "component"), [("none", None), ("ema", "ema"), ("milestone", "scheduler")]
)
def test_plain_pytorch_end_state(fault: str, component: str | None, tmp_path: Path) -> None:
    rep = drill(PLAIN, fault, tmp_path)
    by = {c.name: c for c in rep.checks}
    assert by["twin"].ok, by["twin"].detail  # every step record agrees
    es = by["end_state"]
    assert not es.skipped and not es.informational
    if component is None:
        assert rep.ok and es.ok, es.detail
        assert "ema" in es.detail["compared"] and "scheduler" in es.detail["compared"]
        return
    assert rep.exit_code == 1 and not es.ok
    assert list(es.detail["different"]) == [component], es.detail
    assert (rep.diagnosis.component, rep.diagnosis.confidence) == (component, "high")
    assert rep.to_dict()["diagnosis"]["component"] == component


def test_a_resumed_run_whose_final_save_fails_is_compared_and_fails_end_state(
    tmp_path: Path,
) -> None:
    """Every record agrees, then the resumed run's final save raises (NaN weights): the drill
    compares the records and fails on the missing end state; it is not a crashed drill."""
    rep = drill(PLAIN, "nan-final", tmp_path)
    by = {c.name: c for c in rep.checks}
    assert by["twin"].ok, by["twin"].detail
    es = by["end_state"]
    assert not es.ok and not es.informational
    assert "before its final checkpoint was saved" in es.detail["reason"]
    assert rep.exit_code == 1
    assert (rep.diagnosis.component, rep.diagnosis.confidence) == ("unknown", "low")


def test_trainer_ema_not_restored_is_named(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    rep = drill(SCRIPTS / "hf_ema.py", "ema", tmp_path, isolate=True)
    by = {c.name: c for c in rep.checks}
    assert by["twin"].ok and not by["end_state"].ok
    # the Trainer's own checkpoint-N folders, compared through their adopted manifests
    assert Path(by["end_state"].detail["resumed"]).name == "checkpoint-8"
    assert (rep.exit_code, rep.diagnosis.component, rep.diagnosis.confidence) == (1, "ema", "high")


@pytest.mark.parametrize(
    ("fault", "component"),
    # A Lightning callback's state is its own component, named by its state key.
    [("ema", "callbacks/EMA"), ("milestone", "scheduler")],
)
def test_lightning_state_not_restored_is_named(fault: str, component: str, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    rep = drill(SCRIPTS / "lit_ema.py", fault, tmp_path, isolate=True)
    by = {c.name: c for c in rep.checks}
    assert by["twin"].ok and not by["end_state"].ok, by["end_state"].detail
    assert {"model", "optimizer"} <= set(by["end_state"].detail["compared"])
    assert rep.exit_code == 1 and rep.diagnosis.component == component, rep.diagnosis
    if fault == "ema":
        assert rep.diagnosis.confidence == "high"
    else:
        # The look-ahead ckptkit's callback keeps in the checkpoint (under "ckptkit")
        # records the scheduler's position too, so two components differ; the resume
        # guard, which saw the position restart, breaks the tie.
        assert set(by["end_state"].detail["different"]) == {"scheduler", "ckptkit"}
        assert rep.diagnosis.confidence == "medium"
