"""Non-finite floats in JSON records: strict JSON has no NaN/Infinity, so they travel as
the strings ``"nan"``, ``"inf"`` and ``"-inf"`` (metrics JSONL, drill and watch reports).

The manifest uses tagged values instead (``{"$t": "float", "v": "nan"}``, see
:mod:`ckptkit.format.tree`), because there a string must stay a string.
"""

from __future__ import annotations

import math
from typing import Any

NONFINITE: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
"""The string forms and the floats they stand for."""


def encode_float(x: Any) -> Any:
    """Return ``x`` with a non-finite float replaced by its string form; others unchanged.

    Example:
        >>> encode_float(float("-inf")), encode_float(1.5), encode_float("a")
        ('-inf', 1.5, 'a')
    """
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def decode_float(v: Any) -> float | None:
    """Read a number written by :func:`encode_float`; None for anything that is not one.

    Example:
        >>> decode_float("inf"), decode_float(3), decode_float(True), decode_float("x")
        (inf, 3.0, None, None)
    """
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        return NONFINITE.get(v)
    return None


def decode(obj: Any) -> Any:
    """Turn every string form in a JSON value back into its float (recursively).

    Example:
        >>> decode({"loss": "nan", "ids": [1, "inf"], "name": "run"})
        {'loss': nan, 'ids': [1, inf], 'name': 'run'}
    """
    if isinstance(obj, str):
        return NONFINITE.get(obj, obj)
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    return obj
