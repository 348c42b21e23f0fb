"""Capture and restore the resume-critical state of a training run, one component per module.

Every module pairs ``capture(obj, ...) -> dict`` with ``restore(obj, state, ...) -> None`` and
``summary(state) -> dict``. A capture returns a *snapshot tree* made only of dicts (str or int
keys), lists, tuples, None, bool, int, float, str and dense ``torch.Tensor`` leaves; the storage
engine writes the tensors to safetensors and the rest as JSON and hands the same tree back.
``summary`` returns small JSON facts that go into the manifest so ``ckptkit verify`` can check
consistency without loading tensors.

Every module also has ``problems(state) -> list[str]``: what in a saved snapshot its
``restore`` could not put back as saved (a wrong type, a number out of range, a structure
``load_state_dict`` would choke on). It reads only the snapshot, so ``ckptkit verify`` (check
CK-S013, on the manifest's tree) and ``restore`` (which refuses the checkpoint before it
touches the live state) run the same rule and cannot disagree.

This package module holds the helpers every component shares: :func:`check_tree`, which
enforces the snapshot-tree contract, :func:`tree_fingerprint`, a stable digest of a tree,
and the small value tests the ``problems`` functions are written with.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import torch
import xxhash

from ckptkit import codes
from ckptkit.errors import StateError

# The leaf types the storage engine round-trips exactly (JSON scalars plus tensors).
_SCALARS = (type(None), bool, int, float, str)


def check_tree(tree: Any, *, what: str, hint: str | None = None) -> None:
    """Raise if ``tree`` holds anything the storage engine cannot round-trip.

    Args:
        tree: the snapshot tree to check.
        what: the component name used in the error (``"scheduler"``, ``"optimizer"``...).
        hint: how to fix an unsupported value; a generic hint is used when None.

    Raises:
        StateError: naming the key path of the first unsupported value.

    Example:
        >>> check_tree({"lr": [0.1, 0.01], "step": torch.zeros(())}, what="optimizer")
        >>> check_tree({"fn": print}, what="scheduler")
        Traceback (most recent call last):
        ...
        ckptkit.errors.StateError: scheduler state at 'fn' holds an unsupported builtin_function_or_method ...
    """
    _check(tree, what, "", hint)


def _check(node: Any, what: str, path: str, hint: str | None) -> None:
    if isinstance(node, _SCALARS):
        return
    if isinstance(node, torch.Tensor):
        _check_tensor(node, what, path)
        return
    if isinstance(node, dict):
        for key, value in node.items():
            # bool is an int subclass but JSON would turn True into "true": refuse it.
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise StateError(
                    f"{what} state at {_show(path)} has a key of type {type(key).__name__} ({key!r})",
                    hint="use str or int keys",
                )
            _check(value, what, f"{path}.{key}" if path else str(key), hint)
        return
    if isinstance(node, list | tuple):
        for i, value in enumerate(node):
            _check(value, what, f"{path}[{i}]", hint)
        return
    raise StateError(
        f"{what} state at {_show(path)} holds an unsupported {type(node).__name__} ({_short(node)})",
        hint=hint
        or "make it a plain value (number, string, list, dict or tensor) or recreate it in code",
    )


def _check_tensor(t: torch.Tensor, what: str, path: str) -> None:
    # Tensor subclasses (DTensor, FSDP flat params...) carry sharding metadata safetensors drops.
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        raise StateError(
            f"{what} state at {_show(path)} is a {type(t).__name__}, not a plain tensor",
            hint="gather it to a local tensor first (DTensor.full_tensor() or .to_local())",
        )
    if t.layout != torch.strided or t.is_meta:
        raise StateError(
            f"{what} state at {_show(path)} is a {t.layout} tensor on {t.device}",
            hint="materialize it as a dense tensor (.to_dense(), or load real weights)",
        )


def _show(path: str) -> str:
    return repr(path) if path else "the top level"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


INT64_MAX = 2**63 - 1
"""The largest integer torch (and every counter a resume reads) can hold."""


def is_int(value: Any, *, lo: int = 0, hi: int = INT64_MAX) -> bool:
    """Whether ``value`` is an ``int`` (not a bool) from ``lo`` to ``hi``.

    Example:
        >>> is_int(3), is_int(True), is_int(10**400), is_int(-1, lo=-1)
        (True, False, False, True)
    """
    return type(value) is int and lo <= value <= hi


def show(value: Any) -> str:
    """A short repr of a saved value for a problem message (a huge int stays readable).

    Example:
        >>> show(10**400)
        'an int of 1329 bits'
    """
    if type(value) is int and value.bit_length() > 64:
        # bit_length, not str(): str() of an int past 4300 digits raises.
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return _short(value)


def as_float(value: Any) -> float | None:
    """A saved number as a float for a summary (a tensor read with ``item()``); None when
    it is not a number.

    Example:
        >>> as_float(torch.tensor(0.5)), as_float(3), as_float(True), as_float("1")
        (0.5, 3.0, None, None)
    """
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_floats(values: Any) -> list[float | None] | None:
    """:func:`as_float` of every item of a list or tuple; None when ``values`` is neither.

    Example:
        >>> as_floats((0.1, "x")), as_floats(0.1)
        ([0.1, None], None)
    """
    if not isinstance(values, list | tuple):
        return None
    return [as_float(v) for v in values]


def typed_snapshot(state: Any) -> tuple[Mapping[str, Any] | None, list[str]]:
    """The checks every ``{"type": ..., "state_dict": ...}`` snapshot (optimizer, scheduler)
    starts with: ``(state, problems of its type)``, or ``(None, [why])`` when it is not an
    object at all (nothing else can be checked).

    Example:
        >>> typed_snapshot({"type": "AdamW"}), typed_snapshot(3)
        (({'type': 'AdamW'}, []), (None, ['the snapshot is 3, not an object']))
        >>> typed_snapshot({"type": "os.system"})[1]
        ["type is 'os.system', not a class name"]
    """
    if not isinstance(state, Mapping):
        return None, [f"the snapshot is {show(state)}, not an object"]
    kind = state.get("type")
    if not isinstance(kind, str) or not kind.isidentifier():
        return state, [f"type is {show(kind)}, not a class name"]
    return state, []


def refuse_type(what: str, obj: object, state: Mapping[str, Any], *, or_else: str | None = None) -> None:
    """Raise when a typed snapshot (see :func:`typed_snapshot`) is of another class than ``obj``.

    Args:
        what: the component (``"optimizer"``, ``"scheduler"``).
        obj: the object the snapshot is restored into.
        state: the snapshot, its ``type`` already checked to be a class name.
        or_else: the other fix the hint offers, besides building the saved class.

    Raises:
        StateError: naming both classes.

    Example:
        >>> refuse_type("scheduler", 3, {"type": "StepLR"})
        Traceback (most recent call last):
        ...
        ckptkit.errors.StateError: scheduler state is from a StepLR, the scheduler is a int...
    """
    kind = type(obj).__name__
    if state["type"] != kind:
        hint = f"build a {state['type']} as in the saved run"
        raise StateError(
            f"{what} state is from a {state['type']}, the {what} is a {kind}",
            hint=hint if or_else is None else f"{hint}, or {or_else}",
        )


MAX_LISTED = 5
"""Problems named in one refusal; the rest are counted."""


def refuse(what: str, found: list[str]) -> None:
    """Raise ``CK-S013`` when a ``problems`` function found something (else return).

    Args:
        what: the component (``"optimizer"``, ``"rng"``...).
        found: what its ``problems`` returned.

    Raises:
        StateError: ``CK-S013``, naming the first few problems.

    Example:
        >>> refuse("progress", [])
        >>> refuse("progress", ["step is 'x', not an integer"])
        Traceback (most recent call last):
        ...
        ckptkit.errors.StateError: CK-S013 progress state cannot be restored as saved: ...
    """
    if not found:
        return
    more = f"; and {len(found) - MAX_LISTED} more" if len(found) > MAX_LISTED else ""
    raise codes.error(
        codes.S013, f"{what} state cannot be restored as saved: {'; '.join(found[:MAX_LISTED])}{more}"
    )


def tree_fingerprint(tree: Any) -> str:
    """Return a stable xxh3-64 hex digest of a snapshot tree.

    Lists and tuples hash alike and dict order does not matter, so the digest survives the
    storage round trip. Tensors hash by dtype, shape and bytes (device-independent).

    Args:
        tree: a snapshot tree as returned by a ``capture`` function.

    Returns:
        16 hex characters.

    Example:
        >>> tree_fingerprint({"a": [1, 2]}) == tree_fingerprint({"a": (1, 2)})
        True
    """
    h = xxhash.xxh3_64()
    _feed(h, tree)
    return h.hexdigest()


def _feed(h: xxhash.xxh3_64, node: Any) -> None:
    # One tag byte per node keeps e.g. "1" and 1 and [1] apart.
    if node is None:
        h.update(b"N")
    elif isinstance(node, bool):
        h.update(b"T" if node else b"F")
    elif isinstance(node, int):
        h.update(b"i" + str(node).encode() + b";")
    elif isinstance(node, float):
        h.update(b"f" + (repr(node) if not math.isnan(node) else "nan").encode() + b";")
    elif isinstance(node, str):
        data = node.encode()
        h.update(b"s" + struct.pack("<Q", len(data)) + data)
    elif isinstance(node, torch.Tensor):
        t = node.detach().to("cpu").contiguous()
        h.update(b"t" + str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(node, dict):
        h.update(b"d" + struct.pack("<Q", len(node)))
        for key in sorted(node, key=lambda k: (isinstance(k, str), str(k))):
            _feed(h, key)
            _feed(h, node[key])
    elif isinstance(node, list | tuple):
        h.update(b"l" + struct.pack("<Q", len(node)))
        for value in node:
            _feed(h, value)
    else:
        raise StateError(
            f"cannot fingerprint a {type(node).__name__}",
            hint="pass a snapshot tree as returned by a capture function",
        )


__all__ = [
    "INT64_MAX",
    "MAX_LISTED",
    "as_float",
    "as_floats",
    "check_tree",
    "is_int",
    "refuse",
    "refuse_type",
    "show",
    "tree_fingerprint",
]
