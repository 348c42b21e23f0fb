"""Recorder: JSONL contract, value conversion, window stats, truncated-tail reading."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ckptkit.errors import CkptkitError
from ckptkit.signals.recorder import ENV_METRICS, Recorder, read_jsonl

REPO = Path(__file__).resolve().parents[2]


def test_writes_one_line_per_step_and_converts_values(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "metrics.jsonl"
    with Recorder(p) as rec:
        rec.log(
            1,
            loss=torch.tensor(2.5),
            grad_norm=np.float32(0.5),
            lr=1e-3,
            loss_scale=torch.tensor(65536.0),
            tokens=np.int64(128),
            seq_lens=torch.tensor([3, 7]),
            sample_ids=np.array([10, 11]),
            accuracy=0.25,
            phase="warmup",
        )
        rec.log(2, loss=float("nan"), grad_norm=torch.tensor(float("inf")), lr=-math.inf)
        # line-buffered with flush_every=1: visible before close
        lines = p.read_text().splitlines()
        assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["step"] == 1 and isinstance(first["time"], float)
    assert first["loss"] == 2.5 and first["grad_norm"] == 0.5 and first["tokens"] == 128
    assert first["seq_lens"] == [3, 7] and first["sample_ids"] == [10, 11]
    assert first["accuracy"] == 0.25 and first["phase"] == "warmup"
    assert second == {
        "step": 2,
        "time": second["time"],
        "loss": "nan",
        "grad_norm": "inf",
        "lr": "-inf",
    }  # None fields are left out


def test_flush_every_batches(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    rec = Recorder(p, flush_every=3)
    rec.log(1, loss=1.0)
    rec.log(2, loss=1.0)
    assert p.read_text() == ""
    rec.log(3, loss=1.0)
    assert len(p.read_text().splitlines()) == 3
    rec.log(4, loss=1.0)
    rec.close()
    rec.close()
    assert len(read_jsonl(p)) == 4
    assert len(rec.records) == 4  # window readable after close


def test_appends_across_instances(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    with Recorder(p) as rec:
        rec.log(1, loss=1.0)
    with Recorder(p) as rec:
        rec.log(2, loss=0.5)
    assert [r["step"] for r in read_jsonl(p)] == [1, 2]


def test_env_var_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "drill.jsonl"
    monkeypatch.setenv(ENV_METRICS, str(p))
    with Recorder() as rec:
        rec.log(5, loss=1.0)
    assert read_jsonl(p)[0]["step"] == 5
    other = tmp_path / "explicit.jsonl"
    with Recorder(other) as rec:  # an explicit path wins
        rec.log(6, loss=1.0)
    assert read_jsonl(other)[0]["step"] == 6 and len(read_jsonl(p)) == 1
    monkeypatch.delenv(ENV_METRICS)
    with Recorder() as rec:
        assert rec.path is None
        rec.log(1, loss=1.0)


def test_bad_values_and_args() -> None:
    rec = Recorder(None)
    with pytest.raises(TypeError, match=r"obj=.*cannot be written as JSON"):
        rec.log(1, obj=object())
    with pytest.raises(ValueError, match="reserved"):
        rec.log(1, time=3.0)
    with pytest.raises(ValueError, match="window"):
        Recorder(None, window=0)
    with pytest.raises(ValueError, match="flush_every"):
        Recorder(None, flush_every=0)


def test_window_is_rolling_and_stats() -> None:
    rec = Recorder(None, window=5)
    for s in range(10):
        rec.log(s, loss=float(s), seq_lens=[1, 2, 3, 4, 130])
    st = rec.window_stats()
    assert st["count"] == 5 and st["first_step"] == 5 and st["last_step"] == 9
    loss = st["metrics"]["loss"]
    assert loss == {
        "count": 5,
        "nonfinite": 0,
        "last": 9.0,
        "median": 7.0,
        "mad": 1.0,
        "mean": 7.0,
        "min": 5.0,
        "max": 9.0,
    }
    assert st["length_buckets"] == {"1": 5, "2": 10, "4": 5, "128": 5}
    assert st["fp16_skipped_steps"] == 0


def test_stats_with_nonfinite_and_skips() -> None:
    rec = Recorder(None)
    scales = [1024.0, 512.0, 512.0, 1024.0, 256.0]
    losses = [1.0, float("nan"), 3.0, float("inf"), 2.0]
    for s, (scale, loss) in enumerate(zip(scales, losses, strict=True)):
        rec.log(s, loss=loss, loss_scale=scale, seq_lens=[0])
    st = rec.window_stats()
    assert st["fp16_skipped_steps"] == 2
    assert st["metrics"]["loss"]["nonfinite"] == 2
    assert st["metrics"]["loss"]["median"] == 2.0 and st["metrics"]["loss"]["last"] == 2.0
    assert st["length_buckets"] == {"0": 5}
    json.dumps(st, allow_nan=False)  # JSON-able, no bare NaN

    rec = Recorder(None)
    rec.log(1, loss=float("nan"))
    st = rec.window_stats()
    assert st["metrics"]["loss"]["last"] == "nan" and st["metrics"]["loss"]["median"] is None


def test_empty_stats_and_throughput() -> None:
    rec = Recorder(None)
    st = rec.window_stats()
    assert st["count"] == 0 and st["metrics"] == {} and st["throughput"] is None
    for s in range(3):
        rec.log(s, tokens=1000)
    # time stamps are real; replace them to make throughput exact
    for i, r in enumerate(rec.records):
        r["time"] = 100.0 + i * 0.5
    assert rec.window_stats()["throughput"]["median"] == 2000.0


def test_snapshot_is_json_and_detached() -> None:
    rec = Recorder(None, window=3)
    for s in range(4):
        rec.log(s, loss=torch.tensor(float(s)), grad_norm=float("nan"))
    snap = rec.snapshot()
    text = json.dumps(snap, allow_nan=False)
    assert json.loads(text) == snap
    assert snap["window"] == 3 and [r["step"] for r in snap["records"]] == [1, 2, 3]
    assert snap["stats"]["metrics"]["grad_norm"]["nonfinite"] == 3
    snap["records"][0]["loss"] = 99  # mutating the snapshot leaves the window alone
    assert rec.records[0]["loss"] == 1.0


def test_read_jsonl_truncated_tail_and_damage(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"step":1,"loss":"nan","x":["inf",1]}\n\n{"step":2}\n{"step":3,"lo')
    recs = read_jsonl(p)
    assert [r["step"] for r in recs] == [1, 2]
    assert math.isnan(recs[0]["loss"]) and recs[0]["x"] == [math.inf, 1]
    assert read_jsonl(p, decode_nonfinite=False)[0]["loss"] == "nan"

    p.write_text('{"step":1}\n{"step":2,"lo\n{"step":3}\n')
    assert [r["step"] for r in read_jsonl(p)] == [1, 3]  # damaged: skipped (and logged)
    with pytest.raises(CkptkitError, match="line 2 is not a JSON record") as ei:
        read_jsonl(p, strict=True)
    assert ei.value.path == p
    p.write_text('{"step":1}\n[1, 2]\n')  # damaged, and the bad line is complete
    assert [r["step"] for r in read_jsonl(p)] == [1]
    with pytest.raises(CkptkitError, match="line 2"):
        read_jsonl(p, strict=True)


def test_killed_writer_leaves_readable_file(tmp_path: Path) -> None:
    # A process SIGKILLed while logging: every flushed line reads back, a partial tail is dropped.
    p = tmp_path / "m.jsonl"
    # Stub the package so the child skips ckptkit/__init__ (torch import): only the recorder runs.
    script = (
        "import sys, types\n"
        "pkg = types.ModuleType('ckptkit')\n"
        f"pkg.__path__ = [{str(REPO / 'ckptkit')!r}]\n"
        "sys.modules['ckptkit'] = pkg\n"
        "from ckptkit.signals.recorder import Recorder\n"
        "rec = Recorder(sys.argv[1])\n"
        "step = 0\n"
        "while True:\n"
        "    rec.log(step, loss=1.0 / (step + 1), seq_lens=list(range(50)))\n"
        "    if step == 200: print('GO', flush=True)\n"
        "    step += 1\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(p)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "GO"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=20)
    recs = read_jsonl(p)
    assert len(recs) > 200
    assert [r["step"] for r in recs] == list(range(len(recs)))


def test_append_after_a_torn_last_line_starts_a_new_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"step":1,"loss":1.0}\n{"step":2,"lo')  # a killed writer's fragment
    with Recorder(p) as rec:
        rec.log(3, loss=0.5)
    lines = p.read_text().split("\n")
    assert lines[1] == '{"step":2,"lo' and lines[2].startswith('{"step":3')
    with caplog.at_level("WARNING", logger="ckptkit.signals.recorder"):
        assert [r["step"] for r in read_jsonl(p)] == [1, 3]
    assert "skipped 1 damaged line" in caplog.text
    # a clean file and an empty file get no extra newline
    for body in ("", '{"step":1}\n'):
        q = tmp_path / f"c{len(body)}.jsonl"
        q.write_text(body)
        with Recorder(q) as rec:
            rec.log(2)
        assert q.read_text().count("\n") == body.count("\n") + 1


def test_read_jsonl_and_follower_share_one_damaged_line_policy(tmp_path: Path) -> None:
    from ckptkit.cli.watch import JsonlFollower
    from ckptkit.signals.recorder import parse_line

    p = tmp_path / "m.jsonl"
    body = '{"step":1,"x":["inf"]}\n[1, 2]\n\ngarbage\n{"step":2}{"step":3}\n{"step":4}\n'
    p.write_text(body)
    f = JsonlFollower(p)
    got = f.poll()
    assert got == read_jsonl(p) and [r["step"] for r in got] == [1, 4]
    assert got[0]["x"] == [math.inf]  # nested non-finite strings decoded by both
    assert f.bad_lines == 3
    assert parse_line(b'{"step":5}') == {"step": 5} and parse_line(b"\xff") is None


def test_subscribers_hear_every_record_independently(tmp_path: Path) -> None:
    """Listeners subscribe; nothing replaces ``Recorder.log`` (issue 24), so removing one
    subscription leaves the others, and each hears the loop's values and the written record."""
    from ckptkit.signals.recorder import Logged

    rec = Recorder(tmp_path / "m.jsonl")
    first: list[Logged] = []
    second: list[int] = []
    a = rec.subscribe(first.append)
    rec.subscribe(lambda e: second.append(e.step))
    rec.log(1, loss=torch.tensor(float("nan")), seq_lens=[3])
    a.remove()
    a.remove()  # idempotent, and removes only its own subscription
    rec.log(2, loss=1.0)
    rec.close()
    assert [e.step for e in first] == [1] and second == [1, 2]
    assert isinstance(first[0].given["loss"], torch.Tensor)  # as the loop passed it
    assert first[0].record["loss"] == "nan"  # as written to the file
    assert "log" not in vars(rec)
    with pytest.raises(TypeError):
        first[0].record["loss"] = 0.0  # type: ignore[index]  # the window is not the listener's


def test_subscription_key_keeps_one_subscriber_per_role() -> None:
    rec = Recorder(None)
    seen: list[str] = []
    old = rec.subscribe(lambda e: seen.append("old"), key="role")
    rec.subscribe(lambda e: seen.append("new"), key="role")
    rec.subscribe(lambda e: seen.append("other"))
    rec.log(1, loss=1.0)
    assert seen == ["new", "other"] and not old.active
    assert rec.subscription("role") is not None and rec.subscription("none") is None


def test_a_subscriber_removing_itself_does_not_skip_the_next() -> None:
    rec = Recorder(None)
    seen: list[str] = []

    def once(e: object) -> None:
        seen.append("once")
        sub.remove()

    sub = rec.subscribe(once)
    rec.subscribe(lambda e: seen.append("always"))
    rec.log(1, loss=1.0)
    rec.log(2, loss=1.0)
    assert seen == ["once", "always", "always"]
