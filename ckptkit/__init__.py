"""ckptkit: trustworthy PyTorch training checkpoints."""

import importlib

from ckptkit import _moved
from ckptkit._version import __version__
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.progress import Progress
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint.io import PartialLoad, load, save
from ckptkit.errors import (
    CheckpointExistsError,
    CkptkitError,
    CommittedError,
    DrillError,
    IncompleteCheckpointError,
    IntegrityError,
    LockHeldError,
    ManifestError,
    NotWritableError,
    ReplicaDivergenceError,
    SignatureError,
    StateError,
    UnreadableError,
    UnsafeInputError,
)
from ckptkit.format.manifest import Manifest
from ckptkit.run.manager import CheckpointManager
from ckptkit.run.preempt import PreemptionGuard
from ckptkit.signals.recorder import Recorder
from ckptkit.signals.stability import StabilityWatch
from ckptkit.verify.runner import verify

__all__ = [
    "CheckpointExistsError",
    "CheckpointManager",
    "CkptkitError",
    "CommittedError",
    "DrillError",
    "IncompleteCheckpointError",
    "IntegrityError",
    "LockHeldError",
    "Manifest",
    "ManifestError",
    "NotWritableError",
    "ParallelConfig",
    "PartialLoad",
    "PreemptionGuard",
    "Progress",
    "Recorder",
    "ReplicaDivergenceError",
    "ResumableSampler",
    "SignatureError",
    "StabilityWatch",
    "StateError",
    "TrainState",
    "UnreadableError",
    "UnsafeInputError",
    "__version__",
    "load",
    "save",
    "verify",
]

_moved.install()  # the old module paths (_moved.MOVES) keep working for one release


def __getattr__(name: str) -> object:
    """``ckptkit.dcp`` after a plain ``import ckptkit``: the public module paths of
    :data:`ckptkit._moved.STABLE` resolve as attributes too."""
    if f"ckptkit.{name}" in _moved.STABLE:
        return importlib.import_module(f"ckptkit.{name}")
    raise AttributeError(f"module 'ckptkit' has no attribute {name!r}")
