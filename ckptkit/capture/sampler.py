"""Capture and restore the data cursor: a ResumableSampler, a StatefulDataLoader, or any stateful.

Accepted objects, in order of preference:

- :class:`ckptkit.capture.resumable.ResumableSampler` (exact mid-epoch resume, resume at another world
  size, summarised in detail);
- torchdata's ``StatefulDataLoader`` (imported lazily, only to recognise it);
- any object with ``state_dict()``/``load_state_dict()`` whose state is plain values.

A plain ``DataLoader``, ``RandomSampler`` or ``DistributedSampler`` has no cursor, so capture
raises rather than writing a checkpoint that resumes at the start of the epoch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptkit.capture import check_tree, refuse, show
from ckptkit.capture.resumable import ResumableSampler, state_problems
from ckptkit.errors import StateError

_KINDS = ("resumable", "stateful_dataloader", "state_dict")

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
    "shuffle",
    "drop_last",
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
        hint="use ckptkit.capture.resumable.ResumableSampler (or torchdata's StatefulDataLoader) so the "
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
        StateError: ``CK-S013`` the snapshot is malformed (see :func:`problems`); a
            different kind or type of object, or a cursor that does not fit (see
            :meth:`ckptkit.capture.resumable.ResumableSampler.load_state_dict`).

    Example:
        >>> s = ResumableSampler(100, seed=3)
        >>> restore(s, capture(ResumableSampler(100, seed=3)))
    """
    refuse("sampler", problems(state))
    kind = _kind(obj)
    if kind != state["kind"] or type(obj).__name__ != state["type"]:
        raise StateError(
            f"sampler state is from a {state['type']} ({state['kind']}), got a "
            f"{type(obj).__name__} ({kind})",
            hint=f"build a {state['type']} as in the saved run",
        )
    obj.load_state_dict(state["state"])


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not load as saved (empty: nothing).

    Its kind and type, and for a :class:`~ckptkit.capture.resumable.ResumableSampler` the cursor
    itself (:func:`ckptkit.capture.resumable.state_problems`). A multi-rank save also keeps every
    rank's cursor under ``ranks`` (``{"rank00000": cursor, ...}``); a restore at another
    world size merges them, so each is checked the same way. Another object's state is
    its own business: only its presence is checked. Only the snapshot is read: this is
    the rule verify (CK-S013) and restore share.

    Example:
        >>> problems(capture(ResumableSampler(100, seed=3)))
        []
        >>> problems({"kind": "resumable", "type": "ResumableSampler", "state": []})
        ['state: the cursor is [], not an object']
    """
    if not isinstance(state, Mapping):
        return [f"the snapshot is {show(state)}, not an object"]
    out: list[str] = []
    kind = state.get("kind")
    if kind not in _KINDS:
        out.append(f"kind is {show(kind)}, not one of {', '.join(_KINDS)}")
    if not isinstance(state.get("type"), str) or not state["type"].isidentifier():
        out.append(f"type is {show(state.get('type'))}, not a class name")
    if "state" not in state:
        out.append("it holds no cursor ('state')")
    cursors = [("state", state.get("state"))]
    ranks = state.get("ranks")
    if ranks is not None:
        if not isinstance(ranks, Mapping) or not all(
            isinstance(k, str) and k.startswith("rank") and k[4:].isascii() and k[4:].isdigit()
            for k in ranks
        ):
            out.append(f"ranks is {show(ranks)}, not one cursor per rank ('rank00000': ...)")
        else:
            cursors += [(f"ranks.{k}", v) for k, v in ranks.items()]
    for where, cursor in cursors:
        if kind == "resumable":
            out += [f"{where}: {p}" for p in state_problems(cursor)]
        elif kind == "stateful_dataloader" and not isinstance(cursor, Mapping):
            out.append(f"{where} is {show(cursor)}, not a StatefulDataLoader state")
    return out


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the cursor facts verify compares across ranks.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``kind`` and ``type``, plus ``epoch``, ``position``, ``offset``, ``consumed``,
        ``seed``, ``world_size``, ``rank``, ``num_samples``, ``data_len``, ``shuffle`` and
        ``drop_last`` where the state has them at its top level (a ResumableSampler has
        all of them).

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


__all__ = ["capture", "problems", "restore", "summary"]
