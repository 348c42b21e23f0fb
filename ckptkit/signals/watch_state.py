"""Checked reading of a stability watch's saved state: every value typed and bounded.

A watch's :meth:`~ckptkit.signals.stability.StabilityWatch.state_dict` comes back from a
checkpoint file; these helpers refuse (ValueError) what no watch writes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ckptkit.signals.verdicts import LEVELS, RANK, Level, Signal

STATE_VERSION = 1
"""The layout of :meth:`StabilityWatch.state_dict`."""


def typed(st: Mapping[str, Any], key: str, kind: Any, *, none: bool = False) -> Any:
    """``st[key]``, checked by :func:`as_checked`."""
    return as_checked(st[key], kind, repr(key), none=none)


def as_checked(v: Any, kind: Any, what: str, *, none: bool = False) -> Any:
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


def floats(st: Mapping[str, Any], key: str, most: int | None) -> list[float]:
    return [as_checked(v, float, f"a value of {key!r}") for v in bounded(st, key, most)]


def ints(st: Mapping[str, Any], key: str, most: int | None) -> list[int]:
    return [as_checked(v, int, f"a value of {key!r}") for v in bounded(st, key, most)]


def bounded(st: Mapping[str, Any], key: str, most: int | None) -> list[Any]:
    vals: list[Any] = typed(st, key, list)
    if most is not None and len(vals) > most:
        raise ValueError(f"{key!r} holds {len(vals)} values, more than its window's {most}")
    return vals


def level_of(st: Mapping[str, Any], key: str) -> Level:
    v = st[key]
    if v not in RANK:
        raise ValueError(f"{key!r} is {v!r}, not one of {', '.join(LEVELS)}")
    return v  # type: ignore[no-any-return]


def signal_row(s: Signal) -> list[Any]:
    return [s.name, s.level, s.statistic, s.threshold, s.detail]


def signal_of(row: Any) -> Signal:
    if not (isinstance(row, list | tuple) and len(row) == 5):
        raise ValueError("a signal is not [name, level, statistic, threshold, detail]")
    name, level, stat, threshold, detail = row
    if not (isinstance(name, str) and isinstance(detail, str)):
        raise ValueError("a signal's name or detail is not a string")
    for x in (stat, threshold):
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise ValueError(f"signal {name!r} has a statistic or threshold that is not a number")
    return Signal(name, level_of({"level": level}, "level"), stat, threshold, detail)


__all__ = [
    "STATE_VERSION",
    "as_checked",
    "bounded",
    "floats",
    "ints",
    "level_of",
    "signal_of",
    "signal_row",
    "typed",
]
