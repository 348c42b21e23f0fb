"""What a Lightning checkpoint leaves out of an exact resume, added and put back: every
rank's RNG, the data cursor and the stability watch's state.

Plain ``torch``, no Lightning: :class:`~.callback.CkptkitCallback` and
:class:`~.fabric.FabricCheckpoints` store them under :data:`STATE_KEY` of the checkpoint
dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ckptkit.capture import rng as rng_capture
from ckptkit.capture import sampler as sampler_capture
from ckptkit.errors import StateError
from ckptkit.format.ranks import rank_key
from ckptkit.signals.stability import StabilityWatch

STATE_KEY = "ckptkit"
"""Top-level key of the checkpoint dict that holds what ckptkit adds (RNG, data cursor)."""


def capture_extras(sampler: Any = None, *, watch: StabilityWatch | None = None) -> dict[str, Any]:
    """What ckptkit adds to a Lightning checkpoint: every rank's RNG, the data cursor and,
    with a ``watch``, its health and its state (:meth:`StabilityWatch.state_dict`, this
    rank's: the rank that writes the checkpoint).

    Collective when ``torch.distributed`` is initialised with several ranks (the RNG of
    every rank is gathered; call it on every rank).

    Example:
        >>> from ckptkit.capture.resumable import ResumableSampler
        >>> sorted(capture_extras(ResumableSampler(8)))
        ['rng', 'sampler']
    """
    rank, world = rank_world()
    mine = rng_capture.capture(rank=rank, world_size=world)
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
        rngs = {rank_key(i): s for i, s in enumerate(gathered)}
    else:
        rngs = {rank_key(rank): mine}
    out: dict[str, Any] = {"rng": rngs}
    if sampler is not None:
        out["sampler"] = sampler_capture.capture(sampler)
    if watch is not None:
        out["health"] = watch.snapshot()
        out["watch"] = {"rank": rank, "state": watch.state_dict()}
    return out


def restore_rng(extras: Mapping[str, Any]) -> bool:
    """Put this rank's RNG back from :func:`capture_extras`' tree; False when it has none.

    Raises:
        StateError: the checkpoint has no RNG state for this rank.
    """
    rngs = extras.get("rng")
    if not isinstance(rngs, Mapping) or not rngs:
        return False
    rank, _world = rank_world()
    key = rank_key(rank)
    if key not in rngs:
        raise StateError(
            f"the checkpoint holds RNG state of {sorted(rngs)}, not of {key}",
            hint="resume at the world size it was saved with (RNG state is per rank)",
        )
    rng_capture.restore(rngs[key], rank=rank)
    return True


def restore_watch(watch: StabilityWatch | None, extras: Mapping[str, Any], *, where: str) -> bool:
    """Put the watch's windows back from :func:`capture_extras`' tree, so it goes on judging
    instead of warming up again; False when there is no watch, the checkpoint holds no
    state of this rank's watch, or the state does not fit (a warning naming ``where``:
    the watch starts afresh)."""
    saved = extras.get("watch")
    if watch is None or not isinstance(saved, Mapping):
        return False
    if saved.get("rank") != rank_world()[0]:
        return False  # another rank's windows: this rank's watch starts afresh
    return watch.load_state_dict(saved.get("state"), where=where)


def restore_sampler(sampler: Any, extras: Mapping[str, Any]) -> bool:
    """Put the data cursor back; False when the checkpoint has none."""
    st = extras.get("sampler")
    if sampler is None or not isinstance(st, Mapping):
        return False
    sampler_capture.restore(sampler, st)
    return True


def rank_world() -> tuple[int, int]:
    """This process's rank and the world size: ``(0, 1)`` without a process group."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1

