"""The look-ahead a save records, for the writers that sit below the resume guard.

Every checkpoint records what the run will do next (its look-ahead, the manifest's
``lookahead`` field: the resume guard's automatic part under ``"guard"``), and the first
resumed step is checked against it (:mod:`ckptkit.signals.guard`). The guard lives in the signals
layer, above the checkpoint layer whose writers (``ckptkit.save`` of a ``TrainState``, the
DCP writer) cannot import it. They call :func:`record`; the guard fills it in when it is
imported (:func:`provide`), and ``import ckptkit`` always imports the guard, so a writer
reached through the package always records the look-ahead. One computation, the guard's
:func:`ckptkit.signals.guard.lookahead_of`, for every writer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Provider = Callable[..., dict[str, Any]]
"""``provider(state, *, step, model, optimizer, scheduler, scaler, sampler, data, user)``
returning the manifest's ``lookahead`` field."""

_PROVIDER: Provider | None = None


def provide(fn: Provider) -> None:
    """Install the function that computes look-aheads (the resume guard does, at import).

    Example:
        >>> import ckptkit.signals.guard  # installs ckptkit.signals.guard.lookahead_of
    """
    global _PROVIDER
    _PROVIDER = fn


def record(
    state: Any = None,
    *,
    step: int | None = None,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    scaler: Any = None,
    sampler: Any = None,
    data: Mapping[str, Any] | None = None,
    user: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The manifest ``lookahead`` field of a save, from what the writer has.

    Args:
        state: a :class:`~ckptkit.TrainState` (then the other objects are taken from it).
        step: the step the checkpoint holds (the next step is ``step + 1``).
        model, optimizer, scheduler, scaler, sampler: the live objects, any of them.
        data: the declared data identity.
        user: the script's own look-ahead keys (``mgr.save(ts, lookahead={...})``).

    Returns:
        ``{"guard": {...}, "user": {...}}`` as :class:`ckptkit.format.records.LookAhead` writes
        it; None when no provider is installed (``ckptkit.signals.guard`` never imported).

    Example:
        >>> import torch, ckptkit
        >>> m = torch.nn.Linear(2, 1)
        >>> la = record(step=3, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
        >>> la["guard"]["next_step"], la["guard"]["lr"]
        (4, [0.1])
    """
    if _PROVIDER is None:
        return None
    return _PROVIDER(state, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
                     scaler=scaler, sampler=sampler, data=data, user=user)


__all__ = ["Provider", "provide", "record"]
