"""Short reprs for the objects ckptkit returns: what ``print(result)`` should show.

A result object can hold a whole manifest (the Mersenne-Twister state of every rank),
thousands of tensor names or the loaded state itself; its repr names the few facts a
person looks for and counts the rest, so an interactive ``mgr.restore(ts)`` prints one
line, not 20 KB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from pathlib import PurePath
from typing import Any

MAX_ITEMS = 4
"""Items of a sequence spelled out before the rest is counted."""
MAX_TEXT = 80
"""Characters of a string shown before it is cut."""


def brief(name: str, /, **fields: Any) -> str:
    """``name(k=v, ...)`` with every value shortened by :func:`short`.

    Example:
        >>> brief("Result", step=3, notes=["a", "b", "c", "d", "e", "f"])
        "Result(step=3, notes=['a', 'b', 'c', 'd', … +2])"
    """
    return f"{name}(" + ", ".join(f"{k}={short(v)}" for k, v in fields.items()) + ")"


def short(v: Any) -> str:
    """A repr of ``v`` that stays short: long strings cut, long collections counted.

    Safe on hostile values (huge ints too): error messages quote what a manifest holds.

    Example:
        >>> short("x" * 100)[-10:], short(list(range(10))), short({"a": 1, "b": 2})
        ("xx…' (100)", '[0, 1, 2, 3, … +6]', '{a, b}')
        >>> short(-(10**400))
        '-<an int of 1329 bits>'
    """
    if isinstance(v, PurePath):
        return repr(str(v))
    if isinstance(v, str):
        if len(v) <= MAX_TEXT:
            return repr(v)
        return repr(v[:MAX_TEXT])[:-1] + f"…' ({len(v)})"
    if isinstance(v, Mapping):
        keys = [str(k) for k in list(v)[: MAX_ITEMS + 1]]
        more = f", … +{len(v) - MAX_ITEMS}" if len(v) > MAX_ITEMS else ""
        return "{" + ", ".join(keys[:MAX_ITEMS]) + more + "}"
    if isinstance(v, (Sequence, Set)) and not isinstance(v, (bytes, bytearray)):
        items = list(v)
        head = ", ".join(short(x) for x in items[:MAX_ITEMS])
        more = f", … +{len(items) - MAX_ITEMS}" if len(items) > MAX_ITEMS else ""
        return ("(" if isinstance(v, tuple) else "[") + head + more + (")" if isinstance(v, tuple) else "]")
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 256:
        # repr() of a huge int is long, and past 4300 digits it raises instead.
        return f"{'-' if v < 0 else ''}<an int of {v.bit_length()} bits>"
    text = repr(v)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


__all__ = ["brief", "short"]
