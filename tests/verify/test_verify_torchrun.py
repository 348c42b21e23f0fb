"""``torchrun -m ckptkit verify PATH --torchrun`` on real gloo ranks: the report and the exit
status of a single-process verify, on a good checkpoint and on a run of damaged ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _launch import TIMEOUT, _port
from damaged_run import make_damaged_run

import ckptkit

pytestmark = [pytest.mark.integration, pytest.mark.distributed]


def _json(out: str) -> dict[str, Any]:
    rep: dict[str, Any] = json.loads(out)
    for r in rep["reports"]:
        r.pop("seconds")
    return rep


def _verify(*cmd: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPTKIT_NO_PROGRESS": "1"}
    p = subprocess.run(
        [sys.executable, *cmd, "--json"], capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    return p.returncode, _json(p.stdout) if p.stdout.strip() else {}, p.stderr


def _torchrun(path: Path, world: int) -> tuple[int, dict[str, Any], str]:
    return _verify(
        "-m", "torch.distributed.run", "--nproc-per-node", str(world),
        "--master-port", str(_port()), "-m", "ckptkit", "verify", str(path), "--torchrun",
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_damaged_run(tmp_path_factory.mktemp("torchrun-verify") / "run")


def test_torchrun_verify_of_a_good_checkpoint_exits_0_with_the_same_report(run: Path) -> None:
    good = run / "step-00000001"
    code, ranked, err = _torchrun(good, 2)
    single_code, single, _ = _verify("-m", "ckptkit", "verify", str(good))
    assert (code, single_code) == (0, 0), err
    assert ranked == single and single["reports"][0]["files_checked"] == 7


def test_torchrun_verify_of_damaged_checkpoints_exits_1_with_the_same_report(run: Path) -> None:
    code, ranked, err = _torchrun(run, 2)
    single_code, single, _ = _verify("-m", "ckptkit", "verify", str(run))
    assert (code, single_code) == (1, 1), err
    assert ranked == single
    assert len(ranked["reports"]) == 7 and not ranked["ok"]
    # torchrun prints its own traceback for a job that exits non-zero; no rank crashed
    assert str(Path(ckptkit.__file__).parent) not in err, "a verdict, not a crash of a rank"
