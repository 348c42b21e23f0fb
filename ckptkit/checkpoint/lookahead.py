"""The look-ahead a save records: what the run will do next, computed by every writer.

Every checkpoint records what the run will do next (its look-ahead, the manifest's
``lookahead`` field: the resume guard's automatic part under ``"guard"``), and the first
resumed step is checked against it (:mod:`ckptkit.signals.guard`, which imports the
computation from here). The computation lives in the checkpoint layer so that every writer
(``ckptkit.save`` of a ``TrainState``, the DCP writer, the manager's save) calls it
directly: what a save writes does not depend on which modules were imported before it.
Its keys, and the types a reader checks them as, are :mod:`ckptkit.format.records`'
(:func:`ckptkit.format.records.lookahead_problems`).

Cost: a look-ahead peeks the sampler (no data is loaded) and hashes the RNG states
(a few KiB); the probe is one forward pass in eval mode without grad.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import xxhash

from ckptkit.capture import tree_fingerprint
from ckptkit.capture.rng import FINGERPRINT_VERSION, RngSnapshot
from ckptkit.capture.scaler import scaler_state
from ckptkit.capture.session import DEFAULT_K, ProbeFn
from ckptkit.capture.state import TrainState
from ckptkit.format.records import MAX_K, LookAhead


class StepView:
    """What a save reads from the step observer of a ``TrainState``'s recorder.

    :class:`ckptkit.signals.observe.StepObserver` is one (it derives from this class): the
    GradScaler seen stepping the optimizer, where steps start, and what drew from the RNG
    between one step's record and the next step's start. Declared here so the look-ahead,
    below the signals layer, can read them.
    """

    scaler: Any
    """The GradScaler in use: the state's, or the one seen calling ``optimizer.step``."""
    point: str | None
    """Where steps start: ``data`` or ``forward`` (None: not seen yet)."""

    def gap_patterns(self) -> list[dict[str, int | None]]:
        """The distinct draws made between a step's record and the next step's start."""
        raise NotImplementedError


def rng_fingerprint() -> str:
    """The v0.1 fingerprint of the global RNG states (checkpoints without ``rng_v``).

    New look-aheads use :meth:`ckptkit.capture.rng.RngSnapshot.fingerprint` (``rng_v`` 2),
    the one the step records carry.

    Example:
        >>> rng_fingerprint() == rng_fingerprint()
        True
    """
    parts = [
        repr(random.getstate()).encode(),
        np.random.get_state(legacy=True)[1].tobytes(),  # type: ignore[index]
        torch.get_rng_state().numpy().tobytes(),
    ]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        parts += [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return xxhash.xxh3_64_hexdigest(b"|".join(parts))


def opt_step(opt: torch.optim.Optimizer) -> int | None:
    """The optimizer's step count: the largest ``step`` in its state (0 before any step).

    Example:
        >>> opt_step(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
        0
    """
    steps = []
    for st in opt.state.values():
        s = st.get("step") if isinstance(st, dict) else None
        if isinstance(s, torch.Tensor):
            steps.append(int(s.item()))
        elif isinstance(s, (int, float)):
            steps.append(int(s))
    return max(steps) if steps else 0


def probe_loss(model: torch.nn.Module, probe: ProbeFn) -> float:
    """Run ``probe(model)`` in eval mode without grad and return its loss as a float.

    Train/eval mode is put back afterwards, so dropout state is untouched.

    Example:
        >>> m = torch.nn.Linear(2, 1)
        >>> isinstance(probe_loss(m, lambda mod: mod(torch.ones(1, 2)).sum()), float), m.training
        (True, True)
    """
    was = model.training
    model.eval()
    try:
        # fork_rng: a probe that draws random numbers must not move the training streams.
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = probe(model)
    finally:
        model.train(was)
    return float(out.item() if isinstance(out, torch.Tensor) else out)


def observer_of(ts: TrainState) -> StepView | None:
    """The step observer of ``ts``'s recorder, if it has one.

    Example:
        >>> observer_of(TrainState(model=torch.nn.Linear(1, 1))) is None
        True
    """
    obs = getattr(ts.recorder, "observer", None)
    return obs if isinstance(obs, StepView) else None


def compute(ts: TrainState, *, k: int = DEFAULT_K, probe: ProbeFn | None = None) -> dict[str, Any]:
    """Return the look-ahead of ``ts``: what the next step will use.

    Example:
        >>> import torch, ckptkit
        >>> m = torch.nn.Linear(2, 1)
        >>> ts = ckptkit.TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), step=3)
        >>> la = compute(ts); la["next_step"], la["lr"]
        (4, [0.1])
    """
    out: dict[str, Any] = {
        "k": k,
        "next_step": ts.step + 1,
        "rng": RngSnapshot.take().fingerprint(),
        "rng_v": FINGERPRINT_VERSION,
    }
    if ts.optimizer is not None:
        out["lr"] = [float(g["lr"]) for g in ts.optimizer.param_groups]
        out["opt_step"] = opt_step(ts.optimizer)
    if ts.scheduler is not None and hasattr(ts.scheduler, "last_epoch"):
        out["sched_epoch"] = int(ts.scheduler.last_epoch)
    obs = observer_of(ts)
    own = scaler_state(ts.scaler)
    seen = scaler_state(obs.scaler) if obs is not None and ts.scaler is None else None
    if own is not None or seen is not None:
        scale, tracker = own or seen  # type: ignore[misc]
        out["loss_scale"], out["scale_growth"] = scale, tracker
        if own is None:
            # Seen stepping the optimizer but not in the TrainState: not saved, so the
            # resumed run starts a fresh one; checked at its first optimizer step.
            out["scaler"] = "not in TrainState"
    peek = getattr(ts.sampler, "next_indices", None)
    if callable(peek):
        out["sample_ids"] = [int(i) for i in peek(k)]
        out["epoch"] = int(getattr(ts.sampler, "epoch", 0))
    if getattr(ts.sampler, "counts_ahead", False) is True:
        out["cursor_ahead"] = True
    if ts.data:
        out["data_id"] = tree_fingerprint(dict(ts.data))
    if obs is not None and obs.point is not None:
        out["rng_gaps"] = obs.gap_patterns()
        out["rng_at"] = obs.point
    if probe is not None:
        out["probe_loss"] = probe_loss(ts.model, probe)
    return out


def lookahead(state: TrainState, user: Mapping[str, Any] | None) -> dict[str, Any]:
    """A save's look-ahead: the user's plus the automatic resume-guard one (``guard`` key).

    Computed before capture, from the same instant: peeking the sampler and hashing the
    RNG consume nothing. Per-rank facts (sample ids, RNG) are rank 0's.

    Example:
        >>> ts = TrainState(model=torch.nn.Linear(1, 1), step=2)
        >>> la = lookahead(ts, {"note": "mine"}); la["note"], la["guard"]["next_step"]
        ('mine', 3)
    """
    la: dict[str, Any] | None = None
    if state.guard_k > 0:
        la = compute(state, k=min(state.guard_k, MAX_K), probe=state.probe)
        la["world_size"] = state.parallel.world_size
    return LookAhead(guard=la, user=dict(user or {})).to_dict()


def lookahead_of(
    state: TrainState | None = None,
    *,
    step: int | None = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    sampler: Any = None,
    data: Mapping[str, Any] | None = None,
    user: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A save's look-ahead from a TrainState, or from whatever objects a writer has.

    The one computation behind every save path: the manager and ``ckptkit.save`` of a
    TrainState pass the state, a writer without one (the DCP writer: a state dict, the
    step, maybe the optimizer and scheduler) passes what it has, and the look-ahead then
    holds the facts those objects give (an RNG fingerprint always).

    Args:
        state: a :class:`~ckptkit.TrainState` (then the other objects are taken from it).
        step: the step the checkpoint holds (the next step is ``step + 1``).
        model, optimizer, scheduler, scaler, sampler: the live objects, any of them.
        data: the declared data identity.
        user: the script's own look-ahead keys (``mgr.save(ts, lookahead={...})``).

    Returns:
        ``{"guard": {...}, "user": {...}}`` as :class:`ckptkit.format.records.LookAhead` writes
        it: the manifest ``lookahead`` field.

    Example:
        >>> m = torch.nn.Linear(2, 1)
        >>> la = lookahead_of(step=9, optimizer=torch.optim.SGD(m.parameters(), lr=0.5))
        >>> la["guard"]["next_step"], la["guard"]["lr"]
        (10, [0.5])
    """
    if state is None:
        state = TrainState(
            model=model if model is not None else torch.nn.Module(),
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            sampler=sampler,
            step=int(step or 0),
            data=data,
        )
    elif step is not None and step != state.step:
        state = copy.copy(state)
        state.progress = copy.copy(state.progress)
        state.step = int(step)
    return lookahead(state, user)


record = lookahead_of
"""The manifest ``lookahead`` field of a save, from what the writer has: :func:`lookahead_of`
under the name the writers and docs/dcp.md use (``lookahead.record(step=..., optimizer=...)``)."""


__all__ = [
    "StepView",
    "compute",
    "lookahead",
    "lookahead_of",
    "observer_of",
    "opt_step",
    "probe_loss",
    "record",
    "rng_fingerprint",
]
