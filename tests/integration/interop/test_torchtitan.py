"""torchtitan 0.3.0's own ``CheckpointManager`` with the ckptkit integration: saves carry
manifests, the step loaded is the newest that verifies (plain torchtitan takes a truncated
or flipped newest step), and ``ckptkit ls / verify / prune / rollback`` read its
``checkpoint/step-N`` folders.

The training runs in a subprocess (``scripts/titan_train.py``: torchtitan's real
checkpointer, optimizer and LR-scheduler containers and ``ParallelAwareDataloader`` on a
small ``nn.Module``, a gloo world of one); one run is trained and every case works on a
copy of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ckptkit.cli import main
from ckptkit.layouts.torchtitan import open_torchtitan

pytest.importorskip("torchtitan")

SCRIPT = Path(__file__).parent / "scripts" / "titan_train.py"


def titan(*args: str | Path) -> tuple[list[dict[str, Any]], str]:
    """Run the script; its JSON lines and its stderr."""
    p = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")], p.stderr


def cli(*args: str | Path) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, str]]:
    """Steps 2 and 4 (full) and 5 (the last: model-only, torchtitan's default), saved by
    the integration; the model digest at each save."""
    dump = tmp_path_factory.mktemp("titan") / "dump"
    lines, _ = titan("--manager", "ckptkit", "train", dump, "--steps", "5", "--interval", "2")
    return dump, {x["saved"]: x["digest"] for x in lines}


def damaged(src: Path, dst: Path, how: str) -> Path:
    """A copy of the run stopped after step 4 (no last step), whose step 4 is damaged."""
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "checkpoint" / "step-5")
    for step in (4, 2) if how == "both" else (4,):
        shard = dst / "checkpoint" / f"step-{step}" / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        if how == "truncated":
            shard.write_bytes(bytes(data[: len(data) // 2]))  # a crash or a full disk
        else:
            data[len(data) // 3] ^= 0x01  # one flipped bit, sizes unchanged
            shard.write_bytes(bytes(data))
    return dst


def test_saves_carry_manifests_that_ls_and_verify_read(trained: tuple[Path, dict[int, str]]) -> None:
    dump, saved = trained
    assert sorted(saved) == [2, 4, 5]
    for step in saved:
        assert (dump / "checkpoint" / f"step-{step}" / "ckptkit-manifest.json").is_file()
    doc = json.loads(cli("ls", dump, "--json").output)
    assert doc["layout"] == "torchtitan"
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == [
        (2, "verified"), (4, "verified"), (5, "verified")]
    r = cli("verify", dump)
    assert r.exit_code == 0, r.output


def test_integration_falls_back_past_a_damaged_newest_step_plain_torchtitan_does_not(
    trained: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    src, saved = trained
    cut = damaged(src, tmp_path / "cut", "truncated")
    flip = damaged(src, tmp_path / "flip", "flipped")
    gone = damaged(src, tmp_path / "gone", "both")

    plain, _ = titan("--manager", "torchtitan", "load", cut, flip)
    assert [x["chosen"] for x in plain] == [4, 4]  # .metadata is all torchtitan asks for
    assert plain[1]["loaded"] == 4 and plain[1]["error"] is None  # the flipped bit loads silently

    ours, err = titan("--manager", "ckptkit", "load", cut, flip, gone)
    for x in ours[:2]:
        assert (x["chosen"], x["loaded"], x["error"]) == (2, 2, None), x
        assert x["digest"] == saved[2]  # step 2's weights, bit for bit
    assert "loading step-2, the newest step that verifies, instead of step-4" in err
    assert "CK-F00" in err  # the finding that passed step 4 over is named
    assert ours[2]["loaded"] is None and "no step of this checkpoint folder verifies" in ours[2]["error"]


def test_prune_and_rollback_work_on_the_step_folders(
    trained: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(trained[0], dump)
    r = cli("rollback", dump)
    assert r.exit_code == 0, r.output
    assert "step-5" in r.output and "checkpoint.load_step=5" in r.output
    with open_torchtitan(dump / "checkpoint", readonly=False):  # a training run holds the lock
        assert cli("prune", dump, "--keep-last", "1").exit_code == 2
    r = cli("prune", dump, "--keep-last", "1")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (dump / "checkpoint").iterdir() if p.is_dir()) == ["step-5"]
