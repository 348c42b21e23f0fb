"""Clean and faulty drills of a script whose runs are not bitwise: false fails and catches.

Runs ``tests/scripts/noisy_script.py`` (GPU-like gradient noise from an OS-seeded
stream) through ``ckptkit drill`` many times per setting and prints, per setting: passes,
the diagnosis of each failure, the median wall time, and the twin tolerance on the loss
against the resumed run's own largest deviation from the reference (how tight it is).

Usage::

    python benchmarks/noisy_drills.py [--runs 20] [--eps 1e-7 1e-5] [--repeat 1 2]
        [--faults "" stale-layer bf16-weights] [--json out.json]

Issue 37 (item 1) numbers are in docs/drills.md (statistical mode).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.runner import cleanup, run_drill

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "noisy_script.py"


def one(eps: float, repeat: int, fault: str, w: int, n: int) -> dict[str, Any]:
    t = time.time()
    rep = run_drill(DrillConfig(
        command=[sys.executable, str(SCRIPT)], steps_before=w, steps_after=n, repeat=repeat,
        isolate=True, timeout=300,
        env={"NOISY_EPS": str(eps), "NOISY_FAULT": fault, "NOISY_SEED": "all"},
    ))
    wall = time.time() - t
    d = rep.to_dict()
    twin = next(c for c in d["checks"] if c["name"] == "twin")
    tol = twin["detail"].get("per_step_tolerances", {}).get("loss") or [
        twin["detail"].get("tolerances", {}).get("loss", 0.0)]
    dev = twin["detail"].get("within_tolerance_max_abs_diff", {}).get("loss")
    failed = [c["name"] for c in d["checks"] if not c["ok"] and not c["informational"]]
    cleanup(rep)
    return {"ok": rep.ok, "failed": failed, "wall_s": wall,
            "diagnosis": f"{d['diagnosis']['component']} ({d['diagnosis']['confidence']})",
            "tolerance_max": max(tol) if tol else None, "deviation": dev}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--eps", type=float, nargs="+", default=[1e-7, 1e-5])
    ap.add_argument("--repeat", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--faults", nargs="+", default=["", "stale-layer", "bf16-weights"])
    ap.add_argument("--steps", type=int, nargs=2, default=[6, 6], metavar=("W", "N"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for fault in args.faults:
        for eps in args.eps:
            for repeat in args.repeat:
                res = [one(eps, repeat, fault, *args.steps) for _ in range(args.runs)]
                ratios = [r["tolerance_max"] / r["deviation"] for r in res
                          if r["deviation"] and r["tolerance_max"]]
                row = {
                    "fault": fault or "clean", "eps": eps, "repeat": repeat,
                    "passed": sum(r["ok"] for r in res), "runs": len(res),
                    "diagnoses": dict(Counter(r["diagnosis"] for r in res if not r["ok"])),
                    "failed_checks": dict(Counter(c for r in res for c in r["failed"])),
                    "median_wall_s": round(statistics.median(r["wall_s"] for r in res), 2),
                    "tolerance_over_deviation_median": (round(statistics.median(ratios), 1)
                                                        if ratios else None),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
