"""Capture and restore FP8 scaling state: per-tensor scales, amax histories and the recipe.

Two shapes are accepted: an object with ``state_dict``/``load_state_dict`` (a framework's FP8
state holder), or a flat mapping of tensors such as ``{"layer.scale": t,
"layer.amax_history": t}``. Tensors are returned as live references (the caller copies); a
mapping is restored in place with ``copy_`` so modules that hold those tensors see the values.

The recipe (``margin``, ``amax_history_len``, ``fp8_format``...) is stored next to the state.
Enum values in the recipe are stored by name, since enums are not plain values.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, MutableMapping
from typing import Any, Protocol, runtime_checkable

import torch

from ckptkit.capture import check_tree, refuse, show
from ckptkit.errors import StateError


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> Any:
        """Return the state."""

    def load_state_dict(self, state_dict: Any) -> Any:
        """Load the state."""


FP8State = Stateful | MutableMapping[str, torch.Tensor]


def capture(obj: FP8State, *, recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Snapshot FP8 scaling state.

    Args:
        obj: a stateful FP8 state holder or a mapping of name to tensor.
        recipe: the FP8 recipe (margin, amax_history_len, fp8_format...), stored as is.

    Returns:
        ``{"kind": "stateful" | "tensors", "state": ..., "recipe": dict | None}``.

    Raises:
        StateError: the state or recipe holds an unsupported value, or ``obj`` is neither.

    Example:
        >>> snap = capture({"fc.scale": torch.ones(1), "fc.amax_history": torch.zeros(16, 1)},
        ...                recipe={"margin": 0, "amax_history_len": 16, "fp8_format": "HYBRID"})
        >>> snap["kind"]
        'tensors'
    """
    if isinstance(obj, Stateful):
        kind, state = "stateful", obj.state_dict()
    elif isinstance(obj, Mapping):
        kind, state = "tensors", dict(obj)
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise StateError(
                    f"fp8 state {key!r} is a {type(value).__name__}, not a tensor",
                    hint="pass a mapping of tensors, or an object with state_dict/load_state_dict",
                )
    else:
        raise StateError(
            f"cannot capture fp8 state from a {type(obj).__name__}",
            hint="pass a mapping of tensors, or an object with state_dict/load_state_dict",
        )
    check_tree(state, what="fp8")
    plain_recipe = None if recipe is None else {k: _plain(v) for k, v in recipe.items()}
    check_tree(plain_recipe, what="fp8 recipe")
    return {"kind": kind, "state": state, "recipe": plain_recipe}


def restore(
    obj: FP8State, state: Mapping[str, Any], *, recipe: Mapping[str, Any] | None = None
) -> None:
    """Put FP8 scaling state back.

    Args:
        obj: the FP8 state holder or tensor mapping of the resumed run.
        state: a tree from :func:`capture`.
        recipe: the resumed run's recipe; when given it must equal the saved one.

    Raises:
        StateError: ``CK-S013`` the snapshot is malformed (see :func:`problems`); a
            different recipe, missing or extra tensors, or a shape mismatch.

    Example:
        >>> live = {"fc.scale": torch.ones(1)}
        >>> snap = capture({"fc.scale": torch.full((1,), 4.0)})
        >>> restore(live, snap)
        >>> live["fc.scale"].item()
        4.0
    """
    refuse("fp8", problems(state))
    if recipe is not None:
        current = {k: _plain(v) for k, v in recipe.items()}
        if state.get("recipe") is not None and current != dict(state["recipe"]):
            raise StateError(
                f"fp8 recipe changed: saved {dict(state['recipe'])}, now {current}",
                hint="resume with the saved recipe; a different margin or history length "
                "changes the scales the run computes",
            )
    if state["kind"] == "stateful":
        if not isinstance(obj, Stateful):
            raise StateError(
                f"fp8 state was captured from a state_dict object, got a {type(obj).__name__}",
                hint="pass the same kind of fp8 state holder as the saved run",
            )
        obj.load_state_dict(state["state"])
        return
    if not isinstance(obj, MutableMapping):
        raise StateError(
            f"fp8 state was captured from a tensor mapping, got a {type(obj).__name__}",
            hint="pass the mapping of fp8 tensors of the resumed run",
        )
    saved = state["state"]
    missing, extra = sorted(set(saved) - set(obj)), sorted(set(obj) - set(saved))
    if missing or extra:
        raise StateError(
            f"fp8 tensors differ: missing here {missing}, not in the snapshot {extra}",
            hint="build the model with the same FP8 layers as the saved run",
        )
    for key, value in saved.items():
        target = obj[key]
        if target.shape != value.shape:
            raise StateError(
                f"fp8 tensor {key!r} had shape {list(value.shape)}, now {list(target.shape)}",
                hint="use the same amax_history_len and layer shapes as the saved run",
            )
    with torch.no_grad():
        for key, value in saved.items():
            obj[key].copy_(value)


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not put back as saved (empty: nothing).

    Its kind, a recipe that is null or an object, and for a tensor mapping an object of
    tensors (restore copies each into the live tensor of the same name). A state holder's
    own state is its business: only its presence is checked. Only the snapshot is read:
    this is the rule verify (CK-S013) and restore share.

    Example:
        >>> problems(capture({"fc.scale": torch.ones(1)}))
        []
        >>> problems({"kind": "tensors", "state": {"fc.scale": 1.0}, "recipe": None})
        ["state 'fc.scale' is 1.0, not a tensor"]
    """
    if not isinstance(state, Mapping):
        return [f"the snapshot is {show(state)}, not an object"]
    out: list[str] = []
    kind = state.get("kind")
    if kind not in ("stateful", "tensors"):
        out.append(f"kind is {show(kind)}, not stateful or tensors")
    recipe = state.get("recipe")
    if recipe is not None and not isinstance(recipe, Mapping):
        out.append(f"recipe is {show(recipe)}, not null or an object")
    if "state" not in state:
        out.append("it holds no state")
    elif kind == "tensors":
        saved = state["state"]
        if not isinstance(saved, Mapping):
            out.append(f"state is {show(saved)}, not an object of tensors")
        else:
            out += [
                f"state {show(key)} is {show(value)}, not a tensor"
                for key, value in saved.items()
                if not isinstance(value, torch.Tensor)
            ]
    return out


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return finiteness counts and history facts for verify.

    Scale tensors are those whose key path contains ``scale`` (including ``scale_inv``);
    amax tensors those containing ``amax``; amax histories those containing ``history``.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``kind``, ``num_tensors``, ``num_scale_values``, ``nonfinite_scale``, ``zero_scale``,
        ``num_amax_values``, ``nonfinite_amax``, ``amax_history_len`` (the longest history's
        first dimension, None without histories), ``amax_history_empty``,
        ``amax_history_all_zero`` and ``recipe``.

    Example:
        >>> s = summary(capture({"fc.scale": torch.tensor([1.0, float("inf")])}))
        >>> s["nonfinite_scale"]
        1
    """
    tensors = tensors_of(state["state"])
    scale_vals = [t for k, t in tensors.items() if "scale" in k.lower()]
    amax_vals = [t for k, t in tensors.items() if "amax" in k.lower()]
    histories = [t for k, t in tensors.items() if "amax" in k.lower() and "history" in k.lower()]
    history_len = max((t.shape[0] if t.dim() else 1 for t in histories), default=None)
    return {
        "kind": state["kind"],
        "num_tensors": len(tensors),
        "num_scale_values": sum(t.numel() for t in scale_vals),
        "nonfinite_scale": sum(_nonfinite(t) for t in scale_vals),
        "zero_scale": sum(int((t.float() == 0).sum()) for t in scale_vals),
        "num_amax_values": sum(t.numel() for t in amax_vals),
        "nonfinite_amax": sum(_nonfinite(t) for t in amax_vals),
        "amax_history_len": history_len,
        "amax_history_empty": bool(histories) and all(t.numel() == 0 for t in histories),
        "amax_history_all_zero": bool(histories)
        and all(bool((t.float() == 0).all()) for t in histories),
        "recipe": state.get("recipe"),
    }


def tensors_of(state: Any) -> dict[str, torch.Tensor]:
    """Every tensor of a saved fp8 state, by key path (what the summary counts).

    Example:
        >>> list(tensors_of({"fc": {"scale": torch.ones(1)}}))
        ['fc.scale']
    """
    return dict(_walk(state, ""))


def _walk(node: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(node, torch.Tensor):
        return [(path, node)]
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            out += _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            out += _walk(value, f"{path}[{i}]")
    return out


def _nonfinite(t: torch.Tensor) -> int:
    if not (t.is_floating_point() or t.is_complex()):
        return 0
    # float8 dtypes lack most CPU kernels; widen first (exact for every fp8 value).
    return int((~torch.isfinite(t.float())).sum())


def _plain(value: Any) -> Any:
    # Framework recipes use enums (e.g. Format.HYBRID); store the name, a plain string.
    if isinstance(value, enum.Enum):
        return value.name
    return value


__all__ = ["FP8State", "Stateful", "capture", "problems", "restore", "summary", "tensors_of"]
