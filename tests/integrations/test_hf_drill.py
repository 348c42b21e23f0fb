"""Resume drills of a Trainer script and an Accelerate script, each with only the documented
lines added (``scripts/hf_*_train.py``): real processes, the frameworks' own checkpoints
(found through the run layout, read through the adopted manifest), no native copy.

Clean runs pass bitwise on CPU mid-epoch and across an epoch boundary; each fault seeded
through the framework (``--fault``) fails with the component named. By default one clean
drill and one fault per framework run; the rest of the matrix is ``slow``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.report import DrillReport
from ckptkit.drill.runner import run_drill

pytestmark = pytest.mark.integration

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("torchdata")

SCRIPTS = Path(__file__).parents[1] / "scripts"
TRAINER = [sys.executable, str(SCRIPTS / "hf_trainer_train.py"), "--steps", "30"]
ACCEL = [sys.executable, str(SCRIPTS / "hf_accelerate_train.py"), "--steps", "30"]
CLASSIFIER = [sys.executable, str(SCRIPTS / "hf_trainer_classifier.py")]
"""A differently written Trainer script: BERT classifier, gradient accumulation 2, 5 steps
an epoch, no saves of its own (the drill's save only)."""
PER_EPOCH = 11
"""Optimizer steps per epoch in both scripts (44 samples, batch 4)."""


def drill(cmd: list[str], tmp_path: Path, *, w: int, n: int = 4) -> DrillReport:
    return run_drill(DrillConfig(command=cmd, steps_before=w, steps_after=n,
                                 workdir=tmp_path / "drill", isolate=True, timeout=180))


def assert_bitwise(rep: DrillReport) -> None:
    checks = {c.name: c for c in rep.checks}
    assert rep.ok, rep.diagnosis.to_dict()
    twin = checks["twin"].detail
    assert checks["twin"].statistic == 0
    assert set(twin["modes"].values()) == {"bitwise"}, twin["modes"]
    for f in ("loss", "lr", "opt_step", "rng", "batch_hash"):
        assert f in twin["compared"], twin["compared"]
    # The records carry a hash per batch row, equal in both runs.
    assert checks["exposure"].detail["rows"]["verdict"] == "equal", checks["exposure"].detail
    # The drill resumed the framework's own folder, through its adopted manifest.
    assert rep.checkpoint is not None and rep.checkpoint.name.startswith("checkpoint")
    assert (rep.checkpoint / "ckptkit-manifest.json").is_file()
    assert not (rep.checkpoint / "manifest.json").exists()
    ref, res = rep.reference.summary, rep.resumed.summary
    assert ref and res and ref["param_hash"] == res["param_hash"]


def diagnosis(rep: DrillReport) -> tuple[int, str, str]:
    d = rep.diagnosis
    return rep.exit_code, d.component, d.confidence


# --- default: one clean drill and one fault per framework ---------------------------------------


def test_trainer_drill_passes_bitwise_across_an_epoch_boundary(tmp_path: Path) -> None:
    # Saved mid-epoch (step 9 of 11), resumed into the next epoch (steps 10..13).
    assert_bitwise(drill(TRAINER, tmp_path, w=PER_EPOCH - 2))


def test_trainer_without_optimizer_file_is_refused_and_named(tmp_path: Path) -> None:
    # The Trainer alone resumes silently with fresh Adam moments (and a restarted schedule).
    rep = drill([*TRAINER, "--fault", "no-optimizer"], tmp_path, w=PER_EPOCH - 2)
    assert diagnosis(rep) == (1, "optimizer", "high")
    assert "optimizer.pt" in rep.diagnosis.evidence[0]


def test_accelerate_stateful_drill_passes_bitwise_across_an_epoch_boundary(
    tmp_path: Path,
) -> None:
    rep = drill([*ACCEL, "--loader", "stateful"], tmp_path, w=PER_EPOCH - 2)
    assert_bitwise(rep)
    assert "cursor" in next(c for c in rep.checks if c.name == "twin").detail["compared"]


def test_accelerate_changed_lr_is_named(tmp_path: Path) -> None:
    rep = drill([*ACCEL, "--fault", "lr-changed"], tmp_path, w=PER_EPOCH - 2)
    assert diagnosis(rep) == (1, "hyperparameters", "high")


# --- the matrix (slow) ----------------------------------------------------------------------------

CLEAN: list[tuple[str, list[str], int]] = [
    ("trainer-mid-epoch", TRAINER, PER_EPOCH + 3),
    ("trainer-at-epoch-end", TRAINER, PER_EPOCH),
    ("accelerate-stateful-mid-epoch", [*ACCEL, "--loader", "stateful"], PER_EPOCH + 3),
    ("accelerate-stateful-at-epoch-end", [*ACCEL, "--loader", "stateful"], PER_EPOCH),
    ("accelerate-plain-mid-epoch", [*ACCEL, "--loader", "plain"], PER_EPOCH + 3),
    ("accelerate-plain-across-epochs", [*ACCEL, "--loader", "plain"], PER_EPOCH - 2),
    ("accelerate-plain-at-epoch-end", [*ACCEL, "--loader", "plain"], PER_EPOCH),
    # A save every step with keep-last 3: checkpoint-W would be rotated away before the
    # drill's (once a second) layout scan; the callback pins it for the drill.
    ("trainer-rotating-every-step", [*TRAINER, "--save-steps", "1"], PER_EPOCH - 2),
    ("classifier-grad-accum-across-epochs", CLASSIFIER, 6),
    # Gradient accumulation 2 over 12 micro-batches: 6 optimizer steps an epoch; saved at
    # step 5, resumed across the epoch boundary.
    ("accelerate-stateful-grad-accum",
     [*ACCEL, "--loader", "stateful", "--grad-accum", "2", "--samples", "48"], 5),
    ("accelerate-plain-grad-accum",
     [*ACCEL, "--loader", "plain", "--grad-accum", "2", "--samples", "48"], 5),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "cmd", "w"), CLEAN, ids=[c[0] for c in CLEAN])
def test_clean_drills_pass_bitwise(name: str, cmd: list[str], w: int, tmp_path: Path) -> None:
    assert_bitwise(drill(cmd, tmp_path, w=w))


FAULTS: list[tuple[str, list[str], str, tuple[str, ...]]] = [
    # (id, command, component named, confidences accepted)
    ("trainer-no-scheduler", [*TRAINER, "--fault", "no-scheduler"], "scheduler", ("high",)),
    ("trainer-no-rng", [*TRAINER, "--fault", "no-rng"], "rng", ("high",)),
    ("trainer-data-version", [*TRAINER, "--fault", "data-version"], "data-version", ("high",)),
    ("trainer-lr-changed", [*TRAINER, "--fault", "lr-changed"], "hyperparameters", ("high",)),
    # Without ckptkit's verify the Trainer loads optimizer and scheduler only as a pair: with
    # either file missing both restart (LR and optimizer step count together), so the drill
    # names the optimizer with the scheduler as the other candidate.
    ("trainer-unverified-no-optimizer",
     [*TRAINER, "--fault", "no-optimizer", "--unverified"], "optimizer", ("medium",)),
    ("trainer-unverified-no-scheduler",
     [*TRAINER, "--fault", "no-scheduler", "--unverified"], "optimizer", ("medium",)),
    ("trainer-unverified-no-rng", [*TRAINER, "--fault", "no-rng", "--unverified"], "rng",
     ("high",)),
    ("accelerate-no-optimizer", [*ACCEL, "--fault", "no-optimizer"], "optimizer", ("high",)),
    ("accelerate-no-scheduler", [*ACCEL, "--fault", "no-scheduler"], "scheduler", ("high",)),
    ("accelerate-no-rng", [*ACCEL, "--fault", "no-rng"], "rng", ("high",)),
    ("accelerate-data-version", [*ACCEL, "--fault", "data-version"], "data-version", ("high",)),
    ("accelerate-plain-no-skip", [*ACCEL, "--loader", "plain", "--fault", "no-skip"],
     "sampler", ("medium", "high")),
    ("accelerate-unseeded-loader", [*ACCEL, "--fault", "unseeded-loader"], "rng", ("high",)),
    ("accelerate-stateful-not-seedable", [*ACCEL, "--fault", "not-seedable"], "sampler",
     ("medium", "high")),
    ("accelerate-plain-not-seedable", [*ACCEL, "--loader", "plain", "--fault", "not-seedable"],
     "sampler", ("medium", "high")),
]


FAULTS += [
    ("classifier-data-version", [*CLASSIFIER, "--fault", "data-version"], "data-version",
     ("high",)),
    ("classifier-unverified-no-rng", [*CLASSIFIER, "--fault", "no-rng"], "rng", ("high",)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "cmd", "component", "confidence"), FAULTS,
                         ids=[f[0] for f in FAULTS])
def test_seeded_faults_are_named(
    name: str, cmd: list[str], component: str, confidence: tuple[str, ...], tmp_path: Path
) -> None:
    rep = drill(cmd, tmp_path, w=PER_EPOCH + 2)
    code, comp, conf = diagnosis(rep)
    detail: Any = rep.diagnosis.to_dict()
    assert (code, comp) == (1, component), detail
    assert conf in confidence, detail
    if conf == "medium":
        assert component in detail["candidates"] and len(detail["candidates"]) <= 2, detail


@pytest.mark.slow
@pytest.mark.distributed
def test_trainer_ddp_two_processes_drill_passes_bitwise(tmp_path: Path) -> None:
    # torchrun, gloo on CPU: every rank writes rng_state_<rank>.pth, rank 0 adopts them all
    # (after a barrier) and records the steps; the resumed run verifies before loading.
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", *TRAINER[1:]]
    rep = drill(cmd, tmp_path, w=6)
    assert_bitwise(rep)
    assert rep.checkpoint is not None
    assert {p.name for p in rep.checkpoint.glob("rng_state_*.pth")} == {
        "rng_state_0.pth", "rng_state_1.pth"}
