"""Lightning Trainer and Fabric with ckptkit: the run layout, the CheckpointIO plugin, drills.

The drilled scripts (``scripts/lit_tiny.py``, ``scripts/fabric_tiny.py``) are a plain
Lightning script and a plain Fabric loop with only the documented lines added (marked
``##``); the real ``lightning`` package, CPU, synthetic data. By default one clean drill
and one fault per framework run; the whole fault table is ``slow``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

L = pytest.importorskip("lightning")

from ckptkit.drill.config import DrillConfig  # noqa: E402
from ckptkit.drill.runner import run_drill  # noqa: E402
from ckptkit.errors import IntegrityError, NotWritableError  # noqa: E402
from ckptkit.integrations.lightning import (  # noqa: E402
    CkptkitCallback,
    CkptkitIO,
    FabricCheckpoints,
)
from ckptkit.run import directory as runs  # noqa: E402
from ckptkit.run import retain  # noqa: E402
from ckptkit.run.layouts.lightning import open_lightning  # noqa: E402

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parents[1] / "scripts"
LIT = SCRIPTS / "lit_tiny.py"
FAB = SCRIPTS / "fabric_tiny.py"
LIT2 = SCRIPTS / "lit_datamodule.py"  # differently written: DataModule, StatefulDataLoader, val
EXPECTED = {
    "none": "none",
    "no-rng": "rng",
    "no-sampler": "sampler",
    "fresh-optimizer": "optimizer",
    "lr-changed": "hyperparameters",
    "data-version": "data-version",
}


def _ckpt(path: Path, step: int, **extra: Any) -> Path:
    """A Lightning-shaped training checkpoint (model, optimizer, step)."""
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.save(
        {"state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()],
         "global_step": step, "epoch": 0, "pytorch-lightning_version": "2.6.6", **extra},
        path,
    )
    return path


def _drill(script: Path, fault: str, tmp_path: Path, *, w: int = 6, n: int = 8) -> Any:
    cfg = DrillConfig(
        command=[sys.executable, str(script), "--fault", fault],
        steps_before=w,
        steps_after=n,
        isolate=True,
        workdir=tmp_path / f"drill-{script.stem}-{fault}-{w}",
        timeout=300,
    )
    return run_drill(cfg)


# --- the run layout (files only) -----------------------------------------------------------


def test_open_run_recognises_a_lightning_version_dir_and_lists_one_checkpoint_per_step(
    tmp_path: Path,
) -> None:
    ck = tmp_path / "version_0" / "checkpoints"
    ck.mkdir(parents=True)
    _ckpt(ck / "epoch=0-step=4.ckpt", 4)
    _ckpt(ck / "epoch=0-step=8.ckpt", 8)
    _ckpt(ck / "last.ckpt", 8)  # a copy of step 8: listed once
    _ckpt(ck / "custom-name.ckpt", 12)  # no step in the name: read from the file
    run = runs.open_run(tmp_path / "version_0", readonly=False)  # records its verifies
    try:
        assert run.layout == "lightning"
        assert Path(str(run.root)) == ck
        got = [(c.step, Path(str(c.path)).name, c.status) for c in run.checkpoints()]
        assert got == [
            (4, "epoch=0-step=4.ckpt", "committed"),
            (8, "epoch=0-step=8.ckpt", "committed"),
            (12, "custom-name.ckpt", "committed"),
        ]
        # Verify from the bytes: recorded in the run index, listed verified.
        for c in run.checkpoints():
            assert run.reverify(c) == []
        assert {c.status for c in runs.listing(run)} == {"verified"}
    finally:
        run.close()


def test_a_lone_last_ckpt_is_pinned_and_a_native_run_is_not_lightning(tmp_path: Path) -> None:
    _ckpt(tmp_path / "last.ckpt", 3)
    run = open_lightning(tmp_path)
    assert [(c.step, c.pins) for c in run.checkpoints()] == [(3, ("last",))]
    native = tmp_path / "native"
    (native / "step-00000001").mkdir(parents=True)
    (native / "x.ckpt").write_bytes(b"")
    assert runs.open_run(native).layout == "ckptkit"


def test_a_changed_file_loses_its_verified_status_and_readonly_runs_cannot_delete(
    tmp_path: Path,
) -> None:
    p = _ckpt(tmp_path / "epoch=0-step=2.ckpt", 2)
    with open_lightning(tmp_path, readonly=False) as run:  # only a writer records
        (info,) = run.checkpoints()
        assert run.reverify(info) == []
        assert run.checkpoints()[0].status == "verified"
        _ckpt(p, 2, extra=torch.zeros(3))  # rewritten: the record no longer applies
        assert run.checkpoints()[0].status == "committed"
    reader = open_lightning(tmp_path)
    with pytest.raises(NotWritableError, match="read-only"):
        reader.remove(reader.checkpoints()[0])
    assert p.exists()


def test_prune_keeps_the_newest_good_and_takes_the_adopted_manifest_along(tmp_path: Path) -> None:
    io = CkptkitIO()
    for s in (2, 4, 6):
        p = _ckpt(tmp_path / "src.pt", s)
        io.save_checkpoint(torch.load(p, weights_only=True), tmp_path / f"epoch=0-step={s}.ckpt")
        p.unlink()
    io.teardown()
    run = runs.open_run(tmp_path, readonly=False)
    try:
        assert [c.status for c in run.checkpoints()] == ["verified"] * 3
        # Damage the newest: the re-check before deleting finds it, nothing it justified goes.
        newest = tmp_path / "epoch=0-step=6.ckpt"
        raw = bytearray(newest.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        newest.write_bytes(bytes(raw))
        out = retain.apply(run, retain.Policy(keep_last=1))
        assert any("CK-F" in r for r in out.rechecked)
        assert out.deleted == ["epoch=0-step=2.ckpt: beyond keep_last=1"]
        assert sorted(p.name for p in tmp_path.glob("epoch=*")) == [
            "epoch=0-step=4.ckpt",
            "epoch=0-step=4.ckpt.ckptkit-manifest.json",
            "epoch=0-step=6.ckpt",
            "epoch=0-step=6.ckpt.ckptkit-manifest.json",
        ]
    finally:
        run.close()


def test_the_cli_lists_adopts_prunes_and_rolls_back_a_lightning_directory(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from ckptkit.cli import main

    ck = tmp_path / "version_0" / "checkpoints"
    ck.mkdir(parents=True)
    for s in (5, 10, 15):
        _ckpt(ck / f"epoch=0-step={s}.ckpt", s)
    _ckpt(ck / "last.ckpt", 15)
    run_dir = str(tmp_path / "version_0")
    r = CliRunner().invoke(main, ["adopt", run_dir])
    assert r.exit_code == 0, r.output
    assert all((ck / f"epoch=0-step={s}.ckpt.ckptkit-manifest.json").is_file() for s in (5, 10, 15))
    # Adopting recorded each outcome in the run's index: verified without a re-read.
    doc = json.loads(CliRunner().invoke(main, ["ls", run_dir, "--json"]).output)
    assert [c["status"] for c in doc["checkpoints"]] == ["verified"] * 3
    r = CliRunner().invoke(main, ["ls", run_dir, "--verify", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["layout"] == "lightning"
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == [
        (5, "verified"), (10, "verified"), (15, "verified")
    ]
    r = CliRunner().invoke(main, ["prune", run_dir, "--keep-last", "2"])
    assert r.exit_code == 0, r.output
    assert not (ck / "epoch=0-step=5.ckpt").exists()
    assert not (ck / "epoch=0-step=5.ckpt.ckptkit-manifest.json").exists()
    assert (ck / "last.ckpt").exists()  # a copy of step 15: never rotated
    r = CliRunner().invoke(main, ["rollback", run_dir])
    assert r.exit_code == 0, r.output
    assert "epoch=0-step=15.ckpt" in r.output and "trainer.fit(model, ckpt_path=" in r.output


# --- the plugin in a real Trainer -----------------------------------------------------------


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(root: Path, io: CkptkitIO, *, steps: int, top_k: int = -1, ckpt_path: str | None = None) -> Any:
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    mc = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=root, every_n_train_steps=1, save_top_k=top_k, monitor="step" if top_k > 0 else None,
        mode="max",
    )
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, plugins=[io], callbacks=[CkptkitCallback(), mc],
        default_root_dir=root,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_Tiny(), loader, ckpt_path=ckpt_path)
    return trainer


def test_trainer_saves_are_verified_rotated_and_a_damaged_file_is_refused_at_load(
    tmp_path: Path,
) -> None:
    io = CkptkitIO(keep_last=2)
    _fit(tmp_path, io, steps=5)
    run = open_lightning(tmp_path)
    got = [(c.step, c.status) for c in run.checkpoints()]
    assert got == [(4, "verified"), (5, "verified")], got
    newest = tmp_path / "epoch=1-step=5.ckpt"
    assert (tmp_path / "epoch=1-step=5.ckpt.ckptkit-manifest.json").is_file()
    raw = bytearray(newest.read_bytes())
    raw[len(raw) - 4000] ^= 0x01  # one flipped bit inside the archive
    newest.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError) as e:
        _fit(tmp_path, CkptkitIO(), steps=7, ckpt_path=str(newest))
    assert e.value.code is not None and e.value.code.startswith("CK-F")
    assert "refusing to load" in str(e.value) and "ckptkit ls" in str(e.value)


def test_the_watch_level_is_the_recorded_health_that_ls_and_rollback_read(tmp_path: Path) -> None:
    import ckptkit

    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))
    # A watch that judges after 16 steps: step 8 is saved while it collects its baseline.
    watch = ckptkit.StabilityWatch(window=16, recent=8, min_history=8, warmup=4)
    trainer = L.Trainer(
        max_steps=16, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, plugins=[CkptkitIO()],
        callbacks=[CkptkitCallback(watch=watch),
                   L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=8,
                                                       save_top_k=-1)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    infos = runs.listing(runs.open_run(tmp_path))
    assert [(c.step, c.status, c.health) for c in infos] == [
        (8, "verified", "not judged"), (16, "verified", "ok")
    ]
    choice = runs.rollback(tmp_path)
    assert choice.checkpoint is not None and choice.checkpoint.step == 16
    assert "ckpt_path=" in choice.resume


def test_save_top_k_removals_never_delete_the_newest_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = CkptkitIO()
    _fit(tmp_path, io, steps=3, top_k=1)  # Lightning keeps the best by 'step': the newest
    names = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert names == ["epoch=0-step=3.ckpt"], names
    assert not [p for p in tmp_path.glob("*.ckptkit-manifest.json")
                if not p.name.startswith("epoch=0-step=3")]
    # Asked to remove the only (newest verified) checkpoint: refused, the file stays.
    io2 = CkptkitIO()
    io2.remove_checkpoint(tmp_path / "epoch=0-step=3.ckpt")
    monkeypatch.chdir(tmp_path)
    io2.remove_checkpoint("epoch=0-step=3.ckpt")  # a relative path, as Lightning may pass
    io2.teardown()
    assert (tmp_path / "epoch=0-step=3.ckpt").is_file()


def test_fabric_checkpoints_restore_rng_and_the_data_cursor(tmp_path: Path) -> None:
    import ckptkit

    fabric = L.Fabric(accelerator="cpu", devices=1)
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sampler = ckptkit.ResumableSampler(10, seed=3)
    it = iter(sampler)
    [next(it) for _ in range(3)]
    ck = FabricCheckpoints(fabric, tmp_path, sampler=sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck.save(3, {"model": m, "optimizer": opt, "step": 3})
    expect_rng = torch.rand(3)
    expect_next = list(it)
    ck.close()
    sampler2 = ckptkit.ResumableSampler(10, seed=3)
    ck2 = FabricCheckpoints(fabric, tmp_path, sampler=sampler2)
    state = {"model": m, "optimizer": opt, "step": 0}
    assert ck2.resume(state) is not None
    assert state["step"] == 3
    assert torch.equal(torch.rand(3), expect_rng)
    assert list(sampler2) == expect_next
    ck2.close()


def test_fabric_checkpoints_bring_the_stability_watch_back_past_its_warm_up(
    tmp_path: Path,
) -> None:
    import ckptkit

    def watch() -> ckptkit.StabilityWatch:
        return ckptkit.StabilityWatch(window=16, recent=8, warmup=12)

    fabric = L.Fabric(accelerator="cpu", devices=1)
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    w = watch()
    for step in range(30):
        w.update(step, loss=2.0 + 0.01 * (step % 4))
    assert w.snapshot()["level"] == "ok"
    ck = FabricCheckpoints(fabric, tmp_path, watch=w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck.save(30, {"model": m, "optimizer": opt, "step": 30})
    ck.close()
    # A new process's watch: restored, it judges at once (not "not judged" for 12 steps).
    w2 = watch()
    ck2 = FabricCheckpoints(fabric, tmp_path, watch=w2)
    assert ck2.resume({"model": m, "optimizer": opt, "step": 0}) is not None
    assert w2.snapshot()["level"] == "ok"
    assert json.dumps(w2.state_dict()) == json.dumps(w.state_dict())  # NaN fields too
    ck2.close()


# --- drills -----------------------------------------------------------------------------------


# The drill's end-state check (issue 25) found two differences in the datamodule script
# (a StabilityWatch, a StatefulDataLoader, a validation loop). ckptkit's own: the callback
# saved the watch's health but not its windows, so a resumed watch warmed up again (fixed:
# the watch's state_dict travels in the callback state). Lightning's: resumed from a
# checkpoint saved at the last step of an epoch, the run ends one epoch ahead of the
# uninterrupted one at the same global step (final checkpoints epoch=2-step=16 vs
# epoch=1-step=16; fit_loop.epoch_progress completed 2 vs 1) while every step record
# agrees. Not ckptkit's to fix; strict, so a Lightning fix shows.
_LIGHTNING_EPOCH_COUNTER = pytest.mark.xfail(
    strict=True,
    reason="end_state: Lightning's epoch counter, resumed from a checkpoint saved at an "
    "epoch's last step with a StatefulDataLoader, ends one epoch ahead (Lightning's loop)",
)
_EPOCH_SCRIPTS = [LIT, FAB, LIT2]


@pytest.mark.parametrize("script", _EPOCH_SCRIPTS, ids=["trainer", "fabric", "trainer-datamodule"])
def test_a_clean_drill_passes_bitwise_across_an_epoch_boundary(script: Path, tmp_path: Path) -> None:
    rep = _drill(script, "none", tmp_path, w=6, n=8)  # 10 steps an epoch: 7..14 cross it
    assert rep.ok, rep.to_dict() if hasattr(rep, "to_dict") else rep
    twin = next(c for c in rep.checks if c.name == "twin")
    assert twin.statistic == 0


@pytest.mark.parametrize(
    ("script", "fault"), [(LIT, "no-rng"), (FAB, "no-sampler")], ids=["trainer", "fabric"]
)
def test_a_seeded_fault_fails_with_the_right_diagnosis(script: Path, fault: str, tmp_path: Path) -> None:
    rep = _drill(script, fault, tmp_path)
    assert not rep.ok
    assert rep.diagnosis.component == EXPECTED[fault]


@pytest.mark.slow
@pytest.mark.parametrize("script", [LIT, FAB], ids=["trainer", "fabric"])
@pytest.mark.parametrize("fault", list(EXPECTED))
def test_fault_table(script: Path, fault: str, tmp_path: Path) -> None:
    rep = _drill(script, fault, tmp_path)
    assert rep.ok == (fault == "none")
    if fault != "none":
        assert rep.diagnosis.component == EXPECTED[fault]
        assert rep.diagnosis.confidence in ("high", "medium")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["no-rng", "data-version"])
def test_fault_table_of_the_datamodule_script(fault: str, tmp_path: Path) -> None:
    rep = _drill(LIT2, fault, tmp_path)
    assert not rep.ok
    assert rep.diagnosis.component == EXPECTED[fault]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    [LIT, FAB, pytest.param(LIT2, marks=_LIGHTNING_EPOCH_COUNTER)],
    ids=["trainer", "fabric", "trainer-datamodule"],
)
def test_a_drill_saved_at_the_end_of_an_epoch_passes(script: Path, tmp_path: Path) -> None:
    assert _drill(script, "none", tmp_path, w=10, n=6).ok
