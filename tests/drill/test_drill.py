"""End-to-end resume drills: real processes, real checkpoints, the bundled tiny LM.

The clean drill must pass bitwise on CPU; each injected resume bug must fail with the right
diagnosis. W and N are small so one drill takes seconds (most of it process start-up).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from ckptkit.drill.config import DrillConfig, load_config
from ckptkit.drill.runner import cleanup, run_drill
from ckptkit.drill.snapshots import find_checkpoint
from ckptkit.errors import DrillError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parents[1] / "scripts" / "drill_script.py"
TINY = [
    sys.executable,
    "-m",
    "ckptkit.examples.tiny_lm",
    "--steps",
    "40",
    "--save-every",
    "0",
    "--num-seqs",
    "200",
    "--dim",
    "32",
    "--layers",
    "1",
]
W, N = 6, 6


def drill(cmd: list[str], tmp_path: Path, **kw: object) -> object:
    cfg = DrillConfig(
        command=cmd,
        steps_before=W,
        steps_after=N,
        workdir=tmp_path / "drill",
        isolate=True,
        timeout=120,
        **kw,
    )  # type: ignore[arg-type]
    return run_drill(cfg)


def test_clean_tiny_lm_drill_passes_bitwise() -> None:
    rep = run_drill(
        DrillConfig(command=TINY, steps_before=W, steps_after=N, isolate=True, timeout=120)
    )
    assert rep.ok, [c.to_dict() for c in rep.checks]  # type: ignore[attr-defined]
    d = rep.to_dict()  # type: ignore[attr-defined]
    schema = json.loads((ROOT / "schemas" / "drill-report.schema.json").read_text())
    jsonschema.validate(d, schema)
    twin = next(c for c in d["checks"] if c["name"] == "twin")
    assert set(twin["detail"]["modes"].values()) == {"bitwise"}
    assert {"loss", "lr", "rng", "batch_hash", "opt_step", "param_hash"} <= set(
        twin["detail"]["compared"]
    )
    assert d["diagnosis"]["component"] == "none"
    cont = next(c for c in d["checks"] if c["name"] == "continuity")
    assert cont["detail"]["source"] == "lookahead" and cont["ok"]
    o = d["overhead"]
    assert o["total_s"] >= o["training_s"] > 0 and 0 <= o["overhead_fraction"] <= 1
    # A short control restore from the same checkpoint showed the run is bitwise.
    assert [r["role"] for r in d["runs"]] == ["reference", "resumed", "control"]
    assert d["noise_floor"]["source"] == "control" and d["noise_floor"]["deterministic"]
    assert not rep.workdir_kept  # a passing drill removes its temporary runs
    cleanup(rep)
    assert not rep.workdir.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "component"),
    [
        ("no-rng", "rng"),
        ("no-sampler", "sampler"),
        ("no-scheduler", "scheduler"),
        ("no-moments", "optimizer"),
        ("lr-changed", "hyperparameters"),
        ("step-reset", "progress"),
    ],
)
def test_tiny_lm_fault_is_caught_and_diagnosed(tmp_path: Path, fault: str, component: str) -> None:
    rep = drill([*TINY, "--fault", fault], tmp_path)
    assert not rep.ok  # type: ignore[attr-defined]
    diag = rep.diagnosis  # type: ignore[attr-defined]
    assert diag.component == component, diag.evidence
    assert diag.confidence == "high"


@pytest.mark.slow
def test_fake_script_fault_is_diagnosed_and_repeat_measures_noise(tmp_path: Path) -> None:
    rep = drill([sys.executable, str(SCRIPT), "--fault", "no-sampler"], tmp_path, repeat=2)
    assert not rep.ok  # type: ignore[attr-defined]
    assert rep.diagnosis.component == "sampler"  # type: ignore[attr-defined]
    noise = rep.noise  # type: ignore[attr-defined]
    assert noise.measured and noise.deterministic  # CPU, one thread: bitwise reproducible
    roles = [r.role for r in rep.runs]  # type: ignore[attr-defined]
    assert roles == ["reference", "reference", "resumed", "control", "control"]


def test_crash_raises_drill_error_with_the_script_output(tmp_path: Path) -> None:
    with pytest.raises(DrillError, match="boom: simulated crash"):
        drill([sys.executable, str(SCRIPT), "--fault", "crash"], tmp_path)


def test_a_reference_that_dies_after_its_last_step_is_told_apart_from_a_training_crash(
    tmp_path: Path,
) -> None:
    # Trained, recorded and saved to the end, then SIGABRT on the way out: the message says
    # where it died and the fix (a clean end after the last step), not "run to the stop step".
    with pytest.raises(DrillError) as e:
        drill([sys.executable, str(SCRIPT), "--fault", "exit-abort"], tmp_path)
    text = str(e.value)
    assert f"recorded its stop step {W + N}, then exited with status -6" in text, text
    assert "not in training" in text and "ckptkit.collective.leave(0)" in text, text
    assert "runs to the stop step" not in text, text


def test_missing_checkpoint_raises_drill_error(tmp_path: Path) -> None:
    with pytest.raises(DrillError, match="no checkpoint for step 6"):
        drill([sys.executable, str(SCRIPT), "--fault", "no-save"], tmp_path)


def test_bundled_drill_config_loads() -> None:
    cfg = load_config(ROOT / "drills" / "tiny_lm.toml")
    assert cfg.command[:3] == ["python", "-m", "ckptkit.examples.tiny_lm"]
    assert cfg.steps_before >= 1 and cfg.threads == 1 and "noise_factor" in cfg.thresholds
    assert find_checkpoint(ROOT / "nonexistent", 1) is None


@pytest.mark.slow
def test_readme_main_job_bundled_drill_passes_with_a_quiet_window(tmp_path: Path) -> None:
    """What `make demo` runs: the bundled drill passes, and the window check stays quiet."""
    import json
    import subprocess

    out = tmp_path / "drill.json"
    proc = subprocess.run(
        [sys.executable, "-m", "ckptkit", "drill", "--config", str(ROOT / "drills" / "tiny_lm.toml"),
         "-q", "--json", str(out), "--junit", str(tmp_path / "d.xml")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] and checks["twin"]["ok"] and checks["exposure"]["ok"]
    assert checks["window"]["ok"], checks["window"]["detail"]
    assert report["diagnosis"]["component"] == "none"
