"""``ckptkit diff A B``: text and --json, on native, adopted and foreign checkpoints.

Real processes (``python -m ckptkit diff``); the checkpoints are real files in tmp_path: a
native run of two steps saved by the manager, a plain ``torch.save`` file, and a copy of it
adopted (digests beside it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jsonschema
import pytest
import torch

import ckptkit
from ckptkit.verify.foreign.adopt import adopt_checkpoint
from ckptkit.verify.statediff import Tolerance, diff

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schemas" / "diff-report.schema.json").read_text())


def ckptkit_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptkit", "diff", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("diff")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[100])
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, step=1,
                            extra={"ema": ema})
    out: dict[str, Path] = {}
    with ckptkit.CheckpointManager(d / "run") as mgr:
        for step in (1, 2):
            model(torch.randn(3, 4)).square().mean().backward()
            opt.step()
            sched.step()
            ts.step = step
            out[f"native{step}"] = mgr.save(ts)  # type: ignore[assignment]
    # The EMA did not move between the saves: only the trained parts differ.
    for name in ("a", "b"):
        sd = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 2}
        if name == "b":
            sd["model"] = {k: v + 0.5 if k == "2.bias" else v for k, v in sd["model"].items()}
        torch.save(sd, d / f"{name}.pt")
    shutil.copy(d / "a.pt", d / "adopted.pt")
    assert adopt_checkpoint(d / "adopted.pt").refused is None
    return {**out, "a": d / "a.pt", "b": d / "b.pt", "adopted": d / "adopted.pt"}


def test_native_text_names_what_differs(ckpts: dict[str, Path]) -> None:
    r = ckptkit_cli(ckpts["native1"], ckpts["native2"], "--top", "3")
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("A  ") and "step 1" in lines[0] and "step 2" in lines[1]
    assert any(line.startswith("≠ model") for line in lines)
    assert any(line.startswith("= ema") for line in lines)  # an extra is its own component
    assert any("state_dict/last_epoch: 1 → 2" in line for line in lines)
    assert "moved most (relative L2 change):" in lines
    assert lines[-1].startswith("DIFFERENT: model, optimizer, scheduler")


def test_native_json_validates_and_filters_components(ckpts: dict[str, Path]) -> None:
    r = ckptkit_cli(ckpts["native1"], ckpts["native2"], "--json", "--component", "ema",
                    "--component", "scheduler")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert [c["name"] for c in doc["components"]] == ["scheduler", "ema"]
    assert doc["different"] == ["scheduler"] and doc["a"]["step"] == 1
    ema = doc["components"][1]
    assert ema["equal"] and all(t["bitwise"] for t in ema["tensors"])


def test_adopted_against_foreign_json_and_text(ckpts: dict[str, Path]) -> None:
    # adopted (verified against its digests) vs a plain torch.save file: one tensor moved
    r = ckptkit_cli(ckpts["adopted"], ckpts["b"], "--json", "--top", "1")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert (doc["a"]["format"], doc["b"]["format"]) == ("torch-save", "torch-save")
    assert doc["different"] == ["model"]
    top = doc["moved_most"]
    assert [t["path"] for t in top] == ["model/model/2.bias"] and top[0]["max_abs"] == pytest.approx(0.5, abs=1e-6)
    # equal within a tolerance that covers it; a damaged adopted file cannot be compared
    assert diff(ckpts["adopted"], ckpts["b"], tolerance=Tolerance(atol=0.6)).equal
    raw = bytearray(ckpts["adopted"].read_bytes())
    raw[-30] ^= 0xFF
    bad = ckpts["adopted"].with_name("bad.pt")
    bad.write_bytes(raw)
    shutil.copy(ckpts["adopted"].with_name("adopted.pt.ckptkit-manifest.json"),
                bad.with_name("bad.pt.ckptkit-manifest.json"))
    r = ckptkit_cli(ckpts["a"], bad)
    assert r.returncode == 2 and "bad.pt" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def dcp_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """DCP checkpoints in pairs that differ only in the optimizer's state: written by
    ``ckptkit.dcp.save`` (a manifest), by a native ``TrainState(storage="dcp")``, and by a
    plain ``dcp.save`` in torchtitan's layout (no manifest; the model's parameters
    flattened to the top level beside ``optimizer``)."""
    import torch.distributed.checkpoint as dcp

    import ckptkit.checkpoint.dcp

    d = tmp_path_factory.mktemp("dcp")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    out: dict[str, Path] = {}
    ts = ckptkit.TrainState(model=model, optimizer=opt, storage="dcp", step=1)
    with ckptkit.CheckpointManager(d / "run") as mgr:
        for name in ("a", "b"):
            if name == "b":
                opt.state[model.bias]["exp_avg"][1] += 0.25  # one element of one moment
            sd = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            ckptkit.dcp.save(sd, d / f"writer-{name}", step=1)
            out[f"native-{name}"] = mgr.save(ts, step=1 if name == "a" else 2)  # type: ignore[assignment]
            titan = {**model.state_dict(), "optimizer": opt.state_dict()}
            with warnings.catch_warnings():  # DCP: no process group, a world of one
                warnings.simplefilter("ignore")
                dcp.save(titan, checkpoint_id=d / f"titan-{name}" / "step-1")
    out.update({f"writer-{n}": d / f"writer-{n}" for n in "ab"})
    out.update({f"titan-{n}": d / f"titan-{n}" / "step-1" for n in "ab"})
    for n in "ab":  # a Trainer folder whose FSDP state Accelerate saved with DCP
        hf = d / f"hf-{n}" / "checkpoint-1"
        shutil.copytree(out[f"titan-{n}"], hf / "pytorch_model_fsdp_0")
        (hf / "trainer_state.json").write_text('{"global_step": 1}')
        out[f"hf-{n}"] = hf
    return out


def test_dcp_directories_are_read_item_by_item(dcp_ckpts: dict[str, Path]) -> None:
    # Every item of every .distcp, keyed by its state-dict name: the one changed moment
    # element is found, whichever way the directory was written.
    for kind in ("writer", "native", "titan"):
        sd = diff(dcp_ckpts[f"{kind}-a"], dcp_ckpts[f"{kind}-b"])
        assert sd.complete and [c.name for c in sd.different] == ["optimizer"], (kind, sd.to_dict())
        model = sd.component("model")
        assert model is not None and model.equal and {t.path for t in model.tensors} == {"weight", "bias"}
        [moved] = sd.moved_most(5)
        assert moved.path.startswith("optimizer/state/") and moved.path.endswith("/exp_avg")
        assert moved.max_abs == pytest.approx(0.25)
        opt = sd.component("optimizer")
        assert opt is not None and any(v.path == "param_groups/0/lr" and v.a == 0.1 for v in opt.values)
        assert diff(dcp_ckpts[f"{kind}-a"], dcp_ckpts[f"{kind}-a"]).equal
    # DCP inside a Trainer folder: read the same way, placed under its folder
    sd = diff(dcp_ckpts["hf-a"], dcp_ckpts["hf-b"])
    assert sd.complete and [c.name for c in sd.different] == ["optimizer"], sd.to_dict()
    [moved] = sd.moved_most(5)
    assert moved.path.startswith("optimizer/pytorch_model_fsdp_0:state/")


def test_dcp_diff_cli_and_a_damaged_shard(dcp_ckpts: dict[str, Path], tmp_path: Path) -> None:
    r = ckptkit_cli(dcp_ckpts["writer-a"], dcp_ckpts["writer-b"], "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert doc["different"] == ["optimizer"] and doc["complete"]
    assert (doc["a"]["format"], doc["a"]["step"]) == ("dcp", 1)
    # One flipped byte in a shard the manifest vouches for: cannot be compared, named.
    bad = tmp_path / "bad"
    shutil.copytree(dcp_ckpts["writer-b"], bad)
    shard = next(bad.glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(raw)
    with pytest.raises(ckptkit.CkptkitError) as e:
        diff(dcp_ckpts["writer-a"], bad)
    assert e.value.code == "CK-F003" and shard.name in str(e.value)
