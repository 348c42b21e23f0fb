"""Rolling windows and robust statistics of one watched metric, and the tests they fire.

One :class:`Track` per metric a :class:`~ckptkit.signals.stability.StabilityWatch`
tracks: the baseline and recent windows, their medians and MADs, the drift references, and
the z-score, spread, regression and drift tests of each new value.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptkit._jsonval import encode_float
from ckptkit.signals.verdicts import Signal, SignalSpec
from ckptkit.signals.watch_state import floats, ints, typed

if TYPE_CHECKING:
    from ckptkit.signals.stability import StabilityWatch

_MAD_TO_SIGMA = 1.4826
# Relative floor of a scale estimate (in log space: 0.1 %), so a constant series does not
# give infinite z-scores for the first change in the last digit.
_SCALE_FLOOR = 1e-3
_LOG_FLOOR = 1e-30
# A log-scale track holds levels log(max(x, _LOG_FLOOR)) of finite floats: nothing else.
_LOG_RANGE = (math.log(_LOG_FLOOR), math.log(sys.float_info.max))


class Track:
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
        self.values.extend(floats(st, "values", self.values.maxlen))
        self.diffs.extend(floats(st, "diffs", self.diffs.maxlen))
        trig = ints(st, "trig", self.trig.maxlen)
        if any(t not in (0, 1, 2) for t in trig):
            raise ValueError("'trig' holds a value other than 0, 1 or 2")
        self.trig.extend(trig)
        self.ready = typed(st, "ready", bool)
        pairs = typed(st, "ref_level", list)
        if len(pairs) > w.ref_horizon:
            raise ValueError(f"'ref_level' holds {len(pairs)} entries, more than ref_horizon")
        for pair in pairs:
            if not (isinstance(pair, list | tuple) and len(pair) == 2 and type(pair[0]) is int
                    and type(pair[1]) is float):
                raise ValueError("'ref_level' holds an entry that is not [count, level]")
            self.ref_level.append((pair[0], pair[1]))
        self.spreads.extend(floats(st, "spreads", self.spreads.maxlen))
        for k in self._INTS:
            setattr(self, k, typed(st, k, int))
        for k in self._FLOATS:
            setattr(self, k, typed(st, k, float))
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
            out += _graded(
                f"{self.name}.regression",
                ratio,
                w.regress_warn,
                w.regress_critical,
                lambda: f"recent median {math.exp(self.med_recent):.4g} is {ratio:.2f}x "
                f"the best baseline median {math.exp(self.best):.4g}",
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
        if self.spec.drift:
            out += _graded(
                f"{self.name}.drift",
                ratio,
                w.drift_warn,
                w.drift_critical,
                lambda: f"recent median {math.exp(self.med_recent):.4g} is {ratio:.2f}x the lowest "
                f"baseline median {math.exp(ref):.4g} of the last {w.ref_horizon} steps",
            )
        if self.spec.spread_drift and w.spread_warn is not None and math.isfinite(self.dsig_recent):
            sratio = self.dsig_recent / self.spread_ref
            out += _graded(
                f"{self.name}.spread_drift",
                sratio,
                w.spread_warn,
                w.spread_critical,
                lambda: f"step-to-step spread of the last {w.recent} steps is {sratio:.1f}x the "
                f"lower quartile of the baseline spreads of the last {w.ref_horizon} steps",
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


def _slide_min(q: deque[tuple[int, float]], at: int, value: float, horizon: int) -> None:
    """Push ``(at, value)`` on a sliding-minimum deque and drop entries older than ``horizon``."""
    while q and q[-1][1] >= value:
        q.pop()  # never the minimum again: a newer entry is at least as low
    q.append((at, value))
    while q[0][0] <= at - horizon:
        q.popleft()


def _graded(
    name: str, ratio: float, warn: float | None, critical: float | None, detail: Callable[[], str]
) -> list[Signal]:
    """The signal of a ratio test with optional thresholds: ``warn`` from ``warn`` on,
    ``critical`` from ``critical`` on (None: that level is off); ``detail`` is only
    formatted when it fires."""
    if warn is None or ratio < warn:
        return []
    crit = critical is not None and ratio >= critical
    return [
        Signal(
            name,
            "critical" if crit else "warn",
            ratio,
            (critical if crit else warn) or math.nan,
            detail(),
        )
    ]


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


__all__ = ["Track"]
