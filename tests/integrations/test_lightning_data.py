"""Lightning and Fabric data paths (issue 24): the restored position is kept, the resume
guard watches the first resumed steps, and the documented recipes resume exactly.

Each resume test runs a real script three times in fresh interpreters through the drill
contract (``CKPTKIT_DRILL_*``): uninterrupted to step S, interrupted after step W with a
checkpoint there, and resumed from that checkpoint to S; the resumed run must then equal
the uninterrupted one bitwise (final weights, and the sample ids and loss of every step
after W).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

L = pytest.importorskip("lightning")

from ckptkit.signals.recorder import read_jsonl  # noqa: E402

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parents[1] / "scripts"
FABRIC_LOADER = SCRIPTS / "fabric_loader.py"
TIMEOUT = 300


def _run(cmd: list[str], workdir: Path, name: str, **env: str) -> tuple[Path, Path]:
    """Run ``cmd`` in ``workdir`` with the drill contract in ``env``; return its
    (metrics file, checkpoint dir)."""
    metrics = workdir / f"{name}.jsonl"
    ckpts = workdir / f"{name}-ckpt"
    full = {k: v for k, v in os.environ.items() if not k.startswith("CKPTKIT_")}
    full.update(env, CKPTKIT_METRICS=str(metrics), CKPTKIT_CKPT_DIR=str(ckpts))
    out = subprocess.run(cmd, cwd=workdir, env=full, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return metrics, ckpts


def _steps(metrics: Path) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): r for r in read_jsonl(metrics)}


def _interrupt_and_resume(
    cmd: list[str], workdir: Path, *, w: int, total: int
) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """Run ``cmd`` uninterrupted and interrupted-then-resumed; return both runs' records.

    ``cmd`` is completed with ``--final PATH``; the final weights are compared here.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ref, _ = _run([*cmd, "--final", str(workdir / "ref.pt")], workdir, "ref",
                  CKPTKIT_DRILL_STOP_AT=str(total))
    _, ckpts = _run(cmd, workdir, "first", CKPTKIT_DRILL_SAVE_AT=str(w),
                    CKPTKIT_DRILL_STOP_AT=str(w))
    saved = sorted(ckpts.rglob(f"*step={w}.ckpt"))
    assert saved, f"no checkpoint of step {w} in {sorted(ckpts.rglob('*'))}"
    resumed, _ = _run([*cmd, "--final", str(workdir / "resumed.pt")], workdir, "resumed",
                      CKPTKIT_DRILL_RESUME_FROM=str(saved[0]),
                      CKPTKIT_DRILL_STOP_AT=str(total))
    a = torch.load(workdir / "ref.pt", weights_only=True)
    b = torch.load(workdir / "resumed.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"weights {k} differ after the resume"
    return _steps(ref), _steps(resumed)


def _ids(records: dict[int, dict[str, Any]], steps: range) -> list[Any]:
    return [records[s].get("sample_ids") for s in steps]


# --- Fabric: setup_dataloaders keeps the restored position ----------------------------------


def test_fabric_setup_dataloaders_resumes_bitwise_mid_epoch(tmp_path: Path) -> None:
    # 10 steps an epoch: saved at step 15 (epoch 1, half way), resumed to 25 (into epoch 2).
    # Fabric's wrapper calls set_epoch(0) at the resumed process's first iter(), and builds
    # the DataLoader iterator (a draw from the global RNG) inside the first next(): before
    # the fix the resumed run replayed epoch 0 from its start.
    cmd = [sys.executable, str(FABRIC_LOADER), "--loop", "batches"]
    ref, resumed = _interrupt_and_resume(cmd, tmp_path, w=15, total=25)
    after = range(16, 26)
    assert _ids(resumed, after) == _ids(ref, after)
    assert all(_ids(ref, after)), "the records carry no sample ids: nothing was compared"
    assert [resumed[s]["loss"] for s in after] == [ref[s]["loss"] for s in after]
    assert [resumed[s]["batch_hash"] for s in after] == [ref[s]["batch_hash"] for s in after]


def test_a_plain_loop_over_a_fabric_loader_is_refused_before_a_step_with_the_fix(
    tmp_path: Path,
) -> None:
    # for epoch ...: sampler.set_epoch(epoch); for batch in fabric_loader: Fabric then calls
    # set_epoch(0) over the restored epoch 1. The sampler cannot tell that call from a
    # deliberate restart, so it refuses it, naming the loop that keeps the position.
    cmd = [sys.executable, str(FABRIC_LOADER), "--loop", "plain"]
    _, ckpts = _run(cmd, tmp_path, "first", CKPTKIT_DRILL_SAVE_AT="15", CKPTKIT_DRILL_STOP_AT="15")
    saved = next(ckpts.rglob("step=15.ckpt"))
    metrics = tmp_path / "resumed.jsonl"
    full = {k: v for k, v in os.environ.items() if not k.startswith("CKPTKIT_")}
    full.update(CKPTKIT_METRICS=str(metrics), CKPTKIT_CKPT_DIR=str(tmp_path / "r"),
                CKPTKIT_DRILL_RESUME_FROM=str(saved), CKPTKIT_DRILL_STOP_AT="25")
    out = subprocess.run(cmd, cwd=tmp_path, env=full, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode != 0
    assert "set_epoch(0) right after restoring a cursor of epoch 1" in out.stderr
    assert "sampler.batches(loader)" in out.stderr
    assert not (metrics.exists() and read_jsonl(metrics)), "a step ran before the refusal"


# --- the Trainer: the resume guard watches the first resumed steps --------------------------


class _Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.body(x), y)  # not self(x): no forward hook

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(tmp_path: Path, *, steps: int, ckpt: str | None = None, restart_epoch: bool = False,
         samples: int = 40, every: int = 6, workers: int = 0,
         ) -> tuple[Any, list[dict[str, Any]]]:
    """One small Trainer run (``samples`` samples in batches of 4 over ``workers`` loader
    processes, a checkpoint every ``every`` steps)."""
    import warnings

    import ckptkit
    from ckptkit.integrations.lightning import CkptkitCallback, CkptkitIO

    warnings.filterwarnings("ignore")
    L.seed_everything(0, verbose=False)
    x = torch.randn(samples, 8, generator=torch.Generator().manual_seed(7))
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).tanh())
    sampler = ckptkit.ResumableSampler(data, seed=0)
    rec = ckptkit.Recorder(None)
    cb = CkptkitCallback(sampler=sampler, recorder=rec)

    class RestartEpoch(L.Callback):
        """What a sampler that restarts its epoch on resume does (after the restore)."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if restart_epoch:
                sampler.load_state_dict({**sampler.state_dict(), "position": 0, "consumed": 0})

    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=str(tmp_path), plugins=[CkptkitIO()],
        callbacks=[cb, RestartEpoch(), L.pytorch.callbacks.ModelCheckpoint(
            dirpath=str(tmp_path / "ckpt"), every_n_train_steps=every, save_top_k=-1)],
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler,
                                         num_workers=workers)
    trainer.fit(_Net(), loader, ckpt_path=ckpt)
    return cb, list(rec.records)


def test_a_trainer_resume_that_restarts_the_epoch_is_reported_by_the_guard(tmp_path: Path) -> None:
    _, first = _fit(tmp_path, steps=6)
    assert all(r.get("batch_hash") for r in first), "Trainer records carry no batch hash"
    # A hash per batch row (the drill tells order from content by them) and the workers.
    assert all(len(r.get("rows", [])) == 4 and r.get("num_workers") == 0 for r in first), first
    ckpt = str(tmp_path / "ckpt" / "epoch=0-step=6.ckpt")
    clean, _ = _fit(tmp_path / "clean", steps=10, ckpt=ckpt)
    assert clean.guard is not None, "the resume was not guarded"
    assert clean.guard.findings == []
    cb, records = _fit(tmp_path / "restart", steps=10, ckpt=ckpt, restart_epoch=True)
    assert cb.guard is not None
    assert "CK-D002" in [f.code for f in cb.guard.findings]
    # ...and written into the first resumed step's record, where a drill reads it.
    assert "CK-D002" in [g["code"] for g in records[0].get("guard", [])]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_exact_trainer_resume_at_the_end_of_what_was_fetched_has_no_guard_finding(
    tmp_path: Path, workers: int
) -> None:
    # 3 steps an epoch. Step 2: one batch of epoch 0 left, so the resumed loader's first
    # fetch (and the workers' prefetch) reaches the end of the epoch before the guard looks;
    # step 6: the end of epoch 1. The sampler's look-ahead answered [] there, and the guard
    # reported these exact resumes as CK-D002 ("next sample ids []… differ").
    _, ref = _fit(tmp_path, steps=8, samples=12, every=2, workers=workers)
    want = {r["step"]: r["sample_ids"] for r in ref}
    for w in (2, 6):
        ckpt = str(next((tmp_path / "ckpt").glob(f"*step={w}.ckpt")))
        cb, records = _fit(tmp_path / f"from{w}", steps=8, samples=12, every=2,
                           workers=workers, ckpt=ckpt)
        assert cb.guard is not None, "the resume was not guarded"
        assert cb.guard.findings == [], (w, [f.message for f in cb.guard.findings])
        assert cb.guard.unknown == [], (w, cb.guard.unknown)
        assert {r["step"]: r["sample_ids"] for r in records} == {
            s: ids for s, ids in want.items() if s > w
        }
    # A resume that really replays (the epoch restarts after the restore) is still reported.
    ckpt = str(next((tmp_path / "ckpt").glob("*step=2.ckpt")))
    cb, _ = _fit(tmp_path / "replay", steps=8, samples=12, every=2, workers=workers,
                 ckpt=ckpt, restart_epoch=True)
    assert cb.guard is not None
    assert "CK-D002" in [f.code for f in cb.guard.findings]


# --- the documented Trainer recipe, with worker processes ------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "lightning.md"
LOADER_LINE = "loader = DataLoader(dataset, batch_size=32, sampler=sampler)"
RECIPE_PRELUDE = '''\
import warnings
warnings.filterwarnings("ignore")
import torch
import lightning as L
from torch.utils.data import DataLoader
from lightning.pytorch.callbacks import ModelCheckpoint
torch.manual_seed(0)
x = torch.randn(96, 4, generator=torch.Generator().manual_seed(7))
dataset = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).tanh())
class _LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3),
                                        torch.nn.Linear(16, 1))
    def training_step(self, batch, _i):
        x, y = batch
        return ((self.body(x) - y) ** 2).mean()
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)
model = _LM()
total_steps = 20
'''


def _trainer_recipe() -> str:
    """The Python block under "The lines to add: Trainer" in docs/lightning.md, as written."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## The lines to add: Trainer"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


def test_the_documented_trainer_recipe_resumes_exactly_with_two_workers(tmp_path: Path) -> None:
    from ckptkit.drill.config import DrillConfig
    from ckptkit.drill.runner import run_drill

    recipe = _trainer_recipe()
    assert LOADER_LINE in recipe, "the recipe's DataLoader line changed: update this test"
    script = tmp_path / "train.py"
    script.write_text(
        RECIPE_PRELUDE
        + 'if __name__ == "__main__":\n'  # worker processes may re-import the script
        + "".join(
            "    " + line + "\n"
            for line in recipe.replace(LOADER_LINE, LOADER_LINE[:-1] + ", num_workers=2)")
            .splitlines()
        ),
        encoding="utf-8",
    )
    # 3 steps an epoch, 2 workers prefetch 4 batches (the whole epoch) ahead of the step:
    # saved after step 4 (one batch into epoch 1), compared over steps 5..10.
    rep = run_drill(DrillConfig(command=[sys.executable, str(script)], steps_before=4,
                                steps_after=6, isolate=True, workdir=tmp_path / "drill",
                                timeout=TIMEOUT))
    assert rep.ok, rep.to_dict() if hasattr(rep, "to_dict") else rep
    twin = next(c for c in rep.checks if c.name == "twin")
    assert twin.statistic == 0
