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
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from ckptkit import codes
from ckptkit._jsonval import encode_float
from ckptkit.errors import CkptkitError
from ckptkit.format.records import HEALTH_LEVELS, Health
from ckptkit.signals.emergency import EmergencyPolicy
from ckptkit.signals.track import Track
from ckptkit.signals.verdicts import (
    DEFAULT_SIGNALS,
    LEVELS,
    NOT_JUDGED,
    RANK,
    Level,
    Signal,
    SignalSpec,
    Verdict,
    worse,
)
from ckptkit.signals.watch_options import DEFAULT_OPTIONS, WatchOptions
from ckptkit.signals.watch_state import (
    STATE_VERSION,
    ints,
    level_of,
    signal_of,
    signal_row,
    typed,
)

if TYPE_CHECKING:
    from ckptkit.signals.recorder import Logged, Recorder

_HEALTH_RANK: dict[str, int] = {lvl: i for i, lvl in enumerate(HEALTH_LEVELS)}
log = logging.getLogger(__name__)
_OPTION_NAMES = frozenset(f.name for f in fields(WatchOptions))
"""The keyword arguments of :class:`StabilityWatch` that fill its :class:`WatchOptions`."""
_PARAMS = tuple(
    f.name for f in fields(WatchOptions) if f.name not in ("loss_scale_key", "check_nonfinite", "ignore")
)
"""The options :meth:`StabilityWatch.params` records, in field order, as the watch derived them."""
WATCH_KEY = "stability-watch"
"""The key of a watch's :meth:`~ckptkit.Recorder.subscribe` subscription on its recorder."""


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
        options: all of the above but ``signals`` and ``extra`` in one
            :class:`~ckptkit.signals.watch_options.WatchOptions` (the keywords fill one
            when it is not given; passing both, with a keyword other than its default, is
            a TypeError).

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
        options: WatchOptions | None = None,
    ) -> None:
        given = {k: v for k, v in locals().items() if k in _OPTION_NAMES}
        if options is None:
            options = WatchOptions(**given)
        else:
            mixed = sorted(k for k, v in given.items() if v != getattr(DEFAULT_OPTIONS, k))
            if mixed:
                raise TypeError(
                    "StabilityWatch: pass the thresholds either as options= or as keywords, "
                    f"not both (got options= and {', '.join(mixed)})"
                )
        o = self.options = options
        """The windows and thresholds this watch was built with (as given: None where derived)."""
        self.specs: dict[str, SignalSpec] = dict(DEFAULT_SIGNALS if signals is None else signals)
        for name in extra:
            self.specs.setdefault(name, SignalSpec("both", log=False))
        window = o.window
        self.window = window
        self.recent = o.recent
        self.recompute_every = o.recompute_every or max(1, window // 16)
        self.min_history = window // 2 if o.min_history is None else max(8, o.min_history)
        self.warmup = o.warmup
        self.z_warn = o.z_warn
        self.z_critical = o.z_critical
        self.trigger_count = o.trigger_count
        self.trigger_window = o.trigger_window
        self.std_ratio_warn = o.std_ratio_warn
        self.std_ratio_critical = o.std_ratio_critical
        self.regress_warn = o.regress_warn
        self.regress_critical = o.regress_critical
        self.drift_warn = o.drift_warn
        self.drift_critical = o.drift_critical
        self.spread_warn = o.spread_warn
        self.spread_critical = o.spread_critical
        self.ref_horizon = 4 * window if o.ref_horizon is None else o.ref_horizon
        self.loss_scale_key = o.loss_scale_key
        self.backoff_warn = o.backoff_warn
        self.backoff_critical = o.backoff_critical
        self.backoff_window = o.backoff_window
        self.min_loss_scale = o.min_loss_scale
        self.clear_after = o.clear_after
        self.check_nonfinite = o.check_nonfinite
        self.ignore = frozenset(o.ignore)
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
        self.tracks: dict[str, Track] = {}
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
            "version": STATE_VERSION,
            "params": self.params(),
            "updates": self.updates,
            "recomputes": self.recomputes,
            "level": self.level,
            "episode_level": self.episode_level,
            "episode_start": self.episode_start,
            "first_warn_step": self.first_warn_step,
            "episode_signals": [signal_row(s) for s in self.episode_signals.values()],
            "last": None if self.last is None else {
                "level": self.last.level,
                "step": self.last.step,
                "signals": [signal_row(s) for s in self.last.signals],
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
            if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
                raise ValueError(f"not a watch state of version {STATE_VERSION}")
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
        self.updates = typed(st, "updates", int)
        self.recomputes = typed(st, "recomputes", int)
        self.level = level_of(st, "level")
        self.episode_level = level_of(st, "episode_level")
        self.episode_start = typed(st, "episode_start", int, none=True)
        self.first_warn_step = typed(st, "first_warn_step", int, none=True)
        self.episode_signals = {
            sig.name: sig for sig in map(signal_of, typed(st, "episode_signals", list))
        }
        last = typed(st, "last", Mapping, none=True)
        if last is not None:
            self.last = Verdict(level_of(last, "level"),
                                [signal_of(r) for r in typed(last, "signals", list)],
                                typed(last, "step", int))
        self.quiet = typed(st, "quiet", int)
        self._scale_last = typed(st, "scale_last", float, none=True)
        if self._scale_last is not None and not math.isfinite(self._scale_last):
            raise ValueError(f"'scale_last' is {self._scale_last!r}, not a finite loss scale")
        for k in ("updates", "recomputes", "quiet"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k!r} is negative")
        self._backoffs = deque(ints(st, "backoffs", None))
        self._scale_grew_at = typed(st, "scale_grew_at", int, none=True)
        nonfinite = typed(st, "nonfinite", Mapping)
        if not all(isinstance(k, str) and type(v) is int for k, v in nonfinite.items()):
            raise ValueError("'nonfinite' is not a map of names to counts")
        self._nonfinite = dict(nonfinite)
        tracks = typed(st, "tracks", Mapping)
        for name in tracks:
            spec = self.specs.get(name)
            if spec is None:
                raise ValueError(f"a window of {name!r}, a metric this watch does not track")
            tr = self.tracks[name] = Track(name, spec, self)
            try:
                tr.load(typed(tracks, name, Mapping), self)
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
                tr = self.tracks[name] = Track(name, spec, self)
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
                if old is None or RANK[s.level] >= RANK[old.level]:
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
        out = {name: getattr(self, name) for name in _PARAMS}
        out["signals"] = {k: asdict(v) for k, v in sorted(self.specs.items())}
        return out


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
    "WatchOptions",
    "not_judging",
    "worse",
]
