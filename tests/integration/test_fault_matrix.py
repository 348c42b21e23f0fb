"""The diagnosis, calibrated: every seeded fault of two differently written scripts, at two
logging levels, must be detected; the component named must be right for >= 90% of the
(fault, logging) pairs; a wrong answer is never given with high confidence.

The matrix is ``benchmarks/diagnosis_matrix.py`` (the same code prints the table in
docs/drills.md); one drill per pair, W = N = 6, runs forked from this process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location(
        "diagnosis_matrix", ROOT / "benchmarks" / "diagnosis_matrix.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their module
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def matrix() -> tuple[Any, list[Any]]:
    bench = _bench()
    return bench, bench.run_matrix()


def test_both_scripts_and_both_logging_levels_are_covered(matrix: tuple[Any, list[Any]]) -> None:
    _, rows = matrix
    assert {r.script for r in rows} == {"tiny_lm", "aug_script"}
    assert {r.log for r in rows} == {"minimal", "full"}
    assert not [r for r in rows if r.error], [r.error for r in rows if r.error]


def test_clean_runs_pass_and_every_fault_is_detected(matrix: tuple[Any, list[Any]]) -> None:
    _, rows = matrix
    missed = [(r.script, r.fault, r.log) for r in rows if not r.detected]
    assert not missed, missed


def test_a_wrong_component_is_never_named_with_high_confidence(
    matrix: tuple[Any, list[Any]],
) -> None:
    _, rows = matrix
    wrong_high = [(r.script, r.fault, r.log, r.component) for r in rows
                  if r.expected != "none" and r.confidence == "high" and not r.right]
    assert not wrong_high, wrong_high


def test_the_component_is_right_for_90_percent_of_pairs(matrix: tuple[Any, list[Any]]) -> None:
    bench, rows = matrix
    s = bench.summarize(rows)
    print("\n" + bench.markdown(rows) + "\n", s)
    assert s["right"] >= 0.9 * s["pairs"], bench.markdown(rows)
    for script in ("tiny_lm", "aug_script"):
        sub = bench.summarize([r for r in rows if r.script == script])
        assert sub["right"] >= 0.9 * sub["pairs"], (script, sub)
    # "unknown" must name what it hesitates between.
    assert all(r.candidates for r in rows if r.component == "unknown")
