"""Capture and restore any LR scheduler (``LRScheduler`` subclasses and ``ReduceLROnPlateau``).

The snapshot is the scheduler's ``state_dict()``, checked to hold only plain values. PyTorch
leaves plain functions and lambdas of ``LambdaLR``/``MultiplicativeLR`` out of the state dict
(it stores None for them), which is fine: the training script recreates them. A callable
*object* is stored through its ``__dict__``; if that holds anything but plain values, capture
raises instead of writing a checkpoint that cannot be restored.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from ckptkit.capture import check_tree
from ckptkit.errors import StateError

Scheduler = torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau


def capture(scheduler: Scheduler) -> dict[str, Any]:
    """Snapshot an LR scheduler.

    Args:
        scheduler: any scheduler with ``state_dict``/``load_state_dict`` (``LambdaLR``,
            ``SequentialLR``, ``OneCycleLR``, ``CosineAnnealingLR``, ``ReduceLROnPlateau``...).

    Returns:
        ``{"type": class name, "state_dict": the scheduler's state dict}``.

    Raises:
        StateError: a value in the state dict is not a plain value, naming its key path.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> capture(torch.optim.lr_scheduler.StepLR(opt, step_size=2))["type"]
        'StepLR'
    """
    state_dict = scheduler.state_dict()
    check_tree(
        state_dict,
        what=f"scheduler ({type(scheduler).__name__})",
        hint="make it a plain value or recreate it in code (e.g. a plain function instead of "
        "a callable object holding state)",
    )
    return {"type": type(scheduler).__name__, "state_dict": state_dict}


def restore(scheduler: Scheduler, state: Mapping[str, Any]) -> None:
    """Load a snapshot into a scheduler of the same type.

    The state dict is deep-copied first: several schedulers ``pop`` keys from it or keep its
    lists, which would otherwise tie the live scheduler to the snapshot.

    Args:
        scheduler: a scheduler built as in the saved run (same type, same optimizer groups).
        state: a tree from :func:`capture`.

    Raises:
        StateError: the scheduler type differs.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
        >>> restore(sched, capture(sched))
    """
    kind = type(scheduler).__name__
    if state["type"] != kind:
        raise StateError(
            f"scheduler state is from a {state['type']}, the scheduler is a {kind}",
            hint=f"build a {state['type']} as in the saved run",
        )
    scheduler.load_state_dict(copy.deepcopy(dict(state["state_dict"])))


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the scheduler's type, position and last learning rates.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``{"type", "last_epoch", "last_lr", "base_lrs"}`` (None where the scheduler has no
        such field); ``ReduceLROnPlateau`` adds ``best`` and ``num_bad_epochs``.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> summary(capture(torch.optim.lr_scheduler.StepLR(opt, step_size=2)))["last_lr"]
        [0.1]
    """
    sd = state["state_dict"]
    out: dict[str, Any] = {
        "type": state["type"],
        "last_epoch": sd.get("last_epoch"),
        "last_lr": _floats(sd.get("_last_lr")),
        "base_lrs": _floats(sd.get("base_lrs")),
    }
    for key in ("best", "num_bad_epochs"):
        if key in sd:
            out[key] = _float(sd[key])
    return out


def _float(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _floats(values: Any) -> list[float | None] | None:
    if not isinstance(values, list | tuple):
        return None
    return [_float(v) for v in values]


__all__ = ["Scheduler", "capture", "restore", "summary"]
