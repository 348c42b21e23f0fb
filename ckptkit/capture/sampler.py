"""Capture and restore the data cursor: a ResumableSampler, a StatefulDataLoader, or any stateful.

Accepted objects, in order of preference:

- :class:`ckptkit.sampler.ResumableSampler` (exact mid-epoch resume, resume at another world
  size, summarised in detail);
- torchdata's ``StatefulDataLoader`` (imported lazily, only to recognise it);
- any object with ``state_dict()``/``load_state_dict()`` whose state is plain values.

A plain ``DataLoader``, ``RandomSampler`` or ``DistributedSampler`` has no cursor, so capture
raises rather than writing a checkpoint that resumes at the start of the epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptkit.capture import check_tree
from ckptkit.errors import StateError
from ckptkit.sampler import ResumableSampler

_SUMMARY_KEYS = (
    "epoch",
    "position",
    "offset",
    "consumed",
    "seed",
    "world_size",
    "rank",
    "num_samples",
    "data_len",
)


def _kind(obj: Any) -> str:
    if isinstance(obj, ResumableSampler):
        return "resumable"
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        StatefulDataLoader = None
    if StatefulDataLoader is not None and isinstance(obj, StatefulDataLoader):
        return "stateful_dataloader"
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return "state_dict"
    raise StateError(
        f"a {type(obj).__name__} has no data cursor to capture",
        hint="use ckptkit.sampler.ResumableSampler (or torchdata's StatefulDataLoader) so the "
        "resumed run continues mid-epoch instead of replaying the epoch",
    )


def capture(obj: Any) -> dict[str, Any]:
    """Snapshot a sampler's or data loader's cursor.

    Args:
        obj: a ResumableSampler, a StatefulDataLoader, or an object with
            ``state_dict``/``load_state_dict``.

    Returns:
        ``{"kind": "resumable" | "stateful_dataloader" | "state_dict", "type": class name,
        "state": obj.state_dict()}``.

    Raises:
        StateError: the object has no cursor, or its state holds unsupported values.

    Example:
        >>> capture(ResumableSampler(100, seed=3))["state"]["seed"]
        3
    """
    kind = _kind(obj)
    state = obj.state_dict()
    check_tree(state, what=f"sampler ({type(obj).__name__})")
    return {"kind": kind, "type": type(obj).__name__, "state": state}


def restore(obj: Any, state: Mapping[str, Any]) -> None:
    """Load a cursor snapshot into the same kind of object.

    Args:
        obj: the sampler or data loader of the resumed run.
        state: a tree from :func:`capture`.

    Raises:
        StateError: a different kind or type of object, or a cursor that does not fit
            (see :meth:`ckptkit.sampler.ResumableSampler.load_state_dict`).

    Example:
        >>> s = ResumableSampler(100, seed=3)
        >>> restore(s, capture(ResumableSampler(100, seed=3)))
    """
    kind = _kind(obj)
    if kind != state["kind"] or type(obj).__name__ != state["type"]:
        raise StateError(
            f"sampler state is from a {state['type']} ({state['kind']}), got a "
            f"{type(obj).__name__} ({kind})",
            hint=f"build a {state['type']} as in the saved run",
        )
    obj.load_state_dict(state["state"])


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the cursor facts verify compares across ranks.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``kind`` and ``type``, plus ``epoch``, ``position``, ``offset``, ``consumed``,
        ``seed``, ``world_size``, ``rank``, ``num_samples`` and ``data_len`` where the state
        has them at its top level (a ResumableSampler has all of them).

    Example:
        >>> summary(capture(ResumableSampler(100, seed=3)))["position"]
        0
    """
    inner = state["state"]
    out: dict[str, Any] = {"kind": state["kind"], "type": state["type"]}
    if isinstance(inner, Mapping):
        for key in _SUMMARY_KEYS:
            value = inner.get(key)
            if isinstance(value, int | float | str | None):
                out[key] = value
    return out


__all__ = ["capture", "restore", "summary"]
