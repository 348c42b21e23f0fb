"""Hand-rolled ``torch.save`` checkpoints are recognised by the shape of their content.

Several differently written scripts keep the same state under different names and depths;
each must get the complete component table, every component located, and a guess shown
as a guess ("inferred from structure at X", CK-C012) rather than as a find. Content that
only *looks* named (``"optimizer": "adamw"`` in a config) is never taken for state, and
nothing native is read as foreign.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit.cli import main
from ckptkit.verify.foreign.report import verify_foreign
from ckptkit.verify.foreign.structure import recognise

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]

TRAINING = ("model", "optimizer", "scheduler", "rng", "sampler", "progress")


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    for _ in range(3):
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return {"m": m.state_dict(), "o": opt.state_dict(), "s": sched.state_dict()}


def _rng() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _layouts() -> dict[str, tuple[dict[str, Any], dict[str, tuple[str, str]]]]:
    """Checkpoint dict → {component: (where after 'ck.pt:', how)} expected."""
    s = _state()
    return {
        # The example: data cursor under "data", parallel sizes under "dist".
        "flat-conventional": (
            {
                "model": s["m"], "optim": s["o"], "sched": s["s"], "step": 3,
                "data": {"epoch": 0, "batch_idx": 3, "samples_seen": 6, "seed": 0},
                "dist": {"world_size": 4, "tp": 2, "pp": 1, "dp": 2},
                "rng": _rng(),
            },
            {
                "model": ("model", "found"), "optimizer": ("optim", "found"),
                "scheduler": ("sched", "found"), "progress": ("step", "found"),
                "sampler": ("data", "found"), "parallel": ("dist", "found"),
                "rng": ("rng", "found"),
            },
        ),
        # Nested under a trainer object, odd names for optimizer and RNG.
        "nested-trainer": (
            {
                "net": s["m"],
                "trainer": {"adam": s["o"], "lr_sched": s["s"], "counters": {"global_step": 3, "epoch": 0}},
                "loader": {"epoch": 0, "index": 6, "seed": 0},
                "topology": {"world_size": 1, "rank": 0},
                "random": {"cpu": torch.get_rng_state(), "np": np.random.get_state()},
            },
            {
                "model": ("net", "found"), "optimizer": ("trainer/adam", "inferred"),
                "scheduler": ("trainer/lr_sched", "found"),
                "progress": ("trainer/counters", "found"), "sampler": ("loader", "found"),
                "parallel": ("topology", "found"), "rng": ("random", "inferred"),
            },
        ),
        # Everything in one opaque "state" bag; a list of generator states.
        "state-bag": (
            {
                "weights": s["m"],
                "state": {"o": s["o"], "s": s["s"], "pos": {"epoch": 0, "consumed": 6}},
                "iter_num": 3,
                "gens": [torch.get_rng_state()],
                "parallel_config": {"world": 1, "tp_size": 1},
            },
            {
                "model": ("weights", "found"), "optimizer": ("state/o", "inferred"),
                "scheduler": ("state/s", "inferred"), "sampler": ("state/pos", "inferred"),
                "progress": ("iter_num", "found"), "rng": ("gens", "inferred"),
                "parallel": ("parallel_config", "found"),
            },
        ),
        # A torchdata StatefulDataLoader state and a train_state holding the step.
        "stateful-loader": (
            {
                "model_state_dict": s["m"],
                "optimizer_state_dict": s["o"],
                "scheduler_state_dict": s["s"],
                "train_state": {"step": torch.tensor(3), "tokens_seen": 96},
                "dataloader": {"_num_yielded": 3, "_sampler_iter_yielded": 3,
                               "_iterator_finished": False},
                "rng_states": [_rng()],
            },
            {
                "model": ("model_state_dict", "found"),
                "optimizer": ("optimizer_state_dict", "found"),
                "scheduler": ("scheduler_state_dict", "found"),
                "progress": ("train_state", "found"), "sampler": ("dataloader", "found"),
                "rng": ("rng_states", "found"),
            },
        ),
    }


@pytest.mark.parametrize("name", list(_layouts()))
def test_hand_rolled_layouts_are_complete(tmp_path: Path, name: str) -> None:
    ck, expected = _layouts()[name]
    p = tmp_path / "ck.pt"
    torch.save(ck, p)
    rep = verify_foreign(p)
    assert rep.ok, [f.message for f in rep.errors]
    assert rep.step == 3 and rep.expect == "training"
    codes = {f.code for f in rep.findings}
    # Before: "sampler missing, parallel missing" (CK-C102, CK-C104 for data/dist).
    assert not codes & {"CK-C001", "CK-C002", "CK-C103", "CK-C104"}, rep.findings
    for comp, (where, how) in expected.items():
        c = rep.components[comp]
        assert c.present and c.where == (f"ck.pt:{where}",), (comp, c.where)
        assert rep.found[comp].how == how, (comp, rep.found[comp])
    for comp in TRAINING:
        assert rep.components[comp].present and rep.components[comp].required, comp
    inferred = sorted(f.component for f in rep.findings if f.code == "CK-C012")
    assert inferred == sorted(c for c, (_w, h) in expected.items() if h == "inferred")
    # The consistency family judged the recognised state: counters agree, layout is valid.
    assert not {"CK-S003", "CK-S004", "CK-S007"} & codes
    d = rep.to_dict()["components"]
    for comp, (where, how) in expected.items():
        assert d[comp]["how"] == how
        prefix = "found at" if how == "found" else "inferred from structure at"
        assert d[comp]["found"].startswith(f"{prefix} ck.pt:{where}")


def test_text_output_shows_a_guess_as_a_guess(tmp_path: Path) -> None:
    ck, _ = _layouts()["state-bag"]
    torch.save(ck, tmp_path / "ck.pt")
    r = CliRunner().invoke(main, ["verify", str(tmp_path / "ck.pt")], catch_exceptions=False)
    assert r.exit_code == 0
    assert "INFERRED from structure at ck.pt:state/o" in r.output
    assert "found at ck.pt:weights" in r.output


def test_inspect_says_how_each_component_was_recognised(tmp_path: Path) -> None:
    import json

    ck, expected = _layouts()["nested-trainer"]
    torch.save(ck, tmp_path / "ck.pt")
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "ck.pt"), "--json"],
                           catch_exceptions=False)
    info = json.loads(r.output)
    assert r.exit_code == 0 and info["expect"]["as"] == "training"
    for comp, (where, how) in expected.items():
        assert info["components"][comp]["how"] == how
        assert info["components"][comp]["where"] == [f"ck.pt:{where}"]


def test_inconsistent_hand_rolled_state_is_judged_by_the_native_checks(tmp_path: Path) -> None:
    """Recognised state feeds the consistency checks: a bad layout, a stale scheduler."""
    ck, _ = _layouts()["flat-conventional"]
    ck["dist"] = {"world_size": 6, "tp": 4, "pp": 1}
    ck["sched"]["last_epoch"] = 400
    torch.save(ck, tmp_path / "ck.pt")
    rep = verify_foreign(tmp_path / "ck.pt")
    msgs = {f.code: f.message for f in rep.findings}
    assert "world_size 6 is not divisible by tp*pp*cp = 4" in msgs["CK-S007"]
    assert "last_epoch 400 but the global step is 3" in msgs["CK-S004"]
    assert not rep.ok


@pytest.mark.parametrize(
    "ck",
    [
        {"model": "resnet50", "optimizer": "adamw", "epoch": 3},
        {"data": {"path": "/data/train", "tokenizer": "gpt2"}, "epoch": 1},
        {"config": {"optimizer": {"state": {}, "param_groups": [{"params": [0]}]}}, "step": 2},
        {"meta": {"epoch": 2, "seed": 1}, "step": 2},
        {"sampler": "random", "rng": 1234, "step": 1},
    ],
    ids=["strings", "data-config", "config-ignored", "epoch-seed-only", "named-scalars"],
)
def test_names_without_the_content_are_not_state(tmp_path: Path, ck: dict[str, Any]) -> None:
    torch.save(ck, tmp_path / "ck.pt")
    rep = verify_foreign(tmp_path / "ck.pt")
    present = {n for n, c in rep.components.items() if c.present}
    assert present <= {"progress"}, present
    assert not rep.ok and {"model", "optimizer"} <= {
        f.component for f in rep.findings if f.code == "CK-C001"
    }


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
              st.text(max_size=6)),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(
        st.sampled_from(["step", "epoch", "seed", "index", "world_size", "tp", "lr", "params",
                         "state", "param_groups", "last_epoch", "scale", "data", "model", "x"]),
        c, max_size=5),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_recognise_never_raises_and_never_finds_tensor_state_in_plain_json(obj: Any) -> None:
    rec = recognise({"root": obj})
    comps = {p.component for p in rec.parts}
    assert not comps & {"model", "rng", "fp8"}, rec.parts


def test_native_checkpoints_are_never_read_as_foreign(tmp_path: Path) -> None:
    ck, _ = _layouts()["nested-trainer"]
    ckptkit.save(ck, tmp_path / "plain", step=3)
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mgr = ckptkit.CheckpointManager(tmp_path / "run", verify_after_save=False)
    mgr.save(ckptkit.TrainState(model=m, optimizer=opt, step=1))
    mgr.close()
    (step,) = (tmp_path / "run").glob("step-*")
    for d in (tmp_path / "plain", step):
        rep = ckptkit.verify(d).reports[0]
        assert rep.format == "ckptkit" and rep.found == {} and rep.expect is None
        assert rep.manifest is not None and rep.ok
    run = ckptkit.verify(tmp_path / "run")
    assert [r.format for r in run.reports] == ["ckptkit"]
    # A native checkpoint that lost its manifest is an interrupted save, never weights.
    (tmp_path / "plain" / "manifest.json").unlink()
    rep = ckptkit.verify(tmp_path / "plain").reports[0]
    assert [f.code for f in rep.findings] == ["CK-M001"] and rep.format == "ckptkit"


def test_a_recognised_scaler_is_judged_like_a_native_one(tmp_path: Path) -> None:
    """A GradScaler state under any name: its loss scale is checked (CK-S008), and the steps
    it may skip are allowed between the optimizer's step and the global step (CK-S003)."""
    ck, _ = _layouts()["flat-conventional"]
    scaler = torch.amp.GradScaler("cpu", init_scale=0.25)
    ck["amp_state_of_run"] = scaler.state_dict()
    ck["step"] = 40  # the optimizer stepped 3 times: within what a scaler may skip
    torch.save(ck, tmp_path / "ck.pt")
    rep = verify_foreign(tmp_path / "ck.pt")
    assert rep.found["scaler"].how == "inferred"
    [f] = [f for f in rep.findings if f.code == "CK-S008"]
    assert "loss scale collapsed to 0.25" in f.message and str(f.severity) == "warning"
    assert not [f for f in rep.findings if f.code == "CK-S003"]
