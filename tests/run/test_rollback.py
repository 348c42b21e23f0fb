"""A real (tiny) training run with an induced collapse: emergency save, health, rollback."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import ckptkit
from ckptkit.cli import main
from ckptkit.examples.tiny_lm import TinyLM, collate, make_corpus
from ckptkit.run.directory import rollback
from ckptkit.signals.stability import StabilityWatch

pytestmark = pytest.mark.integration


def test_rollback_after_induced_collapse_picks_pre_warning_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    corpus = make_corpus(400, seed=1, version="v1", vocab=32, max_len=16)
    model = TinyLM(vocab=32, dim=16, heads=2, layers=1, max_len=16, dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ts = ckptkit.TrainState(model=model, optimizer=opt)
    rec = ckptkit.Recorder(tmp_path / "metrics.jsonl")
    watch = StabilityWatch(window=64, recent=16, warmup=150, clear_after=1000).attach(rec)
    mgr = ckptkit.CheckpointManager(tmp_path / "ckpt", keep_last=2, watch=watch)
    onset, saves = 250, 25
    gen = torch.Generator().manual_seed(0)
    for step in range(1, 451):
        lr = 3e-3 * (2.0 ** ((step - onset) / 8) if step > onset else 1.0)  # past the edge
        for g in opt.param_groups:
            g["lr"] = lr
        ids = torch.randint(0, len(corpus), (16,), generator=gen).tolist()
        x, y = collate([corpus[i] for i in ids])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ts.step = step
        rec.log(step, loss=loss.item(), grad_norm=gn.item(), lr=lr)
        mgr.observe(ts)  # emergency save on the first warn
        if step % saves == 0:
            mgr.save(ts)  # health recorded from the attached watch
        if not math.isfinite(loss.item()):
            break
    mgr.close()
    rec.close()

    first = watch.first_warn_step
    assert first is not None and first > onset, watch.last
    infos = mgr.list()
    by_step = {c.step: c for c in infos}
    # The emergency checkpoint: saved at the first warning, pinned, health not ok.
    assert by_step[first].pins == ("emergency",) and by_step[first].health != "ok"
    # Retention kept the newest healthy checkpoint although keep_last=2.
    pre = max(s for s in by_step if s < first and by_step[s].health == "ok")
    assert pre == (first - 1) // saves * saves
    assert all(c.health != "ok" for c in infos if c.step >= first)
    assert len([c for c in infos if c.step > first]) >= 1

    choice = rollback(tmp_path / "ckpt")
    assert choice.checkpoint is not None and choice.checkpoint.step == pre
    res = CliRunner().invoke(main, ["rollback", str(tmp_path / "ckpt")], catch_exceptions=False)
    assert res.exit_code == 0 and f"step-{pre:08d}" in res.output.splitlines()[0]
    assert f"first warning at step {first}" in res.output

    # restore(healthy=True) picks the same checkpoint and resets the watch.
    model2 = TinyLM(vocab=32, dim=16, heads=2, layers=1, max_len=16, dropout=0.0)
    ts2 = ckptkit.TrainState(model=model2, optimizer=torch.optim.AdamW(model2.parameters()))
    mgr2 = ckptkit.CheckpointManager(tmp_path / "ckpt", watch=StabilityWatch())
    result = mgr2.restore(ts2, healthy=True)
    assert result is not None and result.step == pre
    assert any("healthy=True" in n for n in result.notes)
    mgr2.close()
    # A plain restore still takes the newest verified one.
    newest = max(c.step for c in infos if c.status == "verified")
    assert ckptkit.CheckpointManager(tmp_path / "ckpt").restore(ts2).step == newest  # type: ignore[union-attr]
