"""``ckptkit ls`` and ``ckptkit prune``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.cli import main
from ckptkit.run.manager import CheckpointManager
from ckptkit.storage import atomic


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    ts = ckptkit.TrainState(model=torch.nn.Linear(8, 8))
    with CheckpointManager(tmp_path, keep_last=10) as mgr:
        for s in (10, 20, 30, 40):
            ts.step = s
            mgr.save(ts, pin="best" if s == 20 else None)
    return tmp_path


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return res.exit_code, res.stdout  # warnings go to stderr; JSON is on stdout alone


def test_ls_table(run_dir: Path) -> None:
    code, out = _invoke("ls", str(run_dir))
    assert code == 0
    for col in ("step", "time", "size", "status", "pinned", "health"):
        assert col in out
    assert out.count("verified") >= 4 and "best" in out
    assert "4 checkpoints, 4 verified" in out


def test_ls_json_marks_corrupt_and_incomplete(run_dir: Path) -> None:
    f = run_dir / step_dir_name(40) / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(data)
    (run_dir / step_dir_name(50)).mkdir()  # no manifest: incomplete
    tmp = run_dir / f"{step_dir_name(60)}{atomic.TMP_SUFFIX}.00001111"
    tmp.mkdir()
    code, out = _invoke("ls", str(run_dir), "--json")
    doc = json.loads(out)
    st = {c["step"]: c["status"] for c in doc["checkpoints"]}
    # Without --verify, ls reads no file contents: a same-size bit flip still shows the
    # status recorded when it was last verified, with that time ...
    assert st == {10: "verified", 20: "verified", 30: "verified", 40: "verified", 50: "incomplete"}
    assert all(c["verified_at"] for c in doc["checkpoints"] if c["step"] != 50)
    assert code == 1 and doc["leftovers"] == [str(tmp)]
    assert tmp.exists()  # ls never cleans
    # ... and --verify reads every byte and records what it finds.
    code, out = _invoke("ls", str(run_dir), "--json", "--verify")
    rows = {c["step"]: c for c in json.loads(out)["checkpoints"]}
    assert rows[40]["status"] == "corrupt" and "CK-F003" in rows[40]["problem"]
    assert rows[20]["pins"] == ["best"]
    code, out = _invoke("ls", str(run_dir))
    assert code == 1 and "corrupt" in out


def test_ls_missing_dir_is_usage_error(tmp_path: Path) -> None:
    code, _ = _invoke("ls", str(tmp_path / "nope"))
    assert code == 2
    assert not (tmp_path / "nope").exists()


def test_prune_dry_run_then_real(run_dir: Path) -> None:
    code, out = _invoke("prune", str(run_dir), "--keep-last", "1", "--dry-run")
    assert code == 0
    assert "would delete" in out and "beyond keep_last=1" in out and "pinned best" in out
    assert len(CheckpointManager(run_dir, readonly=True).list()) == 4
    code, out = _invoke("prune", str(run_dir), "--keep-last", "1", "--json")
    doc = json.loads(out)
    gone = sorted(d["step"] for d in doc["decisions"] if not d["keep"])
    assert code == 0 and gone == [10, 30]
    assert [c.step for c in CheckpointManager(run_dir, readonly=True).list()] == [20, 40]


def test_prune_keep_every_and_max_bytes(run_dir: Path) -> None:
    code, out = _invoke(
        "prune",
        str(run_dir),
        "--keep-last",
        "1",
        "--keep-every",
        "30",
        "--max-bytes",
        "1kB",
        "--dry-run",
        "--json",
    )
    doc = json.loads(out)
    by = {d["step"]: d for d in doc["decisions"]}
    assert code == 0
    assert not by[30]["keep"] and "over max_bytes budget" in by[30]["reason"]
    assert by[20]["keep"] and by[40]["keep"]  # pinned, newest verified: never dropped
    assert "cannot be met" in doc["budget_note"]


@pytest.mark.parametrize("bad", ["12XB", "-5", "lots"])
def test_prune_rejects_bad_sizes(run_dir: Path, bad: str) -> None:
    res = CliRunner().invoke(main, ["prune", str(run_dir), "--keep-last", "1", "--max-bytes", bad])
    assert res.exit_code == 2 and "--max-bytes" in res.output
