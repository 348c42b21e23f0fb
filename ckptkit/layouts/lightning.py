"""Lightning run directories: a ``checkpoints/`` directory of ``*.ckpt`` files, as a Run.

Lightning's ``ModelCheckpoint`` (and a Fabric script calling ``fabric.save``) writes one
file per checkpoint: ``epoch=0-step=40.ckpt`` (the default name: the step is in it),
names of the user's own template, and ``last.ckpt`` (Lightning's moving resume pointer,
rewritten at every save). Beside each file :mod:`ckptkit.integrations.lightning` (or
``ckptkit adopt``) keeps its digests and component table
(``<file>.ckptkit-manifest.json``); the run index (``.ckptkit-index.json``) records verify
outcomes and the run lock (``.ckptkit.lock``) makes one writer. Files only: Lightning is
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
    >>> run = LightningRun.open(d)
    >>> [(c.step, c.path.name, c.status) for c in run.checkpoints()]
    [(4, 'epoch=0-step=4.ckpt', 'committed')]
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptkit import codes, runs
from ckptkit import manifest as mf
from ckptkit.catalog import Catalog, CheckpointInfo, Status
from ckptkit.codes import Finding
from ckptkit.errors import CkptkitError, LockHeldError
from ckptkit.foreign._load import safe_torch_load
from ckptkit.foreign._scan import ADOPTED_SUFFIX
from ckptkit.foreign.adopted import (
    adopted_path,
    load_adopted,
    needs_code_problem,
    unverifiable,
)
from ckptkit.foreign.report import verify_foreign
from ckptkit.records import health_level
from ckptkit.storage import fs
from ckptkit.storage.fs import Location
from ckptkit.storage.lock import LOCK_NAME, Lock, lock_for
from ckptkit.verify.findings import ERROR

log = logging.getLogger("ckptkit")

LAYOUT = "lightning"
"""The name this layout registers under (:func:`ckptkit.runs.register`)."""
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


class LightningRun:
    """A Lightning ``checkpoints/`` directory as a :class:`ckptkit.runs.Run`.

    Args:
        root: the directory holding the ``*.ckpt`` files.
        readonly: True (the default for ``ls``) takes no lock: nothing can be deleted and
            verify outcomes are recorded only while no writer holds the lock; False takes
            the run lock now (``prune``, the integration), so ``remove`` may delete.
        lock_timeout: seconds to wait for the run lock.

    Raises:
        LockHeldError: not ``readonly`` and another live process holds the lock.
    """

    layout = LAYOUT

    def __init__(self, root: str | Path, *, readonly: bool = True, lock_timeout: float = 0.0) -> None:
        self._root = Path(root)
        self.readonly = readonly
        self.catalog = Catalog(fs.location(self._root))
        self._lock: Lock | None = None
        self._steps: dict[str, tuple[tuple[Any, ...] | None, int | None]] = {}
        if not readonly:
            lock = lock_for(fs.location(self._root), timeout=lock_timeout)
            lock.acquire()
            self._lock = lock

    @classmethod
    def open(cls, root: str | Path, **options: Any) -> LightningRun:
        """Open ``root`` (a ``checkpoints/`` directory, or a version directory holding one).

        Example:
            >>> import tempfile
            >>> LightningRun.open(tempfile.mkdtemp()).layout
            'lightning'
        """
        p = Path(root)
        if not ckpt_files(p) and ckpt_files(p / CHECKPOINTS_DIR):
            p = p / CHECKPOINTS_DIR
        known = {k: options[k] for k in ("readonly", "lock_timeout") if k in options}
        return cls(p, **known)

    # --- Run ------------------------------------------------------------------------------

    @property
    def root(self) -> Location:
        return fs.location(self._root)

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """One checkpoint per step, oldest first (see the module docstring)."""
        index = self.catalog.index()
        raw_rec, raw_pins = index.get("verified"), index.get("pins")
        records: Mapping[str, Any] = raw_rec if isinstance(raw_rec, dict) else {}
        pins: Mapping[str, Any] = raw_pins if isinstance(raw_pins, dict) else {}
        by_step: dict[int, list[CheckpointInfo]] = {}
        for f in ckpt_files(self._root):
            try:
                info = self._info(f, records.get(f.name), pins.get(f.name))
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

    def reverify(self, info: CheckpointInfo) -> builtins.list[Finding]:
        """Verify one file from its bytes; record the outcome when this process may."""
        path = Path(str(info.path))
        rep = verify_foreign(path, "lightning")
        bad = [f for f in rep.findings if f.severity is ERROR]
        why = f"{bad[0].code}: {bad[0].message}" if bad else None
        with self._maybe_writer() as may:
            if may:
                ident = self._identity(path)
                if ident is not None:
                    self.catalog.note(
                        path.name, ident, codes.outcome(f.code for f in bad), why=why
                    )
        return bad

    def record(self, path: Path, outcome: codes.Outcome, *, why: str | None = None) -> None:
        """Record a verify outcome of ``path`` done elsewhere (the integration at save)."""
        with self._maybe_writer() as may:
            ident = self._identity(path)
            if may and ident is not None:
                self.catalog.note(path.name, ident, outcome, why=why)

    def pin(self, path: Path, label: str) -> None:
        """Pin the file ``path`` (rotation never deletes it); the lock holder only."""
        self.fence()
        self.catalog.pin(fs.location(path), label)

    def remove(self, info: CheckpointInfo) -> bool:
        """Delete one file and its adopted manifest (the file first: a lone manifest is a
        leftover, never a checkpoint); False when it was gone."""
        self.fence()
        path = Path(str(info.path))
        return self.remove_file(path)

    def remove_file(self, path: Path) -> bool:
        """Delete ``path``, its adopted manifest and its index record (the lock holder)."""
        self.fence()
        try:
            path.unlink()
            gone = True
        except FileNotFoundError:
            gone = False
        with contextlib.suppress(FileNotFoundError):
            adopted_path(path).unlink()
        with contextlib.suppress(OSError):
            fd = os.open(self._root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.catalog.forget([path.name])
        return gone

    def fence(self) -> None:
        """Raise unless this process holds the run lock."""
        if self._lock is None:
            raise LockHeldError(
                "this Lightning run was opened read-only",
                path=self._root / LOCK_NAME,
                hint="open it with readonly=False to delete",
            )
        self._lock.check()

    def leftovers(self) -> builtins.list[Location]:
        """Adopted manifests whose file is gone, and half-written ones."""
        out: list[Location] = []
        try:
            names = os.listdir(self._root)
        except OSError:
            return []
        for n in sorted(names):
            p = self._root / n
            if n.endswith(f"{SUFFIX}.{ADOPTED_SUFFIX}"):
                if not (self._root / n[: -len(ADOPTED_SUFFIX) - 1]).exists():
                    out.append(fs.location(p))
            elif n.startswith(".") and ADOPTED_SUFFIX in n and n.endswith(".tmp"):
                out.append(fs.location(p))
        return out

    def resume_hint(self, info: CheckpointInfo) -> str:
        """How to resume from ``info`` in Lightning's terms."""
        return (
            f"trainer.fit(model, ckpt_path={str(info.path)!r}) "
            f"(Fabric: FabricCheckpoints.resume(state, {str(info.path)!r}))"
        )

    def close(self) -> None:
        """Release the run lock (if held)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> LightningRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- details ---------------------------------------------------------------------------

    def _info(self, f: Path, rec: Any, pins_extra: Any) -> CheckpointInfo | None:
        st = f.stat()
        man, bad = self._read_adopted(f)
        step = self._step(f, man)
        if step is None:
            return None  # not a checkpoint of a training run (no step anywhere)
        status: Status = "committed"
        problem: str | None = None
        verified_at: float | None = None
        ident = self._identity(f, man)
        verdict = self.catalog.verdict(f.name, ident, rec) if ident is not None else None
        code = unverifiable(man) if man is not None else []
        if code:  # adopted with --force: the manifest cannot vouch for a file needing code
            status, problem = "corrupt", needs_code_problem(code, "lightning")
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
            status, problem = "corrupt", bad
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

    def _adopted(self, f: Path) -> mf.Manifest | None:
        man, _ = self._read_adopted(f)
        return man

    def _read_adopted(self, f: Path) -> tuple[mf.Manifest | None, str | None]:
        """``(adopted manifest, None)``; ``(None, None)`` without one; ``(None, problem)``
        when one is there but cannot be used (invalid, or a FIFO: never opened)."""
        try:
            return load_adopted(f), None
        except CkptkitError as e:
            name = adopted_path(f).name
            return None, f"{e.code}: adopted manifest {name}: {e.what}; fix: {e.hint}"
        except OSError as e:
            return None, f"adopted manifest {adopted_path(f).name} cannot be read: {e}"

    def _identity(self, f: Path, man: mf.Manifest | None = None) -> str | None:
        """What a verify record is keyed by: the adopted manifest's digest, else the file's
        identity (inode, size, mtime); None when the file is gone."""
        man = man if man is not None else self._adopted(f)
        if man is not None:
            return f"adopted:{man.digest}"
        fp = fs.fingerprint(fs.location(f))
        return None if fp is None else "file:" + ":".join(str(x) for x in fp)

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

    @contextlib.contextmanager
    def _maybe_writer(self) -> Iterator[bool]:
        if self._lock is not None:
            yield True
            return
        lock = lock_for(fs.location(self._root), timeout=0.0)
        try:
            lock.acquire()
        except (LockHeldError, OSError):
            yield False
            return
        try:
            yield True
        finally:
            lock.release()


def _adopted_size(man: mf.Manifest) -> int | None:
    adopted = (man.user or {}).get("adopted")
    files = adopted.get("files") if isinstance(adopted, dict) else None
    if isinstance(files, list) and len(files) == 1 and isinstance(files[0], dict):
        size = files[0].get("size")
        return size if isinstance(size, int) else None
    return None


def detect(root: Location, options: dict[str, Any]) -> LightningRun | None:
    """``root`` as a Lightning run: ``*.ckpt`` files in it (or in its ``checkpoints/``).

    A native ckptkit run is never one: :func:`ckptkit.runs.open_run` asks
    :func:`ckptkit.catalog.native_evidence` before any layout.

    Example:
        >>> import tempfile
        >>> detect(fs.location(tempfile.mkdtemp()), {}) is None
        True
    """
    if not fs.is_local(root):
        return None
    p = Path(str(root))
    if not p.is_dir() or p.is_symlink():
        return None
    if not ckpt_files(p) and not ckpt_files(p / CHECKPOINTS_DIR):
        return None
    return LightningRun.open(p, **options)


runs.register(LAYOUT, detect)

__all__ = [
    "CHECKPOINTS_DIR",
    "LAYOUT",
    "LightningRun",
    "ckpt_files",
    "detect",
    "is_last",
    "step_in_name",
]
