#!/usr/bin/env python
"""Benchmark ``ckptkit.signals.stability.StabilityWatch``: lead time before a collapse, false alarms.

Three families of runs, all scored by replaying the watch over per-step series (scoring
offline is identical to scoring online: the watch is a pure function of the series).

**Trained** (the bundled tiny LM of :mod:`ckptkit.examples.tiny_lm`, its model, corpus and
collate, in a configuration small enough for a laptop CPU), one instability induced at step
``--onset``:

``lr_ramp``
    the LR doubles every 20 steps from the onset: ramped past the stable edge.
``corrupt_burst``
    a growing fraction of every batch (0 -> 100 % over 100 steps, a bad shard mixed in
    with growing weight) is replaced by uniformly random tokens.
``scale_down``
    an fp16 overflow cascade. fp16 is *emulated* (CPU): a step overflows when
    ``loss_scale x max|logit| x growth > 65504`` (then, as with ``GradScaler``, it is
    skipped and the scale halved; the scale doubles after 200 clean steps), where
    ``growth`` doubles every 20 steps from the onset; the loss becomes NaN once
    ``max|logit| x growth`` itself passes 65504.
``lr_creep``
    a slow build-up: the LR doubles every 100 steps from the onset. The grad norm first
    falls, then its level and spread climb for several hundred steps while the loss rises
    slowly, until it collapses (1200-1400 steps after the onset).
``clean`` / ``clean_lr_drop``
    no intervention (warmup + cosine); ``clean_lr_drop`` also drops the LR 10x at step
    ``--lr-drop-at``, a deliberate schedule change that must not alarm. The emulated
    scaler runs in every trained run, so clean runs have the usual grow/backoff rhythm.

**Build-ups** (``buildup-L<length>-<kind>``): a slow instability of ``L`` = 200, 500 or
1000 steps overlaid on a clean run, then a loss spike. The clean run is split into a
level (centred running median of ``log grad_norm``) and a residual; from the onset, over
``u = (t - onset) / L`` in [0, 1), ``log grad_norm = level + u log(LEVEL_X) + residual
(1 + u (SPREAD_X - 1))``: kind ``both`` raises the level and the spread, ``level`` only the
level, ``spread`` only the spread. The loss stays flat-ish (+5 % at most) until step
``onset + L``, where it jumps to 4x and turns NaN 10 steps later (the grad norm with it).
``LEVEL_X`` and ``SPREAD_X`` (4x each) are what the ``lr_creep`` runs show between the
grad norm's low point and the collapse (level 4-5x, step-to-step spread 4-6x). The clean
runs they are laid on are the trained clean runs and synthetic runs of every noise model
below (each build-up row mixes them; ``--json`` has every run).

**Synthetic clean** (``synth-<schedule>-<noise>``, 10 000 steps each): grad norm, loss and
max logit with a warmup transient, then either ``cosine`` (the grad norm rises 2.5x over
the second half, as it does near the end of LR decay) or ``lr_drop`` (the LR drops 10x at
40 % and 70 %: the grad-norm level dips 0.74x and its spread 0.8x at each drop, then
recovers slowly, the loss drops), with one of five noise models: ``gauss`` (log-normal,
sigma 0.08, like the tiny LM), ``student_t`` (Student-t with 3 dof, scale 0.15: heavy
tails), ``ar1`` (AR(1), phi 0.95, sd 0.1: slowly wandering), ``spiky`` (gauss plus
isolated upward spikes on 0.5 % of steps, typically 2-6x) and ``wide`` (log-normal sigma 0.3:
small-batch noise).

Reported, per scenario, before (the watch without the drift tests, i.e. the code before
they were added) and after (the defaults): runs, warnings at least 50 steps before the
collapse, median and minimum lead time (collapse step - first warning at or after the
onset), misses (no warning by the collapse), warnings before the onset; per clean
generator: false alarms (ok -> warn/critical episodes) per 10 000 steps. Collapse: the
first step after the onset whose loss is NaN/Inf or above 3x the median of the previous
100 losses.

    python benchmarks/stability_bench.py --quick           # ~5 min on 2 cores
    python benchmarks/stability_bench.py --json runs/stability-bench.json   # ~30 min: 5 seeds
    python benchmarks/stability_bench.py --analyze runs/stability-bench --drift-warn 1.8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

TRAINED = ("lr_ramp", "corrupt_burst", "scale_down", "lr_creep")
TRAINED_CLEAN = ("clean", "clean_lr_drop")
BUILDUP_LENGTHS = (200, 500, 1000)
BUILDUP_KINDS = ("both", "level", "spread")
NOISES = ("gauss", "student_t", "ar1", "spiky", "wide")
SCHEDULES = ("cosine", "lr_drop")
FP16_MAX = 65504.0
LR_DOUBLING = 20
"""lr_ramp: steps per doubling of the LR after the onset."""
LR_CREEP_DOUBLING = 100
"""lr_creep: steps per doubling of the LR after the onset."""
CLIP = 1.0
BURST_RAMP = 100
"""corrupt_burst: steps over which the corrupted fraction of a batch goes 0 -> 100 %."""
LEVEL_X = 4.0
"""Build-ups: grad-norm level at the spike over the level at the onset."""
SPREAD_X = 4.0
"""Build-ups: spread of the grad-norm residual at the spike over the spread at the onset."""
LEAD_TARGET = 50
SYNTH_STEPS = 10_000
NEW_TESTS_OFF = {"drift_warn": None, "spread_warn": None}
"""Watch keywords that switch the drift tests off: the watch as it was before them."""


# --- trained runs -----------------------------------------------------------------------------


def train(scenario: str, seed: int, steps: int, onset: int, lr_drop_at: int) -> dict[str, Any]:
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
    induced = scenario not in TRAINED_CLEAN
    for step in range(1, steps + 1):
        k = step - onset  # steps since the onset (< 0 before)
        lr = base_lr * sched(step - 1)
        if scenario == "lr_ramp" and k >= 0:
            lr *= 2.0 ** (k / LR_DOUBLING)
        if scenario == "lr_creep" and k >= 0:
            lr *= 2.0 ** (k / LR_CREEP_DOUBLING)
        if scenario == "clean_lr_drop" and step >= lr_drop_at:
            lr *= 0.1
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
        if collapse_at is None and induced:
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


# --- synthetic runs ---------------------------------------------------------------------------


def _noise(kind: str, rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Zero-centred log-space noise of one of the noise models, in units of ``scale``."""
    if kind == "gauss":
        return scale * rng.standard_normal(n)
    if kind == "student_t":
        return 1.9 * scale * rng.standard_t(3, n)  # 0.15 for the grad norm: heavy tails
    if kind == "ar1":
        phi = 0.95
        e = 1.25 * scale * math.sqrt(1 - phi * phi) * rng.standard_normal(n)
        out = np.empty(n)
        acc = 1.25 * scale * rng.standard_normal()
        for i in range(n):
            acc = phi * acc + e[i]
            out[i] = acc
        return out
    if kind == "spiky":
        spikes = (rng.random(n) < 0.005) * rng.exponential(0.8, n)
        return scale * rng.standard_normal(n) + spikes
    if kind == "wide":
        return 3.75 * scale * rng.standard_normal(n)
    raise ValueError(f"unknown noise model {kind!r}")


def synth_clean(schedule: str, noise: str, seed: int, n: int = SYNTH_STEPS) -> dict[str, Any]:
    """A synthetic clean run: loss, grad norm and max logit (no loss scale).

    ``series`` holds the values; ``level`` the noise-free log grad norm, so an overlay can
    scale the residual exactly.
    """
    rng = np.random.default_rng([seed, SCHEDULES.index(schedule), NOISES.index(noise)])
    t = np.arange(n, dtype=np.float64)
    p = t / n
    g_level = 1.0 * np.exp(-t / 150)  # the early transient: large gradients at init
    g_spread = np.ones(n)
    l_level = np.log(2.0 + 3.0 * np.exp(-t / 1500))
    if schedule == "cosine":
        g_level += math.log(2.5) * np.clip((p - 0.5) / 0.5, 0, None) ** 2
    elif schedule == "lr_drop":
        for at in (0.4, 0.7):
            k = np.clip(t - at * n, 0, None)
            on = t >= at * n
            # The grad norm dips 0.74x at the drop, then recovers over ~2000 steps to 1.1x.
            g_level += on * (-0.3 + 0.4 * (1 - np.exp(-k / 2000)))
            g_spread *= np.where(on, 0.8, 1.0)
            l_level += on * (-0.05 * (1 - np.exp(-k / 100)))
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    g_res = _noise(noise, rng, n, 0.08) * g_spread
    # The loss and max logit are means/maxima over many tokens: their noise is narrower and
    # not heavy-tailed (a 3x loss outlier would read as a collapse); correlated for ar1.
    other = {"ar1": "ar1", "wide": "wide"}.get(noise, "gauss")
    loss = np.exp(l_level + _noise(other, rng, n, 0.02))
    max_logit = np.exp(math.log(10.0) + 0.2 * p + _noise(other, rng, n, 0.02))
    return {
        "scenario": f"synth-{schedule}-{noise}",
        "seed": seed,
        "onset": n + 1,
        "series": {
            "loss": loss.tolist(),
            "grad_norm": np.exp(g_level + g_res).tolist(),
            "max_logit": max_logit.tolist(),
        },
        "level": g_level.tolist(),
    }


def _running_median(x: np.ndarray, half: int = 32) -> np.ndarray:
    pad = np.pad(x, half, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(pad, 2 * half + 1), axis=1)


def buildup(base: dict[str, Any], kind: str, length: int, seed: int) -> dict[str, Any]:
    """Overlay a slow build-up of ``length`` steps, then a loss spike, on a clean run."""
    s = base["series"]
    name = base["scenario"].encode()
    n_base = len(s["loss"])
    rng = np.random.default_rng([seed, length, BUILDUP_KINDS.index(kind), zlib.crc32(name)])
    lo = 1000
    onset = int(rng.integers(lo, max(lo + 1, n_base - length - 21)))
    spike = onset + length  # 1-based step of the spike
    n = spike + 20
    g = np.log(np.asarray(s["grad_norm"][:n], dtype=np.float64))
    level = (
        np.asarray(base["level"][:n], dtype=np.float64) if "level" in base else _running_median(g)
    )
    res = g - level
    idx = np.arange(1, n + 1)  # 1-based steps
    u = np.clip((idx - onset) / length, 0.0, 1.0)
    up = math.log(LEVEL_X) if kind in ("both", "level") else 0.0
    wide = SPREAD_X if kind in ("both", "spread") else 1.0
    g_new = level + u * up + res * (1 + u * (wide - 1))
    loss = np.asarray(s["loss"][:n], dtype=np.float64) * (1 + 0.05 * u)
    after = idx >= spike
    loss[after] *= 4.0 * 1.1 ** (idx[after] - spike)
    loss[idx >= spike + 10] = math.nan
    g_new[after] += math.log(3.0) + 0.1 * (idx[after] - spike)
    series = {k: list(v[:n]) for k, v in s.items() if k not in ("loss", "grad_norm")}
    series["loss"] = loss.tolist()
    series["grad_norm"] = np.exp(g_new).tolist()
    return {
        "scenario": f"buildup-L{length}-{kind}",
        "base": base["scenario"],
        "seed": base["seed"],
        "onset": onset,
        "series": series,
    }


# --- scoring ----------------------------------------------------------------------------------


def score(run: dict[str, Any], watch_kw: dict[str, Any]) -> dict[str, Any]:
    """Replay the watch over a run's series: first warning, episodes, collapse."""
    from ckptkit.signals.stability import StabilityWatch

    w = StabilityWatch(**watch_kw)
    s = run["series"]
    keys = list(s)
    onset = run["onset"]
    first: int | None = None
    first_sig: list[str] = []
    episodes: list[int] = []
    why: list[str] = []
    prev = "ok"
    for i in range(len(s["loss"])):
        step = i + 1
        v = w.update(step, **{k: s[k][i] for k in keys})
        if v.level != "ok" and prev == "ok":
            episodes.append(step)
            why.append(f"{step}:{'+'.join(x.name for x in v.signals)}")
        # The first warning the build-up caused: a test firing at or after the onset (not an
        # episode of the clean prefix still latched).
        fired = [x for x in v.signals if x.name != "episode"]
        if fired and first is None and step >= onset:
            first, first_sig = step, [x.name for x in fired]
        prev = v.level
    clean = run["scenario"] in TRAINED_CLEAN or run["scenario"].startswith("synth-")
    return {
        "scenario": run["scenario"],
        "base": run.get("base"),
        "seed": run["seed"],
        "steps": len(s["loss"]),
        "onset": onset,
        "first_warn": first,
        "first_signals": first_sig,
        "episodes": len(episodes),
        "episode_starts": why,
        "pre_onset": sum(1 for e in episodes if e < onset),
        "collapse": None if clean else collapse_step(run),
    }


def _score_both(run: dict[str, Any], watch_kw: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return score(run, {**watch_kw, **NEW_TESTS_OFF}), score(run, watch_kw)


def _lead(r: dict[str, Any]) -> int | None:
    if r["collapse"] is None or r["first_warn"] is None or r["first_warn"] > r["collapse"]:
        return None
    return int(r["collapse"] - r["first_warn"])


def detection_rows(scored: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per induced scenario: runs, collapsed, leads, misses, warnings before the onset."""
    out: dict[str, dict[str, Any]] = {}
    names = sorted({r["scenario"] for r in scored if r["collapse"] is not None or _induced(r)})
    for sc in sorted(names, key=_order):
        runs = [r for r in scored if r["scenario"] == sc]
        col = [r for r in runs if r["collapse"] is not None]
        leads = [x for r in col if (x := _lead(r)) is not None]
        out[sc] = {
            "runs": len(runs),
            "collapsed": len(col),
            "lead_ok": sum(1 for x in leads if x >= LEAD_TARGET),
            "median_lead": statistics.median(leads) if leads else None,
            "min_lead": min(leads) if leads else None,
            "missed": len(col) - len(leads),
            "pre_onset": sum(1 for r in runs if r["pre_onset"]),
            "leads": leads,
        }
    return out


def false_alarm_rows(scored: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per clean generator: runs, steps, false-alarm episodes, per 10 000 steps."""
    out: dict[str, dict[str, Any]] = {}
    for sc in sorted({r["scenario"] for r in scored if not _induced(r)}, key=_order):
        runs = [r for r in scored if r["scenario"] == sc]
        steps = sum(r["steps"] for r in runs)
        alarms = sum(r["episodes"] for r in runs)
        out[sc] = {"runs": len(runs), "steps": steps, "alarms": alarms}
        out[sc]["per_10k"] = 1e4 * alarms / steps if steps else None
    # Warnings before the onset of induced runs are false alarms on a clean prefix too.
    pre = [r for r in scored if _induced(r)]
    steps = sum(min(r["steps"], r["onset"] - 1) for r in pre)
    alarms = sum(r["pre_onset"] for r in pre)
    out["(induced runs, before the onset)"] = {
        "runs": len(pre),
        "steps": steps,
        "alarms": alarms,
        "per_10k": 1e4 * alarms / steps if steps else None,
    }
    tot_steps = sum(v["steps"] for v in out.values())
    tot = sum(v["alarms"] for v in out.values())
    out["**all clean steps**"] = {
        "runs": sum(v["runs"] for v in out.values()),
        "steps": tot_steps,
        "alarms": tot,
        "per_10k": 1e4 * tot / tot_steps if tot_steps else None,
    }
    return out


def _induced(r: dict[str, Any]) -> bool:
    return r["scenario"] in TRAINED or r["scenario"].startswith("buildup-")


def _order(name: str) -> tuple[int, str]:
    for i, prefix in enumerate((*TRAINED, "buildup-L200", "buildup-L500", "buildup-L1000")):
        if name == prefix or name.startswith(prefix + "-"):
            return i, name
    return 99, name


def tables(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[str, dict]:
    """The two markdown tables (detection, false alarms), before -> after; and the numbers."""
    db, da = detection_rows(before), detection_rows(after)
    lines = [
        "| scenario | runs | lead >= 50 | median lead | min lead | missed | warned before onset |",
        "|---|---|---|---|---|---|---|",
    ]
    for sc, a in da.items():
        b = db[sc]
        lines.append(
            f"| {sc} | {a['runs']} | {b['lead_ok']} -> **{a['lead_ok']}**/{a['collapsed']} | "
            f"{_fmt(b['median_lead'])} -> {_fmt(a['median_lead'])} | "
            f"{_fmt(b['min_lead'])} -> {_fmt(a['min_lead'])} | {b['missed']} -> {a['missed']} | "
            f"{b['pre_onset']} -> {a['pre_onset']} |"
        )
    fb, fa = false_alarm_rows(before), false_alarm_rows(after)
    lines += [
        "",
        "| clean runs | runs | steps | false alarms | per 10 000 steps |",
        "|---|---|---|---|---|",
    ]
    for sc, a in fa.items():
        b = fb[sc]
        lines.append(
            f"| {sc} | {a['runs']} | {a['steps']} | {b['alarms']} -> {a['alarms']} | "
            f"{_fmt(b['per_10k'], 2)} -> **{_fmt(a['per_10k'], 2)}** |"
        )
    numbers = {"before": {"detection": db, "false_alarms": fb}}
    numbers["after"] = {"detection": da, "false_alarms": fa}
    return "\n".join(lines), numbers


def _fmt(x: float | None, nd: int = 0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


# --- main -------------------------------------------------------------------------------------


def _synth_runs(seeds: int) -> list[dict[str, Any]]:
    return [synth_clean(sc, nz, s) for sc in SCHEDULES for nz in NOISES for s in range(seeds)]


def _buildups(clean: list[dict[str, Any]], seeds: int) -> list[dict[str, Any]]:
    """Every build-up on: the trained clean runs, and one cosine run per noise model."""
    bases = [r for r in clean if r["scenario"] == "clean"]
    bases += [r for r in clean if r["scenario"].startswith("synth-cosine-")]
    out = []
    for length in BUILDUP_LENGTHS:
        for kind in BUILDUP_KINDS:
            for base in bases:
                for s in range(seeds):
                    out.append(buildup(base, kind, length, 1000 * base["seed"] + s))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, 1 build-up per base")
    p.add_argument("--seeds", type=int, default=5, help="seeds per trained scenario")
    p.add_argument("--synth-seeds", type=int, default=3, help="seeds per synthetic clean run")
    p.add_argument("--buildup-seeds", type=int, default=2, help="build-ups per base and kind")
    p.add_argument("--clean-steps", type=int, default=2500, help="steps per trained clean run")
    p.add_argument("--onset", type=int, default=700, help="step the instability starts")
    p.add_argument("--lr-drop-at", type=int, default=1500, help="clean_lr_drop: the LR drop")
    p.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--work-dir", type=Path, default=Path("runs/stability-bench"))
    p.add_argument("--analyze", type=Path, help="re-score cached trained runs in this directory")
    p.add_argument("--json", type=Path, help="write the numbers and every scored run here")
    knobs = ("z_warn", "std_ratio_warn", "drift_warn", "spread_warn", "ref_horizon", "window")
    ints = ("ref_horizon", "window")
    for name in knobs:
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None)
    a = p.parse_args(argv)
    watch_kw = {k: (int(v) if k in ints else v) for k in knobs if (v := getattr(a, k)) is not None}
    if a.quick:
        a.seeds, a.synth_seeds, a.buildup_seeds = 2, 1, 1

    t0 = time.perf_counter()
    work = a.analyze or a.work_dir
    if a.analyze is None:
        work.mkdir(parents=True, exist_ok=True)
        steps = {"lr_creep": a.onset + 1500}
        jobs = [
            (sc, s, a.clean_steps, a.clean_steps + 1)
            for sc in TRAINED_CLEAN
            for s in range(a.seeds)
        ]
        jobs += [
            (sc, s, steps.get(sc, a.onset + 500), a.onset) for sc in TRAINED for s in range(a.seeds)
        ]
        todo = [j for j in jobs if not (work / f"{j[0]}-s{j[1]}.json").exists()]
        with ProcessPoolExecutor(a.workers) as ex:
            drops = [a.lr_drop_at] * len(todo)
            for run in ex.map(train, *zip(*todo, strict=True), drops):
                name = f"{run['scenario']}-s{run['seed']}.json"
                (work / name).write_text(json.dumps(run, allow_nan=True))
                print(f"  trained {name} ({len(run['series']['loss'])} steps)", file=sys.stderr)
    trained = [json.loads(f.read_text()) for f in sorted(work.glob("*-s*.json"))]
    synth = _synth_runs(a.synth_seeds)
    runs = trained + synth + _buildups(trained + synth, a.buildup_seeds)
    t1 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as ex:
        pairs = list(ex.map(_score_both, runs, [watch_kw] * len(runs), chunksize=4))
    before = [b for b, _ in pairs]
    after = [x for _, x in pairs]
    md, numbers = tables(before, after)
    print(md)
    for b, x in pairs:
        lead = _lead(x)
        short = _induced(x) and (lead is None or lead < LEAD_TARGET)
        if (x["episodes"] and not _induced(x)) or x["pre_onset"] or short:
            print(
                f"  {x['scenario']} {x.get('base') or ''} s{x['seed']}: onset {x['onset']} "
                f"first warn {x['first_warn']} ({', '.join(x['first_signals'])}), collapse "
                f"{x['collapse']}, episodes {x['episode_starts']} (before: first warn "
                f"{b['first_warn']}, episodes {b['episode_starts']})",
                file=sys.stderr,
            )
    print(
        f"({len(runs)} runs; scoring {time.perf_counter() - t1:.0f} s, total "
        f"{time.perf_counter() - t0:.0f} s; watch params {watch_kw or 'defaults'})",
        file=sys.stderr,
    )
    if a.json:
        a.json.write_text(
            json.dumps({"numbers": numbers, "before": before, "after": after}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
