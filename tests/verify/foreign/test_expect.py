"""Weights-only and inference checkpoints: ``verify --expect weights|training``.

``torch.save(model.state_dict())``, a ``.safetensors`` file and a ``save_pretrained``
folder are not training checkpoints that lost everything: verify infers "weights" when
that is all they hold (CK-C011) and exits 0 when they are clean; ``--expect training``
says what a resume would lack. The expectation also works on native checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.cli import main
from ckptkit.errors import CkptkitError

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))


SCHEMA = json.loads(
    (Path(__file__).resolve().parents[3] / "schemas" / "verify-report.schema.json").read_text()
)


def _verify_json(path: Path, *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    r = CliRunner().invoke(main, ["verify", str(path), "--json", *args], catch_exceptions=False)
    out = json.loads(r.output)
    jsonschema.Draft202012Validator(SCHEMA).validate(out)  # expect, how, found, evidence
    return r.exit_code, out["reports"][0]


def _weights_files(tmp: Path) -> dict[str, Path]:
    from safetensors.torch import save_file

    sd = _model().state_dict()
    torch.save(sd, tmp / "model.pt")
    save_file(sd, str(tmp / "model.safetensors"))
    return {"torch-save": tmp / "model.pt", "safetensors": tmp / "model.safetensors"}


@pytest.mark.parametrize("fmt", ["torch-save", "safetensors"])
def test_clean_weights_file_exits_0_as_weights(tmp_path: Path, fmt: str) -> None:
    p = _weights_files(tmp_path)[fmt]
    code, rep = _verify_json(p)
    assert code == 0 and rep["format"] == fmt
    assert rep["expect"] == {"as": "weights", "source": "inferred", "why": rep["expect"]["why"]}
    assert "model tensors" in rep["expect"]["why"]
    assert rep["components"]["model"]["present"] and rep["components"]["model"]["required"]
    assert not any(c["required"] for n, c in rep["components"].items() if n != "model")
    codes = [f["code"] for f in rep["findings"]]
    assert "CK-C011" in codes and not {"CK-C001", "CK-C002", "CK-C103"} & set(codes)


@pytest.mark.parametrize("fmt", ["torch-save", "safetensors"])
def test_training_expectation_on_weights_says_what_is_missing(tmp_path: Path, fmt: str) -> None:
    p = _weights_files(tmp_path)[fmt]
    code, rep = _verify_json(p, "--expect", "training")
    assert code == 1 and rep["expect"]["as"] == "training" and rep["expect"]["source"] == "given"
    missing = {f["component"] for f in rep["findings"] if f["code"] == "CK-C001"}
    assert missing == {"optimizer", "progress"}
    assert rep["components"]["optimizer"]["reason"]  # what a resume without it does
    r = CliRunner().invoke(main, ["verify", str(p), "--expect", "training"], catch_exceptions=False)
    assert r.exit_code == 1 and "optimizer state is required" in r.output


def test_library_expect(tmp_path: Path) -> None:
    p = _weights_files(tmp_path)["torch-save"]
    assert ckptkit.verify(p).ok
    assert ckptkit.verify(p, expect="weights").ok
    res = ckptkit.verify(p, expect="training")
    assert not res.ok and res.reports[0].expect == "training"
    with pytest.raises(CkptkitError, match="unknown expectation"):
        ckptkit.verify(p, expect="inference")  # type: ignore[arg-type]


def test_save_pretrained_folder(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "pretrained")
    code, rep = _verify_json(tmp_path / "pretrained")
    assert code == 0 and rep["format"] == "safetensors" and rep["expect"]["as"] == "weights"
    assert rep["components"]["model"]["where"] == ["model.safetensors"]
    assert not [f for f in rep["findings"] if f["code"] == "CK-C104"]  # config.json is known


def test_training_checkpoint_is_not_excused(tmp_path: Path) -> None:
    """Anything of a training run makes it a training checkpoint: gaps stay errors."""
    sd = _model().state_dict()
    torch.save({"model": sd, "epoch": 3}, tmp_path / "ck.pt")
    code, rep = _verify_json(tmp_path / "ck.pt")
    assert code == 1 and rep["expect"]["as"] == "training"
    assert {f["component"] for f in rep["findings"] if f["code"] == "CK-C001"} == {"optimizer"}
    code, rep = _verify_json(tmp_path / "ck.pt", "--expect", "weights")
    assert code == 0 and rep["expect"] == {"as": "weights", "source": "given", "why": ""}


def test_lightning_weights_only_needs_the_flag(lightning_ckpts: dict[str, Path]) -> None:
    """A Lightning save_weights_only file keeps global_step: training unless told."""
    code, rep = _verify_json(lightning_ckpts["weights"])
    assert code == 1 and rep["expect"]["as"] == "training"
    code, rep = _verify_json(lightning_ckpts["weights"], "--expect", "weights")
    assert code == 0


def test_native_expectations(tmp_path: Path) -> None:
    m = _model()
    ckptkit.save({"model": m.state_dict()}, tmp_path / "plain")
    assert ckptkit.verify(tmp_path / "plain").ok  # a plain save requires nothing
    code, _ = _verify_json(tmp_path / "plain", "--expect", "training")
    assert code == 1
    res = ckptkit.verify(tmp_path / "plain", expect="training")
    rep = res.reports[0]
    assert not res.ok
    assert {f.component for f in rep.findings if f.code == "CK-C001"} == {"optimizer", "progress"}
    assert rep.components["optimizer"].required and rep.to_dict()["expect"]["source"] == "given"
    # A TrainState checkpoint checked as weights: its recorded requirements are set aside.
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mgr = ckptkit.CheckpointManager(tmp_path / "run", verify_after_save=False)
    mgr.save(ckptkit.TrainState(model=m, optimizer=opt, step=1))
    mgr.close()
    (step,) = (tmp_path / "run").glob("step-*")
    assert ckptkit.verify(step).ok
    res = ckptkit.verify(step, expect="weights")
    assert res.ok
    assert [n for n, c in res.reports[0].components.items() if c.required] == ["model"]
