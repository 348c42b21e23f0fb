"""The tuning of a stability watch in one frozen object: its windows, thresholds and limits.

``StabilityWatch(options=WatchOptions(...))`` takes one; each of the watch's keyword
arguments (``window=``, ``z_warn=``, ...) fills the field of the same name, with the same
default and meaning (:class:`~ckptkit.signals.stability.StabilityWatch` documents them).
A field left None where the watch derives it (``recompute_every``, ``min_history``,
``ref_horizon``) is derived from ``window`` when the watch is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class WatchOptions:
    """The windows and thresholds of a :class:`~ckptkit.signals.stability.StabilityWatch`.

    Checked when built (ValueError, with the watch's messages).

    Example:
        >>> o = WatchOptions(window=64, recent=16)
        >>> o.z_warn, o.changed()
        (6.0, {'window': 64, 'recent': 16})
        >>> WatchOptions(window=4)
        Traceback (most recent call last):
        ...
        ValueError: StabilityWatch: window and recent must be >= 8, got 4, 64
    """

    window: int = 256
    recent: int = 64
    recompute_every: int | None = None
    min_history: int | None = None
    warmup: int = 500
    z_warn: float = 6.0
    z_critical: float = 12.0
    trigger_count: int = 3
    trigger_window: int = 16
    std_ratio_warn: float = 2.5
    std_ratio_critical: float = 6.0
    regress_warn: float | None = 1.5
    regress_critical: float | None = 2.0
    drift_warn: float | None = 2.0
    drift_critical: float | None = 4.0
    spread_warn: float | None = 2.2
    spread_critical: float | None = 6.0
    ref_horizon: int | None = None
    loss_scale_key: str = "loss_scale"
    backoff_warn: int = 3
    backoff_critical: int = 6
    backoff_window: int = 1000
    min_loss_scale: float = 1.0
    clear_after: int = 200
    check_nonfinite: bool = True
    ignore: tuple[str, ...] = ("lr", "tokens", "epoch", "opt_step", "time")

    def __post_init__(self) -> None:
        object.__setattr__(self, "ignore", tuple(self.ignore))
        window, recent = self.window, self.recent
        if window < 8 or recent < 8:
            raise ValueError(
                f"StabilityWatch: window and recent must be >= 8, got {window}, {recent}"
            )
        if not 1 <= self.trigger_count <= self.trigger_window:
            raise ValueError("StabilityWatch: need 1 <= trigger_count <= trigger_window")
        if self.z_critical < self.z_warn or self.std_ratio_critical < self.std_ratio_warn:
            raise ValueError("StabilityWatch: critical thresholds must not be below warn ones")
        for lo, hi in ((self.drift_warn, self.drift_critical),
                       (self.spread_warn, self.spread_critical)):
            if lo is not None and (lo <= 1.0 or (hi is not None and hi < lo)):
                raise ValueError(
                    "StabilityWatch: drift/spread thresholds are ratios > 1, critical >= warn"
                )
        ref_horizon = 4 * window if self.ref_horizon is None else self.ref_horizon
        if ref_horizon < window:
            raise ValueError(
                f"StabilityWatch: ref_horizon ({ref_horizon}) must be >= window ({window})"
            )

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults, by name (in field order)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != f.default
        }


DEFAULT_OPTIONS = WatchOptions()
"""The options of ``StabilityWatch()``."""


__all__ = ["DEFAULT_OPTIONS", "WatchOptions"]
