"""The tiny LM's learning-rate schedule: linear warmup and cosine decay, and the ``lr-spike``
instability that lives in it.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_spike(
    start: int, ramp: int, peak: float, base: Callable[[int], float], *, hold: int | None = None
) -> Callable[[int], float]:
    """``base`` times a multiplier that climbs geometrically from 1 to ``peak`` over ``ramp``
    steps from ``start`` and stays there (for ``hold`` steps, then back to 1; None: to the
    end): a peak LR set past the stable edge.

    An instability that builds up (the gradient norm's level and spread climb, then the
    loss), then diverges. It lives in the schedule,
    as the real mistake does, so a recovery that scales the scheduler's base LRs
    (:func:`ckptkit.signals.recovery.scale_lr`) brings the LR back under the edge for good.

    Example:
        >>> f = lr_spike(100, 200, 16.0, lambda s: 1.0)
        >>> f(99), f(200), f(300), f(900)
        (1.0, 4.0, 16.0, 16.0)
    """

    def factor(step: int) -> float:
        if hold is not None and step >= start + ramp + hold:
            return base(step)
        x = min(max(step - start, 0) / max(ramp, 1), 1.0)
        return base(step) * peak**x

    return factor


def warmup_cosine(warmup: int, total: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine down to ``min_ratio``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
