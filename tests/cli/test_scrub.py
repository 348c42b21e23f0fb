"""``ckptkit scrub``: bit rot in a kept checkpoint, found from the bytes and recorded.

The run's checkpoints are verified at save. Then bits flip in two of them (the newest and
a middle one) with their sizes kept: ``ls`` still lists them verified (it checks sizes, not
bytes), rollback picks the rotted newest and retention would keep the rotted middle one as
one of its good ones while deleting the only good older one. A scrub reads every byte
again and records what it found; from then on all of them see it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.run import retain
from ckptkit.run.directory import listing, open_run
from ckptkit.run.directory import rollback as pick
from ckptkit.run.scrub import Since, scrub

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "ckptkit", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )


def _state(step: int) -> ckptkit.TrainState:
    torch.manual_seed(step)
    return ckptkit.TrainState(model=torch.nn.Linear(8, 4), step=step)


def _run(root: Path, steps: tuple[int, ...]) -> None:
    with ckptkit.CheckpointManager(root) as mgr:
        for s in steps:
            mgr.save(_state(s))


def _flip(ckpt: Path) -> None:
    """Flip one bit of the model's last byte: same size, same mtime order, other bytes."""
    f = ckpt / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x01
    f.write_bytes(data)


def _status(root: Path) -> dict[int, str]:
    return {c.step: c.status for c in listing(open_run(root))}


def test_bit_rot_found_by_scrub_is_seen_by_ls_retention_rollback_and_restore(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    _run(root, (1, 2, 3))
    for s in (2, 3):
        _flip(root / step_dir_name(s))
    # Before the scrub: the index still vouches for the rotted bytes.
    assert _status(root) == {1: "verified", 2: "verified", 3: "verified"}
    assert pick(root).checkpoint.step == 3  # type: ignore[union-attr]
    policy = retain.Policy(keep_last=2)
    before = open_run(root).plan(policy)
    assert [c.step for c in before.delete] == [1]  # would delete the one good checkpoint

    done = _cli("scrub", str(root), "--json")
    assert done.returncode == 1, done.stderr
    rep: dict[str, Any] = json.loads(done.stdout)
    by_step = {c["step"]: c for c in rep["checked"]}
    assert [s for s, c in by_step.items() if c["went_bad"]] == [2, 3]
    assert all(c["recorded"] for c in by_step.values()) and rep["not_recorded"] is None
    assert by_step[3]["findings"][0]["code"] == codes.F003
    assert rep["latest"] == step_dir_name(1)

    assert _status(root) == {1: "verified", 2: "corrupt", 3: "corrupt"}
    assert (root / "latest").read_text().strip() == step_dir_name(1)
    roll = _cli("rollback", str(root), "--json")
    assert roll.returncode == 0 and json.loads(roll.stdout)["checkpoint"]["step"] == 1
    after = open_run(root).plan(policy)
    assert after.delete == []  # the rotted ones are not counted as good
    assert 1 in {c.step for c in after.keep}
    with ckptkit.CheckpointManager(root) as mgr:
        got = mgr.restore(_state(0))
    assert got is not None and got.step == 1


def test_scrub_while_a_training_run_holds_the_lock_reports_and_records_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    _run(root, (1, 2))
    _flip(root / step_dir_name(2))
    with ckptkit.CheckpointManager(root):  # a live writer: holds the run lock
        done = _cli("scrub", str(root))
        assert done.returncode == 1, done.stderr
        assert "went bad since it was verified" in done.stdout
        assert "not recorded" in done.stdout and f"pid {os.getpid()}" in done.stdout
        assert _status(root)[2] == "verified"  # the writer's index is untouched
    assert _status(root)[2] == "verified"


def test_since_selects_by_step_or_recency(tmp_path: Path) -> None:
    root = tmp_path / "run"
    _run(root, (1, 2, 3))
    rep = scrub(open_run(root, readonly=False), since=Since(step=2))
    assert [c.step for c in rep.checked] == [2, 3] and rep.ok
    assert rep.skipped == [f"{step_dir_name(1)}: outside --since"]
    rep = scrub(open_run(root, readonly=False), since=Since(seconds=3600.0))
    assert [c.step for c in rep.checked] == [1, 2, 3]  # all saved within the hour
    bad = _cli("scrub", str(root), "--since", "yesterday")
    assert bad.returncode == 2 and "neither a step nor a duration" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    ("text", "step", "seconds"),
    [("5000", 5000, None), ("90m", None, 5400.0), ("1.5h", None, 5400.0), ("2w", None, 1209600.0)],
)
def test_since_parse(text: str, step: int | None, seconds: float | None) -> None:
    assert Since.parse(text) == Since(step=step, seconds=seconds)
