#!/usr/bin/env python
"""Calibrate the drill's *window* check: false-positive rate and detection power.

Two modes:

* **real** (default): drives the bundled tiny LM (``python -m ckptkit.examples.tiny_lm``)
  through the drill contract. Per seed: one run from scratch saves at step ``W`` and stops
  (its records are the pre-save window); then, from that checkpoint, one resumed run to
  ``W+N`` per fault (``none`` for the false-positive rate, each ``--fault`` for power).
  ``no-scaler`` needs fp16, so it gets its own fp16 window run and an fp16 clean resume.
* **synthetic** (``--synthetic``): no training. Series are drawn from a noise model fitted
  to the tiny LM's clean runs (power-law loss decay plus Student-t noise, log-normal grad
  norms, the corpus's length distribution, an fp16 scaler with rare skips); scenarios are
  clean continuations and injected drifts of known size. Runs in seconds.

False-positive rate = fraction of clean resumed runs the window check flags (``ok`` False);
power = fraction of faulty/drifted runs flagged. Both are given for the whole check and
for each signal, with a Wilson 95% interval.

    python benchmarks/window_calibration.py --synthetic                  # seconds
    python benchmarks/window_calibration.py --seeds 20 --fault-seeds 3   # real, minutes
    python benchmarks/window_calibration.py --quick --json out.json
    python benchmarks/window_calibration.py --analyze runs/cal            # re-score cached runs

Real runs are cached under ``--work-dir`` (``<work>/<amp>-s<seed>/{pre,<fault>}.jsonl``), so
a threshold change can be re-scored with ``--analyze`` without training again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ckptkit.drill.stats import DEFAULT_THRESHOLDS, window_check
from ckptkit.examples.tiny_lm import FAULTS as ALL_FAULTS
from ckptkit.signals.recorder import read_jsonl

FAULTS = tuple(f for f in ALL_FAULTS if f != "none")
SIGNALS = ("loss_shift", "grad_norm_level", "length_buckets", "skip_rate")

Records = list[dict[str, Any]]


# ----------------------------------------------------------------------------- real runs


def _run_tiny(
    args: argparse.Namespace, *, seed: int, amp: str, env: dict[str, str], fault: str, ckpt: Path
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "ckptkit.examples.tiny_lm",
        "--steps",
        str(args.window + args.post),
        "--seed",
        str(seed),
        "--save-every",
        "0",
        "--ckpt-dir",
        str(ckpt),
        "--amp",
        amp,
        "--fault",
        fault,
    ]
    full = {**os.environ, "CKPTKIT_NO_PROGRESS": "1", **env}
    subprocess.run(cmd, env=full, check=True, capture_output=True, timeout=600)


def _seed_runs(
    args: argparse.Namespace, work: Path, seed: int, amp: str, faults: Sequence[str]
) -> None:
    """One window run (save at W) and one resumed run per fault; skips cached results."""
    d = work / f"{amp}-s{seed}"
    d.mkdir(parents=True, exist_ok=True)
    pre = d / "pre.jsonl"
    ck = d / "ckpt"
    if not pre.exists() or not (ck / "latest").exists():
        pre.unlink(missing_ok=True)
        env = {
            "CKPTKIT_DRILL_SAVE_AT": str(args.window),
            "CKPTKIT_DRILL_STOP_AT": str(args.window),
            "CKPTKIT_METRICS": str(pre.with_suffix(".part")),
        }
        _run_tiny(args, seed=seed, amp=amp, env=env, fault="none", ckpt=ck)
        pre.with_suffix(".part").rename(pre)
    for f in faults:
        out = d / f"{f}.jsonl"
        if out.exists():
            continue
        part = out.with_suffix(".part")
        part.unlink(missing_ok=True)
        env = {"CKPTKIT_DRILL_RESUME_FROM": str(ck), "CKPTKIT_METRICS": str(part)}
        _run_tiny(args, seed=seed, amp=amp, env=env, fault=f, ckpt=d / f"ckpt-{f}")
        part.rename(out)


def real_plan(args: argparse.Namespace) -> list[tuple[int, str, list[str]]]:
    """(seed, amp, faults) jobs: clean seeds, fault seeds, fp16 seeds for ``no-scaler``."""
    faults = [f for f in args.faults if f != "no-scaler"]
    jobs: list[tuple[int, str, list[str]]] = []
    for s in range(args.fault_seeds):
        jobs.append((s, "none", ["none", *faults]))
        if "no-scaler" in args.faults:
            jobs.append((s, "fp16", ["none", "no-scaler"]))
    jobs += [(s, "none", ["none"]) for s in range(args.fault_seeds, args.seeds)]
    return jobs


def run_real(args: argparse.Namespace, work: Path) -> None:
    """Train everything the plan needs (``--workers`` processes at a time), with progress."""
    jobs = real_plan(args)
    t0 = time.monotonic()
    done = 0

    def one(job: tuple[int, str, list[str]]) -> None:
        nonlocal done
        s, amp, faults = job
        try:
            _seed_runs(args, work, s, amp, faults)
        except subprocess.CalledProcessError as e:
            print(f"  seed {s} {amp}: FAILED {e.stderr.decode()[-500:]}", file=sys.stderr)
        done += 1
        print(
            f"  [{done}/{len(jobs)}] seed {s} ({amp}, {len(faults)} resumes) "
            f"{time.monotonic() - t0:.0f}s",
            file=sys.stderr,
            flush=True,
        )

    with ThreadPoolExecutor(args.workers) as ex:
        list(ex.map(one, jobs))


def collect_real(work: Path) -> dict[str, list[tuple[Records, Records]]]:
    """Scenario → list of (window, resumed) record pairs from the cache."""
    out: dict[str, list[tuple[Records, Records]]] = {}
    for d in sorted(work.glob("*-s*")):
        pre_p = d / "pre.jsonl"
        if not pre_p.exists():
            continue
        amp = d.name.split("-s")[0]
        pre = read_jsonl(pre_p)
        for f in sorted(d.glob("*.jsonl")):
            if f.stem == "pre":
                continue
            name = f.stem if amp == "none" else f"{f.stem} (fp16)"
            out.setdefault(name, []).append((pre, read_jsonl(f)))
    return out


# ----------------------------------------------------------------------------- synthetic

# Noise model fitted to the tiny LM's clean runs (W=N=80, --steps 160, CPU, seeds 0-1):
# the mean loss path is a degree-5 polynomial in log(step) (warmup, fast fall, cosine-LR
# flattening); noise is Student-t with df 4 (heavier-tailed than the tiny LM's, which is
# near-Gaussian: batch loss of real LMs is heavy-tailed) scaled to the measured
# σ = 1.4826·MAD ≈ 0.095; grad norm log-normal around 0.95 with log-σ ≈ 0.085; 16
# sequences per step with lengths uniform on 8..64; an fp16 scaler with rare skips (~1%).
SYN: dict[str, Any] = {
    "loss_poly": [0.0024, 0.0275, -0.4176, 1.1309, -0.9232, 5.6172],
    "sigma": 0.095,
    "df": 4.0,
    "gn": 0.95,
    "gn_sigma": 0.085,
    "batch": 16,
    "len_lo": 8,
    "len_hi": 64,
    "skip_p": 0.01,
}


def _syn_series(
    rng: np.random.Generator,
    steps: np.ndarray,
    *,
    start: int,
    shift_sigma: float = 0.0,
    gn_mult: float = 1.0,
    len_hi: int | None = None,
    scale_collapse: bool = False,
    nan_at: int | None = None,
    scale0: float = 2.0**16,
) -> Records:
    p = SYN
    t = rng.standard_t(p["df"], size=steps.size)
    t *= p["sigma"] / (1.4826 * np.median(np.abs(t - np.median(t))))
    loss = np.polyval(p["loss_poly"], np.log(steps)) + t + shift_sigma * p["sigma"]
    gn = p["gn"] * gn_mult * np.exp(rng.normal(0, p["gn_sigma"], size=steps.size))
    hi = len_hi or p["len_hi"]
    scale = scale0
    recs: Records = []
    for i, s in enumerate(steps):
        if scale_collapse or rng.random() < p["skip_p"]:
            scale /= 2
        lens = rng.integers(p["len_lo"], hi + 1, size=p["batch"]).tolist()
        recs.append(
            {
                "step": int(s),
                "time": start + 0.03 * i,
                "loss": math.nan if nan_at is not None and i == nan_at else float(loss[i]),
                "grad_norm": float(gn[i]),
                "lr": 1e-3,
                "loss_scale": scale,
                "seq_lens": lens,
                "tokens": int(sum(lens)),
            }
        )
    return recs


SYN_SCENARIOS: dict[str, dict[str, Any]] = {
    "none": {},
    "loss shift 0.5σ": {"shift_sigma": 0.5},
    "loss shift 1σ": {"shift_sigma": 1.0},
    "loss shift 1.5σ": {"shift_sigma": 1.5},
    "loss shift 2σ": {"shift_sigma": 2.0},
    "loss shift 3σ": {"shift_sigma": 3.0},
    "loss shift 5σ": {"shift_sigma": 5.0},
    "grad norm ×1.5": {"gn_mult": 1.5},
    "grad norm ×2": {"gn_mult": 2.0},
    "lengths 8..96": {"len_hi": 96},
    "lengths 8..128": {"len_hi": 128},
    "loss-scale collapse": {"scale_collapse": True},
    "NaN loss": {"nan": True},
}


def collect_synthetic(
    args: argparse.Namespace,
) -> dict[str, list[tuple[Records, Records]]]:
    """Scenario → ``--reps`` (window, resumed) pairs drawn from the noise model."""
    rng = np.random.default_rng(args.rng_seed)
    w, n = args.window, args.post
    out: dict[str, list[tuple[Records, Records]]] = {}
    for name, kw in SYN_SCENARIOS.items():
        pairs = []
        for _ in range(args.reps):
            pre = _syn_series(rng, np.arange(1, w + 1), start=0)
            k = {key: v for key, v in kw.items() if key != "nan"}
            if kw.get("nan"):
                k["nan_at"] = int(rng.integers(0, n))
            post = _syn_series(
                rng, np.arange(w + 1, w + n + 1), start=1000, scale0=pre[-1]["loss_scale"], **k
            )
            pairs.append((pre, post))
        out[name] = pairs
    return out


# ----------------------------------------------------------------------------- scoring


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``k/n``."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def score(
    data: dict[str, list[tuple[Records, Records]]],
    thresholds: dict[str, Any] | None = None,
    check: Callable[..., dict[str, Any]] = window_check,
) -> dict[str, Any]:
    """Run the window check on every pair; rates overall and per signal, plus statistics."""
    res: dict[str, Any] = {}
    for name, pairs in data.items():
        flags: list[bool] = []
        per: dict[str, list[bool]] = {s: [] for s in SIGNALS}
        stats: dict[str, list[float]] = {s: [] for s in SIGNALS}
        tp: list[float] = []
        for pre, post in pairs:
            r = check(pre, post, thresholds=thresholds)
            flags.append(not r["ok"])
            for s in SIGNALS:
                sig = r["signals"][s]
                per[s].append(not sig["ok"])
                if sig["statistic"] is not None:
                    stats[s].append(float(sig["statistic"]))
            if r["throughput"]["ratio"] is not None:
                tp.append(r["throughput"]["ratio"])
        k, n = sum(flags), len(flags)
        res[name] = {
            "n": n,
            "flagged": k,
            "rate": k / n if n else None,
            "ci95": wilson(k, n),
            "by_signal": {s: sum(v) / n for s, v in per.items()} if n else {},
            "statistic_median": {
                s: float(np.median(v)) if v and np.all(np.isfinite(v)) else None
                for s, v in stats.items()
            },
            "statistic_max": {s: (float(np.max(v)) if v else None) for s, v in stats.items()},
            "throughput_ratio": [min(tp), float(np.median(tp)), max(tp)] if tp else None,
        }
    return res


def table(res: dict[str, Any], title: str) -> str:
    """A plain-text table: scenario, n, flagged, rate [95% CI], rate per signal."""
    head = f"{'scenario':<24} {'n':>5} {'flag':>5} {'rate':>6}  {'95% CI':<13}"
    head += "".join(f" {s[:9]:>9}" for s in SIGNALS) + "  loss σ med/max"
    lines = [title, head, "-" * len(head)]
    for name, r in res.items():
        lo, hi = r["ci95"]
        row = f"{name:<24} {r['n']:>5} {r['flagged']:>5} {r['rate']:>6.1%}  [{lo:.2f}, {hi:.2f}]  "
        row += "".join(f" {r['by_signal'][s]:>9.1%}" for s in SIGNALS)
        med, mx = r["statistic_median"]["loss_shift"], r["statistic_max"]["loss_shift"]
        row += f"  {med if med is None else round(med, 2)}/{mx if mx is None else round(mx, 2)}"
        lines.append(row)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, generate or load runs, score them, print and optionally save."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--synthetic", action="store_true", help="noise-model series, no training")
    p.add_argument("--seeds", type=int, default=20, help="clean real seeds (false-positive rate)")
    p.add_argument("--fault-seeds", type=int, default=3, help="real seeds per fault (power)")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated tiny_lm faults")
    p.add_argument("--window", type=int, default=80, help="W: pre-save window (steps)")
    p.add_argument("--post", type=int, default=80, help="N: resumed steps")
    p.add_argument("--reps", type=int, default=500, help="synthetic draws per scenario")
    p.add_argument("--rng-seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=max(1, min(4, (os.cpu_count() or 2))))
    p.add_argument("--work-dir", default=None, help="cache of real runs (default: a temp dir)")
    p.add_argument("--analyze", metavar="DIR", default=None, help="score cached runs only")
    p.add_argument("--quick", action="store_true", help="6 seeds, 1 per fault / 100 reps")
    p.add_argument("--json", metavar="FILE", default=None)
    args = p.parse_args(argv)
    args.faults = [f for f in args.faults.split(",") if f]
    if args.quick:
        args.seeds, args.fault_seeds, args.reps = min(args.seeds, 6), 1, min(args.reps, 100)

    t0 = time.monotonic()
    if args.synthetic:
        data = collect_synthetic(args)
        mode = "synthetic"
        cmd_info: dict[str, Any] = {"reps": args.reps, "noise_model": SYN}
    else:
        mode = "real"
        if args.analyze:
            work = Path(args.analyze)
        else:
            work = Path(args.work_dir or tempfile.mkdtemp(prefix="window-cal-"))
            print(f"real runs under {work}", file=sys.stderr)
            run_real(args, work)
        data = collect_real(work)
        cmd_info = {"work_dir": str(work), "seeds": args.seeds, "fault_seeds": args.fault_seeds}
    res = score(data)
    title = (
        f"window check calibration ({mode}, W={args.window}, N={args.post}, "
        f"thresholds: loss {DEFAULT_THRESHOLDS['loss_shift']}σ, grad "
        f"{DEFAULT_THRESHOLDS['grad_norm_level']}, JS {DEFAULT_THRESHOLDS['length_js']} & "
        f"p<{DEFAULT_THRESHOLDS['length_alpha']}, skip p<{DEFAULT_THRESHOLDS['skip_alpha']})"
    )
    print(table(res, title))
    print(f"({time.monotonic() - t0:.0f}s)")
    if args.json:
        payload = {
            "mode": mode,
            "window": args.window,
            "post": args.post,
            "thresholds": DEFAULT_THRESHOLDS,
            "argv": list(sys.argv),
            **cmd_info,
            "results": res,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
