"""``ckptkit watch`` and ``ckptkit rollback``: exit codes, alert file, output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.cli import main
from ckptkit.cli.watch import JsonlFollower, follow


def _write_metrics(path: Path, n: int, *, nan_at: int | None = None, partial: bool = False) -> None:
    lines = []
    for s in range(1, n + 1):
        loss: float | str = 2.0 + 0.01 * (s % 7)
        if nan_at is not None and s >= nan_at:
            loss = "nan"
        lines.append(
            json.dumps(
                {
                    "step": s,
                    "time": 0.0,
                    "loss": loss,
                    "grad_norm": 1.0,
                    "seq_lens": [3, 4],
                    "batch_hash": "ab",
                }
            )
        )
    text = "\n".join(lines) + "\n"
    if partial:
        text += '{"step": 99999, "loss": 1'  # a writer killed mid-line
    path.write_text(text)


def test_watch_once_clean_exits_0(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _write_metrics(m, 300, partial=True)
    res = CliRunner().invoke(
        main, ["watch", str(m), "--once", "--exit-on", "critical"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    assert "records 300" in res.output and "loss" in res.output


def test_watch_once_critical_writes_alert_and_exits_1(tmp_path: Path) -> None:
    m, alert = tmp_path / "metrics.jsonl", tmp_path / "ALERT.json"
    _write_metrics(m, 300, nan_at=250)
    res = CliRunner().invoke(
        main,
        ["watch", str(m), "--once", "--exit-on", "critical", "--alert-file", str(alert)],
        catch_exceptions=False,
    )
    assert res.exit_code == 1, res.output
    data = json.loads(alert.read_text())
    assert data["level"] == "critical" and data["worst_step"] == 250
    assert "loss.nonfinite" in data["health"]["signals"]


def test_watch_json_and_never(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _write_metrics(m, 50, nan_at=40)
    res = CliRunner().invoke(main, ["watch", str(m), "--once", "--json"], catch_exceptions=False)
    assert res.exit_code == 0  # --exit-on never (the default)
    out = json.loads(res.output)
    assert out["worst"] == "critical" and out["records"] == 50


def test_watch_missing_file_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["watch", str(tmp_path / "nope.jsonl"), "--once"], catch_exceptions=False
    )
    assert res.exit_code == 2
    assert "metrics file not found" in res.output


def test_follow_live_sees_appends_and_max_idle(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _write_metrics(m, 10)
    polls: list[int] = []

    def on_poll(st) -> None:  # type: ignore[no-untyped-def]
        polls.append(st.records)
        if len(polls) == 1:
            with open(m, "a") as fh:
                fh.write(json.dumps({"step": 11, "loss": "inf"}) + "\n")

    state, code = follow(m, interval=0.05, max_idle=0.3, exit_on="critical", on_poll=on_poll)
    assert code == 1 and state.worst == "critical" and state.records == 11


def test_follower_restarts_on_truncation(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _write_metrics(m, 20)
    f = JsonlFollower(m)
    assert len(f.poll()) == 20
    _write_metrics(m, 5)
    assert [r["step"] for r in f.poll()] == [1, 2, 3, 4, 5]
    assert f.restarted == 1
    with open(m, "a") as fh:
        fh.write("garbage\n" + json.dumps({"step": 6, "loss": "-inf"}) + "\n")
    recs = f.poll()
    assert f.bad_lines == 1 and recs[0]["loss"] == -math.inf


def test_follower_restarts_when_the_file_is_replaced_by_a_larger_one(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _write_metrics(m, 5, nan_at=5)
    seen: list[int] = []
    levels: list[str] = []

    def on_poll(st) -> None:  # type: ignore[no-untyped-def]
        levels.append(st.verdict.level if st.verdict else "ok")
        if len(levels) == 1:
            new = tmp_path / "new.jsonl"
            _write_metrics(new, 12)  # a new run, larger than the old offset
            new.replace(m)  # another inode at the same path

    f = JsonlFollower(m)
    seen += [r["step"] for r in f.poll()]
    new = tmp_path / "new.jsonl"
    _write_metrics(new, 12)
    new.replace(m)
    seen += [r["step"] for r in f.poll()]
    assert seen == [1, 2, 3, 4, 5, *range(1, 13)] and f.restarted == 1
    # follow(): the windows are reset, so the NaN of the old run no longer counts
    _write_metrics(m, 5, nan_at=5)
    state, _ = follow(m, interval=0.01, max_idle=0.2, on_poll=on_poll)
    assert levels[0] == "critical" and state.verdict is not None
    assert state.verdict.level == "ok" and state.restarts == 1
    assert any("replaced" in e for e in state.events)


def test_watch_json_reports_skipped_damaged_lines(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _write_metrics(m, 3)
    with open(m, "a") as fh:
        fh.write('garbage\n{"step":4,"lo\n')
    res = CliRunner().invoke(main, ["watch", str(m), "--once", "--json"], catch_exceptions=False)
    out = json.loads(res.output)
    assert out["records"] == 3 and out["bad_lines"] == 2 and out["restarts"] == 0


def _save(mgr: ckptkit.CheckpointManager, step: int, level: str | None, **kw) -> None:  # type: ignore[no-untyped-def]
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=step)
    health = (
        None
        if level is None
        else {
            "level": level,
            "step": step,
            "first_warn_step": 250 if level != "ok" else None,
            "signals": {}
            if level == "ok"
            else {
                "grad_norm.zscore": {
                    "level": level,
                    "statistic": 9.0,
                    "threshold": 6.0,
                    "detail": "robust z +9.0",
                }
            },
            "window": {},
        }
    )
    mgr.save(ts, health=health, **kw)


def test_rollback_picks_newest_ok(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    mgr = ckptkit.CheckpointManager(run, keep_last=10)
    _save(mgr, 100, "ok")
    _save(mgr, 200, "ok")
    _save(mgr, 250, "warn", pin="emergency")
    _save(mgr, 300, "critical")
    mgr.close()
    res = CliRunner().invoke(main, ["rollback", str(run)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "roll back to:" in res.output and "step-00000200" in res.output.splitlines()[0]
    assert "step-00000300: skipped, health critical, first warning at step 250" in res.output
    assert "grad_norm.zscore" in res.output
    # Hints only for the signals that fired (grad norm), none invented (no std-shift one).
    assert "tighten gradient clipping" in res.output and "noise level rose" not in res.output
    data = json.loads(
        CliRunner().invoke(main, ["rollback", str(run), "--json"], catch_exceptions=False).output
    )
    assert data["checkpoint"]["step"] == 200 and len(data["reasons"]) == 3


def test_rollback_without_healthy_exits_1(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    mgr = ckptkit.CheckpointManager(run, keep_last=5)
    _save(mgr, 10, None)
    _save(mgr, 20, "warn")
    mgr.close()
    res = CliRunner().invoke(main, ["rollback", str(run)], catch_exceptions=False)
    assert res.exit_code == 1
    assert "no healthy checkpoint" in res.output and "no health record" in res.output


def test_rollback_without_a_watch_picks_newest_verified(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    mgr = ckptkit.CheckpointManager(run, keep_last=5)
    _save(mgr, 10, None)
    _save(mgr, 20, None)
    mgr.close()
    res = CliRunner().invoke(main, ["rollback", str(run)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "step-00000020" in res.output.splitlines()[0]
    assert "no checkpoint of this run has health data" in res.output
    assert "suggestions" not in res.output  # no signal fired: no hint is invented


def test_rollback_missing_dir_exits_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["rollback", str(tmp_path / "nope")], catch_exceptions=False)
    assert res.exit_code == 2
