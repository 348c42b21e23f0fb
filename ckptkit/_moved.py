"""Old module paths that moved into the folders of their layers (issue 36), kept importable.

``import ckptkit.manager`` (or ``from ckptkit.sampler import ResumableSampler``) still works
for one release: it gives the module at its new path (the same module object, so
``isinstance`` and monkeypatching see one class) and a :class:`DeprecationWarning` naming
that path. ``ckptkit.dcp`` is a documented public path and stays without a warning. Names in
``ckptkit.__all__`` never moved: ``from ckptkit import CheckpointManager`` is the way to
import the API.

:data:`MOVES` is the one table of old and new paths: ``tools/move_modules.py`` moved the files
and rewrote every reference from it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

MOVES: dict[str, str] = {
    # format: what a checkpoint is on disk
    "ckptkit.manifest": "ckptkit.format.manifest",
    "ckptkit.records": "ckptkit.format.records",
    "ckptkit.signing": "ckptkit.format.signing",
    # storage: one name per file
    "ckptkit.storage.dcp": "ckptkit.storage.dcp_engine",
    # capture: live training objects as trees
    "ckptkit.sampler": "ckptkit.capture.resumable",
    "ckptkit.fit": "ckptkit.capture.fit",
    # checkpoint: writing and reading one checkpoint
    "ckptkit.commit": "ckptkit.checkpoint.commit",
    "ckptkit.io": "ckptkit.checkpoint.io",
    "ckptkit.dcp": "ckptkit.checkpoint.dcp",
    "ckptkit.lookahead": "ckptkit.checkpoint.lookahead",
    "ckptkit.replicas": "ckptkit.checkpoint.replicas",
    "ckptkit.perrank": "ckptkit.capture.perrank",
    "ckptkit.catalog": "ckptkit.checkpoint.catalog",
    "ckptkit.whatis": "ckptkit.checkpoint.whatis",
    "ckptkit.foreign.detect": "ckptkit.checkpoint.detect",
    "ckptkit.foreign._load": "ckptkit.checkpoint.safeload",
    # verify: judging a checkpoint from its bytes, ours or a framework's
    "ckptkit.foreign": "ckptkit.verify.foreign",
    "ckptkit.foreign._scan": "ckptkit.verify.foreign.scan",
    "ckptkit.foreign.dcp": "ckptkit.verify.foreign.distcp",
    "ckptkit.describe": "ckptkit.verify.describe",
    "ckptkit.statediff": "ckptkit.verify.statediff",
    # signals: what a running job observes about itself
    "ckptkit.rngtrace": "ckptkit.signals.rngtrace",
    "ckptkit.observe": "ckptkit.signals.observe",
    "ckptkit.recorder": "ckptkit.signals.recorder",
    "ckptkit.stability": "ckptkit.signals.stability",
    "ckptkit.guard": "ckptkit.signals.guard",
    "ckptkit.recovery_log": "ckptkit.signals.recovery_log",
    "ckptkit.recovery": "ckptkit.signals.recovery",
    # run: a run directory over time
    "ckptkit.rotation": "ckptkit.run.rotation",
    "ckptkit.retain": "ckptkit.run.retain",
    "ckptkit.restore": "ckptkit.run.restore",
    "ckptkit.trajectory": "ckptkit.run.trajectory",
    "ckptkit.manager": "ckptkit.run.manager",
    "ckptkit.saving": "ckptkit.run.saving",
    "ckptkit.preempt": "ckptkit.run.preempt",
    "ckptkit.runs": "ckptkit.run.directory",
    "ckptkit.layouts": "ckptkit.run.layouts",
    # integrations: what a training script or framework calls
    "ckptkit.drill.contract": "ckptkit.integrations.drill_env",
    # cli: commands and what they print
    "ckptkit.render": "ckptkit.cli.render",
    "ckptkit.watch": "ckptkit.cli.watch",
}
"""Old module path -> new one. A moved package's submodules follow it
(``ckptkit.layouts.hf`` is ``ckptkit.run.layouts.hf``)."""

STABLE = frozenset({"ckptkit.dcp"})
"""Old paths that are public API and stay without a warning."""

ATTRIBUTES = frozenset({("ckptkit.foreign", "detect")})
"""``(package, name)`` pairs where ``from package import name`` gives a function its
``__init__`` binds over a submodule of that name (the move rewrites the package only)."""


def new_path(name: str) -> str | None:
    """The new path of old module path ``name`` (a moved package's submodule included), or
    None when it did not move.

    Example:
        >>> new_path("ckptkit.layouts.hf"), new_path("ckptkit.verify")
        ('ckptkit.run.layouts.hf', None)
    """
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        head = ".".join(parts[:n])
        if head in MOVES:
            return ".".join([MOVES[head], *parts[n:]])
    return None


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolve an old module path to the module at its new one."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("ckptkit.") or new_path(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_path(spec.name)
        assert new is not None
        if not any(spec.name == s or spec.name.startswith(s + ".") for s in STABLE):
            warnings.warn(f"{spec.name} moved to {new}: import it from there (or its public "
                          "names from ckptkit); the old path goes in the next release",
                          DeprecationWarning, stacklevel=2)  # importlib's own frames are skipped
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path is already loaded."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would
    otherwise find nothing at an old path and fail.

    Example:
        >>> install(); sum(isinstance(f, _OldPaths) for f in sys.meta_path)
        1
    """
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
