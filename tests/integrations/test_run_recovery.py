"""Issue 24: a kill between a framework's save and its adoption is recovered loudly and right.

Every layout goes through one :class:`ckptkit.run.Run`: the settle step (verify, adopt,
record, rotate), an intent record before an Accelerate ``save_state`` (its
``checkpoint_I`` counts saves, not steps), and ``resume_target`` (the newest complete
state, adopted on the spot). Reproductions of the issue:

* Accelerate, killed after ``save_state`` wrote ``checkpoint_1`` (step 80), before its
  adoption: the restart resumed ``checkpoint_0`` (step 40) silently, ``ls`` showed the
  step-80 state as step 1, ``prune --dry-run`` planned to delete it, ``ckptkit adopt RUN``
  rewrote ``checkpoint_0``'s step, and a state whose step nobody knew was resumed at 0.
* Trainer and Lightning/Fabric: the newest complete but unadopted checkpoint is adopted on
  the spot (Fabric resumed the older adopted one without a word).
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
import torch

from ckptkit import crashpoints
from ckptkit.checkpoint.catalog import INDEX
from ckptkit.run import directory as runs
from ckptkit.verify.foreign.adopt import adopted_path

pytestmark = pytest.mark.integration

pytest.importorskip("accelerate")

SCRIPT = Path(__file__).parents[1] / "scripts" / "acc_steps.py"
TIMEOUT = 300


def train(project: Path, *, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTKIT_")}
    if crash_at is not None:
        env[crashpoints.ENV] = crash_at
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--project-dir", str(project)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )


def ckptkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "ckptkit", *args],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def listed(ckpts: Path) -> dict[str, tuple[int, str]]:
    proc = ckptkit("ls", str(ckpts), "--json")
    doc = json.loads(proc.stdout)
    return {Path(c["path"]).name: (c["step"], c["status"]) for c in doc["checkpoints"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run: 120 steps, saves at 40, 80 and 120."""
    return result(train(tmp_path_factory.mktemp("ref") / "proj"))


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed after ``save_state`` wrote ``checkpoint_1`` (step 80), before adoption."""
    project = tmp_path_factory.mktemp("killed") / "proj"
    proc = train(project, crash_at="settle.begin@2")
    assert proc.returncode == crashpoints.EXIT_CODE, proc.stderr[-3000:]
    ckpts = project / "checkpoints"
    assert (ckpts / "checkpoint_1").is_dir()
    assert not adopted_path(ckpts / "checkpoint_1").exists()  # killed before its adoption
    return project


def copy(project: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "proj"
    shutil.copytree(project, dst)
    return dst


def test_ls_and_prune_see_the_unadopted_checkpoint_at_its_real_step(
    killed: Path, tmp_path: Path
) -> None:
    ckpts = copy(killed, tmp_path) / "checkpoints"
    assert listed(ckpts) == {
        "checkpoint_0": (40, "verified"),
        "checkpoint_1": (80, "committed"),  # not adopted yet, at the step its intent says
    }
    plan = json.loads(
        ckptkit("prune", str(ckpts), "--keep-last", "1", "--dry-run", "--json").stdout
    )
    decisions = {d["step"]: (d["keep"], d["reason"]) for d in plan["decisions"]}
    assert decisions[80][0], decisions  # the newest work is never planned for deletion


def test_the_restart_resumes_the_newest_state_at_its_step_bitwise(
    killed: Path, tmp_path: Path, reference: dict[str, Any]
) -> None:
    project = copy(killed, tmp_path)
    proc = train(project)
    out = result(proc)
    assert out["resumed"] == 80, proc.stderr[-2000:]
    assert "never adopted" in proc.stderr  # said aloud: adopted on the spot
    assert out["weights"] == reference["weights"]  # the uninterrupted run, bitwise
    assert listed(project / "checkpoints")["checkpoint_1"] == (80, "verified")


def test_adopt_run_never_rewrites_a_recorded_step(killed: Path, tmp_path: Path) -> None:
    ckpts = copy(killed, tmp_path) / "checkpoints"
    proc = ckptkit("adopt", str(ckpts))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert listed(ckpts) == {"checkpoint_0": (40, "verified"), "checkpoint_1": (80, "verified")}
    clash = ckptkit("adopt", "--step", "7", str(ckpts / "checkpoint_0"))
    assert clash.returncode == 2
    assert "adopted at step 40" in clash.stderr and "step 7" in clash.stderr
    assert listed(ckpts)["checkpoint_0"] == (40, "verified")


def test_a_checkpoint_of_unknown_step_is_refused_with_the_fix(
    killed: Path, tmp_path: Path, reference: dict[str, Any]
) -> None:
    project = copy(killed, tmp_path)
    ckpts = project / "checkpoints"
    index = project / INDEX  # the run index lives in the project dir, beside checkpoints/
    doc = json.loads(index.read_text())
    del doc["intents"]  # as if written by a version that kept no intent record
    index.write_text(json.dumps(doc))
    assert listed(ckpts)["checkpoint_1"] == (1, "unreadable")  # never deleted, never resumed
    proc = train(project)
    assert proc.returncode != 0
    assert f"ckptkit adopt --step N {ckpts / 'checkpoint_1'}" in proc.stderr
    assert "its step is unknown" in proc.stderr and "never resumed with the step counter at 0" in proc.stderr
    fix = ckptkit("adopt", "--step", "80", str(ckpts / "checkpoint_1"))
    assert fix.returncode == 0, fix.stdout + fix.stderr
    out = result(train(project))
    assert out["resumed"] == 80 and out["weights"] == reference["weights"]


# --- Trainer and Lightning/Fabric, in process ------------------------------------------------


def test_trainer_resume_adopts_the_unadopted_newest_checkpoint(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from ckptkit.integrations.hf import CkptkitCallback, resume_checkpoint

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            x = torch.randint(0, 32, (4,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": x, "labels": x}

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=4)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, save_steps=2,
        per_device_train_batch_size=4, report_to=[], use_cpu=True, disable_tqdm=True,
    )
    transformers.logging.set_verbosity_error()
    transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=args,
                         train_dataset=Tokens(), callbacks=[CkptkitCallback()]).train()
    newest = tmp_path / "out" / "checkpoint-4"
    adopted_path(newest).unlink()  # what a kill at settle.begin leaves
    assert resume_checkpoint(tmp_path / "out") == str(newest)
    assert adopted_path(newest).is_file()  # verified and adopted on the spot
    run = runs.open_run(tmp_path / "out")
    assert [(c.step, c.status) for c in run.checkpoints()] == [(2, "verified"), (4, "verified")]


def test_fabric_resumes_the_unadopted_newest_file(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from ckptkit.integrations.lightning import FabricCheckpoints

    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = FabricCheckpoints(fabric, tmp_path, keep_last=3)
    ck.save(2, {"model": model, "optimizer": opt, "step": 2})
    # Step 4 written by Lightning's own writer: a kill after its files, before adoption.
    TorchCheckpointIO().save_checkpoint(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 4},
        tmp_path / "step=4.ckpt",
    )
    ck.close()
    ck = FabricCheckpoints(fabric, tmp_path, keep_last=3)
    try:
        assert ck.resume({"model": model, "optimizer": opt})["step"] == 4
    finally:
        ck.close()
    assert adopted_path(tmp_path / "step=4.ckpt").is_file()  # adopted on the spot
    # The Lightning Trainer's twin: what to pass as fit(ckpt_path=...).
    from ckptkit.integrations.lightning import resume_checkpoint

    assert resume_checkpoint(tmp_path) == str(tmp_path / "step=4.ckpt")
