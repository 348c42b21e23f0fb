"""Automatic recovery (ckptkit.signals.recovery): triggers, restore, actions, limits, records.

A small real loop (Linear model, SGD + LambdaLR, a ResumableSampler, real checkpoints on
disk) whose health metrics are scripted per step, so each test decides exactly when the
watch warns or goes critical.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.cli import main
from ckptkit.errors import RecoveryError
from ckptkit.format.manifest import Manifest
from ckptkit.signals import recovery as rc
from ckptkit.signals.recovery import RecoveryContext, RecoveryEvent, RecoveryPolicy
from ckptkit.signals.stability import StabilityWatch

BATCH = 4


def small_watch(**kw: Any) -> StabilityWatch:
    """A watch that judges after 24 steps, warns on the very step a value jumps (z-score
    only, one trigger is enough) and is critical only on NaN/Inf: the scripted health of
    each step is the watch's verdict (after the first warning it latches, as by default)."""
    args: dict[str, Any] = {
        "window": 16, "recent": 8, "warmup": 24, "min_history": 8, "clear_after": 1000,
        "trigger_count": 1, "trigger_window": 1, "z_critical": 1e9,
        "std_ratio_warn": 1e8, "std_ratio_critical": 1e9, "regress_warn": None,
        "regress_critical": None, "drift_warn": None, "spread_warn": None,
    }
    args.update(kw)
    return StabilityWatch(**args)


class Loop:
    """A training loop with scripted health: ``health(step) -> 'ok' | 'warn' | 'nan'``."""

    def __init__(
        self,
        root: Path,
        policy: RecoveryPolicy | None,
        *,
        save_every: int = 10,
        watch: StabilityWatch | None = None,
        clip: float = 1.0,
    ) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)
        self.sampler = ckptkit.ResumableSampler(10_000, seed=3, shuffle=True)
        self.ts = ckptkit.TrainState(
            model=self.model, optimizer=self.opt, scheduler=self.sched, sampler=self.sampler
        )
        self.watch = watch if watch is not None else small_watch()
        self.mgr = ckptkit.CheckpointManager(
            root, keep_last=50, watch=self.watch, recovery=policy, background_verify=False
        )
        self.save_every = save_every
        self.clip = clip
        self.seen: dict[int, list[int]] = {}
        """Sample ids trained on at each step (the last time that step ran)."""
        self.trained: list[tuple[int, list[int]]] = []
        """Every step run, replays included, in order."""
        self.events: list[RecoveryEvent] = []
        self.clips: list[float] = []
        self.levels: dict[int, str] = {}

    def first_warning(self) -> int:
        return min(s for s, lvl in self.levels.items() if lvl != "ok")

    def run(self, until: int, health: Callable[[int], str], *, through: bool = False) -> None:
        """Train up to step ``until``; return early after a rollback unless ``through``."""
        while self.ts.step < until:
            ids = list(itertools.islice(iter(self.sampler), BATCH))
            x = torch.randn(BATCH, 4)
            loss = self.model(x).pow(2).mean()
            self.opt.zero_grad()
            loss.backward()
            clip = self.mgr.recovery.clip_norm(self.clip) if self.mgr.recovery else self.clip
            self.clips.append(clip)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.opt.step()
            self.sched.step()
            self.ts.step += 1
            step = self.ts.step
            self.seen[step] = ids
            self.trained.append((step, ids))
            h = health(step)
            value = {"ok": 1.0 + 0.01 * (step % 7), "warn": 4.0, "nan": float("nan")}[h]
            self.levels[step] = self.watch.update(step, loss=value).level
            if step % self.save_every == 0:
                self.mgr.save(self.ts)
            event = self.mgr.recover(self.ts)
            if event is not None:
                self.events.append(event)
                if event.kind == "restored" and not through:
                    return

    def close(self) -> None:
        self.mgr.close()


def read_manifest(ckpt: Path) -> Manifest:
    return Manifest.from_json((ckpt / "manifest.json").read_text())


def nan_at(*steps: int) -> Callable[[int], str]:
    return lambda s: "nan" if s in steps else "ok"


@pytest.fixture
def loop(tmp_path: Path) -> Callable[..., Loop]:
    made: list[Loop] = []

    def make(policy: RecoveryPolicy | None = None, **kw: Any) -> Loop:
        lp = Loop(tmp_path / "run", policy, **kw)
        made.append(lp)
        return lp

    yield make
    for lp in made:
        lp.close()


def test_off_by_default(loop: Callable[..., Loop]) -> None:
    lp = loop(None)
    assert lp.mgr.recovery is None
    lp.run(40, nan_at(35))
    assert lp.events == [] and lp.ts.step == 40
    assert not (lp.mgr.root / rc.LOG).exists()


def test_policy_and_manager_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing triggers"):
        RecoveryPolicy(critical=False)
    with pytest.raises(ValueError, match="lr_factor"):
        RecoveryPolicy(lr_factor=1.5)
    with pytest.raises(ValueError, match="skip"):
        RecoveryPolicy(skip="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_recoveries"):
        RecoveryPolicy(max_recoveries=0)
    with pytest.raises(ValueError, match="needs watch"):
        ckptkit.CheckpointManager(tmp_path / "r", recovery=RecoveryPolicy())


def test_critical_restores_newest_healthy_and_applies_actions(
    loop: Callable[..., Loop], caplog: pytest.LogCaptureFixture
) -> None:
    # Warnings from step 33 (the checkpoint of step 40 is saved mid-episode: not healthy),
    # NaN at step 44: the recovery must go back to step 30, not 40.
    health = {**{s: "warn" for s in range(33, 44)}, 44: "nan"}
    lp = loop(RecoveryPolicy(lr_factor=0.3, clip_factor=0.5, skip="none"))
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        lp.run(45, lambda s: health.get(s, "ok"))
    assert [e.kind for e in lp.events] == ["restored"]
    ev = lp.events[0]
    assert ev.step == 30 and lp.ts.step == 30
    rec = ev.record
    assert rec["restored"] == {"step": 30, "checkpoint": "step-00000030", "notes": rec["restored"]["notes"]}
    assert rec["detected_at"] == 44 and rec["steps_lost"] == 14
    assert rec["trigger"]["level"] == "critical" and "loss.nonfinite" in rec["trigger"]["signals"]
    assert rec["trigger"]["first_warning_step"] == lp.first_warning() == 33
    # LR x0.3 in the param groups and the schedule (later checkpoints carry it).
    assert lp.opt.param_groups[0]["lr"] == pytest.approx(0.03)
    assert lp.sched.base_lrs == [pytest.approx(0.03)]
    assert lp.mgr.recovery.lr_scale == pytest.approx(0.3)
    assert lp.mgr.recovery.clip_norm(1.0) == pytest.approx(0.5)
    assert rec["actions"]["clip"]["read_by_loop"] is True
    # The abandoned trajectory (step 40, saved during the warning) is set aside, not deleted.
    assert [c.step for c in lp.mgr.list()] == [10, 20, 30]
    moved = lp.mgr.root / rc.ABANDONED / "recovery-001" / "step-00000040"
    assert (moved / "manifest.json").is_file()
    assert rec["abandoned"][0]["step"] == 40 and rec["abandoned"][0]["health"] != "ok"
    # Recorded in the run's log, and a line in the log says what happened.
    data = rc.read_log(lp.mgr.root)
    assert [r["n"] for r in data["recoveries"]] == [1] and data["refusals"] == []
    assert data["recoveries"][0]["timing"]["detect_to_resume_s"] >= 0
    assert any("recovery #1 at step 44" in r.message for r in caplog.records)
    # Training continues from 30 with the lower LR; the replayed steps save again.
    lp.run(60, lambda s: "ok")
    assert lp.ts.step == 60 and [c.step for c in lp.mgr.list()] == [10, 20, 30, 40, 50, 60]
    assert lp.clips[-1] == pytest.approx(0.5)


def test_warn_streak_triggers_after_n_consecutive_warnings(loop: Callable[..., Loop]) -> None:
    # Five warnings, a quiet step, four warnings: never 5 in a row under warn_steps=5...
    warn = {33, 34, 35, 36, 37, 39, 40, 41, 42}
    lp = loop(RecoveryPolicy(critical=False, warn_steps=5, skip="none"))
    watch = small_watch(clear_after=1)  # the level follows the metric (no latching)
    lp.watch, lp.mgr.watch = watch, watch
    lp.mgr.recovery.host.watch = watch
    lp.run(50, lambda s: "warn" if s in warn else "ok")
    # ... except the first five (33-37).
    assert len(lp.events) == 1
    assert lp.events[0].record["detected_at"] == 37
    assert lp.events[0].record["trigger"]["reason"].startswith("warn or worse for 5")


def test_warn_streak_counts_only_consecutive_steps(loop: Callable[..., Loop]) -> None:
    watch = small_watch(clear_after=1)
    lp = loop(RecoveryPolicy(critical=False, warn_steps=4, skip="none"), watch=watch)
    warn = {31, 32, 33, 35, 36, 37, 39, 40}
    lp.run(45, lambda s: "warn" if s in warn else "ok")
    assert lp.events == []
    # critical=False: a NaN is a warn-or-worse step, not a trigger on its own.
    lp.run(48, lambda s: "nan" if s == 46 else "ok")
    assert lp.events == []


def test_skip_window_since_first_warning_records_the_skipped_ids(
    loop: Callable[..., Loop],
) -> None:
    health = {**{s: "warn" for s in range(35, 39)}, 39: "nan"}
    lp = loop(RecoveryPolicy(skip="warning"))
    lp.run(39, lambda s: health.get(s, "ok"))
    window = [i for s in range(35, 40) for i in lp.seen[s]]  # the batches of steps 35-39
    (ev,) = lp.events
    assert ev.step == 30
    skip = ev.record["actions"]["skip"]
    assert skip["status"] == "pending" and (skip["from_step"], skip["to_step"]) == (35, 39)
    # The replay trains again on 31-34, then the cursor jumps over the window.
    lp.run(45, lambda s: "ok")
    assert [e.kind for e in lp.events] == ["restored", "skipped"]
    assert lp.events[1].step == 34
    applied = lp.events[1].record["actions"]["skip"]
    assert applied["status"] == "applied" and applied["samples"] == len(window)
    assert [i for _, i in applied["ids"]["0"]] == window
    replayed = [ids for s, ids in lp.trained[39:]]
    assert not set(window) & {i for ids in replayed for i in ids}
    # The batch after the window is the one that came after step 39 in the first pass.
    probe = ckptkit.ResumableSampler(10_000, seed=3, shuffle=True)
    order = list(itertools.islice(iter(probe), 45 * BATCH))
    assert lp.trained[39 + 4][1] == order[39 * BATCH : 40 * BATCH]
    # The log has the ids too.
    logged = rc.read_log(lp.mgr.root)["recoveries"][0]["actions"]["skip"]
    assert logged["status"] == "applied" and logged["samples"] == len(window)


def test_skip_since_checkpoint_jumps_at_once(loop: Callable[..., Loop]) -> None:
    health = {**{s: "warn" for s in range(35, 39)}, 39: "nan"}
    lp = loop(RecoveryPolicy(skip="checkpoint"))
    lp.run(40, lambda s: health.get(s, "ok"))
    (ev,) = lp.events
    skip = ev.record["actions"]["skip"]
    assert ev.step == 30 and skip["status"] == "applied" and skip["samples"] == 9 * BATCH
    window = [i for s in range(31, 40) for i in lp.seen[s]]
    assert [i for _, i in skip["ids"]["0"]] == window
    lp.run(31, lambda s: "ok")
    assert not set(lp.seen[31]) & set(window)


def test_callback_gets_the_state_and_its_answer_is_recorded(loop: Callable[..., Loop]) -> None:
    calls: list[RecoveryContext] = []

    def extra_cut(ctx: RecoveryContext) -> dict[str, Any]:
        calls.append(ctx)
        for g in ctx.state.optimizer.param_groups:
            g["weight_decay"] = 0.5
        return {"weight_decay": 0.5}

    lp = loop(RecoveryPolicy(lr_factor=None, clip_factor=None, skip="none", callback=extra_cut))
    lp.run(35, nan_at(35))
    (ctx,) = calls
    assert ctx.n == 1 and ctx.rank == 0 and ctx.world_size == 1 and ctx.state is lp.ts
    assert ctx.record["restored"]["step"] == 30
    rec = lp.events[0].record
    assert rec["actions"]["callback"] == {"weight_decay": 0.5}
    assert lp.opt.param_groups[0]["lr"] == pytest.approx(0.1)  # lr_factor=None: unchanged


def test_failing_callback_stops_the_run_with_ck_d011(loop: Callable[..., Loop]) -> None:
    def boom(ctx: RecoveryContext) -> None:
        raise RuntimeError("no idea")

    lp = loop(RecoveryPolicy(callback=boom, skip="none"))
    with pytest.raises(RecoveryError, match="callback failed") as ei:
        lp.run(35, nan_at(35))
    assert ei.value.code == "CK-D011"
    assert "failed" in rc.read_log(lp.mgr.root)["refusals"][0]


def test_no_healthy_checkpoint_is_ck_d011(loop: Callable[..., Loop]) -> None:
    lp = loop(RecoveryPolicy(), save_every=1000)
    with pytest.raises(RecoveryError) as ei:
        lp.run(30, nan_at(30))
    assert ei.value.code == "CK-D011" and "no healthy checkpoint" in str(ei.value)


def test_max_recoveries_then_a_clear_error_never_a_loop(loop: Callable[..., Loop]) -> None:
    # The collapse comes back every time after the restore: 2 recoveries, then CK-D010.
    lp = loop(RecoveryPolicy(max_recoveries=2, min_steps_between=0, skip="none"))
    with pytest.raises(RecoveryError, match="max_recoveries=2") as ei:
        lp.run(100, nan_at(35), through=True)
    assert ei.value.code == "CK-D010" and "Fix:" in str(ei.value)
    assert len(lp.events) == 2 and lp.ts.step == 35  # stopped where it was detected
    data = rc.read_log(lp.mgr.root)
    assert len(data["recoveries"]) == 2 and len(data["refusals"]) == 1
    assert "refused" in data["refusals"][0]
    assert lp.mgr.recovery.lr_scale == pytest.approx(0.09)  # compounded: 0.3 x 0.3


def test_min_distance_between_recoveries(loop: Callable[..., Loop]) -> None:
    lp = loop(RecoveryPolicy(min_steps_between=10, skip="none"))
    with pytest.raises(RecoveryError, match="min_steps_between=10") as ei:
        lp.run(100, nan_at(35), through=True)  # 35 - 30 = 5 steps after the restored step
    assert ei.value.code == "CK-D010" and len(lp.events) == 1


def test_later_manifests_carry_the_history_and_a_restart_continues_it(
    tmp_path: Path, loop: Callable[..., Loop]
) -> None:
    lp = loop(RecoveryPolicy(skip="warning", max_recoveries=2, min_steps_between=0))
    health = {**{s: "warn" for s in range(36, 38)}, 38: "nan"}
    lp.run(50, lambda s: health.get(s, "ok"))
    lp.run(50, lambda s: "ok")
    lp.close()
    man = read_manifest(lp.mgr.root / "step-00000050")
    assert man.recoveries is not None
    assert man.recoveries["count"] == 1 and man.recoveries["lr_scale"] == pytest.approx(0.3)
    hist = man.recoveries["history"][0]
    assert hist["restored"]["step"] == 30 and hist["actions"]["skip"]["status"] == "applied"
    assert "pending_skip" not in man.recoveries
    # Checkpoint 30 is before the recovery: it carries none.
    assert read_manifest(lp.mgr.root / "step-00000030").recoveries is None
    # A new process: the scales and the history come back from the checkpoint, the limit
    # counts the recoveries of the run's log.
    lp2 = Loop(lp.mgr.root, RecoveryPolicy(max_recoveries=1, skip="none"))
    try:
        res = lp2.mgr.restore(lp2.ts)
        assert res is not None and res.step == 50
        assert lp2.mgr.recovery.lr_scale == pytest.approx(0.3)
        assert lp2.opt.param_groups[0]["lr"] == pytest.approx(0.03)
        assert len(lp2.mgr.recovery.history) == 1
        with pytest.raises(RecoveryError, match="max_recoveries=1"):
            lp2.run(100, nan_at(55))
    finally:
        lp2.close()


def test_pending_skip_survives_a_restart(tmp_path: Path, loop: Callable[..., Loop]) -> None:
    # Recovery restores 30 and schedules the skip at 34; the process saves at 32 and dies.
    health = {**{s: "warn" for s in range(35, 39)}, 39: "nan"}
    lp = loop(RecoveryPolicy(skip="warning"), save_every=10)
    lp.run(39, lambda s: health.get(s, "ok"))
    lp.run(32, lambda s: "ok")
    lp.mgr.save(lp.ts)
    window = rc.read_log(lp.mgr.root)["recoveries"][0]
    lp.close()
    man = read_manifest(lp.mgr.root / "step-00000032")
    assert man.recoveries["pending_skip"]["at_step"] == 34
    lp2 = Loop(lp.mgr.root, RecoveryPolicy(skip="warning"))
    try:
        lp2.mgr.restore(lp2.ts)
        lp2.run(36, lambda s: "ok")
        assert [e.kind for e in lp2.events] == ["skipped"]
        assert lp2.events[0].record["actions"]["skip"]["samples"] == 5 * BATCH
        assert window["actions"]["skip"]["status"] == "pending"
        assert rc.read_log(lp.mgr.root)["recoveries"][0]["actions"]["skip"]["status"] == "applied"
    finally:
        lp2.close()


def test_scale_lr_covers_schedules_and_is_safe_without_optimizer() -> None:
    m = torch.nn.Linear(1, 1)
    opt = torch.optim.AdamW(m.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=100)
    ts = ckptkit.TrainState(model=m, optimizer=opt, scheduler=sched)
    out = rc.scale_lr(ts, 0.5)
    assert out["applied"] and opt.param_groups[0]["max_lr"] == pytest.approx(0.5)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] < 0.5
    assert rc.scale_lr(ckptkit.TrainState(model=m), 0.5) == {
        "applied": False, "why": "no optimizer in the TrainState"
    }


def test_unreadable_log_refuses_with_ck_d010(loop: Callable[..., Loop]) -> None:
    lp = loop(RecoveryPolicy(skip="none"))
    lp.run(20, lambda s: "ok")
    (lp.mgr.root / rc.LOG).write_text("{not json")
    with pytest.raises(RecoveryError, match="cannot be read"):
        lp.run(40, nan_at(35))


def test_log_is_json_and_describe_reads_it(loop: Callable[..., Loop]) -> None:
    lp = loop(RecoveryPolicy(skip="none"))
    lp.run(40, nan_at(35))
    raw = json.loads((lp.mgr.root / rc.LOG).read_text())
    assert raw["version"] == rc.LOG_VERSION
    (line,) = [rc.describe(r) for r in rc.iter_records(lp.mgr.root)]
    assert line.startswith("recovery #1 at step 35 (critical: loss.nonfinite)")
    assert "restored step-00000030" in line and "LR x0.3" in line


def test_ls_and_rollback_show_the_recoveries(loop: Callable[..., Loop]) -> None:
    lp = loop(RecoveryPolicy(max_recoveries=1, min_steps_between=0, skip="warning"))
    health = {**{s: "warn" for s in range(36, 38)}, 38: "nan"}
    lp.run(50, lambda s: health.get(s, "ok"))
    with pytest.raises(RecoveryError):
        lp.run(50, nan_at(45))
    lp.close()
    run = str(lp.mgr.root)
    runner = CliRunner()
    out = runner.invoke(main, ["ls", run], catch_exceptions=False).output
    assert "automatic recoveries (2):" in out
    assert "recovery #1 at step 38 (critical: loss.nonfinite" in out
    assert "restored step-00000030; LR x0.3; clip norm x0.3" in out
    assert "recovery #2 at step 45" in out and "refused: 1 recoveries already" in out
    js = json.loads(runner.invoke(main, ["ls", run, "--json"], catch_exceptions=False).output)
    assert [r["n"] for r in js["recoveries"]] == [1, 2]
    assert js["recoveries"][0]["actions"]["skip"]["status"] == "applied"
    res = runner.invoke(main, ["rollback", run], catch_exceptions=False)
    assert "roll back to:" in res.output and "automatic recoveries (2):" in res.output
    res = runner.invoke(main, ["rollback", run, "--json"], catch_exceptions=False)
    js = json.loads(res.output)
    assert js["recoveries"][0]["restored"]["step"] == 30 and "refused" in js["recoveries"][1]
