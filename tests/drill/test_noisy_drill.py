"""Drills of a script whose runs are not bitwise (GPU-like gradient noise, noisy_script.py).

Clean drills pass with default options and with ``--repeat 2``; a weight-only fault under
noise fails naming ``model`` and the tensors that moved; a script that seeds only torch is
told which generator it does not seed. ``benchmarks/noisy_drills.py`` runs many of each.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.report import DrillReport
from ckptkit.drill.runner import cleanup, run_drill

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "noisy_script.py"
W, N = 6, 6


def drill(tmp_path: Path, *, eps: float, repeat: int = 1, fault: str = "",
          seed: str = "all") -> tuple[DrillReport, dict[str, Any]]:
    rep = run_drill(DrillConfig(
        command=[sys.executable, str(SCRIPT)], steps_before=W, steps_after=N, repeat=repeat,
        workdir=tmp_path / "drill", isolate=True, timeout=120,
        env={"NOISY_EPS": str(eps), "NOISY_FAULT": fault, "NOISY_SEED": seed},
    ))
    return rep, rep.to_dict()


def check(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in d["checks"] if c["name"] == name)


@pytest.mark.parametrize("eps", [1e-7, 1e-5])
def test_a_clean_noisy_drill_passes_with_default_options(tmp_path: Path, eps: float) -> None:
    rep, d = drill(tmp_path, eps=eps)
    assert rep.ok, [c for c in d["checks"] if not c["ok"]]
    noise = d["noise_floor"]
    # Detected with one reference (a short control segment from W), then measured.
    assert noise["source"] == "control" and not noise["deterministic"]
    assert "not bitwise reproducible" in noise["action"]
    assert noise["control_steps"] == N and noise["per_step"]["grad_norm"]
    # The first control showed noise, so a second one ran after it: three restores, three
    # differences per step (one pair's difference alone failed 1 in 40 clean drills).
    assert noise["controls"] == 2
    assert [r["role"] for r in d["runs"]].count("control") == 2
    twin = check(d, "twin")
    assert "per step" in twin["detail"]["modes"]["loss"]
    assert twin["detail"]["modes"]["batch_hash"] == "bitwise"  # inputs stay bitwise
    # Measured from W, the tolerance is tight: far below the loss's own scale.
    assert max(twin["detail"]["per_step_tolerances"]["loss"]) < 1e-3
    cleanup(rep)


@pytest.mark.parametrize("eps", [pytest.param(1e-7, marks=pytest.mark.slow), 1e-5])
def test_a_clean_noisy_drill_passes_with_repeat_2(tmp_path: Path, eps: float) -> None:
    rep, d = drill(tmp_path, eps=eps, repeat=2)
    assert rep.ok, [c for c in d["checks"] if not c["ok"]]
    assert d["noise_floor"]["controls"] == 2
    assert [r["role"] for r in d["runs"]].count("control") >= 2
    cleanup(rep)


def test_a_stale_layer_under_noise_is_named_model_with_its_tensors(tmp_path: Path) -> None:
    rep, d = drill(tmp_path, eps=1e-5, fault="stale-layer")
    assert not rep.ok
    assert (d["diagnosis"]["component"], d["diagnosis"]["confidence"]) == ("model", "high")
    assert any("CK-D092" in e and "(2.weight, 2.bias)" in e
               for e in d["diagnosis"]["evidence"]), d["diagnosis"]
    twin = check(d, "twin")
    # The first resumed step is computed from the restored weights: it differs there,
    # where two restores of the same checkpoint agree to a few ulps.
    assert twin["detail"]["first_divergence"]["step"] == W + 1
    moved = [m["tensor"] for m in check(d, "end_state")["detail"]["moved"]
             if m["tensor"].startswith("model/")]
    assert moved[:2] and set(moved[:2]) == {"model/2.weight", "model/2.bias"}
    assert any(e.startswith("end state: model tensors beyond the noise, farthest first: 2.")
               for e in d["diagnosis"]["evidence"]), d["diagnosis"]
    cleanup(rep)


def test_a_script_seeding_only_torch_is_told_pythons_random_is_not_seeded(
    tmp_path: Path,
) -> None:
    rep, d = drill(tmp_path, eps=0.0, repeat=2, seed="torch")
    # The resume restores every generator: it is exact, and judged bitwise.
    assert rep.ok, [c for c in d["checks"] if not c["ok"]]
    noise = d["noise_floor"]
    assert noise["deterministic"] and "rng" in noise["reference_noisy_fields"]
    assert [g["name"] for g in noise["generators"]] == ["python"]
    assert "Python's `random` is not seeded by the script" in noise["action"]
    assert "random.seed(SEED)" in noise["action"]
    cleanup(rep)
