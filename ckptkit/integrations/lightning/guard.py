"""The resume guard of a framework save, as the native path has it: the look-ahead
recorded at a save and the check of the restored run against it."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch

from ckptkit import codes
from ckptkit.capture.state import TrainState
from ckptkit.integrations.lightning.extras import rank_world
from ckptkit.signals import guard as guard_mod


def lookahead(
    ts: TrainState, *, step: int, sampler: Any = None, k: int = guard_mod.DEFAULT_K
) -> dict[str, Any]:
    """The resume guard's look-ahead of a framework save: what the next step will use.

    The same record the native path writes into the manifest (:func:`ckptkit.signals.guard.compute`:
    next step, LRs, optimizer step, scheduler position, RNG fingerprint, the next ``k``
    sample ids), computed from ``ts`` at global step ``step`` with ``sampler`` as the data
    cursor. Call it at the instant the RNG is captured (nothing may draw in between). Per-
    rank facts (sample ids, RNG) are this rank's; ``world_size`` says for which layout.

    Example:
        >>> from ckptkit.capture.resumable import ResumableSampler
        >>> m = torch.nn.Linear(2, 1)
        >>> ts = TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
        >>> la = lookahead(ts, step=4, sampler=ResumableSampler(8, shuffle=False), k=2)
        >>> la["next_step"], la["sample_ids"]
        (5, [0, 1])
    """
    la = guard_mod.compute(_as_of(ts, step, sampler), k=min(max(k, 0), guard_mod.MAX_K))
    la["world_size"] = rank_world()[1]
    return la


def start_guard(
    saved: Any, ts: TrainState, *, step: int, sampler: Any = None, recorder: Any = None
) -> guard_mod.ResumeGuard | None:
    """Check a restored framework run against its checkpoint's look-ahead; watch its first steps.

    ``saved`` is what :func:`lookahead` returned at the save (None: an older checkpoint
    without one, nothing to check). Compares the restored objects now (call it once the
    RNG and the data cursor are back, before the first step draws or fetches), then,
    through ``recorder`` (:func:`ckptkit.signals.guard.attach`), the first step records: the
    step, the LR used, the sample ids each step receives. Every mismatch is a ``CK-D``
    finding, logged at WARNING and written into the next step record (``guard``).

    Raises:
        StateError: ``CK-S012``, the look-ahead holds a value of the wrong type (before
            any step ran).

    Example:
        >>> from ckptkit.capture.resumable import ResumableSampler
        >>> m = torch.nn.Linear(2, 1)
        >>> ts = TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
        >>> saved = lookahead(ts, step=4, sampler=ResumableSampler(8, shuffle=False, seed=0))
        >>> fresh = ResumableSampler(8, shuffle=False, seed=0)
        >>> g = start_guard(saved, ts, step=4, sampler=fresh)
        >>> [f.code for f in g.findings]
        []
    """
    if not saved:
        return None
    found = guard_mod.problems(saved, {})
    if found:
        raise codes.error(
            codes.S012, "the checkpoint's resume look-ahead cannot be read: " + "; ".join(found[:3])
        )
    rank, world = rank_world()
    g = guard_mod.ResumeGuard(saved, per_rank=saved.get("world_size") == world and rank == 0)
    g.check_restored(_as_of(ts, step, sampler))
    if recorder is not None:
        guard_mod.attach(recorder, g)
    return g


def _as_of(ts: TrainState, step: int, sampler: Any) -> TrainState:
    """``ts`` as the guard reads it at global step ``step``: a shallow copy (the recorder
    stays bound to ``ts``), with the data cursor and the bare optimizer a framework wraps
    (Fabric's ``_FabricOptimizer``: the guard compares the one that steps)."""
    view = copy.copy(ts)
    view.progress = replace(ts.progress, step=int(step))
    view.sampler = sampler
    opt = ts.optimizer
    inner = getattr(opt, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        view.optimizer = inner
    return view

