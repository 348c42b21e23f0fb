"""No silent partial loads (issue 11): load(into=...) and restore refuse what does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.capture.fit import fit_report


def _mlp(width: int = 8, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 2)
    ).to(dtype)


def test_other_width_is_refused_naming_each_tensor(tmp_path: Path) -> None:
    ckptkit.save({"model": _mlp(8).state_dict(), "step": 3}, tmp_path / "c")
    wide = _mlp(16)
    before = {k: v.clone() for k, v in wide.state_dict().items()}
    with pytest.raises(ckptkit.StateError, match="CK-R010") as ei:
        ckptkit.load(tmp_path / "c", into={"model": wide.state_dict()})
    msg = str(ei.value)
    assert "3 with another shape or dtype" in msg  # 0.weight, 0.bias, 2.weight
    assert "model/0.weight: saved float32[8, 4], here float32[16, 4]" in msg
    # Refused before anything was read: every tensor keeps its value (v0.1 loaded the
    # one tensor whose shape matched and left the rest at their random init).
    for k, v in wide.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_dtype_mismatch_is_refused(tmp_path: Path) -> None:
    ckptkit.save({"model": _mlp(8).state_dict()}, tmp_path / "c")
    with pytest.raises(ckptkit.StateError, match=r"saved float32.*here bfloat16"):
        ckptkit.load(tmp_path / "c", into={"model": _mlp(8, torch.bfloat16).state_dict()})


def test_missing_and_unexpected_keys_are_named(tmp_path: Path) -> None:
    sd = _mlp().state_dict()
    ckptkit.save({"model": sd}, tmp_path / "c")
    live = dict(_mlp().state_dict())
    live["head.weight"] = torch.zeros(3)
    del live["2.bias"]
    with pytest.raises(ckptkit.StateError) as ei:
        ckptkit.load(tmp_path / "c", into={"model": live})
    msg = str(ei.value)
    assert "1 missing from the checkpoint (model/head.weight)" in msg
    assert "1 in the checkpoint but not here (model/2.bias)" in msg


def test_weights_only_into_a_training_checkpoint_is_fine(tmp_path: Path) -> None:
    """Loading only the model of a full training checkpoint is a supported mode: the
    optimizer and the rest are not 'unexpected' (they are outside what was passed)."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ckptkit.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1},
                 tmp_path / "c")
    fresh = _mlp()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    ckptkit.load(tmp_path / "c", into={"model": fresh.state_dict()})
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_non_strict_loads_what_fits_and_reports_the_rest(tmp_path: Path) -> None:
    base = _mlp(8)
    ckptkit.save({"model": base.state_dict()}, tmp_path / "c")
    # Fine-tuning: same body, a new head of another size.
    ft = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5))
    head_before = ft[2].weight.clone()
    res = ckptkit.load(tmp_path / "c", into={"model": ft.state_dict()}, strict=False)
    assert isinstance(res, ckptkit.PartialLoad)
    assert sorted(res.report.loaded) == ["model/0.bias", "model/0.weight"]
    assert [m[0] for m in res.report.mismatched] == ["model/2.weight", "model/2.bias"]
    assert torch.equal(ft[0].weight, base[0].weight)
    assert torch.equal(ft[2].weight, head_before)  # untouched, and said so
    assert res.report.to_dict()["ok"] is False


def test_fit_report_summary_counts_past_the_first_few() -> None:
    live = {f"w{i}": torch.zeros(1) for i in range(8)}
    rep = fit_report(live, {})
    assert rep.summary() == "8 missing from the checkpoint (w0, w1, w2, w3, w4, … (+3))"


def test_restore_refuses_a_model_of_another_dtype(tmp_path: Path) -> None:
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(ckptkit.TrainState(model=_mlp(), step=2))
    ts = ckptkit.TrainState(model=_mlp(dtype=torch.bfloat16))
    before = {k: v.clone() for k, v in ts.model.state_dict().items()}
    # load_state_dict would have converted float32 to bfloat16 silently
    with pytest.raises(ckptkit.StateError, match=r"CK-R010.*saved float32.*here bfloat16"):
        ckptkit.CheckpointManager(tmp_path, readonly=True).restore(ts)
    for k, v in ts.model.state_dict().items():
        assert torch.equal(v, before[k])
    assert ts.step == 0


def test_load_into_a_strided_target_fills_it(tmp_path: Path) -> None:
    """A target the reader cannot fill in place (non-contiguous) is still filled."""
    w = torch.arange(12.0).reshape(3, 4)
    ckptkit.save({"w": w.t().contiguous()}, tmp_path / "c")
    target = torch.zeros(3, 4).t()  # non-contiguous view, shape (4, 3)
    out = ckptkit.load(tmp_path / "c", into={"w": target})
    assert torch.equal(target, w.t()) and out["w"] is target
