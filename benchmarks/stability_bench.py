#!/usr/bin/env python
"""Benchmark ``ckptkit.stability.StabilityWatch`` on the bundled tiny LM.

Trains the tiny LM of :mod:`ckptkit.examples.tiny_lm` (its model, corpus and collate;
a smaller configuration so the whole benchmark runs on a laptop CPU) in an in-benchmark
loop, with one instability induced at step ``--onset`` per scenario, and clean control
runs over several seeds:

``lr_ramp``
    the LR is doubled every 20 steps from the onset: ramped past the stable edge.
``corrupt_burst``
    a burst of corrupted batches: from the onset a growing fraction of every batch
    (0 -> 100 % over 100 steps, a bad shard mixed in with growing weight) is replaced by
    uniformly random tokens.
``scale_down``
    the loss scale is forced down by an fp16 overflow cascade. fp16 is *emulated* (CPU):
    a step overflows when ``loss_scale x max|logit| x growth > 65504`` (then, as with
    ``GradScaler``, it is skipped and the scale halved; the scale doubles after 200
    clean steps), where ``growth`` doubles every 20 steps from the onset (an activation
    running away); the loss becomes NaN once ``max|logit| x growth`` itself passes 65504.
``clean``
    no intervention (the emulated scaler runs in every scenario, so clean runs have the
    usual grow/backoff rhythm too).

The watch sees what a training loop already reads: ``loss``, ``grad_norm`` (before
clipping), ``loss_scale`` and ``max_logit``. Per run the series are cached as JSON; the
watch is then replayed over them (scoring offline is identical to scoring online: the
watch is a pure function of the series), so thresholds can be re-scored with
``--analyze DIR`` without training again.

Reported: detection rate (collapses with a warning at or before the collapse), median
lead time (collapse step - first warning step), and false alarms (ok -> warn/critical
episodes) per 10 000 clean steps. Collapse: the first step whose loss is NaN/Inf or
above 3x the median of the previous 100 losses.

    python benchmarks/stability_bench.py --quick           # ~2 min on 2 cores
    python benchmarks/stability_bench.py                   # ~10 min: 5 seeds, 12 500 clean steps
    python benchmarks/stability_bench.py --analyze runs/stability-bench --z-warn 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

SCENARIOS = ("lr_ramp", "corrupt_burst", "scale_down")
FP16_MAX = 65504.0
LR_DOUBLING = 20
"""lr_ramp: steps per doubling of the LR after the onset."""
CLIP = 1.0
BURST_RAMP = 100
"""corrupt_burst: steps over which the corrupted fraction of a batch goes 0 -> 100 %."""


def train(scenario: str, seed: int, steps: int, onset: int) -> dict[str, Any]:
    """Train one run; return its per-step series (stops 20 steps after a collapse)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from ckptkit.examples.tiny_lm import TinyLM, collate, make_corpus, warmup_cosine

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    vocab, max_len, batch = 128, 32, 16
    corpus = make_corpus(2000, seed=1234, version="v1", vocab=vocab, max_len=max_len)
    model = TinyLM(vocab=vocab, dim=32, heads=2, layers=2, max_len=max_len, dropout=0.1)
    base_lr = 3e-3
    opt = torch.optim.AdamW(model.parameters(), lr=base_lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = warmup_cosine(100, steps)
    scale, good_steps, growth_interval = 2.0**16, 0, 200
    out: dict[str, list[float]] = {"loss": [], "grad_norm": [], "loss_scale": [], "max_logit": []}
    collapse_at: int | None = None
    order = torch.randperm(len(corpus), generator=gen)
    pos = 0
    for step in range(1, steps + 1):
        k = step - onset  # steps since the onset (< 0 before)
        lr = base_lr * sched(step - 1)
        if scenario == "lr_ramp" and k >= 0:
            lr *= 2.0 ** (k / LR_DOUBLING)
        for g in opt.param_groups:
            g["lr"] = lr
        if pos + batch > len(order):
            order, pos = torch.randperm(len(corpus), generator=gen), 0
        seqs = [corpus[i] for i in order[pos : pos + batch].tolist()]
        pos += batch
        if scenario == "corrupt_burst" and k >= 0:
            frac = min(1.0, k / BURST_RAMP)
            n_bad = round(frac * batch)
            for i in range(n_bad):
                seqs[i] = torch.randint(1, vocab, (len(seqs[i]),), generator=gen)
        x, y = collate(seqs)
        logits = model(x)
        growth = 2.0 ** (k / 20) if scenario == "scale_down" and k >= 0 else 1.0
        max_logit = float(logits.detach().abs().max()) * growth
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        loss_v = float(loss.detach())
        if max_logit > FP16_MAX:
            loss_v = math.nan  # the forward pass itself overflows fp16
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        overflow = max_logit * scale > FP16_MAX or not math.isfinite(loss_v)
        if overflow:  # GradScaler: skip the step, back off
            scale *= 0.5
            good_steps = 0
        else:
            opt.step()
            good_steps += 1
            if good_steps >= growth_interval:
                scale *= 2.0
                good_steps = 0
        for key, v in (
            ("loss", loss_v),
            ("grad_norm", grad_norm),
            ("loss_scale", scale),
            ("max_logit", max_logit),
        ):
            out[key].append(v)
        if collapse_at is None and scenario != "clean":
            collapse_at = _collapse(out["loss"], onset)
        if collapse_at is not None and step >= collapse_at + 20:
            break
    return {"scenario": scenario, "seed": seed, "onset": onset, "series": out}


def _collapse(losses: list[float], onset: int) -> int | None:
    """1-based step of the collapse if the newest loss is one, else None."""
    t = len(losses)
    v = losses[-1]
    if t <= onset:
        return None
    if not math.isfinite(v):
        return t
    prev = [x for x in losses[max(0, t - 101) : t - 1] if math.isfinite(x)]
    if len(prev) >= 50 and v > 3 * statistics.median(prev):
        return t
    return None


def collapse_step(run: dict[str, Any]) -> int | None:
    """First collapse step of a run (None: no collapse)."""
    losses = run["series"]["loss"]
    for t in range(run["onset"] + 1, len(losses) + 1):
        c = _collapse(losses[:t], run["onset"])
        if c is not None:
            return c
    return None


def score(run: dict[str, Any], watch_kw: dict[str, Any]) -> dict[str, Any]:
    """Replay the watch over a run's series: first warning, episodes, collapse."""
    from ckptkit.stability import StabilityWatch

    w = StabilityWatch(**watch_kw)
    s = run["series"]
    first: int | None = None
    first_sig: list[str] = []
    episodes = 0
    prev = "ok"
    for i in range(len(s["loss"])):
        step = i + 1
        v = w.update(step, **{k: s[k][i] for k in s})
        if v.level != "ok" and prev == "ok":
            episodes += 1
            if first is None:
                first, first_sig = step, [x.name for x in v.signals]
        prev = v.level
    return {
        "scenario": run["scenario"],
        "seed": run["seed"],
        "steps": len(s["loss"]),
        "onset": run["onset"],
        "first_warn": first,
        "first_signals": first_sig,
        "episodes": episodes,
        "collapse": collapse_step(run) if run["scenario"] != "clean" else None,
    }


def table(scored: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Markdown table per scenario plus the totals; and the numbers as a dict."""
    rows = []
    summary: dict[str, Any] = {}
    all_leads: list[int] = []
    detected_total = collapsed_total = 0
    for sc in SCENARIOS:
        runs = [r for r in scored if r["scenario"] == sc]
        if not runs:
            continue
        col = [r for r in runs if r["collapse"] is not None]
        det = [r for r in col if r["first_warn"] is not None and r["first_warn"] <= r["collapse"]]
        early = [r for r in runs if r["first_warn"] is not None and r["first_warn"] < r["onset"]]
        leads = [r["collapse"] - r["first_warn"] for r in det]
        all_leads += leads
        detected_total += len(det)
        collapsed_total += len(col)
        med = statistics.median(leads) if leads else None
        rows.append(
            f"| {sc} | {len(runs)} | {len(col)}/{len(runs)} | {len(det)}/{len(col)} | "
            f"{_fmt(med)} | {min(leads) if leads else '-'}-{max(leads) if leads else '-'} | "
            f"{len(early)} |"
        )
        summary[sc] = {
            "runs": len(runs),
            "collapsed": len(col),
            "detected": len(det),
            "median_lead": med,
            "leads": leads,
            "pre_onset_warnings": len(early),
        }
    clean = [r for r in scored if r["scenario"] == "clean"]
    clean_steps = sum(r["steps"] for r in clean)
    alarms = sum(r["episodes"] for r in clean)
    fa = 1e4 * alarms / clean_steps if clean_steps else None
    med_all = statistics.median(all_leads) if all_leads else None
    rows.append(
        f"| **all induced** | {sum(1 for r in scored if r['scenario'] != 'clean')} | "
        f"{collapsed_total} | {detected_total}/{collapsed_total} | {_fmt(med_all)} | | |"
    )
    head = (
        "| scenario | runs | collapsed | detected | median lead (steps) | lead range | "
        "warnings before onset |\n|---|---|---|---|---|---|---|"
    )
    clean_line = (
        f"\nClean controls: {len(clean)} runs, {clean_steps} steps, {alarms} false alarm "
        f"episode(s) = **{_fmt(fa, 2)} per 10 000 clean steps**."
    )
    summary["all"] = {
        "collapsed": collapsed_total,
        "detected": detected_total,
        "median_lead": med_all,
        "clean_runs": len(clean),
        "clean_steps": clean_steps,
        "false_alarms": alarms,
        "false_alarms_per_10k": fa,
    }
    return head + "\n" + "\n".join(rows) + clean_line, summary


def _fmt(x: float | None, nd: int = 0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, shorter clean runs")
    p.add_argument("--seeds", type=int, default=5, help="seeds per scenario")
    p.add_argument("--clean-steps", type=int, default=2500, help="steps per clean run")
    p.add_argument("--onset", type=int, default=700, help="step the instability starts")
    p.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--work-dir", type=Path, default=Path("runs/stability-bench"))
    p.add_argument("--analyze", type=Path, help="re-score cached runs in this directory")
    p.add_argument("--json", type=Path, help="write the numbers here")
    for name in ("z_warn", "std_ratio_warn", "window", "recent", "trigger_count"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None)
    a = p.parse_args(argv)
    watch_kw = {
        k: (int(v) if k in ("window", "recent", "trigger_count") else v)
        for k in ("z_warn", "std_ratio_warn", "window", "recent", "trigger_count")
        if (v := getattr(a, k)) is not None
    }
    if a.quick:
        a.seeds, a.clean_steps = 2, 1500

    t0 = time.perf_counter()
    work = a.analyze or a.work_dir
    if a.analyze is None:
        work.mkdir(parents=True, exist_ok=True)
        jobs = [("clean", s, a.clean_steps, a.clean_steps + 1) for s in range(a.seeds)]
        jobs += [(sc, s, a.onset + 500, a.onset) for sc in SCENARIOS for s in range(a.seeds)]
        with ProcessPoolExecutor(a.workers) as ex:
            for run in ex.map(train, *zip(*jobs, strict=True)):
                name = f"{run['scenario']}-s{run['seed']}.json"
                (work / name).write_text(json.dumps(run, allow_nan=True))
                print(f"  trained {name} ({len(run['series']['loss'])} steps)", file=sys.stderr)
    runs = [json.loads(f.read_text()) for f in sorted(work.glob("*-s*.json"))]
    scored = [score(r, watch_kw) for r in runs]
    md, summary = table(scored)
    print(md)
    for r in scored:
        if r["scenario"] != "clean" or r["episodes"]:
            print(
                f"  {r['scenario']}-s{r['seed']}: first warn {r['first_warn']} "
                f"({', '.join(r['first_signals'])}), collapse {r['collapse']}",
                file=sys.stderr,
            )
    print(
        f"({time.perf_counter() - t0:.0f} s; watch params {watch_kw or 'defaults'})",
        file=sys.stderr,
    )
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "runs": scored}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
