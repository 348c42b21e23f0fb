"""ckptkit: trustworthy PyTorch training checkpoints."""

from ckptkit._version import __version__
from ckptkit.errors import (
    CheckpointExistsError,
    CkptkitError,
    DrillError,
    IncompleteCheckpointError,
    IntegrityError,
    LockHeldError,
    ManifestError,
    StateError,
    UnsafeInputError,
)
from ckptkit.io import load, save
from ckptkit.manifest import Manifest
from ckptkit.verify import verify

__all__ = [
    "CheckpointExistsError",
    "CkptkitError",
    "DrillError",
    "IncompleteCheckpointError",
    "IntegrityError",
    "LockHeldError",
    "Manifest",
    "ManifestError",
    "StateError",
    "UnsafeInputError",
    "__version__",
    "load",
    "save",
    "verify",
]
