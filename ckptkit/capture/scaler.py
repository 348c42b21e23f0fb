"""Capture and restore an AMP ``GradScaler`` (``torch.amp.GradScaler`` or the CUDA one).

A resumed fp16 run that starts from the default scale instead of the saved one skips steps
or overflows until the scale settles again, so the scale and growth tracker are resume-critical.
A disabled scaler has an empty state dict; the snapshot still records ``enabled=False`` so
verify can tell "no AMP" from "scaler state missing".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ckptkit.capture import check_tree, is_int, refuse, show
from ckptkit.errors import StateError
from ckptkit.format.numbers import is_real

_CONFIG_KEYS = ("growth_factor", "backoff_factor", "growth_interval")


def capture(scaler: torch.amp.GradScaler) -> dict[str, Any]:
    """Snapshot a gradient scaler.

    Args:
        scaler: a ``torch.amp.GradScaler`` (any device) or ``torch.cuda.amp.GradScaler``.

    Returns:
        ``{"enabled": bool, "state_dict": scaler.state_dict()}`` (the state dict is empty
        when the scaler is disabled).

    Example:
        >>> capture(torch.amp.GradScaler("cpu", init_scale=1024.0))["state_dict"]["scale"]
        1024.0
    """
    state_dict = scaler.state_dict()
    check_tree(state_dict, what="scaler")
    return {"enabled": bool(scaler.is_enabled()), "state_dict": state_dict}


def restore(scaler: torch.amp.GradScaler, state: Mapping[str, Any]) -> None:
    """Load a snapshot into a scaler with the same enabled flag.

    Args:
        scaler: the scaler of the resumed run.
        state: a tree from :func:`capture`.

    Raises:
        StateError: ``CK-S013`` the snapshot is malformed (see :func:`problems`); the
            saved scaler was enabled and this one is not, or the reverse (the run would
            silently switch between fp16 AMP and full precision loss scaling).

    Example:
        >>> scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
        >>> restore(scaler, capture(torch.amp.GradScaler("cpu", init_scale=1024.0)))
        >>> scaler.get_scale()
        1024.0
    """
    refuse("scaler", problems(state))
    saved_enabled = bool(state["enabled"])
    if saved_enabled != scaler.is_enabled():
        raise StateError(
            f"scaler was {'enabled' if saved_enabled else 'disabled'} in the saved run, "
            f"it is {'enabled' if scaler.is_enabled() else 'disabled'} now",
            hint="construct the GradScaler with the same enabled= setting (and device) as the "
            "saved run",
        )
    if saved_enabled:
        scaler.load_state_dict(dict(state["state_dict"]))


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not load as saved (empty: nothing).

    ``GradScaler.load_state_dict`` of an enabled scaler reads five keys and fills its scale
    and growth tracker tensors with them: the scale and factors must be numbers a float
    holds, the interval and tracker integers. A non-finite or zero scale is a training
    problem verify reports as CK-S008, not a malformed snapshot. Only the snapshot is read:
    this is the rule verify (CK-S013) and restore share.

    Example:
        >>> problems(capture(torch.amp.GradScaler("cpu", init_scale=8.0)))
        []
        >>> problems({"enabled": True, "state_dict": {}})
        ["state_dict misses ['_growth_tracker', 'backoff_factor', 'growth_factor', 'growth_interval', 'scale']"]
    """
    if not isinstance(state, Mapping):
        return [f"the snapshot is {show(state)}, not an object"]
    enabled = state.get("enabled")
    if not isinstance(enabled, bool):
        return [f"enabled is {show(enabled)}, not true or false"]
    sd = state.get("state_dict")
    if not isinstance(sd, Mapping):
        return [f"state_dict is {show(sd)}, not an object"]
    if not enabled:
        return []
    need = {"scale", "_growth_tracker", *_CONFIG_KEYS}
    missing = sorted(need - set(sd))
    if missing:
        return [f"state_dict misses {missing}"]
    out = [
        f"{key} is {show(sd[key])}, not a number"
        for key in ("scale", "growth_factor", "backoff_factor")
        if not is_real(sd[key], finite=False)
    ]
    out += [
        f"{key} is {show(sd[key])}, not a non-negative int"
        for key in ("growth_interval", "_growth_tracker")
        if not is_int(sd[key])
    ]
    return out


def scaler_state(scaler: Any) -> tuple[float, int] | None:
    """``(scale, growth tracker)`` of an enabled GradScaler, else None.

    Example:
        >>> scaler_state(torch.amp.GradScaler("cpu", init_scale=8.0))
        (8.0, 0)
    """
    if scaler is None or not callable(getattr(scaler, "is_enabled", None)):
        return None
    if not scaler.is_enabled():
        return None
    sd = scaler.state_dict()
    return float(sd["scale"]), int(sd["_growth_tracker"])


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the scale and the scaler's settings.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``{"enabled", "scale", "growth_tracker", "growth_factor", "backoff_factor",
        "growth_interval"}``, with None values for a disabled scaler.

    Example:
        >>> summary(capture(torch.amp.GradScaler("cpu", enabled=False)))["scale"] is None
        True
    """
    sd = state["state_dict"]
    out: dict[str, Any] = {
        "enabled": bool(state["enabled"]),
        "scale": _num(sd.get("scale")),
        "growth_tracker": _num(sd.get("_growth_tracker")),
    }
    for key in _CONFIG_KEYS:
        out[key] = _num(sd.get(key))
    return out


def _num(value: Any) -> float | int | None:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


__all__ = ["capture", "problems", "restore", "scaler_state", "summary"]
