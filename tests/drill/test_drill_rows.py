"""Order vs content without sample ids: the drill reads the records' batch rows.

Each case drills ``rows_script.py`` (a hand-written loop that logs the loss only: the bound
Recorder fills ``rows``) and checks the diagnosis: the three data-order mistakes name the
sampler, new data names the data version, and new rows from a loader with workers whose
augmentation draws from the global RNG name the workers' RNG. One drill per case, forked.
Before the rows, these were named ``rng (high)`` (shuffle), ``unknown (low)`` (retrain,
chained, content) and ``data-version (medium)`` (workers).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.diagnose import WORKERS_RNG
from ckptkit.drill.runner import run_drill

pytestmark = pytest.mark.integration

SCRIPT = str(Path(__file__).parents[1] / "scripts" / "rows_script.py")

CASES = {
    # case: (W, N, verdict of the rows, component named)
    "shuffle": (3, 4, "order", "sampler"),
    "retrain": (6, 4, "order", "sampler"),
    "chained": (6, 4, "order", "sampler"),
    "content": (6, 6, "content", "data-version"),
    "workers": (3, 3, "content", "rng"),
}


def _drill(case: str, tmp_path: Path) -> dict[str, Any]:
    w, n, _, _ = CASES[case]
    report = run_drill(DrillConfig(command=[sys.executable, SCRIPT, "--case", case],
                                   steps_before=w, steps_after=n, workdir=tmp_path / case,
                                   timeout=120))
    return report.to_dict()


@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_tell_order_from_content(case: str, tmp_path: Path) -> None:
    _, _, verdict, component = CASES[case]
    d = _drill(case, tmp_path)
    assert not d["ok"], d["checks"]
    exposure = next(c for c in d["checks"] if c["name"] == "exposure")
    # The loop logs no sample ids; the README loop's ResumableSampler fills them itself.
    assert exposure["detail"]["basis"] == ("sample_ids" if case == "workers" else "rows")
    assert exposure["detail"]["rows"]["verdict"] == verdict, exposure["detail"]
    diag = d["diagnosis"]
    assert diag["component"] == component, diag
    assert diag["confidence"] != "low", diag  # named, not a guess between candidates
    if case == "workers":
        assert exposure["detail"]["rows"]["num_workers"] == 2
        assert diag["confidence"] in ("medium", "high")
        assert WORKERS_RNG in diag["hint"], diag
        assert any(WORKERS_RNG in line for line in diag["evidence"]), diag


def test_a_lightning_trainer_over_a_plain_shuffled_loader_names_the_sampler(
    tmp_path: Path,
) -> None:
    """The Trainer restarts a plain ``DataLoader(shuffle=True)``'s epoch after a mid-epoch
    resume; the callback's records carry the batch's rows (was ``unknown (low)``)."""
    pytest.importorskip("lightning")
    script = Path(__file__).parents[1] / "scripts" / "lit_tiny.py"
    report = run_drill(DrillConfig(command=[sys.executable, str(script), "--fault",
                                            "plain-shuffle"],
                                   steps_before=3, steps_after=4, isolate=True,
                                   workdir=tmp_path / "lit", timeout=300))
    d = report.to_dict()
    assert not d["ok"]
    exposure = next(c for c in d["checks"] if c["name"] == "exposure")
    assert exposure["detail"]["rows"]["verdict"] == "order", exposure["detail"]
    assert d["diagnosis"]["component"] == "sampler", d["diagnosis"]
