"""``ckptkit ls / prune / rollback / adopt / verify RUN`` on a real Trainer output directory and
a real Accelerate project directory, with the native exit codes."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from ckptkit.cli import main
from ckptkit.run.layouts.hf import open_hf

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from ckptkit.integrations.hf import AccelerateCheckpoints, CkptkitCallback  # noqa: E402

pytestmark = pytest.mark.integration


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


def trainer_run(out: Path, callbacks: list[Any]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                      n_positions=8)
        args = transformers.TrainingArguments(
            output_dir=str(out), max_steps=6, save_steps=2, per_device_train_batch_size=4,
            report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=args,
                             train_dataset=Tokens(), callbacks=callbacks).train()
    return out


@pytest.fixture(scope="module")
def adopted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trainer_run(tmp_path_factory.mktemp("a") / "out", [CkptkitCallback()])


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run without ckptkit: the Trainer's folders only."""
    return trainer_run(tmp_path_factory.mktemp("p") / "out", [])


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def copy(src: Path, tmp_path: Path) -> Path:
    shutil.copytree(src, tmp_path / "out")
    return tmp_path / "out"


def test_ls_lists_the_trainer_run_and_fails_on_damage(adopted: Path, tmp_path: Path) -> None:
    r = cli("ls", str(adopted))
    assert r.exit_code == 0, r.output
    assert "3 checkpoints, 3 verified" in r.output and "(hf-trainer run)" in r.output
    doc = json.loads(cli("ls", str(adopted), "--json").output)
    assert doc["layout"] == "hf-trainer"
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == [
        (2, "verified"), (4, "verified"), (6, "verified")]
    out = copy(adopted, tmp_path)
    (out / "checkpoint-6" / "trainer_state.json").unlink()
    (out / "checkpoint-4" / "scheduler.pt").write_bytes(b"")
    r = cli("ls", str(out))
    assert r.exit_code == 1 and "incomplete" in r.output and "corrupt" in r.output


def test_ls_verify_finds_a_flipped_bit_and_records_it(adopted: Path, tmp_path: Path) -> None:
    out = copy(adopted, tmp_path)
    w = out / "checkpoint-6" / "model.safetensors"
    b = bytearray(w.read_bytes())
    b[-2] ^= 0x10
    w.write_bytes(bytes(b))
    assert cli("ls", str(out)).exit_code == 0  # sizes agree: only the bytes tell
    r = cli("ls", str(out), "--verify")
    assert r.exit_code == 1 and "CK-F003" in r.output
    assert cli("ls", str(out)).exit_code == 1  # recorded in the run index


def test_prune_deletes_through_the_layout_and_respects_a_live_run(
    adopted: Path, tmp_path: Path
) -> None:
    out = copy(adopted, tmp_path)
    with open_hf(out, "hf-trainer", readonly=False):  # a training run holds the lock
        r = CliRunner().invoke(main, ["prune", str(out), "--keep-last", "1"])
        assert r.exit_code == 2, r.output
    r = cli("prune", str(out), "--keep-last", "1")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["checkpoint-6"]


def test_rollback_names_the_trainer_call(adopted: Path) -> None:
    r = cli("rollback", str(adopted))
    assert r.exit_code == 0, r.output
    assert "trainer.train(resume_from_checkpoint=" in r.output and "checkpoint-6" in r.output


def test_adopt_run_dir_then_verify_run_dir(plain: Path, tmp_path: Path) -> None:
    out = copy(plain, tmp_path)
    doc = json.loads(cli("ls", str(out), "--json").output)
    assert {c["status"] for c in doc["checkpoints"]} == {"committed"}
    r = cli("adopt", str(out))
    assert r.exit_code == 0, r.output
    assert all((out / f"checkpoint-{s}" / "ckptkit-manifest.json").is_file() for s in (2, 4, 6))
    assert "3 checkpoints, 3 verified" in cli("ls", str(out)).output
    (out / "checkpoint-2" / "optimizer.pt").unlink()
    r = cli("verify", str(out))
    assert r.exit_code == 1 and "CK-F001" in r.output


def test_ls_and_prune_an_accelerate_project(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = accelerate.Accelerator(cpu=True, project_config=accelerate.utils.ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True))
        m = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m, opt = acc.prepare(m, opt)
        ck = AccelerateCheckpoints(acc, m, opt)
        for step in (5, 10, 15):
            acc.backward(m(torch.ones(1, 2)).sum())
            opt.step()
            ck.save(step)
        ck.close()
    doc = json.loads(cli("ls", str(project), "--json").output)
    assert doc["layout"] == "accelerate"
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == [
        (5, "verified"), (10, "verified"), (15, "verified")]
    # verify PROJECT_DIR verifies each checkpoint of the layout (not the directory itself)
    r = cli("verify", str(project), "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)["reports"]) == 3
    r = cli("prune", str(project / "checkpoints"), "--keep-last", "2")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (project / "checkpoints").iterdir() if p.is_dir()) == [
        "checkpoint_1", "checkpoint_2"]
    assert "load_state" in cli("rollback", str(project)).output
