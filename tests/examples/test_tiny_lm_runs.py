"""Running a documented ``tiny_lm`` command twice in one directory is never a silent no-op.

Before, every invocation without ``--ckpt-dir`` shared ``runs/tiny_lm/ckpt``: the second of
docs/stability.md's two commands resumed the first one's final checkpoint (health
``critical``), trained nothing and printed ``final_loss_avg 0.0`` without a word. Now each
invocation gets its own ``runs/tiny_lm/run-NNN``, ``--resume`` continues the newest, and a
resume says what it resumed, when that checkpoint's health is not ok, and when nothing is
left to train. Under a drill, ``$CKPTKIT_CKPT_DIR`` is used as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ckptkit.examples import tiny_lm

pytestmark = pytest.mark.integration

SMALL = ["--steps", "4", "--save-every", "2", "--dim", "16", "--layers", "1",
         "--num-seqs", "64", "--max-len", "16", "--batch-size", "4"]


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ckptkit.examples.tiny_lm", *SMALL, *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "CKPTKIT_NO_PROGRESS": "1", **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_each_invocation_is_a_new_run_and_resume_says_so(tmp_path: Path) -> None:
    first, err1 = _run(tmp_path)
    second, err2 = _run(tmp_path)
    assert "new run" in err1 and "runs/tiny_lm/run-001/ckpt" in err1
    assert "new run" in err2 and "runs/tiny_lm/run-002/ckpt" in err2
    assert first["resumed_from"] is None and second["resumed_from"] is None
    assert first["final_step"] == second["final_step"] == 4
    assert first["param_hash"] == second["param_hash"]  # the same run, trained twice
    assert (tmp_path / "runs/tiny_lm/run-002/ckpt/step-00000004/manifest.json").is_file()

    again, err = _run(tmp_path, "--resume")
    assert "continuing runs/tiny_lm/run-002/ckpt" in err
    assert "resumed from" in err and "at step 4" in err
    assert "nothing to train" in err and again["resumed_from"] == 4
    assert not (tmp_path / "runs/tiny_lm/run-003").exists()

    named, err = _run(tmp_path, "--ckpt-dir", "mine", "--steps", "6")
    assert named["resumed_from"] is None and "new run" not in err
    more, err = _run(tmp_path, "--ckpt-dir", "mine", "--steps", "8")
    assert more["resumed_from"] == 6 and more["final_step"] == 8
    assert "resumed from" in err and "nothing to train" not in err


def test_a_drill_checkpoint_dir_is_used_as_is(tmp_path: Path) -> None:
    summary, err = _run(tmp_path, env={"CKPTKIT_CKPT_DIR": str(tmp_path / "drill-ckpt")})
    assert summary["final_step"] == 4 and "new run" not in err
    assert (tmp_path / "drill-ckpt" / "step-00000004").is_dir()
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("level", ["critical", "warning"])
def test_resuming_an_unhealthy_checkpoint_is_said(
    level: str, capsys: pytest.CaptureFixture[str]
) -> None:
    health = {"level": level, "signals": {"loss.zscore": {}, "grad_norm.zscore": {}}}
    restored = SimpleNamespace(path="runs/x/ckpt/step-00001500", step=1500,
                               manifest=SimpleNamespace(health=health))
    tiny_lm.say_resumed(restored, stop=1500)
    err = capsys.readouterr().err
    assert f"recorded health is {level} (grad_norm.zscore, loss.zscore)" in err
    assert "ckptkit rollback runs/x/ckpt" in err and "nothing to train" in err


def test_resuming_a_healthy_checkpoint_says_only_where(capsys: pytest.CaptureFixture[str]) -> None:
    restored = SimpleNamespace(path="c/step-00000010", step=10,
                               manifest=SimpleNamespace(health={"level": "ok"}))
    tiny_lm.say_resumed(restored, stop=20)
    assert capsys.readouterr().err == "tiny_lm: resumed from c/step-00000010 at step 10\n"
