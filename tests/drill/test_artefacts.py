"""The drill's ``artefacts`` check on real files in tmp_path (no drill run): which files are
compared, which one-sided files are findings, how each file's differences are named, and
that the statistical mode holds files to the end-state check's tolerance.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

import ckptkit
from ckptkit.drill.artefacts import Judge, compare_artefacts, written
from ckptkit.drill.compare import CheckResult
from ckptkit.drill.diagnose import _from_end_state
from ckptkit.drill.endstate import end_state


def judge(references: Sequence[Path | None], resumed: Path | None, /, *,
          roots: Sequence[str], controls: Sequence[Path | None]) -> CheckResult:
    return end_state(references, resumed, roots=roots, controls=controls)


def run_dir(root: Path, ema: float, *, side: bool = True) -> Path:
    root.mkdir(parents=True)
    (root / "export").mkdir()
    save_file({"w": torch.full((3,), ema)}, str(root / "export" / "ema.safetensors"))
    torch.save({"model": {"w": torch.ones(2)}, "ema": {"w": torch.full((2,), ema)}},
               root / "final.pt")
    ckptkit.save({"model": {"w": torch.ones(2)}}, root / "step-00000006")
    if side:
        torch.save({"w": torch.zeros(1)}, root / "side.pt")
    (root / "train.log").write_text("not an artefact")
    return root


def test_written_lists_checkpoints_and_tensor_files_not_their_insides(tmp_path: Path) -> None:
    d = run_dir(tmp_path / "r", 1.0)
    (d / "step-00000009.ckptkit-tmp.ab12cd34").mkdir()  # a commit's leftover
    assert sorted(written(d)) == ["export/ema.safetensors", "final.pt", "side.pt",
                                  "step-00000006"]
    assert "final.pt" not in written(d, skip=[d / "final.pt"])


def test_equal_runs_pass_and_a_differing_ema_is_named_with_its_tensors(tmp_path: Path) -> None:
    ref, ok, bad = (run_dir(tmp_path / n, e) for n, e in (("ref", 1.0), ("ok", 1.0), ("bad", 2.0)))
    same = compare_artefacts([ref], ok, judge=judge, saved_at=0.0)
    assert same.ok and not same.skipped and same.statistic == 0, same.detail
    assert same.detail["summary"] == "4 artefacts equal (bitwise)"
    got = compare_artefacts([ref], bad, judge=judge, saved_at=0.0)
    assert not got.ok and got.statistic == 2
    files = got.detail["files"]
    # a flat file is named by the file; a file holding components by the component
    assert files["export/ema.safetensors"]["components"] == ["ema"]
    assert files["final.pt"]["components"] == ["ema"]
    assert list(got.detail["different"]) == ["ema"]
    assert got.detail["different"]["ema"]["files"] == ["export/ema.safetensors", "final.pt"]
    assert {t["path"] for t in got.detail["different"]["ema"]["tensors"]} == {"w", "ema/w"}
    d = _from_end_state(got)
    assert (d.component, d.confidence) == ("ema", "high")
    assert d.fields == ["artefacts:ema"]


def test_a_file_one_run_alone_wrote_is_named_unless_it_predates_the_save(tmp_path: Path) -> None:
    ref = run_dir(tmp_path / "ref", 1.0)
    res = run_dir(tmp_path / "res", 1.0, side=False)
    torch.save({"w": torch.ones(1)}, res / "extra.pt")
    torch.save({"w": torch.ones(1)}, ref / "ema-step4.pt")  # beside the step-4 save
    got = compare_artefacts([ref], res, judge=judge, saved_at=0.0, save_step=4)
    assert not got.ok
    assert {r: f["status"] for r, f in got.detail["files"].items()
            if f["status"] != "equal"} == {"side.pt": "only-reference", "extra.pt": "only-resumed"}
    assert set(got.detail["different"]) == {"side", "extra"}
    # written before the step-W checkpoint was committed: not expected of the resumed run
    os.utime(ref / "side.pt", (1.0, 1.0))
    os.remove(res / "extra.pt")
    assert compare_artefacts([ref], res, judge=judge, saved_at=10.0, save_step=4).ok


def test_statistical_mode_holds_files_to_the_control_runs_noise(tmp_path: Path) -> None:
    """Where the run is not bitwise, a tensor may differ by the end-state check's tolerance
    (4 x how far a control run's copy lies from the resumed run's), and no more."""
    ref = run_dir(tmp_path / "ref", 1.0)
    near = run_dir(tmp_path / "near", 1.0 + 2e-6)
    far = run_dir(tmp_path / "far", 1.1)
    ctl = run_dir(tmp_path / "ctl", 1.0 + 3e-6)
    got = compare_artefacts([ref], near, judge=judge, saved_at=0.0, controls=[ctl])
    assert got.ok and got.detail["mode"] != "bitwise", got.detail
    assert not compare_artefacts([ref], near, judge=judge, saved_at=0.0).ok  # bitwise
    ctl_far = run_dir(tmp_path / "ctl_far", 1.1 + 1e-6)
    got = compare_artefacts([ref], far, judge=judge, saved_at=0.0, controls=[ctl_far])
    assert not got.ok and list(got.detail["different"]) == ["ema"]


def test_nothing_to_compare_is_skipped_and_unreadable_files_are_not_equal(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert compare_artefacts([a], b, judge=judge, saved_at=0.0).skipped
    assert compare_artefacts([a], None, judge=judge, saved_at=0.0, why_not="x").detail[
        "reason"] == "x"
    (a / "junk.pt").write_bytes(b"not a torch file")
    (b / "junk.pt").write_bytes(b"not a torch file")
    got = compare_artefacts([a], b, judge=judge, saved_at=0.0)
    assert got.skipped and got.detail["files"]["junk.pt"]["status"] == "not-compared"


def test_a_lightning_callbacks_record_of_its_own_files_is_not_a_difference(
    tmp_path: Path,
) -> None:
    """Lightning restores a ModelCheckpoint's file paths only into the directory they were
    saved from; each drill run has its own, so an intermediate checkpoint of the resumed run
    holds '' there. Any other value of the callback still counts."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        torch.save({"w": torch.ones(1)}, d / "epoch=0-step=10.ckpt")
    cb = "callbacks/ModelCheckpoint{'monitor': None}"

    def lightning_judge(values: list[str]) -> Judge:
        def judge(references: Sequence[Path | None], resumed: Path | None, /, *,
                  roots: Sequence[str], controls: Sequence[Path | None]) -> CheckResult:
            vals = [{"path": f"{cb}/{v}", "a": "x", "b": ""} for v in values]
            return CheckResult("end_state", False, 1, 0, detail={
                "mode": "bitwise", "compared": ["model", cb],
                "different": {cb: {"summary": "differs", "tensors": [], "values": vals}}})
        return judge

    ok = compare_artefacts([a], b, judge=lightning_judge(["last_model_path", "best_k_models/p"]),
                           saved_at=0.0)
    assert ok.ok and ok.detail["files"]["epoch=0-step=10.ckpt"]["status"] == "equal"
    bad = compare_artefacts([a], b, judge=lightning_judge(["last_model_path", "current_score"]),
                            saved_at=0.0)
    assert not bad.ok and list(bad.detail["different"]) == [cb]
