"""ckptkit: trustworthy PyTorch training checkpoints."""

from ckptkit._version import __version__
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.progress import Progress
from ckptkit.capture.state import TrainState
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
from ckptkit.io import PartialLoad, load, save
from ckptkit.manager import CheckpointManager
from ckptkit.manifest import Manifest
from ckptkit.preempt import PreemptionGuard
from ckptkit.recorder import Recorder
from ckptkit.sampler import ResumableSampler
from ckptkit.stability import StabilityWatch
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
