"""torchtitan run directories: a ``CheckpointManager``'s ``checkpoint/step-N/`` folders.

torchtitan (``torchtitan.components.checkpoint.CheckpointManager``) saves each checkpoint
with ``torch.distributed.checkpoint`` into ``<dump_folder>/<checkpoint.folder>/step-N/``
(``N`` the training step, no zero padding): ``.metadata`` and one ``__R_I.distcp`` per
rank, or, for a last step saved with ``last_save_in_hf``, Hugging Face safetensors and
``model.safetensors.index.json``. Its own resume takes the highest ``N`` whose folder holds
``.metadata`` (or that index), and nothing else: this layout reads the same files (neither
torchtitan nor torch.distributed is imported), so ``ckptkit ls``, ``verify``, ``prune``,
``rollback`` and ``drill`` work on such a folder.

A checkpoint's status, without reading file contents (as :mod:`ckptkit.run.layouts.hf`):

``verified``
    its manifest (``step-N/ckptkit-manifest.json``: written at save by
    :class:`ckptkit.dcp.Writer` through :mod:`ckptkit.integrations.torchtitan`, or by
    ``ckptkit adopt``) is valid and every file it lists is there at its recorded size;
``committed``
    ``.metadata`` is there but no manifest (saved by plain torchtitan: ``ckptkit adopt
    RUN`` records digests);
``corrupt``
    a file the manifest lists is missing or resized (a truncated ``.distcp``), or a verify
    of its bytes failed (recorded in the run index);
``incomplete``
    no ``.metadata``: DCP writes it last, so the save was interrupted.

What a step must hold is inferred from its content: a full step (model, ``optimizer``,
``lr_scheduler``, ``dataloader``, ``train_state``) is checked as a training checkpoint, a
model-only step (torchtitan's default last step, ``last_save_model_only``; the seed
checkpoint ``step-0``) as weights.

The run lock and the run index (``.ckptkit.lock``, ``.ckptkit-index.json``) live in the
checkpoint folder beside ``step-N/``: torchtitan's own listing only looks at names holding
``step-<digits>``. Deleting a step removes ``.metadata`` first (torchtitan then no longer
sees it as a checkpoint), then the manifest, then renames the folder aside and removes it,
so a crash mid-delete never leaves a folder either torchtitan or ckptkit would load.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckptkit.checkpoint.catalog import STEP_RE, Catalog, CheckpointInfo
from ckptkit.checkpoint.detect import detect as foreign_format
from ckptkit.checkpoint.safeload import read_dcp_metadata
from ckptkit.format.manifest import Manifest
from ckptkit.run import Run
from ckptkit.run.layout import Index
from ckptkit.run.layouts.hf import _HFLayout
from ckptkit.run.registry import register
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.scan import ADOPTED_SUFFIX
from ckptkit.verify.view import Expect

NAME = "torchtitan"
"""The layout's name (``ckptkit ls`` shows it)."""
METADATA = ".metadata"
"""DCP's metadata file: written last by a save, torchtitan's test of a whole checkpoint."""
HF_INDEX = "model.safetensors.index.json"
"""What a ``last_save_in_hf`` step holds instead of ``.metadata`` (torchtitan's other test)."""
DEFAULT_FOLDER = "checkpoint"
"""torchtitan's default ``checkpoint.folder`` under the dump folder."""
TRAINING_STATES = ("optimizer", "lr_scheduler", "dataloader", "train_state")
"""The states besides the model a torchtitan ``Trainer`` saves in a full step."""


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step-N`` folder of ``root``, by step.

    Names are matched whole (:data:`ckptkit.checkpoint.catalog.STEP_RE`): a folder renamed aside
    (``step-20.ckptkit-tmp.del-…``) is never a checkpoint.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "step-20").mkdir(); (d / "step-5").mkdir()
        >>> [n for n, _ in step_dirs(d)]
        [5, 20]
    """
    out = []
    with contextlib.suppress(OSError):
        for p in root.iterdir():
            m = STEP_RE.match(p.name)
            if m and p.is_dir() and not p.is_symlink():
                out.append((int(m.group(1)), p))
    return sorted(out)


def complete(path: Path) -> bool:
    """Whether torchtitan counts folder ``path`` as a checkpoint (its ``_find_load_step``).

    Example:
        >>> import tempfile
        >>> complete(Path(tempfile.mkdtemp()))
        False
    """
    return (path / METADATA).is_file() or (path / HF_INDEX).is_file()


def holds_any(path: Path, names: Iterable[str]) -> bool | None:
    """Whether step folder ``path`` holds any of the top-level states ``names`` (a DCP key
    ``name`` or ``name.…``, as ``dcp.save`` flattens a state), from its ``.metadata``
    (read with the restricted unpickler); a ``last_save_in_hf`` step holds none. None when
    it cannot tell (no readable ``.metadata``: its verify says why).

    A step > 0 that holds none of :data:`TRAINING_STATES` is model-only (torchtitan's
    ``last_save_model_only``): torchtitan's load of it asks for them and fails.

    Example:
        >>> import tempfile
        >>> holds_any(Path(tempfile.mkdtemp()), TRAINING_STATES) is None
        True
    """
    wanted = tuple(names)
    if not (path / METADATA).is_file():
        return False if (path / HF_INDEX).is_file() else None
    md, _ = read_dcp_metadata(path / METADATA)
    keys = getattr(md, "state_dict_metadata", None)
    if not isinstance(keys, dict):
        return None
    return any(k == n or k.startswith(n + ".") for k in keys for n in wanted)


def _is_titan_step(path: Path) -> bool:
    """A ``step-N`` folder torchtitan wrote (DCP or HF files), or one ckptkit manifested."""
    return (
        foreign_format(path) in ("dcp", "safetensors")
        or (path / ADOPTED_SUFFIX).is_file()
    )


def detect(root: Location) -> Path | None:
    """The folder holding the ``step-N`` checkpoints of a torchtitan run at ``root``.

    ``root`` is the checkpoint folder itself, or the dump folder holding ``checkpoint/``.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoint" / "step-10").mkdir(parents=True)
        >>> _ = (d / "checkpoint" / "step-10" / ".metadata").write_bytes(b"")
        >>> detect(d) == d / "checkpoint"
        True
    """
    p = fs.local_path(root)  # the layout reads local files (as the HF layouts)
    if p is None or not p.is_dir():
        return None
    for where in (p, p / DEFAULT_FOLDER):
        if any(_is_titan_step(d) for _, d in step_dirs(where)):
            return where
    return None


class TorchtitanLayout(_HFLayout):
    """A torchtitan checkpoint folder: ``step-N/`` with ``N`` the training step.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "step-5").mkdir()
        >>> with Run(d, TorchtitanLayout()) as run:
        ...     [(c.step, c.status) for c in run.checkpoints()]
        [(5, 'incomplete')]
    """

    name = NAME
    expect: Expect | None = None  # inferred per step: a full step is training state, a model-only one weights

    def entries(self, root: Location) -> builtins.list[tuple[int, Path]]:
        return step_dirs(self.local(root))

    def meta(self, root: Location) -> Location:
        return root

    def finished(self, p: Path) -> bool:
        return complete(p)

    @property
    def marker(self) -> str:
        return METADATA

    def format_of(self, path: Location) -> str | None:
        return foreign_format(self.local(path)) or "dcp"

    def _step(self, p: Path, man: Manifest | None, catalog: Catalog, index: Index) -> int | None:
        m = STEP_RE.match(p.name)
        return int(m.group(1)) if m else None

    def remove(self, root: Location, path: Location) -> bool:
        """Delete ``step-N`` so that neither torchtitan nor ckptkit ever loads it
        half-deleted: ``.metadata`` goes first (torchtitan's whole-checkpoint test), then
        the manifest (ckptkit's), then the rest (renamed aside first, locally)."""
        if fs.kind(path) is None:
            return False
        for marker in (METADATA, HF_INDEX):
            fs.remove_file(path / marker)
        return fs.remove_dir_aside(path, marker=ADOPTED_SUFFIX, aside=f"{atomic.TMP_SUFFIX}.del-")

    def resume_hint(self, info: CheckpointInfo) -> str:
        if info.step > 0 and holds_any(self.local(info.path), TRAINING_STATES) is False:
            return (
                f"none: step-{info.step} holds the model only (last_save_model_only), which "
                "torchtitan cannot resume training from; to start a new run from its "
                "weights, move it out of the folder and name it in "
                "checkpoint.initial_load_path"
            )
        return (
            f"checkpoint.load_step={info.step} (torchtitan; with the ckptkit integration "
            "the newest step that verifies is loaded by default)"
        )


def open_torchtitan(root: str | Path, **options: Any) -> Run:
    """The :class:`~ckptkit.run.Run` of a torchtitan checkpoint folder (``options``: as
    :class:`~ckptkit.run.Run`).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "step-5").mkdir()
        >>> with open_torchtitan(d) as run:
        ...     [(c.step, c.status) for c in run.checkpoints()]
        [(5, 'incomplete')]
    """
    return Run(root, TorchtitanLayout(), **options)


def open_torchtitan_run(root: Location, options: dict[str, Any]) -> Run | None:
    """The :func:`ckptkit.run.registry.register` detector."""
    where = detect(root)
    return None if where is None else open_torchtitan(where, **options)


register(NAME, open_torchtitan_run)

__all__ = [
    "DEFAULT_FOLDER",
    "HF_INDEX",
    "METADATA",
    "NAME",
    "TRAINING_STATES",
    "TorchtitanLayout",
    "complete",
    "detect",
    "holds_any",
    "open_torchtitan",
    "open_torchtitan_run",
    "step_dirs",
]
