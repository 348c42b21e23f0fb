"""One verifier, several readers: the same defect gets the same code and words in every format.

Each test writes the same state twice, once as a native ckptkit checkpoint and once as a
checkpoint of another tool (plain ``torch.save``, DCP, a Trainer folder), puts the same
defect in both, and checks that the same registered check fires with the same code and the
same message.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.verify import atsave
from ckptkit.verify.findings import CHECKS, Finding
from ckptkit.verify.foreign.report import verify_foreign

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


def _only(findings: list[Finding], code: str) -> list[Finding]:
    return [f for f in findings if f.code == code]


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    return m, opt


def _native_trainstate(tmp: Path, m: torch.nn.Module, opt: torch.optim.Optimizer) -> Path:
    # No read-back verify here: the test runs verify itself, on the committed checkpoint.
    mgr = ckptkit.CheckpointManager(tmp / "native", keep_last=2, verify_after_save=False)
    try:
        mgr.save(ckptkit.TrainState(model=m, optimizer=opt, step=1))
    finally:
        mgr.close()
    (d,) = (tmp / "native").glob("step-*")
    return d


# --- NaN in a weight -------------------------------------------------------------------------------


def test_nan_in_a_weight_native_and_torch_save(tmp_path: Path) -> None:
    m, opt = _trained()
    sd = m.state_dict()
    sd["0.weight"][1, 2] = float("nan")
    state = {"model": sd, "optimizer": opt.state_dict(), "step": 1}
    ckptkit.save(state, tmp_path / "native", step=1)
    torch.save(state, tmp_path / "foreign.pt")
    native = _only(ckptkit.verify(tmp_path / "native").findings, "CK-S010")
    foreign = _only(verify_foreign(tmp_path / "foreign.pt").findings, "CK-S010")
    assert len(native) == len(foreign) == 1
    assert native[0].message == foreign[0].message == (
        "1 tensor(s) hold NaN/Inf: 'model/0.weight' (1 NaN)"
    )
    assert native[0].severity == foreign[0].severity and native[0].hint == foreign[0].hint


def test_nan_in_a_weight_dcp_and_trainer(
    tmp_path: Path, copy_ckpt: Callable[[Path], Path], hf_ckpt: Path
) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file, save_file

    m, opt = _trained()
    sd = m.state_dict()
    sd["0.weight"][0, 0] = float("inf")
    sd["0.weight"][0, 1] = float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": sd, "optimizer": opt.state_dict(), "step": 1}, checkpoint_id=str(tmp_path / "d"))
    [f] = _only(verify_foreign(tmp_path / "d").findings, "CK-S010")
    assert f.message == "1 tensor(s) hold NaN/Inf: 'model/0.weight' (1 NaN, 1 +Inf)"
    # The Trainer's safetensors weights: the same check, the tensor named by its file.
    d = copy_ckpt(hf_ckpt)
    w = load_file(str(d / "model.safetensors"))
    key = sorted(k for k in w if k.endswith("c_attn.weight"))[0]
    w[key][0, 0] = float("nan")
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    [f] = _only(verify_foreign(d).findings, "CK-S010")
    assert f.message == f"1 tensor(s) hold NaN/Inf: 'model.safetensors:{key}' (1 NaN)"


def test_inf_only_in_an_unknown_tensor_is_the_same_warning(tmp_path: Path) -> None:
    """Without a record of which tensors are parameters, ±Inf alone is a warning in both."""
    state = {"model": {"mask": torch.tensor([0.0, float("-inf")])}}
    ckptkit.save(state, tmp_path / "native")
    torch.save(state, tmp_path / "foreign.pt")
    [n] = _only(ckptkit.verify(tmp_path / "native").findings, "CK-S010")
    [f] = _only(verify_foreign(tmp_path / "foreign.pt").findings, "CK-S010")
    assert (n.message, n.severity) == (f.message, f.severity)
    assert str(f.severity) == "warning"


# --- optimizer moment shape mismatch -----------------------------------------------------------------


def test_moment_shape_mismatch_native_and_torch_save(tmp_path: Path) -> None:
    m, opt = _trained()
    opt.state[m[0].weight]["exp_avg"] = torch.zeros(3, 5)
    native = _native_trainstate(tmp_path, m, opt)
    torch.save(
        {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 1}, tmp_path / "f.pt"
    )
    [n] = _only(ckptkit.verify(native).findings, "CK-S002")
    [f] = _only(verify_foreign(tmp_path / "f.pt").findings, "CK-S002")
    core = "1 shape mismatch(es): 'exp_avg' of '0.weight' is [3, 5], the parameter [3, 4]"
    assert n.message == core
    # The plain state dict names no parameter: matched to the model by position, and said so.
    assert f.message.startswith(core) and "by position" in f.message
    # The manager recorded the finding at save (on_inconsistent='raise'): the native hint
    # adds how to accept an intended state; the check's own fix is the same.
    assert n.severity == f.severity
    assert n.hint == f"{f.hint}; {atsave.TO_ACCEPT}"


def test_moment_shape_mismatch_dcp_fqn_keyed(tmp_path: Path) -> None:
    """get_state_dict names parameters by FQN: no guessing, the native wording exactly."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    m, opt = _trained()
    msd, osd = get_state_dict(m, opt)
    osd["state"]["1.weight"]["exp_avg_sq"] = torch.zeros(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"app": {"model": msd, "optim": osd}, "train_state": {"step": 1}},
                 checkpoint_id=str(tmp_path / "d"))
    [f] = _only(verify_foreign(tmp_path / "d").findings, "CK-S002")
    assert f.message == "1 shape mismatch(es): 'exp_avg_sq' of '1.weight' is [7], the parameter [2, 3]"


def test_moments_that_disagree_with_each_other_without_a_model(tmp_path: Path) -> None:
    """Only the optimizer saved: its parameter shapes are unknown, its moments still must agree."""
    _m, opt = _trained()
    sd = opt.state_dict()
    sd["state"][0]["exp_avg_sq"] = torch.zeros(9)
    torch.save({"optimizer": sd, "step": 1}, tmp_path / "o.pt")
    [f] = _only(verify_foreign(tmp_path / "o.pt").findings, "CK-S002")
    assert "'exp_avg_sq' of '#0 of group 0' is [9], 'exp_avg' [3, 4]" in f.message


# --- a missing required component --------------------------------------------------------------------


def test_missing_required_component_native_and_foreign(tmp_path: Path) -> None:
    m, _opt = _trained()
    state = {"model": m.state_dict(), "step": 4}
    ckptkit.save(state, tmp_path / "native", step=4)
    torch.save(state, tmp_path / "foreign.pt")
    for rep in (
        ckptkit.verify(tmp_path / "native", expect="training").reports[0],
        verify_foreign(tmp_path / "foreign.pt", expect="training"),
    ):
        [f] = _only(rep.findings, "CK-C001")
        assert f.component == "optimizer" and str(f.severity) == "error"
        assert f.message.startswith("optimizer state is required (") and f.message.endswith(
            ") but missing"
        )
        assert not rep.ok and rep.components["optimizer"].required


def test_missing_scaler_a_trainer_requires_is_c001_like_a_native_one(
    tmp_path: Path, copy_ckpt: Callable[[Path], Path], hf_ckpt: Path
) -> None:
    """A Trainer folder without scheduler.pt and a TrainState save that lost its scheduler."""
    m, opt = _trained()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    mgr = ckptkit.CheckpointManager(tmp_path / "native", verify_after_save=False)
    mgr.save(ckptkit.TrainState(model=m, optimizer=opt, scheduler=sched, step=1))
    mgr.close()
    (native,) = (tmp_path / "native").glob("step-*")
    # Drop the scheduler from the recorded state: the run required it.
    import json

    from ckptkit.format import manifest as mf

    man = json.loads((native / "manifest.json").read_text())
    man["components"]["scheduler"]["present"] = False
    man["components"]["scheduler"]["where"] = []
    man.pop("manifest_digest")
    man["manifest_digest"] = mf.content_digest(man)
    (native / "manifest.json").write_text(json.dumps(man))
    d = copy_ckpt(hf_ckpt)
    (d / "scheduler.pt").unlink()
    [n] = _only(ckptkit.verify(native).findings, "CK-C001")
    [f] = _only(verify_foreign(d).findings, "CK-C001")
    assert n.component == f.component == "scheduler"
    assert n.message == "scheduler state is required (a scheduler was passed) but missing"
    assert f.message.startswith("scheduler state is required (no scheduler.pt: the Trainer")
    assert n.hint == f.hint


def test_the_checks_that_judge_state_are_the_registered_ones() -> None:
    """No second verifier: the foreign package emits no completeness, consistency, NaN or
    file-rule code itself; registered checks own them."""
    import ast

    pkg = Path(__file__).resolve().parents[3] / "ckptkit" / "foreign"
    judged = ("CK-S", "CK-C0", "CK-C103", "CK-F001", "CK-F002", "CK-F003", "CK-F009")
    assert all(any(c.code.code.startswith(j) for c in CHECKS) for j in judged)
    for py in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                code = re.fullmatch(r"CK-[A-Z]\d{3}", node.value)
                assert not (code and node.value.startswith(judged)), (
                    f"{py.name} names {node.value}: only the registered check may report it"
                )


# --- the one "file inside the checkpoint" rule ----------------------------------------------------


def test_symlink_out_of_the_checkpoint_same_rule(
    tmp_path: Path, copy_ckpt: Callable[[Path], Path], hf_ckpt: Path
) -> None:
    """A file that is a symlink (here to a file outside) is never read, in either format."""
    outside = tmp_path / "elsewhere.safetensors"
    m, _opt = _trained()
    ckptkit.save({"model": m.state_dict()}, tmp_path / "native")
    native = tmp_path / "native"
    (shard,) = native.glob("model*.safetensors")
    shard.rename(outside)
    shard.symlink_to(outside)
    d = copy_ckpt(hf_ckpt)
    (d / "model.safetensors").rename(tmp_path / "hf-weights.safetensors")
    (d / "model.safetensors").symlink_to(tmp_path / "hf-weights.safetensors")
    [n] = _only(ckptkit.verify(native).findings, "CK-F009")
    rep = verify_foreign(d)
    [f] = _only(rep.findings, "CK-F009")
    assert (n.message, n.severity, n.hint) == (f.message, f.severity, f.hint)
    assert f.path == "model.safetensors"
    # Not read, so not present: the model is missing, and said why.
    [c] = _only(rep.findings, "CK-C001")
    assert c.component == "model" and "symlink" in c.message and not rep.ok
