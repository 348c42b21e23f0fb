"""The one rule for a real number in saved state: what a float can hold and training code can use.

The component validators (:mod:`ckptkit.capture`) and the look-ahead's validator
(:mod:`ckptkit.format.records`) read a number by it, so a value one accepts the other does too.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def is_real(value: Any, *, finite: bool = True) -> bool:
    """Whether ``value`` is a number a float can hold (an int, a float or a 0-d tensor).

    A JSON int of any magnitude parses; one past a float's range is not a number any
    training code can use (``float(10**400)`` raises).

    Example:
        >>> is_real(0.1), is_real(10**400), is_real("1"), is_real(float("inf"), finite=False)
        (True, False, False, True)
    """
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_complex() and value.dtype != torch.bool
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) or not finite


__all__ = ["is_real"]
