"""Finding codes for foreign checkpoints (Trainer, Accelerate, Lightning, DCP, torch.save).

Registered in the one code registry (:mod:`ckptkit.verify.findings`) and documented in
docs/verify-codes.md. Foreign reports also reuse native codes where the meaning is the same:
``CK-F001``/``CK-F002``/``CK-F003``/``CK-F006`` for drift against an adopted manifest and
``CK-S010``/``CK-S011`` for NaN/Inf in model/optimizer tensors.
"""

from __future__ import annotations

from ckptkit.errors import IncompleteCheckpointError, UnsafeInputError
from ckptkit.verify.findings import ERROR, INFO, WARNING, register_code

ADOPT = "run 'ckptkit adopt PATH' on a known-good copy so later verifies can detect corruption"
RESTORE = "restore the file from a replica, or resume from an earlier checkpoint"

register_code(
    "CK-F101",
    family="integrity",
    severity=ERROR,
    title="zip archive CRC mismatch",
    hint="a byte changed after the save (torch.load would not notice); " + RESTORE,
)
register_code(
    "CK-F102",
    family="integrity",
    severity=ERROR,
    title="torch file truncated or not a valid archive",
    hint="the file is cut short or damaged (interrupted copy, disk full); " + RESTORE,
)
register_code(
    "CK-F103",
    family="integrity",
    severity=WARNING,
    title="pickle needs code to load: not read",
    hint="ckptkit loads with weights_only=True and a narrow allow-list and never runs "
    "pickled code; the file could not be checked. Re-save that state as plain tensors/dicts "
    "if it matters for resume",
    error_class=UnsafeInputError,
)
register_code(
    "CK-F104",
    family="integrity",
    severity=ERROR,
    title="safetensors header or size inconsistent with file length",
    hint="the weights file is truncated or damaged; " + RESTORE,
)
register_code(
    "CK-F105",
    family="integrity",
    severity=ERROR,
    title="DCP shard missing",
    hint="a .distcp file named in .metadata is absent (partial copy, lost rank); "
    "torch.distributed.checkpoint.load would raise CheckpointException. " + RESTORE,
    error_class=IncompleteCheckpointError,
)
register_code(
    "CK-F106",
    family="integrity",
    severity=ERROR,
    title="DCP shard smaller than its items",
    hint="a .distcp file ends before the byte ranges .metadata records (truncated copy); "
    + RESTORE,
)
register_code(
    "CK-F107",
    family="integrity",
    severity=WARNING,
    title="no digests: silent corruption cannot be detected",
    hint=ADOPT,
)
register_code(
    "CK-F108",
    family="integrity",
    severity=ERROR,
    title="foreign file unreadable",
    hint="the file is damaged or not what its name says; " + RESTORE,
)
register_code(
    "CK-C101",
    family="completeness",
    severity=ERROR,
    title="resume-critical state missing from a foreign checkpoint",
    hint="resume from a checkpoint that has it, or save it (the message says what the tool "
    "does without it)",
)
register_code(
    "CK-C102",
    family="completeness",
    severity=WARNING,
    title="no data-loader position in a foreign checkpoint",
    hint="on resume the data order restarts or replays samples; save the loader state "
    "(torchdata StatefulDataLoader, or ckptkit.sampler.ResumableSampler)",
)
register_code(
    "CK-C103",
    family="completeness",
    severity=WARNING,
    title="no RNG state in a foreign checkpoint",
    hint="resume runs on fresh RNG streams (dropout, shuffling, augmentation differ); "
    "save torch/numpy/python RNG state per rank",
    component="rng",
)
register_code(
    "CK-C104",
    family="completeness",
    severity=INFO,
    title="content not recognised",
    hint="ckptkit did not map these keys/files to a spec component; rename them to a common "
    "key (model, optimizer, scheduler, scaler, step, rng, sampler) or ignore this if they "
    "are not resume state",
)
