"""Typed records (health, look-ahead, recoveries): the JSON written stays the JSON read.

The on-disk format did not change when the records became dataclasses (issue 24): every
record a writer produces reads back to an equal record and writes back to the same JSON,
and a record of the wrong shape reads without raising.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.checkpoint import manifest_io
from ckptkit.format.records import Health, LookAhead, Recoveries, Recovery, health_level
from ckptkit.signals.stability import StabilityWatch


def _watch() -> StabilityWatch:
    w = StabilityWatch(warmup=4, window=16, recent=8)
    for s in range(40):
        w.update(s, loss=2.0 + 0.01 * (s % 5), grad_norm=1.0, loss_scale=1024.0)
    w.update(40, loss=math.inf)
    return w


def test_a_watch_snapshot_round_trips_key_for_key() -> None:
    snap = json.loads(json.dumps(_watch().snapshot(), allow_nan=False))
    again = Health.from_dict(snap).to_dict()
    assert again == snap and list(again) == list(snap)
    worst = StabilityWatch.worst([StabilityWatch().snapshot(), snap])
    assert worst["level"] == "critical" and worst["ranks"] == ["not judged", "critical"]
    assert Health.from_dict(worst).to_dict() == worst


def test_health_reads_wrong_shapes_as_absent() -> None:
    h = Health.from_dict({"level": 3, "step": True, "signals": {"a": "spike"}, "window": [],
                          "time": "now", "ranks": "ok", "future": {"x": 1}})
    assert (h.level, h.step, h.time, h.ranks, dict(h.window)) == (None, None, None, None, {})
    assert h.detail("a") == "spike" and h.extra == {"future": {"x": 1}}
    assert Health.of(["ok"]) is None and health_level("ok") is None


def test_saved_manifest_records_read_as_typed_records(tmp_path: Path) -> None:
    """The manager writes health and the look-ahead through the records; the manifest on
    disk reads back to the same JSON."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ts = ckptkit.TrainState(model=model, optimizer=opt, step=3)
    with ckptkit.CheckpointManager(tmp_path / "ckpt", watch=_watch()) as mgr:
        path = mgr.save(ts, lookahead={"note": "mine"})
    man = manifest_io.read_path(Path(path) / "manifest.json")
    assert Health.of(man.health) is not None
    assert Health.from_dict(man.health).to_dict() == dict(man.health)  # type: ignore[arg-type]
    look = LookAhead.of(man.lookahead)
    assert look.user == {"note": "mine"} and look.guard is not None
    assert look.guard["next_step"] == 4
    assert look.to_dict() == dict(man.lookahead)  # type: ignore[arg-type]
    assert LookAhead.of(None) == LookAhead()


def test_recoveries_round_trip_and_tolerate_bad_values() -> None:
    summary: dict[str, Any] = {
        "count": 1, "lr_scale": 0.5, "clip_scale": 1.0,
        "history": [{"n": 1, "detected_at": 90, "trigger": {"level": "critical",
                     "signals": {"loss.nonfinite": {}}}, "restored": {"checkpoint": "step-50"},
                     "actions": {"lr": {"factor": 0.5, "scale": 0.5}}, "steps_lost": 40}],
        "pending_skip": {"n": 1, "at_step": 60},
    }
    rec = Recoveries.from_dict(summary)
    assert rec.to_dict() == summary
    (one,) = rec.records
    assert (one.outcome, one.level, one.signal_names) == ("recovered", "critical", ("loss.nonfinite",))
    assert one.to_dict() == summary["history"][0]
    bad = Recoveries.from_dict({"count": "1", "lr_scale": "x", "history": [3, {"n": 2}]})
    assert (bad.count, bad.lr_scale, bad.history) == (0, 1.0, ({"n": 2},))
    assert Recovery.from_dict({"n": 1, "failed": "disk"}).outcome == "failed"
    assert Recoveries.of("no") is None


@pytest.mark.parametrize("raw", [None, [], "x", {"guard": "not an object"}])
def test_lookahead_never_raises_on_what_a_manifest_holds(raw: Any) -> None:
    assert LookAhead.of(raw).guard is None
