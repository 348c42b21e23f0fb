"""Lightning run directories: a ``checkpoints/`` directory of ``*.ckpt`` files, as a Run.

Lightning's ``ModelCheckpoint`` (and a Fabric script calling ``fabric.save``) writes one
file per checkpoint: ``epoch=0-step=40.ckpt`` (the default name: the step is in it),
names of the user's own template, and ``last.ckpt`` (Lightning's moving resume pointer,
rewritten at every save). Beside each file :mod:`ckptkit.integrations.lightning` (or
``ckptkit adopt``) keeps its digests and component table
(``<file>.ckptkit-manifest.json``); the run (:class:`ckptkit.run.Run`) keeps the run index (``.ckptkit-index.json``:
verify outcomes) and the run lock (``.ckptkit.lock``: one writer). Files only: Lightning is
not imported, so ``ckptkit ls`` works where it is not installed.

How a file maps to a checkpoint of the run:

* its step is ``step=N`` in its name, else the step its adopted manifest records, else
  ``global_step`` read from the file (``torch.load(weights_only=True)``: nothing runs);
* steps are unique in a run: when several files hold one step (``last.ckpt`` beside
  ``epoch=0-step=40.ckpt``, a ``-v1`` copy), the run lists one (a named file before
  ``last``, then the newest) and the others are never deleted by rotation;
* ``last*.ckpt`` listed on its own (no other file holds its step) is pinned ``last``:
  ``fit(ckpt_path="last")`` needs it;
* its status: ``verified`` when the index records a passing verify of this exact file
  (the adopted manifest's digest, or the file's identity when it has none) and the file
  still has the adopted size; ``corrupt`` when that verify failed; else ``committed``.

Example:
    >>> import tempfile, pathlib, torch
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "checkpoints"; d.mkdir()
    >>> torch.save({"state_dict": {}, "global_step": 4, "pytorch-lightning_version": "2"},
    ...            d / "epoch=0-step=4.ckpt")
    >>> run = open_lightning(d)
    >>> [(c.step, c.path.name, c.status) for c in run.checkpoints()]
    [(4, 'epoch=0-step=4.ckpt', 'committed')]
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptkit.checkpoint.catalog import Catalog, CheckpointInfo, Status, refused_status
from ckptkit.checkpoint.safeload import safe_torch_load
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format.records import health_level
from ckptkit.run import Run
from ckptkit.run.framework import FrameworkLayout
from ckptkit.run.layout import Index
from ckptkit.run.registry import register
from ckptkit.storage import fs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.adopted import (
    adopted_path,
    load_adopted,
    needs_code_problem,
    unverifiable,
)
from ckptkit.verify.foreign.scan import ADOPTED_SUFFIX

log = logging.getLogger("ckptkit")

LAYOUT = "lightning"
"""The name this layout registers under (:func:`ckptkit.run.registry.register`)."""
SUFFIX = ".ckpt"
"""Lightning's checkpoint file extension."""
CHECKPOINTS_DIR = "checkpoints"
"""Where a Lightning logger version directory keeps its checkpoints."""
_STEP_IN_NAME = re.compile(r"(?:\A|[-_/])step=([0-9]{1,19})(?!\d)")
"""``step=N`` in a file name: ASCII digits only (``\\d`` and ``int()`` take any Unicode
digit), not followed by any other digit, at most 19 (a longer number is no step:
``int()`` of thousands of digits raises)."""
_LAST = re.compile(r"\Alast(?:-v[0-9]+)?\.ckpt\Z")


def step_in_name(name: str) -> int | None:
    """The step a Lightning file name carries (``step=N``), or None.

    Example:
        >>> step_in_name("epoch=1-step=120.ckpt"), step_in_name("last.ckpt")
        (120, None)
    """
    m = _STEP_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def is_last(name: str) -> bool:
    """Whether ``name`` is Lightning's ``last.ckpt`` (or a ``last-vN.ckpt`` copy).

    Example:
        >>> is_last("last.ckpt"), is_last("last-v1.ckpt"), is_last("epoch=0-step=4.ckpt")
        (True, True, False)
    """
    return bool(_LAST.match(name))


def ckpt_files(root: Path) -> list[Path]:
    """The ``*.ckpt`` regular files directly under ``root`` (symlinks are aliases: skipped).

    Example:
        >>> import tempfile, pathlib
        >>> ckpt_files(pathlib.Path(tempfile.mkdtemp()))
        []
    """
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    return sorted(
        Path(e.path)
        for e in entries
        if e.name.endswith(SUFFIX) and not e.name.startswith(".") and e.is_file(follow_symlinks=False)
    )


class LightningLayout(FrameworkLayout):
    """A Lightning ``checkpoints/`` directory of ``*.ckpt`` files (see the module docstring).

    Example:
        >>> import tempfile
        >>> from ckptkit.run import Run
        >>> with Run(tempfile.mkdtemp(), LightningLayout()) as run:
        ...     run.layout, run.checkpoints()
        ('lightning', [])
    """

    name = LAYOUT

    def __init__(self) -> None:
        self._steps: dict[str, tuple[tuple[Any, ...] | None, int | None]] = {}
        """Steps read from files, by name, for the file identity they were read from."""

    def meta(self, root: Location) -> Location:
        return root

    def checkpoints(self, root: Location, catalog: Catalog, index: Index) -> builtins.list[CheckpointInfo]:
        """One checkpoint per step, oldest first (see the module docstring)."""
        raw_rec, raw_pins = index.get("verified"), index.get("pins")
        records: Mapping[str, Any] = raw_rec if isinstance(raw_rec, dict) else {}
        pins: Mapping[str, Any] = raw_pins if isinstance(raw_pins, dict) else {}
        by_step: dict[int, list[CheckpointInfo]] = {}
        for f in ckpt_files(self.local(root)):
            try:
                info = self._info(f, catalog, records.get(f.name), pins.get(f.name))
            except FileNotFoundError:
                continue  # rotated away while we looked
            if info is not None:
                by_step.setdefault(info.step, []).append(info)
        out = []
        for infos in by_step.values():
            infos.sort(key=lambda c: (not is_last(c.path.name), c.time, c.path.name))
            chosen = infos[-1]
            if is_last(chosen.path.name) and "last" not in chosen.pins:
                chosen = replace(chosen, pins=tuple(sorted({*chosen.pins, "last"})))
            out.append(chosen)
        return sorted(out, key=lambda c: c.step)

    def step_of(self, path: Location, catalog: Catalog, index: Index) -> int | None:
        f = self.local(path)
        man, _bad, _ = _read_adopted(f, catalog.key)  # another key's step is no step
        return self._step(f, man)

    def identity(self, path: Location, catalog: Catalog) -> str | None:
        """The adopted manifest's digest, else the file's identity (inode, size, mtime);
        None when the file is gone."""
        f = self.local(path)
        man, _bad, _ = _read_adopted(f, None)
        return _identity(f, man)

    def remove(self, root: Location, path: Location) -> bool:
        """Delete one file and its adopted manifest (the file first: a lone manifest is a
        leftover, never a checkpoint); False when it was gone."""
        p = self.local(path)
        try:
            p.unlink()
            gone = True
        except FileNotFoundError:
            gone = False
        with contextlib.suppress(FileNotFoundError):
            adopted_path(p).unlink()
        with contextlib.suppress(OSError):
            fs.sync_dir(fs.location(p.parent))
        return gone

    def leftovers(self, root: Location) -> builtins.list[Location]:
        """Adopted manifests whose file is gone, and half-written ones."""
        d = self.local(root)
        out: list[Location] = []
        try:
            names = os.listdir(d)
        except OSError:
            return []
        for n in sorted(names):
            p = d / n
            if n.endswith(f"{SUFFIX}.{ADOPTED_SUFFIX}"):
                if not (d / n[: -len(ADOPTED_SUFFIX) - 1]).exists():
                    out.append(fs.location(p))
            elif n.startswith(".") and ADOPTED_SUFFIX in n and n.endswith(".tmp"):
                out.append(fs.location(p))
        return out

    def clean_leftovers(self, root: Location) -> builtins.list[str]:
        """Half-written index replacements only: a lone adopted manifest is reported by
        ``ls``, never deleted (it may be the only record of a file moved away)."""
        return Catalog(root).clean_leftovers()

    def resume_hint(self, info: CheckpointInfo) -> str:
        return (
            f"trainer.fit(model, ckpt_path={str(info.path)!r}) "
            f"(Fabric: FabricCheckpoints.resume(state, {str(info.path)!r}))"
        )

    # --- details ---------------------------------------------------------------------------

    def _info(self, f: Path, catalog: Catalog, rec: Any, pins_extra: Any) -> CheckpointInfo | None:
        st = f.stat()
        man, bad, refused = _read_adopted(f, catalog.key)
        if man is None and bad is not None:
            unsigned, _, _ = _read_adopted(f, None)  # its step, when only the key refuses it
            step = self._step(f, unsigned)
        else:
            step = self._step(f, man)
        if step is None:
            return None  # not a checkpoint of a training run (no step anywhere)
        status: Status = "committed"
        problem: str | None = None
        verified_at: float | None = None
        ident = _identity(f, man)
        verdict = catalog.verdict(f.name, ident, rec) if ident is not None else None
        code = unverifiable(man) if man is not None else []
        if code:  # adopted with --force: the manifest cannot vouch for a file needing code
            status, problem = "unsound", needs_code_problem(code, "lightning")
        elif verdict is not None and verdict.outcome is not None:
            verified_at = verdict.at
            if verdict.outcome != "verified":
                status, problem = verdict.outcome, verdict.problem
            elif man is not None and _adopted_size(man) not in (None, st.st_size):
                problem = "the file was rewritten since it was verified"
            else:
                status = "verified"
        elif isinstance(rec, dict):
            problem = "the file changed since it was last verified"
        if bad is not None:
            # Verify fails on it too (the same reader, foreign.adopted.load_adopted).
            status, problem = refused, bad
        pins: set[str] = set(man.pins) if man is not None else set()
        if isinstance(pins_extra, list):
            pins |= {x for x in pins_extra if isinstance(x, str)}
        health = man.health if man is not None and isinstance(man.health, Mapping) else None
        level = health_level(health)
        return CheckpointInfo(
            step,
            fs.location(f),
            status,
            st.st_size,
            st.st_mtime,
            tuple(sorted(pins)),
            level,
            problem,
            verified_at,
            dict(health) if health else None,
        )

    def _step(self, f: Path, man: mf.Manifest | None) -> int | None:
        s = step_in_name(f.name)
        if s is not None:
            return s
        if man is not None and man.step is not None:
            return int(man.step)
        fp = fs.fingerprint(fs.location(f))
        hit = self._steps.get(f.name)
        if hit is not None and hit[0] == fp:
            return hit[1]
        obj, _problem = safe_torch_load(f, check_crc=False)
        step = obj.get("global_step") if isinstance(obj, Mapping) else None
        step = int(step) if isinstance(step, int) and not isinstance(step, bool) else None
        self._steps[f.name] = (fp, step)
        return step


def _read_adopted(
    f: Path, key: bytes | None
) -> tuple[mf.Manifest | None, str | None, Status]:
    """``(adopted manifest, None, _)``; ``(None, None, _)`` without one; ``(None, problem,
    status)`` when one is there but cannot be used (invalid, not signed with ``key``, or a
    FIFO: never opened), with the status that makes the checkpoint
    (:func:`ckptkit.checkpoint.catalog.refused_status`)."""
    try:
        return load_adopted(f, key=key), None, "committed"
    except CkptkitError as e:
        name = adopted_path(f).name
        return None, f"{e.code}: adopted manifest {name}: {e.what}; fix: {e.hint}", refused_status(e)
    except OSError as e:
        return None, f"adopted manifest {adopted_path(f).name} cannot be read: {e}", "corrupt"


def _identity(f: Path, man: mf.Manifest | None) -> str | None:
    """What a verify record is keyed by: the adopted manifest's digest, else the file's
    identity (inode, size, mtime); None when the file is gone."""
    if man is not None:
        return f"adopted:{man.digest}"
    fp = fs.fingerprint(fs.location(f))
    return None if fp is None else "file:" + ":".join(str(x) for x in fp)


def _adopted_size(man: mf.Manifest) -> int | None:
    adopted = (man.user or {}).get("adopted")
    files = adopted.get("files") if isinstance(adopted, dict) else None
    if isinstance(files, list) and len(files) == 1 and isinstance(files[0], dict):
        size = files[0].get("size")
        return size if isinstance(size, int) else None
    return None


def detect(root: Location, options: dict[str, Any]) -> Run | None:
    """``root`` as a Lightning run: ``*.ckpt`` files in it (or in its ``checkpoints/``).

    A native ckptkit run is never one: :func:`ckptkit.run.directory.open_run` asks
    :func:`ckptkit.checkpoint.catalog.native_evidence` before any layout.

    Example:
        >>> import tempfile
        >>> detect(fs.location(tempfile.mkdtemp()), {}) is None
        True
    """
    p = fs.local_path(root)  # Lightning writes to a local disk only
    if p is None or not p.is_dir() or p.is_symlink():
        return None
    if not ckpt_files(p) and not ckpt_files(p / CHECKPOINTS_DIR):
        return None
    return open_lightning(p, **options)


def open_lightning(root: str | Path, **options: Any) -> Run:
    """The :class:`~ckptkit.run.Run` of ``root`` (a ``checkpoints/`` directory, or a
    version directory holding one); ``options`` as :class:`~ckptkit.run.Run`.

    Example:
        >>> import tempfile
        >>> open_lightning(tempfile.mkdtemp()).layout
        'lightning'
    """
    p = Path(root)
    if not ckpt_files(p) and ckpt_files(p / CHECKPOINTS_DIR):
        p = p / CHECKPOINTS_DIR
    return Run(p, LightningLayout(), **options)


register(LAYOUT, detect)

__all__ = [
    "CHECKPOINTS_DIR",
    "LAYOUT",
    "LightningLayout",
    "ckpt_files",
    "detect",
    "is_last",
    "open_lightning",
    "step_in_name",
]
