"""Trainer and Accelerate run directories as ckptkit runs, with the real libraries, in process.

``ckptkit.integrations.hf`` adopts each checkpoint the framework writes (digests beside its
files), rotates with verified retention instead of ``save_total_limit`` / ``total_limit``,
and picks the newest checkpoint that verifies for the resume; ``ckptkit.run.layouts.hf``
lists them with a status for ``ls`` / ``prune`` / ``rollback``.
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptkit.checkpoint.manifest_io import read_path
from ckptkit.errors import CkptkitError, LockHeldError
from ckptkit.run import directory as runs
from ckptkit.run import retain
from ckptkit.run.layouts.hf import open_hf
from ckptkit.signals.stability import StabilityWatch
from ckptkit.verify.foreign.adopt import adopt_checkpoint

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from ckptkit.integrations.hf import (  # noqa: E402
    AccelerateCheckpoints,
    CkptkitCallback,
    check_resumable,
    data_identity,
    resume_checkpoint,
)

pytestmark = pytest.mark.integration


@contextmanager
def quiet() -> Iterator[None]:
    """The libraries warn about CPU-only runs and deprecations: not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        yield


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = 24, seed: int = 0) -> None:
        self.x = torch.randint(0, 64, (n, 8), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_model() -> Any:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=8)
    return transformers.GPT2LMHeadModel(cfg)


def train(out: Path, *, steps: int, callbacks: list[Any], resume: str | None = None,
          save_total_limit: int | None = None) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, save_steps=2, per_device_train_batch_size=4,
        report_to=[], use_cpu=True, logging_steps=1, disable_tqdm=True, seed=0,
        save_total_limit=save_total_limit,
    )
    with quiet():
        tr = transformers.Trainer(model=tiny_model(), args=args, train_dataset=Tokens(),
                                  callbacks=callbacks)
        tr.train(resume_from_checkpoint=resume)
    return tr


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Trainer run of 8 steps saving every 2 with the callback, save_total_limit=3."""
    out = tmp_path_factory.mktemp("trainer") / "out"
    cb = CkptkitCallback()
    train(out, steps=8, callbacks=[cb], save_total_limit=3)
    assert [a.ok for a in cb.adoptions] == [True] * 4
    return out


def copy_run(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


def statuses(run: Any) -> list[tuple[int, str]]:
    return [(c.step, c.status) for c in run.checkpoints()]


# --- the Trainer callback ------------------------------------------------------------------


def test_callback_adopts_each_save_and_rotates_verified(trainer_run: Path) -> None:
    run = runs.open_run(trainer_run)
    assert run.layout == "hf-trainer"
    # save_total_limit=3 became verified rotation: the three newest are kept, all verified.
    assert statuses(run) == [(4, "verified"), (6, "verified"), (8, "verified")]
    assert all((c.path / "ckptkit-manifest.json").is_file() for c in run.checkpoints())  # type: ignore[operator]
    assert not (trainer_run / ".ckptkit.lock").exists()  # released at the end of training
    run.close()


def test_an_ema_callback_copies_the_model_with_a_recorder_bound(tmp_path: Path) -> None:
    """Issue 24: the callback's loss hook on the model held the callback, so an EMA helper's
    ``copy.deepcopy(model)`` copied it and the Recorder's open file (``TypeError: cannot
    pickle '_io.TextIOWrapper'``)."""
    import copy

    from ckptkit.signals.recorder import Recorder, read_jsonl

    class Ema(transformers.TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.copies: list[Any] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.copies.append(copy.deepcopy(kw["model"]))

    rec = Recorder(tmp_path / "metrics.jsonl")
    ema = Ema()
    train(tmp_path / "out", steps=2, callbacks=[CkptkitCallback(recorder=rec), ema])
    rec.close()
    assert len(ema.copies) == 2
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in read_jsonl(tmp_path / "metrics.jsonl"))


def test_statuses_from_files(trainer_run: Path, tmp_path: Path) -> None:
    out = copy_run(trainer_run, tmp_path)
    (out / "checkpoint-8" / "trainer_state.json").unlink()  # an interrupted save
    (out / "checkpoint-6" / "optimizer.pt").write_bytes(b"x")  # resized since adopted
    (out / "checkpoint-4" / "ckptkit-manifest.json").unlink()  # never adopted
    run = runs.open_run(out)
    got = {c.step: (c.status, c.problem) for c in run.checkpoints()}
    assert got[8][0] == "incomplete" and "trainer_state.json" in (got[8][1] or "")
    assert got[6][0] == "corrupt" and "optimizer.pt" in (got[6][1] or "")
    assert got[4][0] == "committed" and "not adopted" in (got[4][1] or "")


def test_resume_skips_and_names_corrupt_checkpoints(
    trainer_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = copy_run(trainer_run, tmp_path)
    w = out / "checkpoint-8" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-3] ^= 0x01  # a flipped bit in a weight: same size, only the digest tells
    w.write_bytes(bytes(data))
    assert statuses(runs.open_run(out))[-1] == (8, "verified")  # sizes agree: not seen yet
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        got = resume_checkpoint(out)
    assert got == str(out / "checkpoint-6")
    assert any("checkpoint-8" in r.message and "CK-F003" in r.message for r in caplog.records)
    with pytest.raises(CkptkitError) as e:
        check_resumable(out / "checkpoint-8", "hf-trainer")
    assert e.value.code == "CK-F003" and "model" in str(e.value)


def test_resume_continues_the_run(trainer_run: Path, tmp_path: Path) -> None:
    out = copy_run(trainer_run, tmp_path)
    ckpt = resume_checkpoint(out)
    assert ckpt == str(out / "checkpoint-8")
    cb = CkptkitCallback(keep=2)
    tr = train(out, steps=12, callbacks=[cb], resume=ckpt)
    assert tr.state.global_step == 12
    assert statuses(runs.open_run(out)) == [(10, "verified"), (12, "verified")]
    # Every save records the look-ahead of its next step, and the resume is checked
    # against it (no Recorder): an exact resume has no finding.
    saved = read_path(out / "checkpoint-10" / "ckptkit-manifest.json").lookahead["guard"]
    assert saved["next_step"] == 11 and saved["opt_step"] == 10 and saved["sched_epoch"] == 10
    assert cb._keeper.guard is not None and cb._keeper.guard.findings == []


def test_emergency_save_on_a_stability_warning(tmp_path: Path) -> None:
    class NaNAt(transformers.TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if state.global_step == 3 and logs and "loss" in logs:
                logs["loss"] = math.nan

    cb = CkptkitCallback(watch=StabilityWatch())
    out = tmp_path / "out"
    train(out, steps=4, callbacks=[NaNAt(), cb])
    infos = {c.step: c for c in runs.open_run(out).checkpoints()}
    assert infos[3].pins == ("emergency",) and infos[3].health == "critical"
    # Step 2 was saved during the watch's warm-up: nothing judged but NaN/Inf, not "ok".
    assert infos[2].health == "not judged" and infos[4].pins == ()
    assert infos[3].status == "verified"


# --- the run layout ---------------------------------------------------------------------------


def test_remove_needs_the_lock_and_rotation_keeps_the_newest_good(
    trainer_run: Path, tmp_path: Path
) -> None:
    out = copy_run(trainer_run, tmp_path)
    ro = runs.open_run(out)
    with pytest.raises(CkptkitError, match="read-only"):
        ro.remove(ro.checkpoints()[0])
    (out / "checkpoint-8" / "optimizer.pt").unlink()  # the newest is not good
    with open_hf(out, "hf-trainer", readonly=False) as run:
        with pytest.raises(LockHeldError):
            open_hf(out, "hf-trainer", readonly=False)
        outcome = retain.apply(run, retain.Policy(keep_last=1))
        # keep-last-1 keeps the newest (corrupt); the newest good one (6) is never deleted.
        assert [d.split(":")[0] for d in outcome.deleted] == ["checkpoint-4"]
        assert statuses(run) == [(6, "verified"), (8, "corrupt")]
        assert run.leftovers() == []


def test_adopt_records_what_the_loop_knows(trainer_run: Path, tmp_path: Path) -> None:
    from ckptkit.verify.foreign.adopt import Notes

    out = copy_run(trainer_run, tmp_path)
    a = adopt_checkpoint(out / "checkpoint-4", "hf-trainer", expect="training",
                         notes=Notes(step=4, pins=("best",), health={"level": "warn"},
                                     data={"snapshot": "abc"}))
    assert a.ok
    info = next(c for c in runs.open_run(out).checkpoints() if c.step == 4)
    assert info.pins == ("best",) and info.health == "warn"


def test_data_identity_is_content_and_leaves_rng_alone() -> None:
    torch.manual_seed(1)
    before = torch.get_rng_state()
    a, b = data_identity(Tokens(seed=0)), data_identity(Tokens(seed=1))
    assert torch.equal(before, torch.get_rng_state())
    assert a is not None and b is not None and a["snapshot"] != b["snapshot"]
    assert a == data_identity(Tokens(seed=0))
    assert data_identity(iter([1, 2])) is None


# --- Accelerate ---------------------------------------------------------------------------------


def acc_loop(project: Path, *, steps: int, keep: int | None, total_limit: int | None,
             resume: bool) -> tuple[AccelerateCheckpoints, int]:
    with quiet():
        acc = accelerate.Accelerator(
            cpu=True,
            project_config=accelerate.utils.ProjectConfiguration(
                project_dir=str(project), automatic_checkpoint_naming=True,
                total_limit=total_limit),
        )
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
        dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
        m, opt, dl = acc.prepare(m, opt, dl)
        ck = AccelerateCheckpoints(acc, m, opt, None, dl, keep=keep, save_every=2)
        step = ck.resume() if resume else 0
        start = step
        for x, y in dl:
            acc.backward(((m(x) - y) ** 2).mean())
            opt.step()
            opt.zero_grad()
            step += 1
            ck.step_end(step)
            if step >= steps:
                break
        ck.close()
    return ck, start


def test_accelerate_adopts_rotates_and_resumes(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    ck, _ = acc_loop(project, steps=8, keep=None, total_limit=2, resume=False)
    assert [a.ok for a in ck.adoptions] == [True] * 4
    run = runs.open_run(project)  # the project dir: its checkpoints/ is the run
    assert run.layout == "accelerate"
    # total_limit=2 became verified rotation; steps come from the adopted manifests.
    assert [(c.step, c.status, Path(str(c.path)).name) for c in run.checkpoints()] == [
        (6, "verified", "checkpoint_2"), (8, "verified", "checkpoint_3")]
    # Nothing of ckptkit's inside checkpoints/ (Accelerate sorts its entries by the number
    # in their names: load_state() without a path would fail on a lock or index file).
    assert all(p.name.startswith("checkpoint_") for p in (project / "checkpoints").iterdir())
    assert (project / ".ckptkit-index.json").is_file()
    ck, start = acc_loop(project, steps=10, keep=3, total_limit=None, resume=True)
    assert start == 8
    saved = read_path(project / "checkpoints" / "checkpoint_3" / "ckptkit-manifest.json")
    assert saved.lookahead["guard"]["next_step"] == 9  # the look-ahead, checked at the resume
    assert ck._keeper.guard is not None and ck._keeper.guard.findings == []
    names = [Path(str(c.path)).name for c in runs.open_run(project).checkpoints()]
    assert names == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]  # counts on, never overwrites


def test_accelerate_emergency_save_on_nan_loss(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    with quiet():
        acc = accelerate.Accelerator(cpu=True, project_config=accelerate.utils.ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True))
        m = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m, opt = acc.prepare(m, opt)
        ck = AccelerateCheckpoints(acc, m, opt, watch=True)
        saves = []
        for step in range(1, 6):
            acc.backward(m(torch.ones(1, 2)).sum())
            opt.step()
            before = len(ck.adoptions)
            ck.step_end(step, loss=math.nan if step == 4 else 1.0)
            saves += [step] * (len(ck.adoptions) - before)
        ck.close()
    assert saves == [4]  # no save_every: only the emergency
    (info,) = runs.open_run(project).checkpoints()
    assert info.step == 4 and info.pins == ("emergency",) and info.health == "critical"
