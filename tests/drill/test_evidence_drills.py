"""Evidence before names (issue 37, item 2), drilled on ``char_script.py``: a char-level LM
with length bucketing, gradient accumulation and token noise drawn in ``__getitem__`` from
the global RNG, written independently of the bundled example.

Each reported case is one drill (W = N = 6, about a second each): the component named, its
confidence, and what the resume guard wrote into the resumed run's records. The dataset
size (``CHAR_LINES``) places the save where the reported evidence arises: at 24 lines (6
batches an epoch) a re-seeded augmentation reproduces an earlier epoch's row, which the
rows alone took for a reordering.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.runner import cleanup, run_drill

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "char_script.py"
W = N = 6


def drill(fault: str, log: str, lines: int = 32) -> Any:
    old = os.environ.get("CHAR_LINES")
    os.environ["CHAR_LINES"] = str(lines)
    try:
        cfg = DrillConfig(command=[sys.executable, str(SCRIPT), "--log", log, "--fault", fault],
                          steps_before=W, steps_after=N, timeout=120, keep=True)
        return run_drill(cfg)
    finally:
        if old is None:
            os.environ.pop("CHAR_LINES", None)
        else:
            os.environ["CHAR_LINES"] = old


def guard_findings(rep: Any) -> list[dict[str, Any]]:
    """The resume guard's findings in the resumed run's records."""
    out: list[dict[str, Any]] = []
    for line in (Path(rep.workdir) / "resumed" / "metrics.jsonl").read_text().splitlines():
        out += json.loads(line).get("guard") or []
    return out


@pytest.fixture
def drilled() -> Iterator[list[Any]]:
    reps: list[Any] = []
    yield reps
    for rep in reps:
        cleanup(rep)


@pytest.mark.parametrize("log", ["full", "busy"])
def test_an_exact_resume_gets_no_guard_warning(log: str, drilled: list[Any]) -> None:
    """``__getitem__`` draws from the global RNG (num_workers=0, a custom batch sampler):
    those draws are the step's own, not a drift (was ``CK-D008 torch advanced N words``)."""
    rep = drill("none", log)
    drilled.append(rep)
    assert rep.ok, rep.diagnosis
    assert guard_findings(rep) == []


@pytest.mark.parametrize(("fault", "log", "lines"), [
    ("reseed", "full", 24),        # was sampler (medium): "the data order is not resumed"
    ("reseed", "minimal", 24),
    ("manual-seed", "busy", 32),   # was sampler (medium) although the guard said re-seeded
])
def test_a_reseed_after_restore_is_the_rng_with_the_call_the_guard_saw(
    fault: str, log: str, lines: int, drilled: list[Any]
) -> None:
    rep = drill(fault, log, lines)
    drilled.append(rep)
    d = rep.diagnosis
    assert not rep.ok and (d.component, d.confidence) == ("rng", "high"), d.evidence
    assert "manual_seed(5)" in d.to_dict()["hint"]
    assert any("re-seeded" in g["message"] for g in guard_findings(rep))


@pytest.mark.parametrize("log", ["busy", "full"])
def test_rng_restored_after_the_first_batch_is_the_rng(log: str, drilled: list[Any]) -> None:
    """Was ``unknown (low) [rng, data-version]`` at busy logging."""
    rep = drill("rng-late", log)
    drilled.append(rep)
    d = rep.diagnosis
    assert not rep.ok and d.component == "rng" and d.confidence in ("high", "medium"), d.evidence
    assert any("nothing drew from the restored" in g["message"] for g in guard_findings(rep))


def test_a_loader_with_workers_is_never_the_sampler_or_the_data(drilled: list[Any]) -> None:
    """Augmentation in ``__getitem__`` with 2 workers: at full logging (content hashes equal)
    the workers' RNG; at busy logging never a wrong name at medium or high."""
    rep = drill("workers2", "full")
    drilled.append(rep)
    d = rep.diagnosis
    assert not rep.ok and (d.component, d.confidence) == ("rng", "medium"), d.evidence
    rep = drill("workers2", "busy")
    drilled.append(rep)
    d = rep.diagnosis
    assert not rep.ok and d.component in ("rng", "unknown") and "rng" in (d.component,
                                                                          *d.candidates)


@pytest.mark.parametrize("log", ["minimal", "full"])
def test_a_reset_accumulation_counter_never_names_an_absent_scaler(
    log: str, drilled: list[Any]
) -> None:
    """Was ``scaler (medium)`` in a run with no GradScaler."""
    rep = drill("accum-reset", log)
    drilled.append(rep)
    d = rep.diagnosis
    assert not rep.ok and d.component == "progress" and "scaler" not in d.candidates, d
    cont = next(c for c in rep.checks if c.name == "continuity")
    for item in cont.detail.get("items", []):  # never "FAIL opt_step: recorded 1, resumed 1"
        assert item["ok"] or item["checkpoint"] != item["resumed"], item


def test_a_scheduler_built_after_the_restore_is_the_scheduler(drilled: list[Any]) -> None:
    rep = drill("sched-rebuilt", "busy")
    drilled.append(rep)
    assert not rep.ok and rep.diagnosis.component == "scheduler", rep.diagnosis.evidence
