"""tools/diagnosis_table.py without drilling: how a cell reads, and --check on stale rows.

The drills themselves run in tests/drill/test_diagnosis_table.py (slow); here the tool
renders given rows, so the fast lane covers its judgement of a cell and its --check exit.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOL = Path(__file__).resolve().parents[2] / "tools" / "diagnosis_table.py"


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("diagnosis_table_unit", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their module
    spec.loader.exec_module(mod)
    return mod


def _row(fault: str, expected: str, component: str, confidence: str, candidates: list[str],
         log: str = "busy") -> dict[str, Any]:
    return {"script": "s", "fault": fault, "log": log, "expected": expected, "detected": True,
            "component": component, "confidence": confidence, "candidates": candidates,
            "seconds": 1.0}


def test_a_cell_is_right_hedged_or_wrong_and_the_summary_counts_them() -> None:
    tool = _tool()
    rows = [tool.Row(**r) for r in (
        _row("a", "sampler", "sampler", "high", []),
        _row("b", "sampler", "unknown", "low", ["sampler", "rng"]),
        _row("c", "sampler", "rng", "high", []),
        _row("d", "sampler", "unknown", "low", ["rng", "data-version"]),
    )]
    assert [(r.right, r.hedged, r.wrong) for r in rows] == [
        (True, False, False), (False, True, False), (False, False, True), (False, False, True)]
    text = tool.section(rows)
    assert "| s | b | sampler | unknown (low) [sampler, rng] |" in text
    assert "| s | c | sampler | **rng (high)** |" in text  # a wrong name stands out
    s = tool.summarize(rows)
    assert (s["right"], s["unknown_with_right_candidate"], s["wrong"], s["wrong_high"]) == (
        1, 1, 2, 1)


def test_check_fails_when_the_docs_table_is_not_the_rows_one(tmp_path: Path) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"rows": [_row("x", "rng", "rng", "high", [])]}))
    r = subprocess.run([sys.executable, str(TOOL), "--check", "--rows", str(rows)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "stale" in r.stderr and "tools/diagnosis_table.py" in r.stderr
