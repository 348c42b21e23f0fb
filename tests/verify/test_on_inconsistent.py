"""Consistency findings at save time (issue 16, item 5): raise or warn, recorded either way.

The state of a save can be whole and still inconsistent: a fresh optimizer at step 500
(an intentional reset), NaN weights. ``on_inconsistent="raise"`` (default) keeps that
loud; ``"warn"`` accepts it. Either way the manifest records the findings, and neither
``ls`` nor ``restore`` is silent about them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.checkpoint.commit import save_state
from ckptkit.cli import main
from ckptkit.errors import CommittedError, ManifestError
from ckptkit.format import manifest as mf
from ckptkit.verify import atsave
from ckptkit.verify.runner import verify_one


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))


def _stepped(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return opt


def _reset_at_500(root: Path, policy: str) -> ckptkit.CheckpointManager:
    """Save step 400, then step 500 right after an intentional optimizer reset."""
    model = _model()
    ts = ckptkit.TrainState(model=model, optimizer=_stepped(model), step=400)
    mgr = ckptkit.CheckpointManager(root, on_inconsistent=policy)  # type: ignore[arg-type]
    mgr.save(ts)
    mgr.wait()
    ts.optimizer = torch.optim.AdamW(model.parameters())  # the reset: no state yet
    ts.step = 500
    mgr.save(ts)
    return mgr


def _recorded(ckpt: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((ckpt / "manifest.json").read_text())["findings"]


def _fresh_state() -> ckptkit.TrainState:
    model = _model()
    return ckptkit.TrainState(model=model, optimizer=torch.optim.AdamW(model.parameters()))


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout


def test_raise_is_loud_and_records_the_findings(tmp_path: Path) -> None:
    mgr = _reset_at_500(tmp_path, "raise")
    with pytest.raises(CommittedError, match="CK-S001") as ei:
        mgr.wait()
    assert "on_inconsistent='warn'" in str(ei.value)  # the fix says how to accept it
    rec = _recorded(tmp_path / "step-00000500")
    assert rec["policy"] == "raise" and rec["items"][0]["code"] == "CK-S001"
    assert rec["items"][0]["severity"] == "error"
    assert mgr.last_save.findings and mgr.last_save.findings[0].startswith("CK-S001")
    info = {c.step: c for c in mgr.list()}
    assert info[500].status == "unsound" and "CK-S001" in (info[500].problem or "")
    res = mgr.restore(_fresh_state())
    assert res is not None and res.step == 400
    assert any("step-00000500" in n and "CK-S001" in n for n in res.notes), res.notes
    code, out = _cli("verify", str(tmp_path / "step-00000500"))
    assert code == 1 and "CK-S001" in out
    mgr.close()


def test_warn_accepts_records_and_says_so_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        mgr = _reset_at_500(tmp_path, "warn")
        mgr.wait()  # no CommittedError
    assert any("accepted (on_inconsistent='warn')" in r.message and "CK-S001" in r.message
               for r in caplog.records)
    rec = _recorded(tmp_path / "step-00000500")
    assert rec["policy"] == "warn" and rec["items"][0]["code"] == "CK-S001"
    info = {c.step: c for c in mgr.list()}
    assert info[500].status == "verified"
    assert "accepted at save" in (info[500].problem or "") and "CK-S001" in info[500].problem
    assert mgr.latest() is not None and mgr.latest().step == 500  # type: ignore[union-attr]
    res = mgr.restore(_fresh_state())
    assert res is not None and res.step == 500  # not skipped
    note = next(n for n in res.notes if n.startswith("CK-S001"))
    assert "accepted at save" in note
    code, out = _cli("verify", str(tmp_path / "step-00000500"))
    assert code == 0 and "warning CK-S001" in out and "accepted at save" in out
    assert _cli("verify", str(tmp_path / "step-00000500"), "--strict")[0] == 1
    code, out = _cli("ls", str(tmp_path))
    assert code == 0 and "accepted at save" in " ".join(out.split())
    mgr.close()


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_nan_weights_async(tmp_path: Path, policy: str) -> None:
    model = torch.nn.Linear(4, 4)
    ts = ckptkit.TrainState(model=model, step=10)
    mgr = ckptkit.CheckpointManager(tmp_path, on_inconsistent=policy)  # type: ignore[arg-type]
    mgr.save(ts, async_=True)
    mgr.wait()
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    ts.step = 20
    mgr.save(ts, async_=True)
    with torch.no_grad():
        model.weight[0, 0] = 0.0  # the snapshot was taken: the live model may move on
    if policy == "raise":
        with pytest.raises(CommittedError, match="CK-S010"):
            mgr.wait()
    else:
        mgr.wait()
    items = _recorded(tmp_path / "step-00000020")["items"]
    assert [i["code"] for i in items] == ["CK-S010"] and "1 NaN" in items[0]["message"]
    res = mgr.restore(ckptkit.TrainState(model=torch.nn.Linear(4, 4)))
    assert res is not None
    if policy == "raise":
        assert res.step == 10 and any("CK-S010" in n for n in res.notes)
    else:
        assert res.step == 20 and any("CK-S010" in n and "accepted" in n for n in res.notes)
    mgr.close()


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_restore_reads_the_record_when_it_does_not_scan_values(tmp_path: Path, policy: str) -> None:
    """A writer killed before its verify leaves a 'committed' checkpoint; restore reads
    digests, not values, so the NaN the save saw must come from the manifest."""
    model = torch.nn.Linear(4, 4)
    mgr = ckptkit.CheckpointManager(tmp_path, on_inconsistent=policy, verify_after_save=False)  # type: ignore[arg-type]
    mgr.save(ckptkit.TrainState(model=model, step=10))
    with torch.no_grad():
        model.weight[1, 1] = float("inf")
    mgr.save(ckptkit.TrainState(model=model, step=20))
    mgr.close()
    assert {c.step: c.status for c in mgr.list()} == {10: "committed", 20: "committed"}
    rep = verify_one(tmp_path / "step-00000020", options={"scan_values": False})
    assert [f.code for f in rep.findings if f.code == "CK-S010"] == ["CK-S010"]
    res = ckptkit.CheckpointManager(tmp_path).restore(ckptkit.TrainState(model=torch.nn.Linear(4, 4)))
    assert res is not None
    if policy == "raise":
        assert res.step == 10 and any("step-00000020" in n and "CK-S010" in n for n in res.notes)
    else:
        assert res.step == 20 and any("CK-S010" in n and "accepted" in n for n in res.notes)


def test_a_clean_save_records_nothing(tmp_path: Path) -> None:
    model = _model()
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(ckptkit.TrainState(model=model, optimizer=_stepped(model), step=1))
    assert "findings" not in json.loads((tmp_path / "step-00000001" / "manifest.json").read_text())
    assert mgr.last_save.findings == []


def test_value_codes_are_the_checks_that_read_values(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    for st in opt.state.values():
        st["exp_avg"].fill_(float("nan"))
    d = tmp_path / "c"
    save_state(ckptkit.TrainState(model=model, optimizer=opt, step=1), d)
    full = {f.code for f in verify_one(d).findings}
    blind = {f.code for f in verify_one(d, options={"scan_values": False}).findings}
    assert full - blind == set(atsave.VALUE_CODES)


def test_only_consistency_codes_can_be_accepted(tmp_path: Path) -> None:
    """A manifest claiming to have accepted an integrity finding changes nothing."""
    d = tmp_path / "c"
    ckptkit.save({"model": {"w": torch.ones(4)}}, d)
    obj = json.loads((d / "manifest.json").read_text())
    obj["findings"] = {"policy": "warn", "items": [{"code": "CK-F003", "severity": "error",
                       "component": "model", "message": "x", "hint": "y"}]}
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))
    (d / "model.safetensors").write_bytes(b"\0" * (d / "model.safetensors").stat().st_size)
    rep = verify_one(d)
    assert [str(f.severity) for f in rep.findings if f.code == "CK-F003"] == ["error"]


def test_schema_allows_the_record_and_nothing_else(tmp_path: Path) -> None:
    d = tmp_path / "c"
    ckptkit.save({"model": {"w": torch.ones(4)}}, d)
    base = json.loads((d / "manifest.json").read_text())
    good = {"policy": "warn", "items": [{"code": "CK-S001", "severity": "error",
            "component": "optimizer", "message": "m", "hint": "h"}]}

    def parse(findings: object) -> mf.Manifest:
        obj = {**base, "findings": findings}
        obj["manifest_digest"] = mf.content_digest(obj)
        return mf.Manifest.from_json(json.dumps(obj))

    assert parse(good).findings == good
    for bad in ({"policy": "ignore", "items": []},
                {"policy": "warn", "items": [], "extra": 1},
                {"policy": "warn", "items": [{"code": "S001", "severity": "error",
                 "component": "x", "message": "m", "hint": "h"}]}):
        with pytest.raises(ManifestError, match="CK-M003"):
            parse(bad)


def test_unknown_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_inconsistent"):
        ckptkit.CheckpointManager(tmp_path, on_inconsistent="ignore")  # type: ignore[arg-type]


def test_a_failing_check_never_costs_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("a bug in a check")

    monkeypatch.setattr(atsave, "check_before_commit", broken)
    with caplog.at_level(logging.ERROR, logger="ckptkit"), ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=1))
    assert [c.status for c in mgr.list()] == ["verified"]
    assert any("a bug in a check" in r.message for r in caplog.records)


def test_values_scanned_at_save_are_not_scanned_again_and_nan_still_fails(tmp_path: Path) -> None:
    """One process, all tensors in memory: the read-back verify checks digests only, yet the
    NaN found in memory before the commit still makes the checkpoint corrupt."""
    m = _model()
    ts = ckptkit.TrainState(model=m, optimizer=_stepped(m), step=1)
    mgr = ckptkit.CheckpointManager(tmp_path / "run", background_verify=False)
    mgr.save(ts)
    assert mgr.last_save.values_scanned
    with torch.no_grad():
        m[0].weight[0, 0] = float("nan")
    ts.step = 2
    with pytest.raises(CommittedError, match="CK-S010"):
        mgr.save(ts)
    assert mgr.last_save.values_scanned
    assert [c.status for c in mgr.list()] == ["verified", "unsound"]
    mgr.close()
