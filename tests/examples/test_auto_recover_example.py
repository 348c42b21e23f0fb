"""The bundled example shows automatic recovery (issue 18 item 4), in real processes.

``python -m ckptkit.examples.tiny_lm --fault lr-spike`` diverges; with ``--auto-recover``
the manager rolls back to the newest healthy checkpoint, lowers the LR and continues, and
the run ends within 10 % of a clean run's final loss with at least one recorded recovery.
The three runs start together (about 40 s of CPU each); the model is the example's
with a smaller width so the test stays in budget (the watch keeps its defaults).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptkit.checkpoint import manifest_io
from ckptkit.signals import recovery as rc

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SIZE = ["--dim", "32", "--max-len", "32", "--log", "minimal"]


def _start(tmp: Path, name: str, args: list[str]) -> tuple[subprocess.Popen[str], Path]:
    d = tmp / name
    cmd = [sys.executable, "-m", "ckptkit.examples.tiny_lm", *args, *SIZE,
           "--ckpt-dir", str(d / "ckpt"), "--metrics", str(d / "metrics.jsonl")]
    env = {**os.environ, "CKPTKIT_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), d


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("auto_recover")
    started = {
        "clean": _start(tmp, "clean", ["--fault", "none", "--steps", "1500", "--watch"]),
        "spike": _start(tmp, "spike", ["--fault", "lr-spike"]),
        "recover": _start(tmp, "recover", ["--fault", "lr-spike", "--auto-recover"]),
    }
    out: dict[str, Any] = {}
    for name, (proc, d) in started.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{name} failed:\n{stderr[-3000:]}"
        out[name] = {"summary": json.loads(stdout.strip().splitlines()[-1]), "dir": d,
                     "stderr": stderr}
    return out


def test_without_recovery_the_spike_diverges(runs: dict[str, Any]) -> None:
    clean = runs["clean"]["summary"]["final_loss_avg"]
    spiked = runs["spike"]["summary"]["final_loss_avg"]
    assert not math.isfinite(spiked) or spiked > 1.5 * clean, (spiked, clean)
    assert runs["spike"]["summary"]["recoveries"] == []


def test_auto_recover_ends_within_10_percent_of_a_clean_run(runs: dict[str, Any]) -> None:
    clean = runs["clean"]["summary"]["final_loss_avg"]
    rec = runs["recover"]["summary"]
    assert rec["final_step"] == 1500
    assert abs(rec["final_loss_avg"] - clean) <= 0.10 * clean, (rec["final_loss_avg"], clean)
    assert len(rec["recoveries"]) >= 1
    for r in rec["recoveries"]:
        assert r["restored"] < r["first_warning"] <= r["detected_at"]
        assert r["detect_to_resume_s"] > 0
    assert "tiny_lm: recovery #1 at step" in runs["recover"]["stderr"]


def test_the_recoveries_are_recorded_in_the_run(runs: dict[str, Any]) -> None:
    root = runs["recover"]["dir"] / "ckpt"
    n = len(runs["recover"]["summary"]["recoveries"])
    log = rc.read_log(root)
    assert len(log["recoveries"]) == n and log["refusals"] == []
    first = log["recoveries"][0]
    assert first["restored"]["checkpoint"].startswith("step-")
    assert first["trigger"]["signals"] and first["actions"]["lr"]["applied"]
    newest = max(root.glob("step-*"))
    man = manifest_io.read(newest)
    assert man.recoveries is not None and man.recoveries["count"] == n
    assert man.recoveries["lr_scale"] == pytest.approx(0.3**n)
