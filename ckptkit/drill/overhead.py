"""The drill's overhead accounting: its wall time split into training, start-up, save, the rest.

Estimated from the runs' record timestamps (:func:`drill_overhead`); the report's
``overhead`` object.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

from ckptkit.drill.report import RunResult, rounded


def _timing(run: RunResult, *, save_at: int | None) -> dict[str, Any]:
    """Split one run's wall time into start-up, training, save and tear-down.

    From the record timestamps: the median gap between consecutive records is one step;
    the time before the first record beyond one step is start-up (imports, setup,
    restore); the excess of the gap after the save step is the save. ``intervals`` are the
    wall-clock spans the run spent training (the save cut out).
    """
    times = [float(r["time"]) for r in run.records if isinstance(r.get("time"), int | float)]
    steps = [r.get("step") for r in run.records]
    if not times:
        return {"startup_s": run.wall_s, "train_s": 0.0, "save_s": 0.0, "teardown_s": 0.0,
                "intervals": []}
    gaps = [b - a for a, b in itertools.pairwise(times)]
    step_s = statistics.median(gaps) if gaps else 0.0
    save_s = 0.0
    intervals = [(times[0] - step_s, times[-1])]
    if save_at is not None and save_at in steps:
        i = steps.index(save_at)
        if i + 1 < len(times):
            save_s = max(0.0, times[i + 1] - times[i] - step_s)
            intervals = [(times[0] - step_s, times[i]), (times[i] + save_s, times[-1])]
    startup = max(0.0, times[0] - run.launched_at - step_s)
    train = max(0.0, times[-1] - times[0] + step_s - save_s)
    return {
        "startup_s": startup,
        "train_s": train,
        "save_s": save_s,
        "teardown_s": max(0.0, run.ended_at - times[-1]),
        "step_s": step_s,
        "intervals": intervals,
    }


def _union(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def drill_overhead(
    refs: list[RunResult], resumed: RunResult, *, save_at: int, stats_s: float, total_s: float
) -> dict[str, Any]:
    ref_t = [_timing(r, save_at=save_at) for r in refs]
    res_t = _timing(resumed, save_at=None)
    busy = sum(t["train_s"] for t in ref_t) + res_t["train_s"]
    # Runs overlap (the resumed one starts once the checkpoint commits): the drill's
    # training time is the wall-clock time during which at least one run trained.
    train = _union([iv for t in (*ref_t, res_t) for iv in t["intervals"]])
    startup = sum(t["startup_s"] for t in ref_t) + res_t["startup_s"]
    save = sum(t["save_s"] for t in ref_t)
    # The resumed start-up minus a fresh start-up is the restore (same imports and setup).
    restore = max(0.0, res_t["startup_s"] - ref_t[0]["startup_s"])
    teardown = sum(t["teardown_s"] for t in ref_t) + res_t["teardown_s"]
    overhead = max(0.0, total_s - train)
    return {
        "total_s": rounded(total_s),
        "training_s": rounded(train),
        "training_process_s": rounded(busy),
        "warmup_s": rounded(sum(r.warm_s for r in (*refs, resumed))),
        "process_start_s": rounded(startup - restore),
        "save_s": rounded(save),
        "restore_s": rounded(restore),
        "teardown_s": rounded(teardown),
        "statistics_s": rounded(stats_s),
        "overhead_s": rounded(overhead),
        "overhead_fraction": rounded(overhead / total_s) if total_s > 0 else None,
        "overhead_vs_training": rounded(overhead / train) if train > 0 else None,
        "step_s": rounded(ref_t[0].get("step_s", 0.0)),
        "launch": sorted({r.method for r in (*refs, resumed)}),
        "method": "estimated from record timestamps: training is the wall-clock time during "
        "which at least one run trained (runs overlap); warm-up is the drill process "
        "importing what the forked runs need (torch._dynamo ...); start-up is the time to "
        "the first record after the launch less one step (imports and setup of each run); "
        "restore is the resumed start-up less the fresh one; save is the excess of the gap "
        "after the save step; overhead is the total less training",
    }


__all__ = ["drill_overhead"]
