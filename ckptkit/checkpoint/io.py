"""``ckptkit.save`` / ``ckptkit.load``: the safe, verified twin of torch.save / torch.load.

Nested state (dicts, lists, tuples, tensors, int/float/str/bool/None, numpy arrays)
goes to safetensors files plus a JSON manifest with a digest per file. No pickle is
written or read on any path; every byte is verified while it is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import torch

from ckptkit._repr import short
from ckptkit.capture.fit import FitReport
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint import commit, lookahead, manifest_io
from ckptkit.checkpoint.read import read_checkpoint
from ckptkit.checkpoint.whatis import not_a_checkpoint
from ckptkit.format import manifest as mf
from ckptkit.format import signing
from ckptkit.format.manifest import Manifest
from ckptkit.storage import codec, shards


def save(
    state: Any,
    path: str | Path,
    *,
    compress: codec.Compression | None = None,
    shard_bytes: int = shards.DEFAULT_SHARD_BYTES,
    overwrite: bool = True,
    step: int | None = None,
    progress: bool | None = None,
    user: dict[str, Any] | None = None,
    key: signing.KeyLike | None = None,
) -> Manifest:
    """Save nested ``state`` as a checkpoint directory at ``path``, atomically.

    Tensors are written to safetensors files (one group per top-level key, split into
    shards past ``shard_bytes``), everything else as JSON in ``manifest.json``, which is
    written last. Tensors reachable twice (tied weights) are stored once and come back
    shared. A crash leaves the previous checkpoint at ``path`` or the new one, never a
    mix.

    Args:
        state: what to save; a :class:`~ckptkit.TrainState` is captured whole, as
            :meth:`CheckpointManager.save` captures it (with the look-ahead of its next
            step, which the resume guard checks), into this one directory.
        path: the checkpoint directory (created; its parent too).
        compress: ``"zstd"`` for streaming multithreaded compression of each file.
        shard_bytes: the largest file before a group is split.
        overwrite: replace an existing ckptkit checkpoint at ``path`` (like torch.save);
            a directory that is not a checkpoint is never replaced.
        step: training step to record in the manifest, an int with
            ``0 <= step < 2**53`` (default: ``state["step"]`` when ``state`` is a mapping
            whose top-level ``"step"`` is such an integer, as in
            ``save({"model": ..., "step": 1000}, path)``).
        progress: show a progress bar (default: on a terminal, for big saves).
        user: free-form JSON metadata stored in the manifest.
        key: HMAC key to sign the manifest with (default: ``CKPTKIT_HMAC_KEY`` or
            ``CKPTKIT_HMAC_KEY_FILE``, else unsigned); see docs/security.md.

    Returns:
        The :class:`~ckptkit.format.manifest.Manifest` written.

    Raises:
        StateError: an object in ``state`` cannot be stored without pickle, or ``step``
            is not a valid step (nothing is written).
        CheckpointExistsError: ``path`` holds data that is not a ckptkit checkpoint.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp() + "/ckpt"
        >>> m = ckptkit.save({"model": {"w": torch.ones(2)}, "step": 3}, d)
        >>> [f.path for f in m.files], m.step
        (['model.safetensors'], 3)
    """
    if isinstance(state, TrainState):
        return _save_train_state(state, path, compress=compress, overwrite=overwrite, step=step,
                                 user=user, key=signing.resolve_key(key))
    step = _step_of(state) if step is None else mf.check_step(step)
    return commit.save_tree(
        state,
        path,
        compress=compress,
        shard_bytes=shard_bytes,
        overwrite=overwrite,
        step=step,
        progress=progress,
        manifest_fields={"user": user} if user is not None else None,
        key=signing.resolve_key(key),
    )


def _save_train_state(
    state: TrainState,
    path: str | Path,
    *,
    compress: codec.Compression | None,
    overwrite: bool,
    step: int | None,
    user: dict[str, Any] | None,
    key: bytes | None,
) -> Manifest:
    """``save`` of a whole TrainState: the manager's capture and commit, without its run.

    Like every save path, it records the look-ahead of the next step
    (:func:`ckptkit.checkpoint.lookahead.record`, the one the resume guard checks), so a
    resume from it is checked as one from the manager is.
    """
    at = state.step if step is None else mf.check_step(step)
    fields: dict[str, Any] = {}
    fields["lookahead"] = lookahead.record(state, step=at)
    if user is not None:
        fields["user"] = user
    man = commit.save_state(state, path, step=at, fields=fields, compress=compress,
                            overwrite=overwrite, key=key)
    assert man is not None  # one process: this rank commits
    return man


def _step_of(state: Any) -> int | None:
    """The step a plain ``save`` records: an integer ``state["step"]`` that is a valid step
    (:func:`ckptkit.format.manifest.is_step`; a bool, a negative or a huge value is no step)."""
    value = state.get("step") if isinstance(state, Mapping) else None
    return mf.check_step(value) if mf.is_step(value) else None


@dataclass(frozen=True)
class PartialLoad:
    """What ``load(..., into=..., strict=False)`` returns: the state and what was loaded."""

    state: Any
    """The loaded object (sharing the ``into`` tensors that received bytes)."""
    report: FitReport
    """Which tensors were loaded, missing, unexpected or of another shape/dtype."""

    def __repr__(self) -> str:
        return f"PartialLoad(state={short(self.state)}, report={self.report!r})"


@overload
def load(
    path: str | Path,
    map_location: str | torch.device | None = ...,
    *,
    into: Any = ...,
    strict: Literal[True] = ...,
    progress: bool | None = ...,
    max_bytes: int | None = ...,
    key: signing.KeyLike | None = ...,
) -> Any: ...


@overload
def load(
    path: str | Path,
    map_location: str | torch.device | None = ...,
    *,
    into: Any = ...,
    strict: Literal[False],
    progress: bool | None = ...,
    max_bytes: int | None = ...,
    key: signing.KeyLike | None = ...,
) -> PartialLoad: ...


def load(
    path: str | Path,
    map_location: str | torch.device | None = "cpu",
    *,
    into: Any = None,
    strict: bool = True,
    progress: bool | None = None,
    max_bytes: int | None = None,
    key: signing.KeyLike | None = None,
) -> Any:
    """Load a checkpoint saved by :func:`save`, verifying every byte as it is read.

    Args:
        path: the checkpoint directory.
        map_location: device of the returned tensors.
        into: an object shaped like (part of) the saved state, e.g. ``{"model":
            model.state_dict()}``; its tensors receive the bytes (in place on the CPU,
            without a second copy of the state in RAM) and the returned object shares
            them. If an integrity error is raised, those tensors may already hold damaged
            bytes: load another checkpoint into them.
        strict: with ``into``: refuse, before reading anything, any tensor of ``into``
            without a saved counterpart, any saved tensor inside a mapping of ``into``
            without a counterpart there, and any shape or dtype mismatch, each named
            (``CK-R010``). ``strict=False`` loads what fits, leaves the rest untouched,
            and returns :class:`PartialLoad` (the state and a report of what was and was
            not loaded): the mode for fine-tuning from a checkpoint of another head or
            loading weights into a changed model on purpose.
        progress: show a progress bar (default: on a terminal, for big loads).
        max_bytes: refuse checkpoints declaring more tensor bytes (default: physical RAM).
        key: HMAC key the manifest must be signed with (default: ``CKPTKIT_HMAC_KEY`` or
            ``CKPTKIT_HMAC_KEY_FILE``, else none: a signature is then not checked).

    Returns:
        The saved object, with its container types, shared tensors and scalars; with
        ``into`` and ``strict=False``, a :class:`PartialLoad`.

    Raises:
        IncompleteCheckpointError: ``path`` does not exist or is not one checkpoint (a
            run directory: the message lists its checkpoints), no manifest
            (``CK-M001``), or a listed file missing (``CK-F001``).
        ManifestError: the manifest is malformed (``CK-M002/3/4/7/9``).
        UnsafeInputError: hostile manifest (``CK-M005/6/8``), decompression bomb
            (``CK-F008``), a listed file that is a symlink (``CK-F009``) or not a regular
            file (``CK-F022``).
        IntegrityError: size (``CK-F002``), digest (``CK-F003``) or header
            (``CK-F004/5``) mismatch.
        SignatureError: a key was given and the manifest is unsigned (``CK-M010``) or
            not signed with it (``CK-M011``).
        StateError: ``CK-R010`` the tensors of ``into`` do not fit (``strict``).

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp() + "/ckpt"
        >>> _ = ckptkit.save({"model": {"w": torch.arange(3.0), "b": torch.zeros(1)}}, d)
        >>> ckptkit.load(d)["model"]["w"].tolist()
        [0.0, 1.0, 2.0]
        >>> live = {"model": {"w": torch.zeros(3), "head": torch.zeros(2)}}
        >>> ckptkit.load(d, into=live)
        Traceback (most recent call last):
        ...
        ckptkit.errors.StateError: CK-R010 ...: the tensors to load into do not fit the checkpoint: 1 missing from the checkpoint (model/head); 1 in the checkpoint but not here (model/b). Fix: ...
        >>> r = ckptkit.load(d, into=live, strict=False).report
        >>> r.loaded, r.missing, live["model"]["w"].tolist()
        (['model/w'], ['model/head'], [0.0, 1.0, 2.0])
    """
    wrong = not_a_checkpoint(path)
    if wrong is not None:
        raise wrong
    k = signing.resolve_key(key)
    obj, _, fit = read_checkpoint(
        path,
        manifest=manifest_io.read(path, key=k),
        key=k,
        targets_from=into,
        strict=strict,
        map_location=map_location,
        progress=progress,
        max_bytes=max_bytes,
    )
    if into is not None and not strict:
        assert fit is not None
        return PartialLoad(obj, fit)
    return obj
