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

from ckptkit.capture import check_tree
from ckptkit.errors import StateError

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
        StateError: the saved scaler was enabled and this one is not, or the reverse (the
            run would silently switch between fp16 AMP and full precision loss scaling).

    Example:
        >>> scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
        >>> restore(scaler, capture(torch.amp.GradScaler("cpu", init_scale=1024.0)))
        >>> scaler.get_scale()
        1024.0
    """
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


__all__ = ["capture", "restore", "summary"]
