"""Capture and restore any ``torch.optim.Optimizer``: per-parameter state and param groups.

The snapshot holds ``optimizer.state_dict()`` as is: its tensors (Adam ``exp_avg``...) are the
live optimizer tensors, not copies, so the caller decides when to copy them (the storage engine
copies while writing). Parameter names and shapes are recorded alongside so a restore can name
the parameter that no longer matches instead of failing deep inside ``load_state_dict`` or,
worse, silently loading moments of the wrong shape.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import torch

from ckptkit.capture import check_tree
from ckptkit.errors import StateError


def capture(
    optimizer: torch.optim.Optimizer, *, model: torch.nn.Module | None = None
) -> dict[str, Any]:
    """Snapshot an optimizer.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        model: the module owning the optimized parameters; when given, parameter names are
            recorded (matched by identity through ``model.named_parameters()``).

    Returns:
        ``{"type", "state_dict", "param_names", "param_shapes"}``; ``param_names`` is None
        without a model, else one list of names per param group.

    Raises:
        StateError: the state holds an unsupported value, or a parameter is not in ``model``.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.Adam(model.parameters())
        >>> capture(opt, model=model)["param_names"]
        [['weight', 'bias']]
    """
    state_dict = optimizer.state_dict()
    check_tree(
        state_dict,
        what=f"optimizer ({type(optimizer).__name__})",
        hint="optimizer state must be tensors and plain values; keep objects out of param groups",
    )
    names: list[list[str]] | None = None
    if model is not None:
        by_id = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
        names = []
        for gi, group in enumerate(optimizer.param_groups):
            group_names = []
            for pi, p in enumerate(group["params"]):
                if id(p) not in by_id:
                    raise StateError(
                        f"optimizer param group {gi} parameter {pi} (shape {list(p.shape)}) "
                        f"is not a parameter of the given {type(model).__name__}",
                        hint="pass the module that owns every optimized parameter, or model=None",
                    )
                group_names.append(by_id[id(p)])
            names.append(group_names)
    shapes = [[list(p.shape) for p in group["params"]] for group in optimizer.param_groups]
    return {
        "type": type(optimizer).__name__,
        "state_dict": state_dict,
        "param_names": names,
        "param_shapes": shapes,
    }


def restore(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load a snapshot into an optimizer after checking it fits.

    The optimizer type, group count, parameter counts and shapes, and the shape of every
    per-parameter state tensor are checked first. After loading, the optimizer holds the
    snapshot's tensors (as ``load_state_dict`` does when device and dtype already match), so
    do not reuse the same snapshot for a second optimizer without copying it.

    Args:
        optimizer: an optimizer built over the same parameters, in the same order.
        state: a tree from :func:`capture`.

    Raises:
        StateError: naming the first mismatching group or parameter.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> snap = capture(opt)
        >>> restore(torch.optim.SGD(model.parameters(), lr=0.5), snap)
    """
    kind = type(optimizer).__name__
    if state["type"] != kind:
        raise StateError(
            f"optimizer state is from a {state['type']}, the optimizer is a {kind}",
            hint=f"build a {state['type']} as in the saved run, or start the optimizer fresh",
        )
    saved_shapes = state["param_shapes"]
    saved_names = state.get("param_names")
    groups = optimizer.param_groups
    if len(saved_shapes) != len(groups):
        raise StateError(
            f"optimizer state has {len(saved_shapes)} param group(s), the optimizer has {len(groups)}",
            hint="build the param groups the same way as in the saved run",
        )
    for gi, (group, shapes) in enumerate(zip(groups, saved_shapes, strict=True)):
        if len(group["params"]) != len(shapes):
            raise StateError(
                f"optimizer param group {gi} had {len(shapes)} parameter(s), now {len(group['params'])}",
                hint="the model's trainable parameters changed; freeze/unfreeze as in the saved run",
            )
        for pi, (p, shape) in enumerate(zip(group["params"], shapes, strict=True)):
            if list(p.shape) != list(shape):
                raise StateError(
                    f"optimizer parameter {_name(saved_names, gi, pi)} had shape {list(shape)}, "
                    f"now {list(p.shape)}",
                    hint="build the model with the same config as the saved run",
                )
    state_dict = _int_keys(state["state_dict"])
    flat_shapes = [list(s) for shapes in saved_shapes for s in shapes]
    flat_params = [p for group in groups for p in group["params"]]
    for index, per_param in state_dict["state"].items():
        if not 0 <= index < len(flat_params):
            raise StateError(
                f"optimizer state has an entry for parameter index {index} but only "
                f"{len(flat_params)} parameters are optimized",
                hint="the snapshot does not belong to this optimizer",
            )
        for key, value in per_param.items():
            # Moments must match their parameter; 0-d tensors (Adam "step") are exempt.
            if (
                isinstance(value, torch.Tensor)
                and value.dim() > 0
                and list(value.shape) != list(flat_params[index].shape)
            ):
                raise StateError(
                    f"optimizer state {key!r} of parameter "
                    f"{_name(saved_names, *_locate(saved_shapes, index))} has shape "
                    f"{list(value.shape)}, the parameter has {flat_shapes[index]}",
                    hint="the snapshot is corrupt or from another model",
                )
    optimizer.load_state_dict(state_dict)


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return small facts about an optimizer snapshot for the manifest.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``type``, ``num_param_groups``, ``lrs``, ``betas``, ``weight_decays`` (one per group,
        None where the group has no such field), ``num_params``, ``num_params_with_state``,
        ``num_params_without_state``, ``step_min`` and ``step_max`` (None without steps).

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> summary(capture(torch.optim.Adam(model.parameters())))["num_params_with_state"]
        0
    """
    sd = state["state_dict"]
    groups = sd["param_groups"]
    per_param = sd["state"]
    steps = [
        step
        for entry in per_param.values()
        if isinstance(entry, Mapping) and (step := _step(entry.get("step"))) is not None
    ]
    num_params = sum(len(g["params"]) for g in groups)
    with_state = sum(1 for entry in per_param.values() if entry)
    return {
        "type": state["type"],
        "num_param_groups": len(groups),
        "lrs": [_number(g.get("lr")) for g in groups],
        "betas": [_number_list(g.get("betas")) for g in groups],
        "weight_decays": [_number(g.get("weight_decay")) for g in groups],
        "num_params": num_params,
        "num_params_with_state": with_state,
        "num_params_without_state": num_params - with_state,
        "step_min": min(steps) if steps else None,
        "step_max": max(steps) if steps else None,
    }


def _int_keys(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    # Copy the two top-level containers so load_state_dict never mutates the snapshot's own
    # dicts, and accept "0"-style keys in case a storage layer stringified them.
    out = dict(state_dict)
    out["state"] = {int(k): v for k, v in state_dict["state"].items()}
    out["param_groups"] = copy.deepcopy(
        [{k: v for k, v in g.items()} for g in state_dict["param_groups"]]
    )
    return out


def _locate(shapes: list[list[Any]], index: int) -> tuple[int, int]:
    for gi, group in enumerate(shapes):
        if index < len(group):
            return gi, index
        index -= len(group)
    return len(shapes) - 1, index


def _name(names: list[list[str]] | None, gi: int, pi: int) -> str:
    if names is not None and gi < len(names) and pi < len(names[gi]):
        return repr(names[gi][pi])
    return f"#{pi} of group {gi}"


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _step(value: Any) -> float | int | None:
    number = _number(value)
    # Adam keeps step as a float tensor; integral steps read better (and compare) as ints.
    if number is not None and math.isfinite(number) and number.is_integer():
        return int(number)
    return number


def _number_list(value: Any) -> list[float | None] | None:
    if isinstance(value, list | tuple):
        return [_number(v) for v in value]
    return None


__all__ = ["capture", "restore", "summary"]
