#!/usr/bin/env python
"""Automatic recovery on the bundled tiny LM: before/after loss curves and the timings.

Runs ``python -m ckptkit.examples.tiny_lm`` three times, in parallel fresh processes, with
the same seed and size:

``clean``
    ``--fault none --watch`` (the watch on, so the three runs pay the same overhead);
``spike``
    ``--fault lr-spike``: the induced instability, nobody acts;
``spike+recover``
    ``--fault lr-spike --auto-recover``: the manager rolls back and continues.

and reports, per run, the final loss (the mean of the last 50 steps, ``final_loss_avg``,
and the last step's) and, for the recovered run, each recovery: first warning, detection
step, restored step, LR scale, samples skipped, and the detection-to-resume wall time the
recovery recorded (restore, set-aside and actions, measured inside the process, so the
machine's other load counts in it). ``--plot`` draws the three loss curves (the recovered
run's abandoned stretches dashed) into a PNG (needs the ``plot`` extra, matplotlib)::

    python benchmarks/recovery_curves.py --plot docs/img/recovery.png --json out/recovery.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ckptkit.examples.tiny_lm import SPIKE_STEPS

RUNS = {
    "clean": ["--fault", "none", "--steps", str(SPIKE_STEPS), "--watch"],
    "spike": ["--fault", "lr-spike"],
    "spike+recover": ["--fault", "lr-spike", "--auto-recover"],
}


def start(name: str, extra: list[str], work: Path) -> tuple[subprocess.Popen[str], Path]:
    d = work / name.replace("+", "_")
    d.mkdir(parents=True, exist_ok=True)
    metrics = d / "metrics.jsonl"
    cmd = [
        sys.executable, "-m", "ckptkit.examples.tiny_lm", *RUNS[name], *extra,
        "--log", "minimal", "--ckpt-dir", str(d / "ckpt"), "--metrics", str(metrics),
    ]
    env = {**os.environ, "CKPTKIT_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), metrics


def segments(metrics: Path) -> list[list[tuple[int, float]]]:
    """The (step, loss) records in file order, split where the step goes back (a rollback)."""
    out: list[list[tuple[int, float]]] = [[]]
    for line in metrics.read_text().splitlines():
        r = json.loads(line)
        step, loss = int(r["step"]), float(r["loss"])
        if out[-1] and step <= out[-1][-1][0]:
            out.append([])
        out[-1].append((step, loss))
    return out


def final_trajectory(segs: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The trajectory the run ended on: each segment cut where the next one resumed."""
    path: list[tuple[int, float]] = []
    for seg in segs:
        if seg:
            path = [p for p in path if p[0] < seg[0][0]] + seg
    return path


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    colors = {"clean": "tab:green", "spike": "tab:red", "spike+recover": "tab:blue"}
    layer = {"spike": 1, "spike+recover": 2, "clean": 3}
    for name, r in results.items():
        segs = r["segments"]
        final = final_trajectory(segs)
        on_final = set(final)
        for seg in segs:  # the abandoned stretches: what a recovery rolled back
            gone = [p for p in seg if p not in on_final]
            if gone and name == "spike+recover":
                gx, gy = zip(*gone, strict=True)
                ax.plot(gx, gy, color=colors[name], lw=0.6, ls=":", alpha=0.6, zorder=0)
        xs, ys = zip(*final, strict=True)
        ax.plot(xs, [min(y, 12.0) if math.isfinite(y) else 12.0 for y in ys],
                color=colors[name], lw=0.9, alpha=0.85, zorder=layer.get(name, 1),
                label=f"{name}: final {r['final_loss_avg']:.3f} (mean of the last 50 steps)")
    recs = results["spike+recover"]["summary"].get("recoveries", [])
    for rec in recs:
        ax.axvline(rec["detected_at"], color="tab:blue", lw=0.5, ls="--", alpha=0.7)
    if recs:
        lines = [f"recovery #{r['n']} at step {r['detected_at']} -> step {r['restored']}, "
                 f"LR x{r['lr_scale']:.3g}, {r['detect_to_resume_s']:.2f} s" for r in recs]
        ax.text(0.99, 0.55, "\n".join(lines), transform=ax.transAxes, ha="right", va="top",
                fontsize=7, color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (clipped at 12)")
    ax.set_yscale("log")
    ax.set_title("tiny_lm --fault lr-spike: without and with --auto-recover")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plot", type=Path, help="write the loss curves to this PNG")
    p.add_argument("--json", type=Path, help="write the numbers as JSON")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temp dir)")
    p.add_argument(
        "--replot", action="store_true",
        help="do not train: plot the runs kept in --workdir by an earlier call (with --workdir)",
    )
    p.add_argument("extra", nargs="*", help="more tiny_lm arguments for all three runs")
    a = p.parse_args(argv)
    if a.replot:
        results = {}
        for name in RUNS:
            d = a.workdir / name.replace("+", "_")
            summary = json.loads((d / "summary.json").read_text())
            results[name] = {"summary": summary, "final_loss_avg": summary["final_loss_avg"],
                             "segments": segments(d / "metrics.jsonl")}
        plot(results, a.plot)
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        work = a.workdir or Path(tmp)
        procs = {name: start(name, a.extra, work) for name in RUNS}
        results: dict[str, Any] = {}
        for name, (proc, metrics) in procs.items():
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed ({proc.returncode}):\n{err[-3000:]}")
            summary = json.loads(out.strip().splitlines()[-1])
            metrics.with_name("summary.json").write_text(json.dumps(summary))
            results[name] = {
                "summary": summary,
                "final_loss": summary["final_loss"],
                "final_loss_avg": summary["final_loss_avg"],
                "segments": segments(metrics),
            }
        clean = results["clean"]["final_loss_avg"]
        table = {
            name: {
                "final_loss_avg": r["final_loss_avg"],
                "final_loss": r["final_loss"],
                "vs_clean": r["final_loss_avg"] / clean if math.isfinite(r["final_loss_avg"]) else None,
                "recoveries": r["summary"].get("recoveries", []),
                "seconds": r["summary"]["seconds"],
            }
            for name, r in results.items()
        }
        for name, t in table.items():
            ratio = f"{t['vs_clean']:.3f}x clean" if t["vs_clean"] is not None else "not finite"
            print(f"{name:14s} final loss (last 50 steps) {t['final_loss_avg']:.4f} ({ratio}), "
                  f"last step {t['final_loss']:.4f}, {t['seconds']:.0f} s")
            for rec in t["recoveries"]:
                print(f"    recovery #{rec['n']}: first warning {rec['first_warning']}, detected "
                      f"{rec['detected_at']} ({rec['level']}: {', '.join(rec['signals'][:3])}), "
                      f"restored {rec['restored']}, LR x{rec['lr_scale']:.3g}, skipped "
                      f"{rec['skipped_samples']} samples, detect-to-resume "
                      f"{rec['detect_to_resume_s']:.3f} s")
        if a.plot:
            plot(results, a.plot)
            print(f"plot: {a.plot}")
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(table, indent=2))
        return table


if __name__ == "__main__":
    main()
