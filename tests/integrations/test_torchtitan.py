"""torchtitan 0.3.0's own ``CheckpointManager`` with the ckptkit integration: saves carry
manifests, the step loaded is the newest full step that verifies (plain torchtitan takes a
truncated or flipped newest step, and its default model-only last step, whose full-state
load fails), the run lock is held while it trains, ``ckptkit ls / verify / prune /
rollback`` read its ``checkpoint/step-N`` folders and ``ckptkit drill`` drills it.

The training runs in a subprocess (``scripts/titan_train.py``: torchtitan's real
checkpointer, optimizer and LR-scheduler containers and ``ParallelAwareDataloader`` on a
small ``nn.Module``, a gloo world of one); one run is trained and every case works on a
copy of it. Subprocesses importing torchtitan are slow to start: the loads of every case
share one.
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

from ckptkit.checkpoint.dcp import read_manifest
from ckptkit.cli import main
from ckptkit.run.layouts.torchtitan import open_torchtitan

pytestmark = pytest.mark.integration

pytest.importorskip("torchtitan")

SCRIPT = Path(__file__).parents[1] / "scripts" / "titan_train.py"


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
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Steps 2 and 4 (full) and 5 (the last: model-only, torchtitan's default), saved by
    the integration, with ``ckptkit prune`` tried after the first save; the script's lines."""
    dump = tmp_path_factory.mktemp("titan") / "dump"
    lines, _ = titan(
        "--manager", "ckptkit", "train", dump, "--steps", "5", "--interval", "2", "--probe-prune"
    )
    return dump, lines


@pytest.fixture(scope="module")
def trained(trained_run: tuple[Path, list[dict[str, Any]]]) -> tuple[Path, dict[int, str]]:
    """The trained run and the model digest at each save."""
    dump, lines = trained_run
    return dump, {x["saved"]: x["digest"] for x in lines if "saved" in x}


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


def test_saves_carry_manifests_that_ls_and_verify_read(
    trained: tuple[Path, dict[int, str]], trained_run: tuple[Path, list[dict[str, Any]]]
) -> None:
    dump, saved = trained
    assert sorted(saved) == [2, 4, 5]
    lrs = {x["saved"]: x["lr"] for x in trained_run[1] if "saved" in x}
    for step in saved:
        assert (dump / "checkpoint" / f"step-{step}" / "ckptkit-manifest.json").is_file()
        # The look-ahead of the step (the resume guard's): the LR its next step uses.
        la = read_manifest(dump / "checkpoint" / f"step-{step}").lookahead["guard"]
        assert (la["next_step"], la["lr"], la["opt_step"]) == (step + 1, lrs[step], step), la
    doc = json.loads(cli("ls", dump, "--json").output)
    assert doc["layout"] == "torchtitan"
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == [
        (2, "verified"), (4, "verified"), (5, "verified")]
    r = cli("verify", dump)
    assert r.exit_code == 0, r.output


def test_an_empty_step_folder_is_an_interrupted_titan_save_not_a_native_run(
    trained: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    # torchtitan creates step-N/ before it writes into it: killed right then, the folder
    # is empty. Before: counted as an interrupted native save, the folder opened as a
    # native ckptkit run.
    dump = tmp_path / "dump"
    shutil.copytree(trained[0], dump)
    (dump / "checkpoint" / "step-6").mkdir()
    r = cli("ls", dump / "checkpoint", "--json")
    assert r.exit_code == 1, r.output  # a run with an incomplete checkpoint
    doc = json.loads(r.output)
    assert doc["layout"] == "torchtitan"
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]][-2:] == [
        (5, "verified"), (6, "incomplete")]


def test_training_holds_the_run_lock_until_close(
    trained_run: tuple[Path, list[dict[str, Any]]]
) -> None:
    dump, lines = trained_run
    (probe,) = [x for x in lines if "prune_rc" in x]
    # ckptkit prune, run while torchtitan trained (after its first save), was refused.
    assert probe["prune_rc"] == 2 and "locked by pid" in probe["prune_err"], probe
    with open_torchtitan(dump / "checkpoint", readonly=False):
        pass  # released at close: a writer may open the run now


def test_every_rank_sees_the_checkpoint_folder_before_its_first_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchtitan's load chooses a step (a collective: rank 0 chooses, the others are told)
    # only when the folder exists. Before: only rank 0's run lock created it, so rank 1's
    # first load could skip the choice rank 0 made, and the ranks locked up at the next
    # collective (tests/integrations/test_titan_ranks.py, under load).
    from ckptkit.integrations import torchtitan as integration

    monkeypatch.setattr(integration, "_rank", lambda: 1)
    cfg = integration.CheckpointManager.Config(enable=True, folder="checkpoint", interval=2)
    ck = cfg.build(
        dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={},
        sd_adapter=None, base_folder=str(tmp_path),
    )
    assert (tmp_path / "checkpoint").is_dir()
    assert ck._run is None  # rank 0 alone holds the run lock
    ck.close()


def test_integration_falls_back_past_a_damaged_or_model_only_newest_step_plain_torchtitan_does_not(
    trained: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    src, saved = trained
    cut = damaged(src, tmp_path / "cut", "truncated")
    flip = damaged(src, tmp_path / "flip", "flipped")
    gone = damaged(src, tmp_path / "gone", "both")
    finished = tmp_path / "finished"  # as trained: the newest step, 5, holds the model only
    shutil.copytree(src, finished)

    plain, _ = titan("--manager", "torchtitan", "load", cut, flip, finished)
    assert [x["chosen"] for x in plain] == [4, 4, 5]  # .metadata is all torchtitan asks for
    assert plain[1]["loaded"] == 4 and plain[1]["error"] is None  # the flipped bit loads silently
    assert plain[2]["loaded"] is None and "CheckpointException" in plain[2]["error"]
    assert plain[1]["rng_moved"]  # its load draws from the global generator

    # The last dump again, its LR set by hand after the load: the resume guard says so.
    ours, err = titan(
        "--manager", "ckptkit", "load", cut, flip, gone, finished, finished, "--set-lr", "4", "0.5"
    )
    for x in ours[:2]:
        assert (x["chosen"], x["loaded"], x["error"]) == (2, 2, None), x
        assert x["digest"] == saved[2]  # step 2's weights, bit for bit
        assert not x["rng_moved"]  # the load leaves the generators as it found them
        assert x["guard"] == []  # resumed as saved: the guard has nothing to say
    assert ours[3]["guard"] == [] and ours[4]["guard"] == ["CK-D003"], ours[3:]
    assert "the first resumed step uses LR [0.5]" in err
    assert "loading step-2, the newest full step that verifies, instead of step-4" in err
    assert "CK-F00" in err  # the finding that passed step 4 over is named
    assert ours[2]["loaded"] is None
    assert "no step of this checkpoint folder verifies as a full training state" in ours[2]["error"]
    assert (ours[3]["chosen"], ours[3]["loaded"], ours[3]["error"]) == (4, 4, None), ours[3]
    assert ours[3]["digest"] == saved[4]
    assert "instead of step-5: holds the model only (torchtitan's last_save_model_only)" in err


def test_ckptkit_drill_drills_the_titan_script(tmp_path: Path) -> None:
    # Nothing of ckptkit in the script but the integration: it sends the checkpoints to
    # the drill's folder, saves at W, stops at W+N, resumes the drill's copy of step W and
    # records each step. ("--manager=ckptkit" in one word: the drill makes an argument that
    # names an existing path absolute, and ./ckptkit is one here.)
    cmd = [sys.executable, str(SCRIPT), "--manager=ckptkit", "train", "out", "--steps", "100",
           "--interval", "100"]
    p = subprocess.run(
        [sys.executable, "-m", "ckptkit", "drill", "-W", "2", "-N", "2", "--isolate",
         "--timeout", "240", "--workdir", str(tmp_path / "drill"), "--json", "-", "--", *cmd],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads(p.stdout[p.stdout.index("{"):])
    assert rep["ok"]
    twin = next(c for c in rep["checks"] if c["name"] == "twin")
    assert twin["statistic"] == 0 and {"rng", "lr", "opt_step", "batch_hash"} <= set(twin["detail"]["compared"])
    es = next(c for c in rep["checks"] if c["name"] == "end_state")
    assert es["ok"] and not es["skipped"], es["detail"]
    # the final step is model-only (torchtitan's last_save_model_only): its model, read from DCP
    assert "model" in es["detail"]["compared"] and not es["detail"]["not_compared_state"], es["detail"]
    assert Path(rep["checkpoint"]).name == "step-2"  # torchtitan's own step folder, copied
    assert (Path(rep["checkpoint"]) / "ckptkit-manifest.json").is_file()


def test_prune_and_rollback_work_on_the_step_folders(
    trained: tuple[Path, dict[int, str]], tmp_path: Path
) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(trained[0], dump)
    r = cli("rollback", dump)  # the newest good step is the model-only last one: said so
    assert r.exit_code == 0, r.output
    assert "step-5 holds the model only (last_save_model_only)" in r.output
    shutil.rmtree(dump / "checkpoint" / "step-5")
    r = cli("rollback", dump)  # a full step: torchtitan's own setting to resume from it
    assert r.exit_code == 0, r.output
    assert "step-4" in r.output and "checkpoint.load_step=4" in r.output
    with open_torchtitan(dump / "checkpoint", readonly=False):  # a training run holds the lock
        assert cli("prune", dump, "--keep-last", "1").exit_code == 2
    r = cli("prune", dump, "--keep-last", "1")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (dump / "checkpoint").iterdir() if p.is_dir()) == ["step-4"]
