"""The *window* check of a resume drill: a drift monitor, not a certificate.

Compares the resumed run's per-step records with the pre-save window (the steps just
before the checkpoint) on four signals, each normalised so that ``score >= 1`` fails:

* ``loss_shift``: robust detrended loss. A Theil–Sen trend fitted on the window is
  extrapolated over the resumed steps; the statistic is the median of the resumed
  residuals in units of the window's noise (``1.4826·MAD`` of its residuals). A
  non-finite loss after resume, where the window had none, fails outright.
* ``grad_norm_level``: ``|log median(post) − log median(pre)|`` in MAD units of the
  window's log grad norms.
* ``length_buckets``: power-of-two sequence-length buckets; Jensen–Shannon distance
  (effect size) *and* a chi-square test of homogeneity (significance) must both
  exceed their thresholds.
* ``skip_rate``: fp16 skipped steps (the loss scale decreased); one-sided Fisher exact
  test of "more skips after resume", plus a minimum rate increase.

Throughput is reported, never judged, unless the caller passes a reference run measured
at the same time *and* a ``throughput_min_ratio`` threshold: on a shared machine step
time swings 0.2–2.8× between runs for no reason of the run's own.

Why it only informs: the resume bugs drills look for (RNG, sampler replay or reshuffle,
scheduler, optimizer moments, LR) move the loss by 0–0.6σ of its per-step noise, below the
~1.4σ a window test can resolve without false alarms. It does catch real distribution
shifts (a different data version, a length-sampler change) and loss-scale collapses.
The thresholds and the measured false-positive rate are in ``docs/drills.md (window check)``
(``benchmarks/window_calibration.py``).

Everything here is pure numpy/scipy with no I/O; records are the dicts
:func:`ckptkit.signals.recorder.read_jsonl` returns, and any value may be missing, ``None``,
non-finite, or the strings ``"nan"``/``"inf"``/``"-inf"``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps
from scipy.spatial.distance import jensenshannon

from ckptkit._jsonval import NONFINITE

MAD_SCALE = 1.4826
"""``1.4826·MAD`` estimates σ for Gaussian noise; robust to the heavy tails of batch loss."""

MIN_POINTS = 8
"""Fewer finite points than this on either side: the signal is skipped (``ok``)."""

DEFAULT_THRESHOLDS: dict[str, float | None] = {
    "loss_shift": 3.0,
    "grad_norm_level": 3.0,
    "length_js": 0.1,
    "length_alpha": 1e-3,
    "skip_alpha": 1e-3,
    "skip_min_increase": 0.05,
    "min_points": float(MIN_POINTS),
    "throughput_min_ratio": None,
}
"""Default thresholds of :func:`window_check` (calibration: ``docs/drills.md (window check)``).

* ``loss_shift`` 3.0σ: clean continuations of the bundled tiny LM (fresh-start W=N=80) and
  of the fitted synthetic model reach at most ~2.9–3.0σ, mostly trend-extrapolation error
  from the curve bending; a real 3σ level shift still fails ~96% of the time.
* ``grad_norm_level`` 3.0 MAD units of log grad norm, chosen the same way.
* ``length_js`` 0.1 (base-2 Jensen–Shannon *distance*) with ``length_alpha`` 1e-3: the
  distance of two samples of ~1000 lengths from one distribution is ~0.03; requiring
  significance too keeps tiny samples (large distance by chance) from failing.
* ``skip_alpha`` 1e-3 with ``skip_min_increase`` 0.05: a one-sided Fisher test at 1e-3
  over ~80 steps, and at least 5 more skipped steps per 100.
* ``throughput_min_ratio`` None: throughput is never part of the verdict by default.
"""

TREND_POWERS: tuple[float, ...] = (1.0, 0.5, 0.0, -0.5, -1.0)
"""Step coordinates tried for the loss trend: linear, square root, log, and two power laws."""

_MAX_TREND_POINTS = 1000  # Theil–Sen is O(n²) in memory; subsample beyond this.


# ----------------------------------------------------------------------------- trend


@dataclass(frozen=True)
class Trend:
    """A robust straight-line fit ``value ≈ intercept + slope·x(step)``."""

    slope: float
    """Change per unit of the step coordinate."""
    intercept: float
    """Value at step coordinate 0."""
    power: float
    """The step coordinate: ``x = step`` for 1, ``log(1 + step)`` for 0, else the Box–Cox
    ``((1 + step)^power − 1) / power`` (negative steps clipped to 0 when ``power != 1``)."""
    residuals: np.ndarray
    """``value − predict(step)`` for the fitted points (NaN where the value was non-finite)."""

    def predict(self, steps: Sequence[float] | np.ndarray) -> np.ndarray:
        """Evaluate the trend at ``steps``.

        Args:
            steps: step numbers.

        Returns:
            The fitted values, as a float array.

        Example:
            >>> t = robust_trend([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
            >>> t.predict([4]).tolist()
            [5.0]
        """
        return self.intercept + self.slope * _basis(np.asarray(steps, dtype=float), self.power)


def robust_trend(
    steps: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    *,
    power: float = 1.0,
) -> Trend:
    """Fit a Theil–Sen line (median of pairwise slopes) and return it with its residuals.

    Theil–Sen tolerates ~29% outliers, which batch loss (heavy-tailed) needs. Non-finite
    values are ignored by the fit and get NaN residuals. With fewer than two distinct
    finite points the slope is 0 and the intercept is the median.

    Args:
        steps: step numbers, one per value.
        values: the series (e.g. loss).
        power: the step coordinate (see :attr:`Trend.power`): 1 fits against the step;
            0 (``log(1 + step)``) or negative powers follow the convex, flattening part
            of a loss curve.

    Returns:
        The :class:`Trend`; ``residuals`` aligns with ``values``.

    Example:
        >>> t = robust_trend([0, 1, 2, 3, 4], [0.0, 1.0, 2.0, 30.0, 4.0])
        >>> round(t.slope, 6), t.residuals.tolist()[:3]
        (1.0, [0.0, 0.0, 0.0])
    """
    x_all = _basis(np.asarray(steps, dtype=float), power)
    y_all = np.asarray(values, dtype=float)
    n = min(x_all.size, y_all.size)
    x_all, y_all = x_all[:n], y_all[:n]
    m = np.isfinite(x_all) & np.isfinite(y_all)
    x, y = x_all[m], y_all[m]
    slope, intercept = 0.0, float(np.median(y)) if y.size else 0.0
    if y.size >= 2 and np.unique(x).size >= 2:
        if x.size > _MAX_TREND_POINTS:
            idx = np.linspace(0, x.size - 1, _MAX_TREND_POINTS).astype(int)
            x, y = x[idx], y[idx]
        with _quiet():
            res = sps.theilslopes(y, x)
        s = float(res[0])
        if math.isfinite(s):
            slope = s
            intercept = float(np.median(y - slope * x))
    with _quiet():
        resid = np.where(m, y_all - (intercept + slope * x_all), np.nan)
    return Trend(slope=slope, intercept=intercept, power=power, residuals=resid)


# ----------------------------------------------------------------------------- signals


def loss_shift(
    pre: Sequence[Mapping[str, Any]],
    post: Sequence[Mapping[str, Any]],
    *,
    threshold: float = 3.0,
    min_points: int = MIN_POINTS,
) -> dict[str, Any]:
    """Measure the resumed loss's level shift against the window's extrapolated trend.

    The trend is a Theil–Sen line in a power of the step (:data:`TREND_POWERS`), the one
    with the smallest residual MAD on the window, so an early, still-bending loss curve
    is not extrapolated as a straight line.

    Args:
        pre: pre-save window records (need ``step`` and ``loss``).
        post: resumed-run records.
        threshold: fail at ``|median post residual| / (1.4826·MAD(pre residuals))`` ≥ this.
        min_points: fewer finite losses on either side: skipped, ``ok``.

    Returns:
        A signal dict: ``statistic``, ``threshold``, ``score`` (statistic/threshold),
        ``ok``, ``detail``, plus ``shift`` (signed, in σ), ``sigma``, ``power``.

    Example:
        >>> pre = [{"step": i, "loss": 3.0 - 0.01 * i + 0.1 * (-1) ** i} for i in range(40)]
        >>> post = [{"step": i, "loss": 3.0 - 0.01 * i + 0.1 * (-1) ** i} for i in range(40, 80)]
        >>> loss_shift(pre, post)["ok"]
        True
    """
    s0, y0 = _series(pre, "loss")
    s1, y1 = _series(post, "loss")
    bad0, bad1 = int(np.sum(~np.isfinite(y0))), int(np.sum(~np.isfinite(y1)))
    if bad1 and not bad0:
        return _signal(
            math.inf,
            threshold,
            f"{bad1} non-finite loss(es) after resume, none in the {y0.size}-step window",
            nonfinite_post=bad1,
        )
    f0, f1 = np.isfinite(y0) & np.isfinite(s0), np.isfinite(y1) & np.isfinite(s1)
    if f0.sum() < min_points or f1.sum() < min_points:
        return _skip(threshold, f"too few points (window {int(f0.sum())}, resumed {int(f1.sum())})")
    # Extrapolate no further ahead than the fit spans: a loss curve bends (warmup,
    # power-law fall, LR decay), so a line carried far ahead drifts off. The whole window
    # is fitted: fitting only its recent part was measured worse, the noisier slope costs
    # more than the curvature it avoids (docs/drills.md (window check)).
    xs0, ys0, xs1, ys1 = s0[f0], y0[f0], s1[f1], y1[f1]
    span = float(xs0[-1] - xs0[0]) if xs0.size > 1 else 0.0
    near = xs1 <= xs0[-1] + span
    if near.sum() < min_points:
        near = np.arange(xs1.size) < min_points
    xs1, ys1 = xs1[near], ys1[near]
    # Which power fits a noisy window best is itself noisy, and a wrong pick extrapolates
    # badly; the median of the candidates' predictions is stable (calibration: §FPR).
    fits = [robust_trend(xs0, ys0, power=p) for p in TREND_POWERS]
    mads = [_mad(t.residuals) for t in fits]
    trend = fits[int(np.argmin(mads))]
    sigma = _scale(trend.residuals, ys0)
    with _quiet():
        r1 = ys1 - np.median([t.predict(xs1) for t in fits], axis=0)
    shift = float(np.median(r1))
    stat = abs(shift) / sigma if sigma > 0 else (0.0 if shift == 0 else math.inf)
    note = f"; non-finite: window {bad0}, resumed {bad1}" if (bad0 or bad1) else ""
    return _signal(
        stat,
        threshold,
        f"median resumed residual {shift:+.4g} = {_fmt(stat)}σ of the window's noise "
        f"(σ={sigma:.4g}, median of {len(fits)} trends){note}",
        shift=shift / sigma if sigma > 0 else None,
        sigma=sigma,
        power=trend.power,
    )


def grad_norm_level(
    pre: Sequence[Mapping[str, Any]],
    post: Sequence[Mapping[str, Any]],
    *,
    threshold: float = 3.0,
    min_points: int = MIN_POINTS,
) -> dict[str, Any]:
    """Compare grad-norm levels: log-ratio of medians in MAD units of the window's log norm.

    Non-finite and non-positive norms (fp16 overflow steps) are dropped here; the skip
    rate signal judges those.

    Args:
        pre: pre-save window records (need ``grad_norm``).
        post: resumed-run records.
        threshold: fail at ``|log(med post / med pre)| / (1.4826·MAD(log pre))`` ≥ this.
        min_points: fewer usable norms on either side: skipped, ``ok``.

    Returns:
        A signal dict (see :func:`loss_shift`) with ``log_ratio``.

    Example:
        >>> pre = [{"grad_norm": 1.0 + 0.1 * (i % 5)} for i in range(20)]
        >>> post = [{"grad_norm": 10.0 + (i % 5)} for i in range(20)]
        >>> grad_norm_level(pre, post)["ok"]
        False
    """
    _, g0 = _series(pre, "grad_norm")
    _, g1 = _series(post, "grad_norm")
    g0, g1 = g0[np.isfinite(g0) & (g0 > 0)], g1[np.isfinite(g1) & (g1 > 0)]
    if g0.size < min_points or g1.size < min_points:
        return _skip(threshold, f"too few points (window {g0.size}, resumed {g1.size})")
    l0, l1 = np.log(g0), np.log(g1)
    ratio = float(np.median(l1) - np.median(l0))
    sigma = _scale(l0 - np.median(l0), l0)
    stat = abs(ratio) / sigma if sigma > 0 else (0.0 if ratio == 0 else math.inf)
    return _signal(
        stat,
        threshold,
        f"median grad norm {math.exp(float(np.median(l0))):.4g} → "
        f"{math.exp(float(np.median(l1))):.4g} (×{math.exp(ratio):.3g}) = "
        f"{_fmt(stat)} MAD units of log grad norm",
        log_ratio=ratio,
    )


def length_buckets(
    pre: Sequence[Mapping[str, Any]],
    post: Sequence[Mapping[str, Any]],
    *,
    js_threshold: float = 0.1,
    alpha: float = 1e-3,
    min_count: int = 20,
    min_points: int = MIN_POINTS,
) -> dict[str, Any]:
    """Compare sequence-length distributions in power-of-two buckets.

    Bucket ``k`` holds lengths in ``(2^(k-1), 2^k]``. Fails only when the base-2
    Jensen–Shannon distance is at least ``js_threshold`` (the shift is large) *and* a
    chi-square test of homogeneity gives ``p < alpha`` (it is not sampling noise).
    Buckets with an expected count below 5 are merged into a neighbour first, and a 2×2
    table gets Yates' correction (scipy's default at one degree of freedom).

    Args:
        pre: pre-save window records (``seq_lens``: list of ints, or absent).
        post: resumed-run records.
        js_threshold: Jensen–Shannon distance (0–1) at which a shift is large.
        alpha: chi-square significance level.
        min_count: fewer lengths on either side: skipped, ``ok``.
        min_points: fewer steps with lengths on either side: skipped, ``ok`` (lengths
            within one batch are not independent; steps are the sampling unit).

    Returns:
        A signal dict with ``statistic`` = JS distance, ``p_value``, ``buckets``
        (upper bound → [pre count, post count]).

    Example:
        >>> pre = [{"seq_lens": [100, 120, 60, 30]} for _ in range(20)]
        >>> post = [{"seq_lens": [500, 900, 700, 1000]} for _ in range(20)]
        >>> length_buckets(pre, post)["ok"]
        False
    """
    a, b = _lengths(pre), _lengths(post)
    na, nb = _steps_with_lengths(pre), _steps_with_lengths(post)
    if a.size < min_count or b.size < min_count or na < min_points or nb < min_points:
        return _skip(
            js_threshold,
            f"too few points (window {na} steps/{a.size} lengths, resumed {nb}/{b.size})",
        )
    ka, kb = _bucket(a), _bucket(b)
    keys = np.union1d(ka, kb)
    table = np.array(
        [[np.sum(ka == k) for k in keys], [np.sum(kb == k) for k in keys]], dtype=float
    )
    with _quiet():
        js = float(jensenshannon(table[0], table[1], base=2))
    js = js if math.isfinite(js) else 0.0
    p = _chi2_homogeneity(table)
    p_score = -math.log10(max(p, 1e-300)) / -math.log10(alpha)
    score = min(js / js_threshold, p_score)
    buckets = {str(2 ** int(k)): [int(table[0, i]), int(table[1, i])] for i, k in enumerate(keys)}
    return {
        "statistic": js,
        "threshold": js_threshold,
        "score": score,
        "ok": bool(score < 1.0),
        "detail": f"Jensen–Shannon distance {js:.3f} (fails ≥ {js_threshold:g} with p < "
        f"{alpha:g}); chi-square p={p:.3g}; {a.size} vs {b.size} lengths",
        "p_value": p,
        "buckets": buckets,
    }


def skip_rate(
    pre: Sequence[Mapping[str, Any]],
    post: Sequence[Mapping[str, Any]],
    *,
    alpha: float = 1e-3,
    min_increase: float = 0.05,
    min_points: int = MIN_POINTS,
) -> dict[str, Any]:
    """Compare fp16 skipped-step rates; a step is skipped when the loss scale decreased.

    Transitions counted: within the window, and for the resumed run from the window's last
    record to the first resumed one and then within the resumed run (a restore that
    resets the scale too high shows up as skips right after resume). One-sided Fisher
    exact test of "the resumed rate is higher"; fails when ``p < alpha`` and the rate rose
    by at least ``min_increase``.

    Args:
        pre: pre-save window records (``loss_scale``: float or None).
        post: resumed-run records.
        alpha: significance level of the Fisher test.
        min_increase: smallest rate increase (skips per step) that fails.
        min_points: fewer loss-scale transitions on either side: skipped, ``ok``.

    Returns:
        A signal dict with ``statistic`` = ``-log10 p``, ``rate_pre``, ``rate_post`` and
        the last loss scale of each side.

    Example:
        >>> pre = [{"loss_scale": 65536.0} for _ in range(40)]
        >>> post = [{"loss_scale": 65536.0 / 2**i} for i in range(1, 21)]
        >>> skip_rate(pre, post)["ok"]
        False
    """
    thr = -math.log10(alpha)
    _, c0 = _series(pre, "loss_scale")
    _, c1 = _series(post, "loss_scale")
    if not np.any(np.isfinite(c0)) and not np.any(np.isfinite(c1)):
        return _skip(thr, "no loss_scale recorded (not fp16)")
    d0 = _decreases(c0)
    d1 = _decreases(np.concatenate([c0[-1:], c1]) if c0.size else c1)
    if d0.size < min_points or d1.size < min_points:
        return _skip(thr, f"too few points (window {d0.size}, resumed {d1.size} transitions)")
    k0, n0, k1, n1 = int(d0.sum()), int(d0.size), int(d1.sum()), int(d1.size)
    with _quiet():
        p = float(sps.fisher_exact([[k1, n1 - k1], [k0, n0 - k0]], alternative="greater")[1])
    p = p if math.isfinite(p) else 1.0
    stat = -math.log10(max(min(p, 1.0), 1e-300))
    r0, r1 = k0 / n0, k1 / n1
    inc = r1 - r0
    score = min(stat / thr, inc / min_increase) if min_increase > 0 else stat / thr
    last0 = _last_finite(c0)
    last1 = _last_finite(c1)
    return {
        "statistic": stat,
        "threshold": thr,
        "score": max(score, 0.0),
        "ok": bool(score < 1.0),
        "detail": f"skipped steps {k0}/{n0} ({r0:.1%}) in the window vs {k1}/{n1} ({r1:.1%}) "
        f"after resume, one-sided Fisher p={p:.3g}; loss scale {_fmt(last0)} → {_fmt(last1)}",
        "rate_pre": r0,
        "rate_post": r1,
        "loss_scale_pre": last0,
        "loss_scale_post": last1,
    }


def throughput(
    pre: Sequence[Mapping[str, Any]],
    post: Sequence[Mapping[str, Any]],
    *,
    reference: Sequence[Mapping[str, Any]] | None = None,
    min_ratio: float | None = None,
) -> dict[str, Any]:
    """Report step and token throughput; judge it only against a same-time reference.

    Step time is the median of ``Δtime/Δstep`` between consecutive records of one run
    (never across the resume boundary). ``judged`` is True only when ``reference`` and
    ``min_ratio`` are both given; then ``ok`` is ``resumed/reference ≥ min_ratio``.

    Args:
        pre: pre-save window records (``time`` in seconds, ``step``, optional ``tokens``).
        post: resumed-run records.
        reference: the reference run over the same steps, measured at the same time.
        min_ratio: smallest acceptable resumed/reference steps-per-second ratio.

    Returns:
        ``{"pre": {...}, "post": {...}, "ratio": post/pre, "reference": {...} | None,
        "ratio_vs_reference", "judged", "ok", "detail"}``; rates are None when unknown.

    Example:
        >>> pre = [{"step": i, "time": 0.5 * i} for i in range(10)]
        >>> post = [{"step": i, "time": 100 + 1.0 * i} for i in range(10, 20)]
        >>> throughput(pre, post)["ratio"]
        0.5
    """
    r0, r1 = _rates(pre), _rates(post)
    rr = _rates(reference) if reference is not None else None
    ratio = _ratio(r1["steps_per_s"], r0["steps_per_s"])
    vs_ref = _ratio(r1["steps_per_s"], rr["steps_per_s"]) if rr is not None else None
    judged = vs_ref is not None and min_ratio is not None
    ok = bool(vs_ref >= min_ratio) if judged else True  # type: ignore[operator]
    detail = "resumed/window steps per second " + (
        f"×{ratio:.3g}" if ratio is not None else "unknown"
    )
    if vs_ref is not None:
        detail += f"; resumed/reference ×{vs_ref:.3g}"
    detail += (
        f" (judged: fails below ×{min_ratio:g})"
        if judged
        else " (reported only: run-to-run swings of 0.2–2.8× are normal on a shared machine)"
    )
    return {
        "pre": r0,
        "post": r1,
        "reference": rr,
        "ratio": ratio,
        "ratio_vs_reference": vs_ref,
        "judged": judged,
        "ok": ok,
        "detail": detail,
    }


# ----------------------------------------------------------------------------- the check


def window_check(
    pre_records: Sequence[Mapping[str, Any]],
    resumed_records: Sequence[Mapping[str, Any]],
    *,
    thresholds: Mapping[str, float | None] | None = None,
    reference_records: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the window drift monitor: resumed run vs the pre-save window.

    Informational only: the drill reports it and never fails on it (its ``ok`` is shown
    as drift, the verdict ignores it). Never raises on malformed records (non-dicts are
    ignored, bad values count as missing).

    Args:
        pre_records: the pre-save window, oldest first (e.g. the manifest's metrics
            snapshot or the reference run's records up to the save step).
        resumed_records: the resumed run's records, oldest first.
        thresholds: overrides for :data:`DEFAULT_THRESHOLDS` (unknown keys ignored).
        reference_records: the reference run over the resumed steps, only used to put
            throughput in context (and to judge it if ``throughput_min_ratio`` is set).

    Returns:
        ``{"name": "window", "ok", "informational": True, "statistic": max score,
        "threshold": 1.0, "signals": {name: {statistic, threshold, score, ok, detail,
        ...}}, "throughput": {...}, "detail"}``. ``statistic`` is the largest
        normalised score (``statistic/threshold`` of each signal), so ≥ 1 means a signal
        fired; it is ``inf`` when a signal failed outright (a non-finite loss).

    Example:
        >>> pre = [{"step": i, "loss": 2.0 + 0.1 * (i % 3)} for i in range(30)]
        >>> post = [{"step": i, "loss": 2.0 + 0.1 * (i % 3)} for i in range(30, 60)]
        >>> r = window_check(pre, post)
        >>> r["ok"], r["informational"]
        (True, True)
    """
    th = dict(DEFAULT_THRESHOLDS)
    if thresholds:
        th.update({k: v for k, v in thresholds.items() if k in th})
    pre = [r for r in (pre_records or []) if isinstance(r, Mapping)]
    post = [r for r in (resumed_records or []) if isinstance(r, Mapping)]
    ref = (
        [r for r in reference_records if isinstance(r, Mapping)]
        if reference_records is not None
        else None
    )
    mp = int(_num(th["min_points"], MIN_POINTS))
    signals = {
        "loss_shift": loss_shift(pre, post, threshold=_num(th["loss_shift"], 3.0), min_points=mp),
        "grad_norm_level": grad_norm_level(
            pre, post, threshold=_num(th["grad_norm_level"], 3.0), min_points=mp
        ),
        "length_buckets": length_buckets(
            pre,
            post,
            js_threshold=_num(th["length_js"], 0.1),
            alpha=_num(th["length_alpha"], 1e-3),
            min_points=mp,
        ),
        "skip_rate": skip_rate(
            pre,
            post,
            alpha=_num(th["skip_alpha"], 1e-3),
            min_increase=_num(th["skip_min_increase"], 0.05),
            min_points=mp,
        ),
    }
    tp = throughput(
        pre,
        post,
        reference=ref,
        min_ratio=th["throughput_min_ratio"] if ref is not None else None,
    )
    scores = [s["score"] for s in signals.values() if s["score"] is not None]
    ok = all(s["ok"] for s in signals.values()) and tp["ok"]
    failed = [n for n, s in signals.items() if not s["ok"]]
    if not tp["ok"]:
        failed.append("throughput")
    ran = [n for n, s in signals.items() if s["score"] is not None]
    if failed:
        detail = "drift in " + ", ".join(failed)
    elif ran:
        detail = "no drift beyond thresholds in " + ", ".join(ran)
    else:
        detail = "too few points: no signal could be computed"
    return {
        "name": "window",
        "ok": bool(ok),
        "informational": True,
        "statistic": max(scores) if scores else 0.0,
        "threshold": 1.0,
        "signals": signals,
        "throughput": tp,
        "detail": detail,
    }


# ----------------------------------------------------------------------------- helpers


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence numpy/scipy numeric warnings: degenerate inputs are handled by the caller."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def _basis(steps: np.ndarray, power: float) -> np.ndarray:
    if power == 1.0:
        return steps
    with _quiet():
        s = np.maximum(steps, 0.0)
        if power == 0.0:
            return np.log1p(s)
        return np.expm1(power * np.log1p(s)) / power


def _to_float(v: Any) -> float:
    if isinstance(v, bool) or v is None:
        return math.nan
    if isinstance(v, int | float | np.integer | np.floating):
        try:
            return float(v)
        except (OverflowError, ValueError):
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        return NONFINITE.get(v.strip().lower(), math.nan)
    return math.nan


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps (falling back to the record index) and values of ``key`` (NaN when missing)."""
    steps = np.array([_to_float(r.get("step")) for r in records], dtype=float)
    bad = ~np.isfinite(steps)
    steps[bad] = np.arange(len(records), dtype=float)[bad]
    vals = np.array([_to_float(r.get(key)) for r in records], dtype=float)
    return steps, vals


def _mad(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    if not x.size:
        return math.inf
    with _quiet():
        return float(np.median(np.abs(x - np.median(x))))


def _scale(resid: np.ndarray, level: np.ndarray) -> float:
    """Robust σ of residuals: 1.4826·MAD, falling back to the mean absolute deviation, and
    to a relative epsilon of the level for an exactly constant series."""
    r = resid[np.isfinite(resid)]
    if not r.size:
        return 0.0
    with _quiet():
        s = MAD_SCALE * float(np.median(np.abs(r - np.median(r))))
        if not s > 0:
            s = 1.2533 * float(np.mean(np.abs(r - np.median(r))))
        if not (s > 0 and math.isfinite(s)):
            lv = level[np.isfinite(level)]
            s = 1e-9 * max(1.0, float(np.max(np.abs(lv))) if lv.size else 1.0)
    return s if math.isfinite(s) else 0.0


def _lengths(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
    out: list[float] = []
    for r in records:
        v = r.get("seq_lens")
        if isinstance(v, list | tuple):
            out.extend(_to_float(x) for x in v)
    a = np.array(out, dtype=float)
    return a[np.isfinite(a) & (a >= 1) & (a < 2.0**62)]


def _steps_with_lengths(records: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for r in records if isinstance(r.get("seq_lens"), list | tuple) and r["seq_lens"])


def _bucket(lengths: np.ndarray) -> np.ndarray:
    return np.ceil(np.log2(lengths)).astype(np.int64)


def _chi2_homogeneity(table: np.ndarray) -> float:
    """p-value of a 2×K homogeneity test after merging sparse buckets into neighbours."""
    t = table[:, table.sum(axis=0) > 0]
    while t.shape[1] > 1:
        expected = np.outer(t.sum(axis=1), t.sum(axis=0)) / t.sum()
        col = int(np.argmin(expected.min(axis=0)))
        if expected[:, col].min() >= 5:
            break
        nb = col - 1 if col == t.shape[1] - 1 else col + 1
        if 0 < col < t.shape[1] - 1 and t[:, col - 1].sum() < t[:, col + 1].sum():
            nb = col - 1
        t[:, nb] += t[:, col]
        t = np.delete(t, col, axis=1)
    if t.shape[1] < 2 or np.any(t.sum(axis=1) == 0):
        return 1.0
    with _quiet():
        p = float(sps.chi2_contingency(t, correction=True)[1])
    return p if math.isfinite(p) else 1.0


def _decreases(scales: np.ndarray) -> np.ndarray:
    """One bool per consecutive pair of finite positive scales: did the scale drop?"""
    s = scales[np.isfinite(scales) & (scales > 0)]
    return s[1:] < s[:-1]


def _last_finite(x: np.ndarray) -> float | None:
    f = x[np.isfinite(x)]
    return float(f[-1]) if f.size else None


def _rates(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    steps, t = _series(records, "time")
    _, tok = _series(records, "tokens")
    with _quiet():
        ds, dt = np.diff(steps), np.diff(t)
        ok = np.isfinite(dt) & np.isfinite(ds) & (ds > 0) & (dt > 0)
        per_step = dt[ok] / ds[ok]
        sps_ = float(1.0 / np.median(per_step)) if per_step.size else None
        tk = tok[1:][ok]
        tk_ok = np.isfinite(tk) & (tk >= 0)
        tps = float(np.sum(tk[tk_ok]) / np.sum(dt[ok][tk_ok])) if tk_ok.sum() else None
    return {
        "steps_per_s": sps_ if sps_ is not None and math.isfinite(sps_) else None,
        "tokens_per_s": tps if tps is not None and math.isfinite(tps) else None,
        "intervals": int(per_step.size),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b > 0:
        return None
    r = a / b
    return r if math.isfinite(r) else None


def _num(v: Any, default: float) -> float:
    x = _to_float(v)
    return x if math.isfinite(x) else default


def _signal(stat: float, threshold: float, detail: str, **extra: Any) -> dict[str, Any]:
    score = stat / threshold if threshold > 0 else (math.inf if stat > 0 else 0.0)
    return {
        "statistic": stat,
        "threshold": threshold,
        "score": score,
        "ok": bool(score < 1.0),
        "detail": detail,
        **extra,
    }


def _skip(threshold: float, detail: str) -> dict[str, Any]:
    return {"statistic": None, "threshold": threshold, "score": None, "ok": True, "detail": detail}


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3g}" if math.isfinite(x) else str(x)
