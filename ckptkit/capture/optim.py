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

from ckptkit.capture import (
    INT64_MAX,
    as_float,
    as_floats,
    check_tree,
    is_int,
    refuse,
    refuse_type,
    show,
    typed_snapshot,
)
from ckptkit.errors import StateError
from ckptkit.format.numbers import is_real

# Hyper-parameters of torch's optimizers and what their step functions need them to be.
# Others (a custom optimizer's) are left alone: only their container is checked.
_GROUP_NUMBERS = (
    "lr",
    "initial_lr",
    "eps",
    "weight_decay",
    "momentum",
    "dampening",
    "alpha",
    "lr_decay",
    "initial_accumulator_value",
    "rho",
    "lambd",
    "t0",
    "momentum_decay",
)
_GROUP_LR = ("lr", "initial_lr")
"""Always one number: the scheduler and the resume guard compute with them."""
_GROUP_FLAGS = (
    "amsgrad",
    "maximize",
    "nesterov",
    "capturable",
    "differentiable",
    "centered",
    "decoupled_weight_decay",
)
_GROUP_OPTIONAL_FLAGS = ("foreach", "fused")

# Per-parameter state legitimately not shaped like its parameter: the factored second
# moments of Adafactor and friends (``row_var`` ...), as verify's CK-S002 exempts them.
_FACTORED = ("row", "col", "factored")


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

    The snapshot is checked first (:func:`problems`: its structure and the shape of every
    per-parameter state tensor against the saved parameter shapes), then its type, group
    count, parameter counts and shapes against the optimizer. After loading, the optimizer holds the
    snapshot's tensors (as ``load_state_dict`` does when device and dtype already match), so
    do not reuse the same snapshot for a second optimizer without copying it.

    Args:
        optimizer: an optimizer built over the same parameters, in the same order.
        state: a tree from :func:`capture`.

    Raises:
        StateError: ``CK-S013`` the snapshot is malformed (see :func:`problems`); else
            naming the first mismatching group or parameter.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> snap = capture(opt)
        >>> restore(torch.optim.SGD(model.parameters(), lr=0.5), snap)
    """
    refuse("optimizer", problems(state))
    refuse_type("optimizer", optimizer, state, or_else="start the optimizer fresh")
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
    # problems() checked every entry against the saved shapes, which equal the live ones.
    optimizer.load_state_dict(state_dict)


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not load as saved (empty: nothing).

    The structure is held to what :func:`capture` writes from ``optimizer.state_dict()``:
    param groups whose ``params`` number the parameters 0, 1, 2... in group order (as torch
    does), a saved shape per parameter, per-parameter state keyed by those numbers whose
    tensors have their parameter's shape (0-d ones such as Adam's ``step`` and factored
    moments excepted), and the hyper-parameters torch's optimizers read typed as they need
    them. Only the snapshot is read: this is the rule verify (CK-S013) and restore share.

    Args:
        state: a snapshot as :func:`capture` returns it, or as a manifest decodes it
            (tensors may be stand-ins on the ``meta`` device: only their shapes are read).

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> snap = capture(torch.optim.SGD(model.parameters(), lr=0.1))
        >>> problems(snap)
        []
        >>> snap["param_shapes"] = [[[1, 2], "x"]]
        >>> problems(snap)
        ["param_shapes[0][1] is 'x', not a list of sizes"]
    """
    snap, out = typed_snapshot(state)
    if snap is None:
        return out
    sd = snap.get("state_dict")
    if not isinstance(sd, Mapping):
        return [*out, f"state_dict is {show(sd)}, not an object"]
    groups = sd.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        return [*out, f"param_groups is {show(groups)}, not a list of objects"]
    counts: list[int] = []
    for gi, group in enumerate(groups):
        out += _group_problems(gi, group, first=sum(counts))
        params = group.get("params")
        counts.append(len(params) if isinstance(params, list) else 0)
    shapes = _shapes(state.get("param_shapes"), counts, out)
    names = state.get("param_names")
    flat_names: list[str] | None = None
    if names is not None:
        if (
            isinstance(names, list)
            and [len(n) if isinstance(n, list) else -1 for n in names] == counts
            and all(isinstance(x, str) for n in names for x in n)
        ):
            flat_names = [x for n in names for x in n]
        else:
            out.append(f"param_names is {show(names)}, not one list of names per param group")
    per_param = sd.get("state")
    if not isinstance(per_param, Mapping):
        return [*out, f"state is {show(per_param)}, not an object"]
    for key, entry in per_param.items():
        index = _index(key)
        if index is None or index >= sum(counts):
            out.append(
                f"state has an entry for parameter {show(key)}, but the param groups number "
                f"{sum(counts)} parameter(s)"
            )
            continue
        name = repr(flat_names[index]) if flat_names else f"#{index}"
        out += _entry_problems(name, entry, shapes[index] if shapes else None)
    return out


def _group_problems(gi: int, group: Mapping[str, Any], *, first: int) -> list[str]:
    out: list[str] = []
    params = group.get("params")
    if not isinstance(params, list) or params != list(range(first, first + len(params))):
        # torch numbers parameters 0, 1, 2... across the groups in order; other numbers
        # would silently attach the saved state to no parameter, or to the wrong one.
        out.append(
            f"param group {gi} params is {show(params)}, not the parameter numbers "
            f"{first}, {first + 1}... in order"
        )
    for key, value in group.items():
        if not isinstance(key, str):
            out.append(f"param group {gi} has a key {show(key)}, not a string")
        elif key in _GROUP_NUMBERS and not _number_like(value, strict=key in _GROUP_LR):
            out.append(f"param group {gi} {key} is {show(value)}, not a finite number")
        elif key == "betas" and not (
            isinstance(value, list | tuple) and len(value) == 2 and all(map(is_real, value))
        ):
            out.append(f"param group {gi} betas is {show(value)}, not two finite numbers")
        elif key in _GROUP_FLAGS and not isinstance(value, bool):
            out.append(f"param group {gi} {key} is {show(value)}, not true or false")
        elif key in _GROUP_OPTIONAL_FLAGS and not (value is None or isinstance(value, bool)):
            out.append(f"param group {gi} {key} is {show(value)}, not true, false or null")
    return out


def _number_like(value: Any, *, strict: bool) -> bool:
    """A finite number; unless ``strict``, also a tuple of numbers or nulls (Adafactor's
    ``eps`` is ``(None, 1e-3)``: one name, another type, in another optimizer)."""
    if is_real(value):
        return True
    return not strict and isinstance(value, list | tuple) and all(
        v is None or is_real(v) for v in value
    )


def _shapes(saved: Any, counts: list[int], out: list[str]) -> list[list[int]] | None:
    """The saved parameter shapes, flat, when they are well formed (else None, noted)."""
    if not isinstance(saved, list) or [
        len(g) if isinstance(g, list) else -1 for g in saved
    ] != counts:
        out.append(f"param_shapes is {show(saved)}, not one list of shapes per param group")
        return None
    flat: list[list[int]] = []
    for gi, group in enumerate(saved):
        for pi, shape in enumerate(group):
            if not isinstance(shape, list) or not all(is_int(d, hi=INT64_MAX) for d in shape):
                out.append(f"param_shapes[{gi}][{pi}] is {show(shape)}, not a list of sizes")
                return None
            flat.append(shape)
    return flat


def _index(key: Any) -> int | None:
    # restore accepts "0"-style keys in case a storage layer stringified them.
    if is_int(key):
        return int(key)
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18:
        return int(key)
    return None


def _entry_problems(name: str, entry: Any, shape: list[int] | None) -> list[str]:
    if not isinstance(entry, Mapping):
        return [f"state of parameter {name} is {show(entry)}, not an object"]
    out: list[str] = []
    for key, value in entry.items():
        where = f"state {show(key)} of parameter {name}"
        if not isinstance(key, str):
            out.append(f"{where} has a key that is not a string")
        elif key == "step" and not is_real(value):
            # Adam-family __setstate__ turns a plain step into a tensor with float().
            out.append(f"{where} is {show(value)}, not a step count")
        elif not _plain_state(value):
            out.append(f"{where} is {show(value)}, not a tensor, number or list of them")
        elif (
            isinstance(value, torch.Tensor)
            and value.dim() > 0
            and shape is not None
            and list(value.shape) != shape
            and not any(f in key.lower() for f in _FACTORED)
        ):
            out.append(f"{where} has shape {list(value.shape)}, the parameter {shape}")
    return out


def _plain_state(value: Any) -> bool:
    """A per-parameter state value torch's optimizers keep: a tensor, None, a number, or
    a list of them (LBFGS keeps histories as lists of tensors)."""
    if value is None or isinstance(value, torch.Tensor | bool) or is_real(value):
        return True
    if isinstance(value, list | tuple):
        return all(v is None or isinstance(v, torch.Tensor) or is_real(v) for v in value)
    return False


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
        "lrs": [as_float(g.get("lr")) for g in groups],
        "betas": [as_floats(g.get("betas")) for g in groups],
        "weight_decays": [as_float(g.get("weight_decay")) for g in groups],
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


def _name(names: list[list[str]] | None, gi: int, pi: int) -> str:
    if names is not None and gi < len(names) and pi < len(names[gi]):
        return repr(names[gi][pi])
    return f"#{pi} of group {gi}"


def _step(value: Any) -> float | int | None:
    number = as_float(value)
    # Adam keeps step as a float tensor; integral steps read better (and compare) as ints.
    if number is not None and math.isfinite(number) and number.is_integer():
        return int(number)
    return number


__all__ = ["capture", "problems", "restore", "summary"]
