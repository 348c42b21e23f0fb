"""Detection x diagnosis over seeded resume faults: two training scripts, two logging levels.

Runs one resume drill per (script, fault, logging) and reports, for each, whether the drill
failed (detected), the component it named, its confidence and the candidates it left, then
the calibration: how often each confidence level named the right component.

* ``tiny_lm``: the bundled ``python -m ckptkit.examples.tiny_lm`` (a causal LM, AdamW,
  ``ResumableSampler``, no augmentation), faults ``ckptkit.examples.tiny_lm.FAULT_COMPONENTS``;
* ``aug_script``: ``tests/integration/aug_script.py``, written differently (augmentation on
  the global RNGs, its own sampler, SGD-Nesterov, fp16 GradScaler with a short growth
  interval), faults ``aug_script.FAULTS``.

Logging: ``minimal`` logs only the loss (the Recorder bound to the TrainState fills the rest),
``full`` logs every field docs/drills.md lists.

```bash
python benchmarks/diagnosis_matrix.py                 # both scripts, ~1-2 min on 2 cores
python benchmarks/diagnosis_matrix.py --json matrix.json --scripts aug_script
```
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ckptkit.drill.runner import DrillConfig, cleanup, run_drill
from ckptkit.errors import DrillError
from ckptkit.examples.tiny_lm import FAULT_COMPONENTS as TINY_FAULTS

ROOT = Path(__file__).resolve().parents[1]
AUG = ROOT / "tests" / "integration" / "aug_script.py"
W = N = 6
LOGS = ("minimal", "full")


def _aug_faults() -> dict[str, str]:
    sys.path.insert(0, str(AUG.parent))
    try:
        from aug_script import FAULTS
    finally:
        sys.path.remove(str(AUG.parent))
    return dict(FAULTS)


def scripts() -> dict[str, tuple[list[str], dict[str, str], dict[str, list[str]]]]:
    """name -> (command prefix, fault -> expected component, fault -> extra arguments)."""
    tiny = [sys.executable, "-m", "ckptkit.examples.tiny_lm", "--steps", "40", "--save-every",
            "0", "--num-seqs", "200", "--dim", "32", "--layers", "1"]
    return {
        "tiny_lm": (tiny, dict(TINY_FAULTS),
                    {"no-scaler": ["--amp", "fp16", "--growth-interval", "4"]}),
        "aug_script": ([sys.executable, str(AUG), "--steps", "40"], _aug_faults(), {}),
    }


@dataclass
class Row:
    script: str
    fault: str
    log: str
    expected: str
    detected: bool
    """A fault made the drill fail (for ``none``: the drill passed)."""
    component: str
    confidence: str
    candidates: list[str]
    right: bool
    step: int | None
    seconds: float
    error: str | None = None


def run_matrix(
    names: Sequence[str] | None = None, *, logs: Sequence[str] = LOGS, timeout: float = 180
) -> list[Row]:
    """Drill every (script, fault, logging) pair; return one row each."""
    rows: list[Row] = []
    for name, (cmd, faults, extra) in scripts().items():
        if names and name not in names:
            continue
        for fault, expected in faults.items():
            for log in logs:
                t0 = time.time()
                argv = [*cmd, "--log", log, "--fault", fault, *extra.get(fault, [])]
                cfg = DrillConfig(command=argv, steps_before=W, steps_after=N, timeout=timeout)
                try:
                    rep = run_drill(cfg)
                except DrillError as e:
                    rows.append(Row(name, fault, log, expected, False, "error", "low", [],
                                    False, None, time.time() - t0, str(e)))
                    continue
                d = rep.diagnosis
                detected = rep.ok if expected == "none" else not rep.ok
                rows.append(Row(name, fault, log, expected, detected, d.component,
                                d.confidence, list(d.candidates), d.component == expected,
                                d.step, round(time.time() - t0, 2)))
                cleanup(rep)
    return rows


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    """Detection, accuracy and calibration over the faulty pairs (clean runs apart)."""
    faulty = [r for r in rows if r.expected != "none"]
    calib: dict[str, dict[str, int]] = {}
    for r in faulty:
        c = calib.setdefault(r.confidence, {"right": 0, "total": 0})
        c["total"] += 1
        c["right"] += int(r.right)
    return {
        "pairs": len(faulty),
        "detected": sum(r.detected for r in faulty),
        "right": sum(r.right for r in faulty),
        "wrong_high": sum(1 for r in faulty if r.confidence == "high" and not r.right),
        "unknown": sum(1 for r in faulty if r.component == "unknown"),
        "clean_pass": all(r.detected for r in rows if r.expected == "none"),
        "calibration": calib,
    }


def markdown(rows: Sequence[Row]) -> str:
    """The detection x diagnosis table: one line per (script, fault), both logging levels."""
    out = ["| script | fault | expected | minimal: detected / named (confidence) "
           "| full: detected / named (confidence) |", "|---|---|---|---|---|"]
    by = {(r.script, r.fault, r.log): r for r in rows}
    for (script, fault, _), r in by.items():
        if r.log != LOGS[0]:
            continue
        cells = []
        for log in LOGS:
            x = by.get((script, fault, log))
            if x is None:
                cells.append("-")
                continue
            mark = "yes" if x.detected else "**no**"
            named = x.component if x.right else f"**{x.component}**"
            cand = f" [{', '.join(x.candidates)}]" if x.candidates else ""
            cells.append(f"{mark} / {named} ({x.confidence}){cand}")
        out.append(f"| {script} | {fault} | {r.expected} | {cells[0]} | {cells[1]} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scripts", nargs="*", choices=sorted(scripts()), default=None)
    ap.add_argument("--json", help="write the rows and the summary here")
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = run_matrix(args.scripts)
    summary = summarize(rows)
    print(markdown(rows))
    print(json.dumps(summary, indent=1))
    print(f"{len(rows)} drills in {time.time() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"rows": [asdict(r) for r in rows], "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
