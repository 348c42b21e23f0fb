"""Which run layouts exist: framework layouts register a detector here at import.

Below :mod:`ckptkit.run.layouts` (which register themselves) and :mod:`ckptkit.run.directory` (which
imports the built-in layouts by name, then asks every detector), so neither imports the
other back. Third parties register their own layout the same way
(``ckptkit.run.directory.register`` is this function).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ckptkit.run import retain
from ckptkit.storage.fs import Location


@runtime_checkable
class RunLike(retain.RunStore, Protocol):
    """What the run-level commands need of a run: a :class:`ckptkit.run.Run`, or a third
    party's own run object returned by its registered detector."""

    @property
    def root(self) -> Location: ...

    @property
    def layout(self) -> str:
        """``ckptkit`` for native runs, else the framework (``hf-trainer`` ...)."""
        ...

    def leftovers(self) -> Sequence[Location]:
        """What interrupted saves left behind (never checkpoints)."""
        ...

    def close(self) -> None:
        """Release the lock and anything else held."""
        ...

    # Optional: ``resume_hint(info) -> str``, how to resume this layout from ``info`` (the
    # framework's own call, e.g. ``trainer.train(resume_from_checkpoint=...)``); see
    # :func:`resume_hint`.


Detector = Callable[[Location, dict[str, Any]], "RunLike | None"]
"""``detector(root, options) -> RunLike | None``: a run of this layout at ``root``, or None.
``options``: those of :class:`ckptkit.run.Run` (``readonly``, ``key``, ``lock_timeout``, ``lazy``)."""

DETECTORS: list[tuple[str, Detector]] = []
"""Registered layouts, asked in order by :func:`open_run`."""

def register(name: str, detector: Detector) -> None:
    """Register a framework run layout (called by an integration at import time).

    Raises:
        ValueError: ``name`` is registered already.
    """
    if any(n == name for n, _ in DETECTORS):
        raise ValueError(f"run layout {name!r} is registered already")
    DETECTORS.append((name, detector))


__all__ = ["DETECTORS", "Detector", "RunLike", "register"]
