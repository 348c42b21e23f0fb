"""The module paths users imported before the folders followed the layers still work.

Each old path (``ckptkit/_moved.py``) imports, in a fresh interpreter, the very module at its
new path, with a DeprecationWarning that names the new path (``ckptkit.dcp``, public API,
without one); every name of ``ckptkit.__all__`` is still there. This file names the old
paths on purpose: ``tools/move_modules.py`` leaves it alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ckptkit
from ckptkit import _moved

DOCUMENTED = [
    "ckptkit.manager", "ckptkit.sampler", "ckptkit.recorder", "ckptkit.stability",
    "ckptkit.manifest", "ckptkit.io", "ckptkit.dcp", "ckptkit.guard", "ckptkit.runs",
    "ckptkit.foreign", "ckptkit.foreign.detect", "ckptkit.layouts.hf",
    "ckptkit.drill.contract", "ckptkit.statediff", "ckptkit.preempt", "ckptkit.render.text",
]
"""Old paths the docs, examples or user reports named (the test imports every old path)."""

PROBE = r"""
import importlib, json, sys, warnings
out = {}
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(f"import {old}")  # a plain import statement, as a user's script has
    moved = [w for w in seen if issubclass(w.category, DeprecationWarning)
             and "moved to" in str(w.message)]
    out[old] = {
        "same": sys.modules[old] is importlib.import_module(new),
        "warnings": [str(w.message) for w in moved],
        "where": sorted({w.filename for w in moved}),
    }
print(json.dumps(out))
"""


def test_every_documented_old_path_is_in_the_table() -> None:
    assert all(_moved.new_path(p) for p in DOCUMENTED)


def test_every_old_path_imports_the_module_at_its_new_path() -> None:
    """One fresh interpreter imports every old path in turn (an old package before its
    old submodules: ``ckptkit.layouts`` warns once, then ``ckptkit.layouts.hf`` once)."""
    table = {old: _moved.new_path(old) for old in sorted({*_moved.MOVES, *DOCUMENTED})}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(table)], capture_output=True,
                       text=True, timeout=300, check=True)
    found = json.loads(r.stdout.strip().splitlines()[-1])
    for old, new in table.items():
        got = found[old]
        assert got["same"], old
        if old == "ckptkit.dcp":
            assert got["warnings"] == [], got  # public API: no warning
        else:
            assert len(got["warnings"]) == 1 and new in got["warnings"][0], (old, got)
            assert got["where"] == ["<string>"], (old, got)  # at the importing line


def test_from_imports_of_old_paths_give_the_same_objects() -> None:
    for old in ("ckptkit.manager", "ckptkit.sampler"):
        sys.modules.pop(old, None)  # imported earlier in this process: import it afresh
    with pytest.warns(DeprecationWarning, match="ckptkit.run.manager"):
        from ckptkit.manager import CheckpointManager
    assert CheckpointManager is ckptkit.CheckpointManager
    with pytest.warns(DeprecationWarning):
        from ckptkit.sampler import ResumableSampler
    assert ResumableSampler is ckptkit.ResumableSampler


def test_the_public_names_are_unchanged() -> None:
    assert sorted(ckptkit.__all__) == sorted([
        "CheckpointExistsError", "CheckpointManager", "CkptkitError", "CommittedError",
        "DrillError", "IncompleteCheckpointError", "IntegrityError", "LockHeldError",
        "Manifest", "ManifestError", "NotWritableError", "ParallelConfig", "PartialLoad",
        "PreemptionGuard", "Progress", "Recorder", "ReplicaDivergenceError",
        "ResumableSampler", "SignatureError", "StabilityWatch", "StateError", "TrainState",
        "UnreadableError", "UnsafeInputError", "__version__", "load", "save", "verify",
    ])
    for name in ckptkit.__all__:
        assert getattr(ckptkit, name) is not None
