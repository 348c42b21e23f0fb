"""Training-stability watch: classify a run as ``ok`` / ``warn`` / ``critical`` from its scalars.

:class:`StabilityWatch` is fed the per-step scalars a training loop already reads (loss,
gradient norm, loss scale, max |logit|, attention entropy, any named scalar), directly with
:meth:`StabilityWatch.update` or through a :class:`~ckptkit.Recorder` with
:meth:`StabilityWatch.attach`. It never touches tensors itself: pass Python floats you
already synced for (a tensor is converted with ``float()``, which waits for the GPU).

Per tracked metric it keeps a rolling window of the (by default log-transformed) values,
split into a *recent* part (the last ``recent`` steps) and a *baseline* (the ``window``
steps before that). The baseline lags on purpose: an instability that builds up over the
recent steps does not contaminate the statistics it is compared against. The tests:

``<metric>.nonfinite``
    NaN or Inf: ``critical`` at once (checked for every numeric scalar passed in).
``<metric>.zscore``
    robust z-score of each value against the baseline median and MAD (x1.4826); ``warn``
    when at least ``trigger_count`` of the last ``trigger_window`` steps reach ``z_warn``,
    ``critical`` when as many reach ``z_critical``. Counting triggers in a short window
    ignores the isolated spikes of heavy-tailed noise but catches a run of them.
``<metric>.std_shift``
    level-shift test on the rolling standard deviation: the robust scale of the recent
    first differences over that of the baseline's (differences, so a smooth trend such
    as a falling loss does not count as noise). ``warn`` at ``std_ratio_warn``.
``<metric>.regression`` (loss only, by default)
    the recent median against the best (lowest) baseline median seen so far: a run that
    diverged and settled on a worse plateau is not "ok" again once the baseline has
    absorbed the jump.
``<metric>.drift`` (grad norm and max logit, by default)
    the recent median against the healthiest reference: the lowest baseline median of the
    last ``ref_horizon`` steps. A build-up that climbs for hundreds of steps (attention-logit
    growth, an LR past the stable edge) moves the lagging baseline along with it, so the
    z-score never fires; the healthiest reference does not move. ``warn`` at
    ``drift_warn`` (2x), ``critical`` at ``drift_critical``. The horizon bounds it: a rise
    slower than ``drift_warn`` per ``ref_horizon`` steps (the grad norm's slow climb as the
    LR decays) is not flagged.
``<metric>.spread_drift`` (grad norm, by default)
    the same for the noise: the recent step-to-step spread (as in ``std_shift``) against
    the lower quartile of the baseline spreads of the last ``ref_horizon`` steps.
``loss_scale.backoff``
    monotone loss-scale backoff: ``backoff_warn`` decreases with no increase in between
    (within ``backoff_window`` steps) is an overflow cascade, not the isolated backoff of
    a healthy fp16 run; ``critical`` at ``backoff_critical`` or below ``min_loss_scale``.

Levels latch: once a step is ``warn`` or ``critical`` the verdict stays at the worst level
of the episode until ``clear_after`` consecutive steps trigger nothing, so a checkpoint
saved between two spikes is not labelled healthy.

Cost: O(1) amortised per update. Appending to the windows is O(1); the medians and MADs are
recomputed every ``recompute_every`` steps (default ``window // 16``) with a linear-time
selection over ``window + recent`` values, and the drift references take one entry per
recompute (a sliding minimum, O(1) amortised, and a quartile over the
``ref_horizon / recompute_every`` = 64 entries kept), so the amortised cost is
O((window + recent + ref_horizon / recompute_every) / recompute_every), a constant that
does not grow with the run. Between recomputes each value is scored against the last
baseline (at most ``recompute_every`` steps old).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ckptkit import codes
from ckptkit._jsonval import encode_float
from ckptkit.errors import CkptkitError
from ckptkit.format.records import HEALTH_LEVELS, Health

if TYPE_CHECKING:
    from ckptkit.signals.recorder import Logged, Recorder

Level = Literal["ok", "warn", "critical"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "critical")
_RANK = {lvl: i for i, lvl in enumerate(LEVELS)}
NOT_JUDGED = "not judged"
"""The health recorded for a checkpoint saved while the watch could not judge the run yet
(its warm-up, or no baseline window yet) and had seen nothing wrong: neither healthy nor
unhealthy. ``ckptkit rollback`` and ``restore(healthy=True)`` do not take it as healthy."""
_HEALTH_RANK: dict[str, int] = {lvl: i for i, lvl in enumerate(HEALTH_LEVELS)}
_MAD_TO_SIGMA = 1.4826
# Relative floor of a scale estimate (in log space: 0.1 %), so a constant series does not
# give infinite z-scores for the first change in the last digit.
_SCALE_FLOOR = 1e-3
_LOG_FLOOR = 1e-30
# A log-scale track holds levels log(max(x, _LOG_FLOOR)) of finite floats: nothing else.
_LOG_RANGE = (math.log(_LOG_FLOOR), math.log(sys.float_info.max))
log = logging.getLogger(__name__)
WATCH_KEY = "stability-watch"
"""The key of a watch's :meth:`~ckptkit.Recorder.subscribe` subscription on its recorder."""


def worse(a: Level, b: Level) -> Level:
    """Return the more severe of two levels.

    Example:
        >>> worse("ok", "warn")
        'warn'
    """
    return a if _RANK[a] >= _RANK[b] else b


@dataclass(frozen=True)
class SignalSpec:
    """How one named scalar is watched."""

    direction: Literal["up", "down", "both"] = "up"
    """Which excursions are unhealthy: ``up`` (loss, grad norm), ``down`` (entropy), ``both``."""
    log: bool = True
    """Score ``log(value)``: scale-free, and multiplicative noise becomes additive."""
    regression: bool = False
    """Also compare the recent median with the best baseline median seen (loss-like metrics)."""
    drift: bool = False
    """Also compare the recent median with the lowest baseline median seen within
    ``ref_horizon`` steps: catches a level that climbs for hundreds of steps, which the
    lagging baseline absorbs (grad norm, max logit). Needs ``log=True``, ``direction="up"``."""
    spread_drift: bool = False
    """Also compare the recent step-to-step spread with the lower quartile of the baseline
    spreads seen within ``ref_horizon`` steps: catches noise that widens for hundreds of
    steps (grad norm). Needs ``log=True``, ``direction="up"``."""

    def __post_init__(self) -> None:
        if (self.drift or self.spread_drift) and (not self.log or self.direction != "up"):
            raise ValueError(
                "SignalSpec(drift=True / spread_drift=True) needs log=True and "
                "direction='up': the drift tests compare ratios of a positive metric with "
                "its lowest healthy level"
            )


DEFAULT_SIGNALS: dict[str, SignalSpec] = {
    "loss": SignalSpec("up", log=True, regression=True),
    "grad_norm": SignalSpec("up", log=True, drift=True, spread_drift=True),
    "max_logit": SignalSpec("up", log=True, drift=True),
    "attn_entropy": SignalSpec("down", log=False),
}
"""Metrics tracked by default. ``loss_scale`` is handled by the backoff test."""


@dataclass(frozen=True)
class Signal:
    """One test that fired, with the number it computed and the threshold it crossed."""

    name: str
    """``<metric>.<test>``, e.g. ``grad_norm.zscore``."""
    level: Level
    """The level this test alone gives."""
    statistic: float
    """The computed statistic (z-score, ratio, backoff count, ...)."""
    threshold: float
    """The threshold it reached."""
    detail: str
    """One sentence for humans."""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (non-finite numbers as strings)."""
        return {
            "level": self.level,
            "statistic": encode_float(self.statistic),
            "threshold": encode_float(self.threshold),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Verdict:
    """The classification of one step."""

    level: Level
    """The run's level: the worst active signal, or the latched level of the episode."""
    signals: list[Signal]
    """The signals behind the level (empty when ``ok``)."""
    step: int
    """The step classified."""

    @property
    def ok(self) -> bool:
        """True when the level is ``ok``."""
        return self.level == "ok"

    def summary(self) -> str:
        """One line: the level and the named signals.

        Example:
            >>> Verdict("ok", [], 3).summary()
            'step 3: ok'
        """
        if not self.signals:
            return f"step {self.step}: {self.level}"
        why = "; ".join(f"{s.name} {s.level} ({s.detail})" for s in self.signals)
        return f"step {self.step}: {self.level}: {why}"


class _Track:
    """Rolling windows and robust statistics of one metric."""

    def __init__(self, name: str, spec: SignalSpec, watch: StabilityWatch) -> None:
        self.name = name
        self.spec = spec
        n = watch.window + watch.recent
        self.values: deque[float] = deque(maxlen=n)
        self.diffs: deque[float] = deque(maxlen=n)
        self.trig: deque[int] = deque(maxlen=watch.trigger_window)  # 0 none, 1 warn, 2 critical
        self.n_warn = 0
        self.n_crit = 0
        self.since = 0  # updates since the last recompute
        self.ready = False
        self.med = self.sig = self.dsig_base = self.dsig_recent = self.med_recent = math.nan
        self.best = math.inf
        # References for the drift tests, one entry per recompute after the warm-up, over
        # the last ref_horizon updates. Level: the lowest baseline median, a sliding minimum
        # ((count, value) pairs with increasing values: the front is the minimum, each entry
        # is pushed and popped once, O(1) amortised). Spread: the lower quartile of the
        # baseline spreads (the minimum of noisy spread estimates is biased ~15 % low, which
        # a ratio test cannot afford); O(ref_horizon / recompute_every) per recompute.
        self.ref_level: deque[tuple[int, float]] = deque()
        self.spreads: deque[float] = deque(maxlen=-(-watch.ref_horizon // watch.recompute_every))
        self.spread_ref = math.nan
        self.last = math.nan
        self.z = 0.0
        self.count = 0

    _FLOATS = ("med", "sig", "dsig_base", "dsig_recent", "med_recent", "best", "spread_ref",
               "last", "z")
    _INTS = ("n_warn", "n_crit", "since", "count")

    def state(self) -> dict[str, Any]:
        """The windows and statistics (:meth:`StabilityWatch.state_dict`)."""
        out: dict[str, Any] = {
            "values": list(self.values),
            "diffs": list(self.diffs),
            "trig": list(self.trig),
            "ready": self.ready,
            "ref_level": [[c, v] for c, v in self.ref_level],
            "spreads": list(self.spreads),
        }
        out.update({k: getattr(self, k) for k in self._INTS + self._FLOATS})
        return out

    def load(self, st: Mapping[str, Any], w: StabilityWatch) -> None:
        """Take :meth:`state`'s values, each checked (they come from a checkpoint file)."""
        self.values.extend(_floats(st, "values", self.values.maxlen))
        self.diffs.extend(_floats(st, "diffs", self.diffs.maxlen))
        trig = _ints(st, "trig", self.trig.maxlen)
        if any(t not in (0, 1, 2) for t in trig):
            raise ValueError("'trig' holds a value other than 0, 1 or 2")
        self.trig.extend(trig)
        self.ready = _typed(st, "ready", bool)
        pairs = _typed(st, "ref_level", list)
        if len(pairs) > w.ref_horizon:
            raise ValueError(f"'ref_level' holds {len(pairs)} entries, more than ref_horizon")
        for pair in pairs:
            if not (isinstance(pair, list | tuple) and len(pair) == 2 and type(pair[0]) is int
                    and type(pair[1]) is float):
                raise ValueError("'ref_level' holds an entry that is not [count, level]")
            self.ref_level.append((pair[0], pair[1]))
        self.spreads.extend(_floats(st, "spreads", self.spreads.maxlen))
        for k in self._INTS:
            setattr(self, k, _typed(st, k, int))
        for k in self._FLOATS:
            setattr(self, k, _typed(st, k, float))
        self._check()

    def _check(self) -> None:
        """Refuse what no watch writes and :meth:`push` could not survive (ValueError).

        A watch's own state always holds these: finite levels (on a log scale, within the
        logs of finite floats), changes that are numbers, spreads above zero
        (:meth:`recompute` floors them), trigger counts that count the triggers. A zero
        spread would divide by zero in the next :meth:`push`; a level past the float range
        would overflow ``exp``.
        """
        lo, hi = _LOG_RANGE if self.spec.log else (-sys.float_info.max, sys.float_info.max)

        def level(key: str, v: float, *, unset: float = math.nan) -> None:
            if (math.isnan(unset) and math.isnan(v)) or v == unset:
                return
            if not lo <= v <= hi:
                scale = "log-scale " if self.spec.log else ""
                raise ValueError(f"{key!r} is {v!r}, not a finite {scale}level")

        def spread(key: str, v: float, *, zero: bool = False) -> None:
            if v < 0 or (v == 0 and not zero):  # NaN: not set
                raise ValueError(f"{key!r} is {v!r}, not a spread above zero")

        for v in self.values:
            level("values", v)
        for v in self.diffs:
            # Two finite levels differ by a number (past the float range: inf); on a log
            # scale by a finite one.
            if math.isnan(v) or (self.spec.log and not math.isfinite(v)):
                raise ValueError(f"'diffs' holds {v!r}, not a step-to-step change")
        for _, v in self.ref_level:
            level("ref_level", v)
        for v in self.spreads:
            if not v > 0:
                raise ValueError(f"'spreads' holds {v!r}, not a spread above zero")
        level("med", self.med)
        level("med_recent", self.med_recent)
        level("best", self.best, unset=math.inf)
        spread("sig", self.sig)
        spread("dsig_base", self.dsig_base)
        spread("dsig_recent", self.dsig_recent, zero=True)
        spread("spread_ref", self.spread_ref)
        # A ready baseline may hold statistics that are not finite: recompute over levels
        # near the float range overflows (inf - inf is NaN), and the watch writes that; a
        # statistic that is not finite judges nothing (every test asks isfinite or
        # compares), so it is taken as the watch took it.
        if self.n_warn != sum(t >= 1 for t in self.trig) or self.n_crit != sum(
            t >= 2 for t in self.trig
        ):
            raise ValueError("'n_warn'/'n_crit' do not count the triggers in 'trig'")
        for k in ("since", "count"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k!r} is negative")

    def transform(self, x: float) -> float:
        return math.log(max(x, _LOG_FLOOR)) if self.spec.log else x

    def recompute(self, w: StabilityWatch) -> None:
        """Recompute the baseline and recent statistics: O(window + recent)."""
        w.recomputes += 1
        self.since = 0
        # Levels past ±1e308 differ by inf, and inf - inf is NaN: a statistic that is not
        # finite judges nothing (every test asks isfinite or compares), it never raises.
        with np.errstate(invalid="ignore", over="ignore"):
            self._recompute(w)

    def _recompute(self, w: StabilityWatch) -> None:
        n_recent = min(w.recent, len(self.values))
        vals = np.fromiter(self.values, dtype=np.float64, count=len(self.values))
        base = vals[: len(vals) - n_recent]
        if len(base) < w.min_history:
            self.ready = False
            return
        diffs = np.fromiter(self.diffs, dtype=np.float64, count=len(self.diffs))
        dbase, drecent = diffs[: len(diffs) - n_recent], diffs[len(diffs) - n_recent :]
        self.med = float(np.median(base))
        floor = _SCALE_FLOOR * (1.0 if self.spec.log else max(abs(self.med), 1e-12))
        self.sig = max(_MAD_TO_SIGMA * float(np.median(np.abs(base - self.med))), floor)
        self.dsig_base = max(_mad_sigma(dbase), floor)
        self.dsig_recent = _mad_sigma(drecent) if len(drecent) >= 8 else math.nan
        recent = vals[len(vals) - n_recent :]
        self.med_recent = float(np.median(recent)) if len(recent) else math.nan
        self.best = min(self.best, self.med)
        if (self.spec.drift or self.spec.spread_drift) and w.updates > w.warmup:
            # References only from after the warm-up: early training is not a healthy
            # level to come back to (logits grow, the grad norm settles).
            _slide_min(self.ref_level, self.count, self.med, w.ref_horizon)
            self.spreads.append(self.dsig_base)
            self.spread_ref = float(np.percentile(np.fromiter(self.spreads, np.float64), 25))
        self.ready = True

    def push(self, x: float, w: StabilityWatch) -> list[Signal]:
        """Score one finite value, then add it to the windows. Returns the signals it fires."""
        self.count += 1
        self.last = x
        t = self.transform(x)
        out: list[Signal] = []
        trig = 0
        armed = self.ready and w.updates > w.warmup
        if self.ready:
            z = (t - self.med) / self.sig
            self.z = z
            score = {"up": z, "down": -z, "both": abs(z)}[self.spec.direction]
            trig = (2 if score >= w.z_critical else 1 if score >= w.z_warn else 0) if armed else 0
        self._count_trigger(trig, w)
        if armed and self.n_warn >= w.trigger_count:
            crit = self.n_crit >= w.trigger_count
            thr = w.z_critical if crit else w.z_warn
            out.append(
                Signal(
                    f"{self.name}.zscore",
                    "critical" if crit else "warn",
                    self.z,
                    thr,
                    f"robust z {self.z:+.1f} (value {x:.4g}); {self.n_crit if crit else self.n_warn}"
                    f" of the last {len(self.trig)} steps beyond {thr:g}",
                )
            )
        if armed and math.isfinite(self.dsig_recent):
            ratio = self.dsig_recent / self.dsig_base
            if ratio >= w.std_ratio_warn:
                crit = ratio >= w.std_ratio_critical
                out.append(
                    Signal(
                        f"{self.name}.std_shift",
                        "critical" if crit else "warn",
                        ratio,
                        w.std_ratio_critical if crit else w.std_ratio_warn,
                        f"step-to-step spread of the last {w.recent} steps is {ratio:.1f}x "
                        f"the baseline's",
                    )
                )
        if armed and self.spec.regression and self.spec.log and math.isfinite(self.best):
            ratio = _exp(self.med_recent - self.best)
            if w.regress_warn is not None and ratio >= w.regress_warn:
                crit = w.regress_critical is not None and ratio >= w.regress_critical
                out.append(
                    Signal(
                        f"{self.name}.regression",
                        "critical" if crit else "warn",
                        ratio,
                        (w.regress_critical if crit else w.regress_warn) or math.nan,
                        f"recent median {math.exp(self.med_recent):.4g} is {ratio:.2f}x "
                        f"the best baseline median {math.exp(self.best):.4g}",
                    )
                )
        if armed and self.ref_level:
            out.extend(self._drift(w))
        if self.values:
            self.diffs.append(t - self.values[-1])
        self.values.append(t)
        self.since += 1
        if self.since >= w.recompute_every or (not self.ready and self.since >= 1):
            # Before the baseline is ready, retry often (cheap: the windows are short);
            # once ready, every recompute_every steps.
            if self.ready or len(self.values) - min(w.recent, len(self.values)) >= w.min_history:
                self.recompute(w)
            else:
                self.since = 0
        return out

    def _drift(self, w: StabilityWatch) -> list[Signal]:
        """Level and spread against the healthiest baselines of the last ``ref_horizon`` steps."""
        out: list[Signal] = []
        ref = self.ref_level[0][1]
        ratio = _exp(self.med_recent - ref)
        if self.spec.drift and w.drift_warn is not None and ratio >= w.drift_warn:
            crit = w.drift_critical is not None and ratio >= w.drift_critical
            out.append(
                Signal(
                    f"{self.name}.drift",
                    "critical" if crit else "warn",
                    ratio,
                    (w.drift_critical if crit else w.drift_warn) or math.nan,
                    f"recent median {math.exp(self.med_recent):.4g} is {ratio:.2f}x the lowest "
                    f"baseline median {math.exp(ref):.4g} of the last {w.ref_horizon} steps",
                )
            )
        if self.spec.spread_drift and w.spread_warn is not None and math.isfinite(self.dsig_recent):
            sratio = self.dsig_recent / self.spread_ref
            if sratio >= w.spread_warn:
                crit = w.spread_critical is not None and sratio >= w.spread_critical
                out.append(
                    Signal(
                        f"{self.name}.spread_drift",
                        "critical" if crit else "warn",
                        sratio,
                        (w.spread_critical if crit else w.spread_warn) or math.nan,
                        f"step-to-step spread of the last {w.recent} steps is {sratio:.1f}x the "
                        f"lower quartile of the baseline spreads of the last {w.ref_horizon} "
                        "steps",
                    )
                )
        return out

    def _count_trigger(self, trig: int, w: StabilityWatch) -> None:
        if len(self.trig) == self.trig.maxlen:
            old = self.trig[0]
            self.n_warn -= old >= 1
            self.n_crit -= old >= 2
        self.trig.append(trig)
        self.n_warn += trig >= 1
        self.n_crit += trig >= 2

    def stats(self) -> dict[str, Any]:
        back = (lambda v: math.exp(v)) if self.spec.log else (lambda v: v)
        ready = self.ready
        return {
            "count": self.count,
            "last": encode_float(self.last),
            "baseline_median": encode_float(back(self.med)) if ready else None,
            "baseline_sigma": encode_float(self.sig) if ready else None,
            "recent_median": encode_float(back(self.med_recent)) if ready else None,
            "z": encode_float(self.z) if ready else None,
            "std_ratio": encode_float(self.dsig_recent / self.dsig_base)
            if ready and math.isfinite(self.dsig_recent)
            else None,
            "triggers": self.n_warn,
            "log": self.spec.log,
            **(self._drift_stats() if self.spec.drift or self.spec.spread_drift else {}),
        }

    def _drift_stats(self) -> dict[str, Any]:
        if not (self.ready and self.ref_level):
            return {"reference_median": None, "drift_ratio": None, "spread_drift_ratio": None}
        ref, sref = self.ref_level[0][1], self.spread_ref
        return {
            "reference_median": encode_float(math.exp(ref)),
            "drift_ratio": encode_float(_exp(self.med_recent - ref)),
            "spread_drift_ratio": encode_float(self.dsig_recent / sref)
            if math.isfinite(self.dsig_recent)
            else None,
        }


class StabilityWatch:
    """Classify a training run as ``ok`` / ``warn`` / ``critical`` from its per-step scalars.

    Args:
        signals: metrics to track and how (default :data:`DEFAULT_SIGNALS`: loss,
            grad_norm, max_logit, attn_entropy). Untracked numeric scalars are still
            checked for NaN/Inf.
        extra: more metric names to track, each with ``SignalSpec("both", log=False)``.
        window: baseline length in steps (default 256).
        recent: recent-window length in steps (default 64); the baseline lags by this much.
        recompute_every: steps between recomputing the medians/MADs (default
            ``max(1, window // 16)``); the amortised cost per step is
            O((window + recent) / recompute_every).
        min_history: baseline values needed before a metric's statistical tests run
            (default ``window // 2``).
        warmup: updates before any test but NaN/Inf and the loss-scale floor fires
            (default 500): early training changes its own noise level and a fresh
            ``GradScaler`` backs off repeatedly on purpose.
        z_warn: robust z-score that counts as a warn trigger (default 6).
        z_critical: robust z-score that counts as a critical trigger (default 12).
        trigger_count: triggers needed ... (default 3) ...
        trigger_window: ... within this many most recent steps (default 16).
        std_ratio_warn: recent/baseline step-to-step spread for ``warn`` (default 2.5).
        std_ratio_critical: ... for ``critical`` (default 6).
        regress_warn: recent median / best baseline median for ``warn`` (default 1.5;
            None disables).
        regress_critical: ... for ``critical`` (default 2.0; None: never critical).
        drift_warn: recent median / lowest baseline median of the last ``ref_horizon``
            steps for ``warn``, for metrics with ``SignalSpec(drift=True)`` (default 2.0;
            None disables).
        drift_critical: ... for ``critical`` (default 4.0; None: never critical).
        spread_warn: recent step-to-step spread / lower quartile of the baseline spreads
            of the last ``ref_horizon`` steps for ``warn``, for metrics with
            ``SignalSpec(spread_drift=True)`` (default 2.2; None disables).
        spread_critical: ... for ``critical`` (default 6.0; None: never critical).
        ref_horizon: how many steps back the drift tests look for the healthiest
            baseline (default ``4 * window`` = 1024): a rise slower than this is read as
            the schedule's.
        loss_scale_key: the metric holding the AMP loss scale (default ``loss_scale``).
        backoff_warn: loss-scale decreases with no increase between for ``warn`` (default 3).
        backoff_critical: ... for ``critical`` (default 6).
        backoff_window: only backoffs within this many steps count (default 1000).
        min_loss_scale: a loss scale below this is ``critical`` (default 1.0).
        clear_after: consecutive quiet steps that end a warn/critical episode (default 200).
        check_nonfinite: NaN/Inf in any numeric scalar is ``critical`` (default True).
        ignore: metric names never looked at (default: ``lr``, ``tokens``, ``epoch``,
            ``opt_step``, ``time``).

    Example:
        >>> import random
        >>> w = StabilityWatch(window=64, recent=16)
        >>> rnd = random.Random(0)
        >>> for s in range(300):
        ...     v = w.update(s, loss=2.0 + 0.05 * rnd.random(), grad_norm=1.0 + 0.1 * rnd.random())
        >>> v.level
        'ok'
        >>> w.update(300, loss=float("nan")).signals[0].name
        'loss.nonfinite'
    """

    def __init__(
        self,
        signals: Mapping[str, SignalSpec] | None = None,
        *,
        extra: Iterable[str] = (),
        window: int = 256,
        recent: int = 64,
        recompute_every: int | None = None,
        min_history: int | None = None,
        warmup: int = 500,
        z_warn: float = 6.0,
        z_critical: float = 12.0,
        trigger_count: int = 3,
        trigger_window: int = 16,
        std_ratio_warn: float = 2.5,
        std_ratio_critical: float = 6.0,
        regress_warn: float | None = 1.5,
        regress_critical: float | None = 2.0,
        drift_warn: float | None = 2.0,
        drift_critical: float | None = 4.0,
        spread_warn: float | None = 2.2,
        spread_critical: float | None = 6.0,
        ref_horizon: int | None = None,
        loss_scale_key: str = "loss_scale",
        backoff_warn: int = 3,
        backoff_critical: int = 6,
        backoff_window: int = 1000,
        min_loss_scale: float = 1.0,
        clear_after: int = 200,
        check_nonfinite: bool = True,
        ignore: Iterable[str] = ("lr", "tokens", "epoch", "opt_step", "time"),
    ) -> None:
        if window < 8 or recent < 8:
            raise ValueError(
                f"StabilityWatch: window and recent must be >= 8, got {window}, {recent}"
            )
        if not 1 <= trigger_count <= trigger_window:
            raise ValueError("StabilityWatch: need 1 <= trigger_count <= trigger_window")
        if z_critical < z_warn or std_ratio_critical < std_ratio_warn:
            raise ValueError("StabilityWatch: critical thresholds must not be below warn ones")
        for lo, hi in ((drift_warn, drift_critical), (spread_warn, spread_critical)):
            if lo is not None and (lo <= 1.0 or (hi is not None and hi < lo)):
                raise ValueError(
                    "StabilityWatch: drift/spread thresholds are ratios > 1, critical >= warn"
                )
        ref_horizon = 4 * window if ref_horizon is None else ref_horizon
        if ref_horizon < window:
            raise ValueError(
                f"StabilityWatch: ref_horizon ({ref_horizon}) must be >= window ({window})"
            )
        self.specs: dict[str, SignalSpec] = dict(DEFAULT_SIGNALS if signals is None else signals)
        for name in extra:
            self.specs.setdefault(name, SignalSpec("both", log=False))
        self.window = window
        self.recent = recent
        self.recompute_every = recompute_every or max(1, window // 16)
        self.min_history = window // 2 if min_history is None else max(8, min_history)
        self.warmup = warmup
        self.z_warn = z_warn
        self.z_critical = z_critical
        self.trigger_count = trigger_count
        self.trigger_window = trigger_window
        self.std_ratio_warn = std_ratio_warn
        self.std_ratio_critical = std_ratio_critical
        self.regress_warn = regress_warn
        self.regress_critical = regress_critical
        self.drift_warn = drift_warn
        self.drift_critical = drift_critical
        self.spread_warn = spread_warn
        self.spread_critical = spread_critical
        self.ref_horizon = ref_horizon
        self.loss_scale_key = loss_scale_key
        self.backoff_warn = backoff_warn
        self.backoff_critical = backoff_critical
        self.backoff_window = backoff_window
        self.min_loss_scale = min_loss_scale
        self.clear_after = clear_after
        self.check_nonfinite = check_nonfinite
        self.ignore = frozenset(ignore)
        self.listeners: list[Callable[[Verdict], None]] = []
        """Called with every verdict (e.g. ``CheckpointManager.observe``)."""
        self.reset()

    def reset(self) -> None:
        """Forget every window and episode (after a rollback: the old windows describe another run).

        Example:
            >>> w = StabilityWatch()
            >>> _ = w.update(1, loss=float("inf"))
            >>> w.reset(); w.level
            'ok'
        """
        self.tracks: dict[str, _Track] = {}
        self.recomputes = 0
        """How many full window recomputations ran (the O(1) amortised check counts these)."""
        self.updates = 0
        self.last: Verdict | None = None
        self.level: Level = "ok"
        self.episode_level: Level = "ok"
        self.episode_start: int | None = None
        self.first_warn_step: int | None = None
        self.episode_signals: dict[str, Signal] = {}
        self.quiet = 0
        self._scale_last: float | None = None
        self._backoffs: deque[int] = deque()
        self._scale_grew_at: int | None = None
        self._nonfinite: dict[str, int] = {}

    def state_dict(self) -> dict[str, Any]:
        """The windows, references and episode, to save with a checkpoint.

        Given back to :meth:`load_state_dict` after a resume in a new process, the watch
        goes on judging exactly as the uninterrupted run's would, instead of warming up
        again (``warmup`` steps in which every checkpoint's health is ``not judged``). An
        automatic recovery keeps one for each healthy checkpoint this process saves and
        goes back to it when it rolls back to that checkpoint. It holds only lists, dicts,
        strings and numbers (non-finite floats included), copies of the watch's own: ckptkit's
        tree stores it without pickle.

        Example:
            >>> w = StabilityWatch(window=16, recent=8, warmup=0)
            >>> for s in range(40):
            ...     _ = w.update(s, loss=2.0 + 0.01 * (s % 3))
            >>> again = StabilityWatch(window=16, recent=8, warmup=0)
            >>> again.load_state_dict(w.state_dict())
            True
            >>> again.update(40, loss=9.0) == w.update(40, loss=9.0)
            True
        """
        return {
            "version": _STATE_VERSION,
            "params": self.params(),
            "updates": self.updates,
            "recomputes": self.recomputes,
            "level": self.level,
            "episode_level": self.episode_level,
            "episode_start": self.episode_start,
            "first_warn_step": self.first_warn_step,
            "episode_signals": [_signal_row(s) for s in self.episode_signals.values()],
            "last": None if self.last is None else {
                "level": self.last.level,
                "step": self.last.step,
                "signals": [_signal_row(s) for s in self.last.signals],
            },
            "quiet": self.quiet,
            "scale_last": self._scale_last,
            "backoffs": list(self._backoffs),
            "scale_grew_at": self._scale_grew_at,
            "nonfinite": dict(self._nonfinite),
            "tracks": {name: tr.state() for name, tr in self.tracks.items()},
        }

    def load_state_dict(
        self, state: Any, *, where: str = "the checkpoint", strict: bool = False
    ) -> bool:
        """Go on from a :meth:`state_dict` saved with a checkpoint; True when it did.

        False, with a warning naming ``where`` and why, when the state was saved by a
        watch with other parameters (its windows would be judged by thresholds they were
        not built for) or is malformed (``CK-S030``; it comes from a file): a value of the
        wrong type, or one no watch writes and the next :meth:`update` could not survive
        (a zero or negative spread, a level past the float range, trigger counts that do
        not count the triggers). The watch is then reset and warms up again, judging
        nothing it cannot. The listeners stay as they are. Every state this method takes
        is one :meth:`update` and :meth:`health` work from.

        Args:
            state: what :meth:`state_dict` returned, read back from a file.
            where: the file or checkpoint it came from, for the message.
            strict: raise on a malformed state instead of warning (the watch is left as
                it was).

        Raises:
            StateError: ``CK-S030``, with ``strict``, the state is malformed.

        Example:
            >>> w = StabilityWatch()
            >>> w.load_state_dict({"version": 1}, where="x.ckpt", strict=True)
            Traceback (most recent call last):
            ...
            ckptkit.errors.StateError: CK-S030 the stability watch's state in x.ckpt is malformed: ...
        """
        try:
            fresh = self._restored(state, where)
        except CkptkitError as e:
            if strict:
                raise
            log.warning("ckptkit: %s %s; the watch starts afresh (warming up for %d steps)",
                        e.code, e.what, self.warmup)
            self.reset()
            return False
        if fresh is None:
            log.warning(
                "ckptkit: the stability watch's state in %s was saved with other "
                "parameters; the watch starts afresh (warming up for %d steps)",
                where, self.warmup)
            self.reset()
            return False
        vars(self).update({k: v for k, v in vars(fresh).items() if k != "listeners"})
        return True

    def _restored(self, state: Any, where: str) -> StabilityWatch | None:
        """A copy of this watch filled from ``state``; None when saved with other parameters.

        Raises:
            StateError: ``CK-S030``, the state is malformed.
        """
        try:
            if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
                raise ValueError(f"not a watch state of version {_STATE_VERSION}")
            if state["params"] != self.params():
                return None
            fresh = StabilityWatch.__new__(StabilityWatch)
            vars(fresh).update({k: v for k, v in vars(self).items() if k != "listeners"})
            fresh.reset()
            fresh._load(state)
        except (KeyError, TypeError, ValueError) as e:
            why = f"{e.args[0]!r} is missing" if isinstance(e, KeyError) else str(e)
            raise codes.error(
                codes.S030, f"the stability watch's state in {where} is malformed: {why}"
            ) from None
        return fresh

    def _load(self, st: Mapping[str, Any]) -> None:
        """Fill a reset watch from a checked :meth:`state_dict` (raises ValueError)."""
        self.updates = _typed(st, "updates", int)
        self.recomputes = _typed(st, "recomputes", int)
        self.level = _level(st, "level")
        self.episode_level = _level(st, "episode_level")
        self.episode_start = _typed(st, "episode_start", int, none=True)
        self.first_warn_step = _typed(st, "first_warn_step", int, none=True)
        self.episode_signals = {
            sig.name: sig for sig in map(_signal, _typed(st, "episode_signals", list))
        }
        last = _typed(st, "last", Mapping, none=True)
        if last is not None:
            self.last = Verdict(_level(last, "level"),
                                [_signal(r) for r in _typed(last, "signals", list)],
                                _typed(last, "step", int))
        self.quiet = _typed(st, "quiet", int)
        self._scale_last = _typed(st, "scale_last", float, none=True)
        if self._scale_last is not None and not math.isfinite(self._scale_last):
            raise ValueError(f"'scale_last' is {self._scale_last!r}, not a finite loss scale")
        for k in ("updates", "recomputes", "quiet"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k!r} is negative")
        self._backoffs = deque(_ints(st, "backoffs", None))
        self._scale_grew_at = _typed(st, "scale_grew_at", int, none=True)
        nonfinite = _typed(st, "nonfinite", Mapping)
        if not all(isinstance(k, str) and type(v) is int for k, v in nonfinite.items()):
            raise ValueError("'nonfinite' is not a map of names to counts")
        self._nonfinite = dict(nonfinite)
        tracks = _typed(st, "tracks", Mapping)
        for name in tracks:
            spec = self.specs.get(name)
            if spec is None:
                raise ValueError(f"a window of {name!r}, a metric this watch does not track")
            tr = self.tracks[name] = _Track(name, spec, self)
            try:
                tr.load(_typed(tracks, name, Mapping), self)
            except (KeyError, TypeError, ValueError) as e:
                why = f"{e.args[0]!r} is missing" if isinstance(e, KeyError) else str(e)
                raise ValueError(f"the window of {name!r}: {why}") from None

    # --- feeding ---------------------------------------------------------------------------

    def update(self, step: int, /, **metrics: Any) -> Verdict:
        """Feed one step's scalars; return the verdict for that step.

        Args:
            step: the global step.
            **metrics: named scalars (Python numbers, numpy or 0-d tensors; a CUDA tensor
                is synced by ``float()``). Lists, strings and None are ignored.

        Returns:
            The :class:`Verdict` (also kept as :attr:`last`).

        Example:
            >>> w = StabilityWatch()
            >>> w.update(1, loss=2.3, grad_norm=0.7, lr=1e-3).level
            'ok'
        """
        self.updates += 1
        fired: list[Signal] = []
        for name, raw in metrics.items():
            if name in self.ignore:
                continue
            x = _scalar(raw)
            if x is None:
                continue
            if not math.isfinite(x):
                if self.check_nonfinite or name in self.specs or name == self.loss_scale_key:
                    self._nonfinite[name] = self._nonfinite.get(name, 0) + 1
                    fired.append(
                        Signal(f"{name}.nonfinite", "critical", x, math.nan, f"{name} is {x}")
                    )
                continue
            if name == self.loss_scale_key:
                fired.extend(self._scale(step, x))
                continue
            spec = self.specs.get(name)
            if spec is None:
                continue
            tr = self.tracks.get(name)
            if tr is None:
                tr = self.tracks[name] = _Track(name, spec, self)
            fired.extend(tr.push(x, self))
        return self._decide(step, fired)

    def alert(self, step: int, name: str, detail: str, *, level: Level = "critical") -> Verdict:
        """Hear of an event the scalars cannot show; return the verdict for ``step``.

        The event is a signal of the current episode like any other: the level, the
        health record of the next checkpoint, rollback and every listener (emergency
        checkpoint, recovery) see it. The manager calls it when the replicas of a tensor
        disagree at a save (``replicas.divergent``, :mod:`ckptkit.checkpoint.replicas`).

        Example:
            >>> w = StabilityWatch()
            >>> w.alert(40, "replicas.divergent", "model/w: rank 1 differs").level
            'critical'
            >>> w.health().signals["replicas.divergent"]["detail"]
            'model/w: rank 1 differs'
        """
        return self._decide(step, [Signal(name, level, 1.0, 0.0, detail)])

    def __call__(self, step: int, /, **metrics: Any) -> Verdict:
        """Alias of :meth:`update`."""
        return self.update(step, **metrics)

    def _scale(self, step: int, x: float) -> list[Signal]:
        prev, self._scale_last = self._scale_last, x
        if prev is not None and x > prev:
            self._backoffs.clear()  # growth: the cascade (if any) is over
            self._scale_grew_at = step
        elif prev is not None and x < prev and self.updates > self.warmup:
            # A fresh GradScaler backs off many times in its first steps (the initial
            # scale is deliberately too high): only backoffs after warm-up count.
            self._backoffs.append(step)
        while self._backoffs and self._backoffs[0] <= step - self.backoff_window:
            self._backoffs.popleft()
        out: list[Signal] = []
        n = len(self._backoffs)
        if x < self.min_loss_scale:
            out.append(
                Signal(
                    f"{self.loss_scale_key}.floor",
                    "critical",
                    x,
                    self.min_loss_scale,
                    f"loss scale {x:g} below {self.min_loss_scale:g}",
                )
            )
        if n >= self.backoff_warn:
            crit = n >= self.backoff_critical
            out.append(
                Signal(
                    f"{self.loss_scale_key}.backoff",
                    "critical" if crit else "warn",
                    n,
                    self.backoff_critical if crit else self.backoff_warn,
                    f"{n} backoffs since step {self._backoffs[0]} with no growth (scale {x:g})",
                )
            )
        return out

    def _decide(self, step: int, fired: list[Signal]) -> Verdict:
        active: Level = "ok"
        for s in fired:
            active = worse(active, s.level)
        if active != "ok":
            if self.episode_level == "ok":
                self.episode_start = step
                self.episode_signals = {}
            if self.first_warn_step is None:
                self.first_warn_step = step
            self.episode_level = worse(self.episode_level, active)
            for s in fired:
                old = self.episode_signals.get(s.name)
                if old is None or _RANK[s.level] >= _RANK[old.level]:
                    self.episode_signals[s.name] = s
            self.quiet = 0
        elif self.episode_level != "ok":
            self.quiet += 1
            if self.quiet >= self.clear_after:
                self.episode_level = "ok"
                self.episode_start = None
                self.episode_signals = {}
        signals = list(fired)
        if not fired and self.episode_level != "ok":
            signals.append(
                Signal(
                    "episode",
                    self.episode_level,
                    self.quiet,
                    self.clear_after,
                    f"{self.episode_level} since step {self.episode_start} "
                    f"({', '.join(sorted(self.episode_signals))}); clears after "
                    f"{self.clear_after - self.quiet} more quiet steps",
                )
            )
        self.level = worse(active, self.episode_level)
        verdict = Verdict(self.level, signals, int(step))
        self.last = verdict
        for fn in self.listeners:
            fn(verdict)
        return verdict

    # --- Recorder hook ---------------------------------------------------------------------

    def attach(self, recorder: Recorder) -> StabilityWatch:
        """Feed every record ``recorder`` writes to this watch (a recorder subscription).

        The recorder writes first, then the watch scores the scalars the loop logged; the
        verdict is :attr:`last`. Lists (``seq_lens``, ``sample_ids``) and strings are
        skipped. A recorder feeds one watch at a time; other subscribers (the resume
        guard) are independent of it.

        Returns:
            self, for chaining.

        Raises:
            ValueError: the recorder already feeds a watch.

        Example:
            >>> from ckptkit.signals.recorder import Recorder
            >>> rec = Recorder(None)
            >>> w = StabilityWatch().attach(rec)
            >>> rec.log(1, loss=float("nan"))
            >>> w.last.level
            'critical'
        """
        if recorder.subscription(WATCH_KEY) is not None:
            raise ValueError("this Recorder already feeds a StabilityWatch; detach() it first")
        recorder.subscribe(self._on_logged, key=WATCH_KEY)
        return self

    def _on_logged(self, event: Logged) -> None:
        self.update(event.step, **event.given)

    @staticmethod
    def detach(recorder: Recorder) -> None:
        """Stop feeding ``recorder``'s records to its watch (undo :meth:`attach`).

        Only the watch's subscription ends; the resume guard and any other subscriber
        keep hearing every record.

        Example:
            >>> from ckptkit.signals.recorder import Recorder
            >>> rec = Recorder(None)
            >>> _ = StabilityWatch().attach(rec)
            >>> StabilityWatch.detach(rec)
            >>> rec.subscription(WATCH_KEY) is None
            True
        """
        sub = recorder.subscription(WATCH_KEY)
        if sub is not None:
            sub.remove()

    # --- reporting -------------------------------------------------------------------------

    def health(self) -> Health:
        """Return the health record for a checkpoint manifest (:meth:`snapshot` as JSON).

        Returns:
            A :class:`~ckptkit.format.records.Health` (``level``, ``not_judging``, ``step``,
            ``episode_start``, ``first_warn_step``, ``signals``, ``window``, ``params``,
            ``time``): ``level`` is the watch's level, or
            ``"not judged"`` while it is ``ok`` only because nothing could be judged yet
            (``not_judging`` says why: see :func:`not_judging`; None once it judges);
            ``signals`` maps each signal of the current episode to
            ``{level, statistic, threshold, detail}``; ``window`` maps each tracked metric
            to its rolling statistics (baseline median and sigma, recent median, last
            z-score, std ratio; for metrics with drift tests also the healthiest reference
            median, ``drift_ratio`` and ``spread_drift_ratio``), plus ``loss_scale``.

        Example:
            >>> w = StabilityWatch()
            >>> _ = w.update(5, loss=1.0)
            >>> h = w.health(); h.level, h.step
            ('not judged', 5)
            >>> _ = w.update(6, loss=float("nan")); w.health().level
            'critical'
        """
        sigs: dict[str, Signal] = dict(self.episode_signals)
        if self.last is not None:
            for s in self.last.signals:
                if s.name != "episode":
                    sigs[s.name] = s
        window: dict[str, Any] = {name: tr.stats() for name, tr in sorted(self.tracks.items())}
        if self._scale_last is not None:
            window[self.loss_scale_key] = {
                "last": encode_float(self._scale_last),
                "backoffs_without_growth": len(self._backoffs),
                "last_growth_step": self._scale_grew_at,
            }
        if self._nonfinite:
            window["nonfinite_counts"] = dict(self._nonfinite)
        waiting = not_judging(self)
        level = NOT_JUDGED if self.level == "ok" and waiting is not None else self.level
        return Health(
            level=level,
            not_judging=waiting,
            step=self.last.step if self.last is not None else None,
            episode_start=self.episode_start,
            first_warn_step=self.first_warn_step,
            signals={name: s.to_dict() for name, s in sorted(sigs.items())},
            window=window,
            params=self.params(),
            time=time.time(),
        )

    def snapshot(self) -> dict[str, Any]:
        """Return the JSON-able health record for a checkpoint manifest (:meth:`health`).

        Example:
            >>> StabilityWatch().snapshot()["level"]
            'not judged'
        """
        return self.health().to_dict()

    @staticmethod
    def worst(snapshots: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Return the least healthy of several ranks' :meth:`snapshot` results.

        A checkpoint of a multi-rank run is healthy only if every rank's watch says so
        (a rank may see what the others do not: its own data shard, its own layers), and
        judged only if every rank's watch judged: ``not judged`` ranks between ``ok`` and
        ``warn``. The first snapshot at the worst level is taken, with ``ranks``: every
        rank's level.

        Example:
            >>> StabilityWatch.worst([{"level": "ok"}, {"level": "warn"}])
            {'level': 'warn', 'ranks': ['ok', 'warn']}
            >>> StabilityWatch.worst([{"level": "ok"}, {"level": "not judged"}])["level"]
            'not judged'
        """
        snaps = list(snapshots)
        levels = [Health.from_dict(s).level for s in snaps]
        pick = max(range(len(snaps)), key=lambda i: _HEALTH_RANK.get(levels[i] or "", 0))
        return {**snaps[pick], "ranks": levels}

    def params(self) -> dict[str, Any]:
        """Return the thresholds in effect (recorded with every snapshot)."""
        return {
            "window": self.window,
            "recent": self.recent,
            "recompute_every": self.recompute_every,
            "min_history": self.min_history,
            "warmup": self.warmup,
            "z_warn": self.z_warn,
            "z_critical": self.z_critical,
            "trigger_count": self.trigger_count,
            "trigger_window": self.trigger_window,
            "std_ratio_warn": self.std_ratio_warn,
            "std_ratio_critical": self.std_ratio_critical,
            "regress_warn": self.regress_warn,
            "regress_critical": self.regress_critical,
            "drift_warn": self.drift_warn,
            "drift_critical": self.drift_critical,
            "spread_warn": self.spread_warn,
            "spread_critical": self.spread_critical,
            "ref_horizon": self.ref_horizon,
            "backoff_warn": self.backoff_warn,
            "backoff_critical": self.backoff_critical,
            "backoff_window": self.backoff_window,
            "min_loss_scale": self.min_loss_scale,
            "clear_after": self.clear_after,
            "signals": {
                k: {
                    "direction": v.direction,
                    "log": v.log,
                    "regression": v.regression,
                    "drift": v.drift,
                    "spread_drift": v.spread_drift,
                }
                for k, v in sorted(self.specs.items())
            },
        }


def not_judging(w: StabilityWatch) -> str | None:
    """Why the watch cannot call the run healthy yet (None once every test is armed).

    During its warm-up only NaN/Inf and the loss-scale floor are judged, and the trend
    tests need a baseline window first: an "ok" then means "nothing judged", not healthy
    (a checkpoint saved then records the health :data:`NOT_JUDGED`).

    Example:
        >>> w = StabilityWatch(warmup=100)
        >>> _ = w.update(1, loss=2.0)
        >>> not_judging(w)
        'warming up: 1 of 100 steps (only NaN/Inf and the loss-scale floor are judged)'
    """
    if w.updates <= w.warmup:
        return (
            f"warming up: {w.updates} of {w.warmup} steps (only NaN/Inf and the loss-scale "
            "floor are judged)"
        )
    if w.tracks and not any(t.ready for t in w.tracks.values()):
        return f"collecting a baseline: {w.min_history} steps of history before the trend tests"
    return None


# --- emergency checkpoints --------------------------------------------------------------------


@dataclass
class EmergencyPolicy:
    """When the checkpoint manager saves and pins an emergency checkpoint.

    On the first step of an episode that reaches ``on`` (default ``warn``, so also
    ``critical``), at most once per ``min_interval_steps``. Pure bookkeeping, no I/O:
    :meth:`CheckpointManager.observe` asks :meth:`should_save` and calls :meth:`saved`.

    Example:
        >>> p = EmergencyPolicy(min_interval_steps=100)
        >>> p.should_save(Verdict("warn", [], 10)), p.saved(10)
        (True, None)
        >>> p.should_save(Verdict("ok", [], 11)), p.should_save(Verdict("warn", [], 50))
        (False, False)
    """

    enabled: bool = True
    """False: never save an emergency checkpoint."""
    min_interval_steps: int = 500
    """Rate limit: steps between two emergency saves."""
    pin: str = "emergency"
    """Pin label of the emergency checkpoint (rotation never deletes a pinned one)."""
    on: Level = "warn"
    """The lowest level that triggers a save."""
    last_saved_step: int | None = None
    """Step of the last emergency save."""
    _prev: Level = field(default="ok", repr=False)

    def should_save(self, verdict: Verdict) -> bool:
        """Return True when this verdict starts an episode that deserves an emergency save."""
        prev, self._prev = self._prev, verdict.level
        if not self.enabled or _RANK[verdict.level] < _RANK[self.on]:
            return False
        if _RANK[prev] >= _RANK[self.on]:
            return False  # not the first step of the episode
        return (
            self.last_saved_step is None
            or verdict.step - self.last_saved_step >= self.min_interval_steps
        )

    def saved(self, step: int) -> None:
        """Record that an emergency checkpoint was saved at ``step``."""
        self.last_saved_step = step

    def rewind(self, step: int) -> None:
        """Forget what happened after ``step`` (the run was rolled back to it).

        The next warning starts a new episode, and a save after ``step`` no longer
        rate-limits the next one.

        Example:
            >>> p = EmergencyPolicy(); _ = p.should_save(Verdict("warn", [], 80)); p.saved(80)
            >>> p.rewind(50); p.last_saved_step, p.should_save(Verdict("warn", [], 60))
            (None, True)
        """
        self._prev = "ok"
        if self.last_saved_step is not None and self.last_saved_step > step:
            self.last_saved_step = None


# --- rollback ---------------------------------------------------------------------------------

HINTS: dict[str, str] = {
    "loss": "inspect the batch window before the first warning (sample ids in the metrics "
    "file): a bad shard or a corrupted batch shows up as a loss spike",
    "grad_norm": "tighten gradient clipping (e.g. halve the clip norm) or lower the peak LR",
    "max_logit": "logits are growing: consider z-loss / QK-norm, lower LR, or more weight decay",
    "attn_entropy": "attention entropy collapse: consider QK-norm or a lower LR",
    "loss_scale": "fp16 overflow cascade: check for activations growing toward fp16 max; "
    "consider bf16 or a lower LR",
    "std_shift": "noise level rose before the failure: lower the LR (e.g. x0.5) from the "
    "rollback point",
    "drift": "the level climbed for hundreds of steps before the failure (LR past the stable "
    "edge, attention-logit growth): lower the LR (e.g. x0.5) or add QK-norm / z-loss, and "
    "resume from a checkpoint before the climb began",
    "spread_drift": "the gradient noise widened for hundreds of steps before the failure: "
    "lower the LR (e.g. x0.5) from a checkpoint before it began",
    "nonfinite": "a NaN/Inf appeared: find the first non-finite step in the metrics file and "
    "replay that batch with anomaly detection on",
}


# --- helpers ----------------------------------------------------------------------------------


def _slide_min(q: deque[tuple[int, float]], at: int, value: float, horizon: int) -> None:
    """Push ``(at, value)`` on a sliding-minimum deque and drop entries older than ``horizon``."""
    while q and q[-1][1] >= value:
        q.pop()  # never the minimum again: a newer entry is at least as low
    q.append((at, value))
    while q[0][0] <= at - horizon:
        q.popleft()


def _exp(x: float) -> float:
    """``exp(x)``, ``inf`` past the float range: a ratio of two log-scale levels can be past
    it (a loss of 1e300 after one of 1e-30), and a ratio that large is simply critical."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _mad_sigma(a: np.ndarray) -> float:
    if len(a) == 0:
        return math.nan
    return _MAD_TO_SIGMA * float(np.median(np.abs(a - np.median(a))))


_STATE_VERSION = 1
"""The layout of :meth:`StabilityWatch.state_dict`."""


def _typed(st: Mapping[str, Any], key: str, kind: Any, *, none: bool = False) -> Any:
    """``st[key]``, checked by :func:`_as`."""
    return _as(st[key], kind, repr(key), none=none)


def _as(v: Any, kind: Any, what: str, *, none: bool = False) -> Any:
    """``v``, which must be a ``kind`` (or None with ``none``): an int where a float is
    expected is taken as that float; a bool is never a number."""
    if v is None and none:
        return None
    if kind is float and type(v) is int:
        if abs(v) > sys.float_info.max:
            raise ValueError(f"{what} is {v}, past every float")
        return float(v)
    name = getattr(kind, "__name__", str(kind))
    if (isinstance(v, bool) and kind is not bool) or not isinstance(v, kind):
        raise ValueError(f"{what} is a {type(v).__name__}, not a {name}")
    return v


def _floats(st: Mapping[str, Any], key: str, most: int | None) -> list[float]:
    return [_as(v, float, f"a value of {key!r}") for v in _bounded(st, key, most)]


def _ints(st: Mapping[str, Any], key: str, most: int | None) -> list[int]:
    return [_as(v, int, f"a value of {key!r}") for v in _bounded(st, key, most)]


def _bounded(st: Mapping[str, Any], key: str, most: int | None) -> list[Any]:
    vals: list[Any] = _typed(st, key, list)
    if most is not None and len(vals) > most:
        raise ValueError(f"{key!r} holds {len(vals)} values, more than its window's {most}")
    return vals


def _level(st: Mapping[str, Any], key: str) -> Level:
    v = st[key]
    if v not in _RANK:
        raise ValueError(f"{key!r} is {v!r}, not one of {', '.join(LEVELS)}")
    return v  # type: ignore[no-any-return]


def _signal_row(s: Signal) -> list[Any]:
    return [s.name, s.level, s.statistic, s.threshold, s.detail]


def _signal(row: Any) -> Signal:
    if not (isinstance(row, list | tuple) and len(row) == 5):
        raise ValueError("a signal is not [name, level, statistic, threshold, detail]")
    name, level, stat, threshold, detail = row
    if not (isinstance(name, str) and isinstance(detail, str)):
        raise ValueError("a signal's name or detail is not a string")
    for x in (stat, threshold):
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise ValueError(f"signal {name!r} has a statistic or threshold that is not a number")
    return Signal(name, _level({"level": level}, "level"), stat, threshold, detail)


def _scalar(v: Any) -> float | None:
    if v is None or isinstance(v, bool | str | bytes | list | tuple | dict):
        return None
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(v)  # numpy scalar, 0-d tensor (syncs a CUDA tensor)
    except (TypeError, ValueError):
        return None


__all__ = [
    "DEFAULT_SIGNALS",
    "HINTS",
    "LEVELS",
    "NOT_JUDGED",
    "WATCH_KEY",
    "EmergencyPolicy",
    "Health",
    "Level",
    "Signal",
    "SignalSpec",
    "StabilityWatch",
    "Verdict",
    "not_judging",
    "worse",
]
