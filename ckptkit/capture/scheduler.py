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

from ckptkit.capture import (
    as_float,
    as_floats,
    check_tree,
    is_int,
    refuse,
    refuse_type,
    show,
    typed_snapshot,
)
from ckptkit.format.numbers import is_real

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
        StateError: ``CK-S013`` the snapshot is malformed (see :func:`problems`), or the
            scheduler type differs.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
        >>> restore(sched, capture(sched))
    """
    refuse("scheduler", problems(state))
    refuse_type("scheduler", scheduler, state)
    scheduler.load_state_dict(copy.deepcopy(dict(state["state_dict"])))


# ReduceLROnPlateau's load_state_dict re-derives its comparison from these two (and raises
# on another value).
_PLATEAU_MODES = {"mode": ("min", "max"), "threshold_mode": ("rel", "abs")}


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not load as saved (empty: nothing).

    ``load_state_dict`` of torch's schedulers copies the state into the scheduler's
    ``__dict__`` and checks nothing, so a wrong value surfaces at the next ``step()`` or in
    the resume guard. The fields every ``LRScheduler`` keeps are checked here as the
    scheduler reads them: ``last_epoch`` and ``_step_count`` integers, ``base_lrs`` and
    ``_last_lr`` lists of finite numbers; ``LambdaLR``'s ``lr_lambdas`` (None or the state
    of a callable object), the nested states of ``SequentialLR``/``ChainedScheduler`` (each
    checked the same way), and ``ReduceLROnPlateau``'s modes (its ``load_state_dict``
    raises on an unknown one). Only the snapshot is read: this is the rule verify
    (CK-S013) and restore share.

    Args:
        state: a snapshot as :func:`capture` returns it, or as a manifest decodes it.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> snap = capture(torch.optim.lr_scheduler.StepLR(opt, step_size=2))
        >>> problems(snap)
        []
        >>> snap["state_dict"]["base_lrs"] = "x"
        >>> problems(snap)
        ["base_lrs is 'x', not a list of finite numbers"]
    """
    snap, out = typed_snapshot(state)
    if snap is None:
        return out
    return out + _state_dict_problems(snap.get("state_dict"), "")


def _state_dict_problems(sd: Any, where: str) -> list[str]:
    if not isinstance(sd, Mapping):
        return [f"{where}state_dict is {show(sd)}, not an object"]
    out: list[str] = []
    # Only ReduceLROnPlateau keeps a threshold_mode; CyclicLR's "mode" means something else.
    plateau = "threshold_mode" in sd
    for key, value in sd.items():
        at = f"{where}{key}" if isinstance(key, str) else where + show(key)
        if not isinstance(key, str) or key == "optimizer":
            # load_state_dict copies every key into the scheduler's __dict__; state_dict()
            # never writes "optimizer" (it would replace the scheduler's optimizer).
            out.append(f"{where}state_dict has a key {show(key)} no scheduler writes")
        elif key in ("last_epoch", "_step_count") and not is_int(value, lo=-1):
            out.append(f"{at} is {show(value)}, not an integer")
        elif key in ("base_lrs", "_last_lr", "min_lrs") and not (
            isinstance(value, list) and all(map(is_real, value))
        ):
            out.append(f"{at} is {show(value)}, not a list of finite numbers")
        elif key in _PLATEAU_MODES and plateau and value not in _PLATEAU_MODES[key]:
            out.append(f"{at} is {show(value)}, not one of {', '.join(_PLATEAU_MODES[key])}")
        elif key == "lr_lambdas" and not (
            isinstance(value, list)
            and all(v is None or (isinstance(v, Mapping) and all(isinstance(k, str) for k in v))
                    for v in value)
        ):
            out.append(f"{at} is {show(value)}, not a list of null or callable-object states")
        elif key == "_schedulers":
            if not isinstance(value, list):
                out.append(f"{at} is {show(value)}, not a list of scheduler states")
            else:
                for i, nested in enumerate(value):
                    out += _state_dict_problems(nested, f"{at}[{i}].")
        elif key == "_milestones" and not (
            isinstance(value, list) and all(is_int(v) for v in value)
        ):
            out.append(f"{at} is {show(value)}, not a list of steps")
    lens = {k: len(sd[k]) for k in ("base_lrs", "_last_lr") if isinstance(sd.get(k), list)}
    if len(set(lens.values())) > 1:
        out.append(f"{where}base_lrs and _last_lr differ in length ({lens})")
    return out


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
        "last_lr": as_floats(sd.get("_last_lr")),
        "base_lrs": as_floats(sd.get("base_lrs")),
    }
    for key in ("best", "num_bad_epochs"):
        if key in sd:
            out[key] = as_float(sd[key])
    return out


__all__ = ["Scheduler", "capture", "problems", "restore", "summary"]
