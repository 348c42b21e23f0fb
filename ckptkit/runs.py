"""Run directories of every layout behind one interface: native ckptkit runs and framework runs.

The run-level commands (``ckptkit ls``, ``prune``, ``rollback``, ``verify RUN``, ``adopt
RUN``) and verified rotation work on a *run*: something that lists checkpoints with a
status (:class:`~ckptkit.catalog.CheckpointInfo`), verifies one from its bytes, removes one
safely and holds a lock — a :class:`~ckptkit.retain.RunStore` plus listing details.

A native run is a :class:`~ckptkit.CheckpointManager`'s directory. A framework keeps its
checkpoints in its own layout (a Trainer's ``checkpoint-N/``, a Lightning ``*.ckpt``);
an integration registers a detector with :func:`register` that recognises its run
directories and returns a :class:`Run` for them. :func:`open_run` asks the detectors in
order and falls back to the native layout.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ckptkit import retain
from ckptkit.catalog import CheckpointInfo
from ckptkit.codes import Finding
from ckptkit.manager import CheckpointManager
from ckptkit.storage import fs
from ckptkit.storage.fs import Location


@runtime_checkable
class Run(retain.RunStore, Protocol):
    """A run directory of some layout (see the module docstring)."""

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


Detector = Callable[[Location, dict[str, Any]], "Run | None"]
"""``detector(root, options) -> Run | None``: a run of this layout at ``root``, or None."""

DETECTORS: list[tuple[str, Detector]] = []
"""Registered layouts, asked in order by :func:`open_run`."""

BUILTIN_LAYOUTS: tuple[str, ...] = ("ckptkit.layouts.lightning",)
"""Modules of :mod:`ckptkit.layouts` that :func:`open_run` imports (each registers itself)."""

_loaded = False


def _load_builtin_layouts() -> None:
    """Import the built-in layout modules once (they register at import, like plugins)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for name in BUILTIN_LAYOUTS:
            importlib.import_module(name)


def register(name: str, detector: Detector) -> None:
    """Register a framework run layout (called by an integration at import time).

    Raises:
        ValueError: ``name`` is registered already.
    """
    if any(n == name for n, _ in DETECTORS):
        raise ValueError(f"run layout {name!r} is registered already")
    DETECTORS.append((name, detector))


class NativeRun:
    """A native run directory (a :class:`CheckpointManager`'s) as a :class:`Run`."""

    layout = "ckptkit"

    def __init__(self, root: Location, *, readonly: bool = True, **manager: Any) -> None:
        self.manager = CheckpointManager(root, readonly=readonly, **manager)

    @property
    def root(self) -> Location:
        return self.manager.root

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        return self.manager.checkpoints()

    def reverify(self, info: CheckpointInfo) -> builtins.list[Finding]:
        return self.manager.reverify(info)

    def remove(self, info: CheckpointInfo) -> bool:
        return self.manager.remove(info)

    def fence(self) -> None:
        self.manager.fence()

    def leftovers(self) -> builtins.list[Location]:
        return self.manager.leftovers()

    def close(self) -> None:
        self.manager.close()


def open_run(root: str | Location, **options: Any) -> Run:
    """The run at ``root``: the first registered framework layout that recognises it, else
    the native layout.

    Example:
        >>> import tempfile
        >>> open_run(tempfile.mkdtemp()).layout
        'ckptkit'
    """
    _load_builtin_layouts()
    loc = fs.location(root)
    for _name, detect in DETECTORS:
        run = detect(loc, dict(options))
        if run is not None:
            return run
    return NativeRun(loc, **options)


__all__ = ["BUILTIN_LAYOUTS", "DETECTORS", "Detector", "NativeRun", "Run", "open_run", "register"]
