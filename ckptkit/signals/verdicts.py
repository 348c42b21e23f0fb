"""The levels, signals and verdicts a stability watch classifies a training step with.

A :class:`Verdict` is one step's level (``ok`` / ``warn`` / ``critical``) with the
:class:`Signal` of every test that fired; :class:`SignalSpec` says how one named scalar is
watched, and :data:`DEFAULT_SIGNALS` which scalars are watched by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ckptkit._jsonval import encode_float

Level = Literal["ok", "warn", "critical"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "critical")
RANK: dict[str, int] = {lvl: i for i, lvl in enumerate(LEVELS)}
"""The severity of each level: ``ok`` 0, ``warn`` 1, ``critical`` 2."""
NOT_JUDGED = "not judged"
"""The health recorded for a checkpoint saved while the watch could not judge the run yet
(its warm-up, or no baseline window yet) and had seen nothing wrong: neither healthy nor
unhealthy. ``ckptkit rollback`` and ``restore(healthy=True)`` do not take it as healthy."""


def worse(a: Level, b: Level) -> Level:
    """Return the more severe of two levels.

    Example:
        >>> worse("ok", "warn")
        'warn'
    """
    return a if RANK[a] >= RANK[b] else b


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


__all__ = [
    "DEFAULT_SIGNALS",
    "LEVELS",
    "NOT_JUDGED",
    "RANK",
    "Level",
    "Signal",
    "SignalSpec",
    "Verdict",
    "worse",
]
