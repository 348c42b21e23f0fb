"""Hugging Face run directories: a Trainer ``output_dir`` and an Accelerate ``checkpoints/``.

Two layouts, read from files only (neither library is imported):

``hf-trainer``
    ``OUTPUT_DIR/checkpoint-N/`` with ``N`` the global step. The Trainer writes
    ``trainer_state.json`` last, so a folder without it is an interrupted save.
``accelerate``
    ``PROJECT_DIR/checkpoints/checkpoint_I/`` (``ProjectConfiguration(
    automatic_checkpoint_naming=True)``) with ``I`` the save count, not a step.
    ``save_state`` writes the RNG files (``random_states_<rank>.pkl``) after the model,
    optimizer, scheduler and data-loader files, so a folder without one is an interrupted
    save. The step of a checkpoint is the one its adopted manifest records (the
    integration records the optimizer step), else its intent record's, else unknown
    (never ``I``: see below).

A checkpoint's status, without reading file contents:

``verified``
    its adopted manifest (``ckptkit-manifest.json``, written by ``ckptkit adopt`` or the
    integration, which verify first) is valid and every file it lists is there at its
    recorded size, and no later verify of it failed;
``committed``
    complete by the framework's own marker, but not adopted (no digests yet);
``corrupt``
    a verify failed (recorded in the run index, ``.ckptkit-index.json``), the adopted
    manifest is invalid, or a file it lists is missing or resized;
``incomplete``
    the framework's completion marker is missing (an interrupted save).

:class:`TrainerLayout` and :class:`AccelerateLayout` are layout strategies of a
:class:`ckptkit.run.Run`, which owns the lock, the run index and retention: ``ls``,
``prune``, ``rollback``, ``verify RUN`` and ``adopt RUN`` use it, and the integrations
settle each save through it. Deleting renames the folder aside first (a crash leaves a
marked leftover, never a checkpoint that looks whole) and needs the run lock
(``.ckptkit.lock`` in the Trainer ``output_dir`` or the Accelerate ``project_dir``: never
inside ``checkpoints/``, which Accelerate parses), which a training run holds while it
trains.

The step of an Accelerate checkpoint is the one its adopted manifest records, else the one
its intent record says (:meth:`ckptkit.run.Run.intend`: written before ``save_state``, so
a kill before adoption still knows it). With neither it is unknown: listed at the number in
its name as ``unreadable`` (never deleted, never resumed), and ``ckptkit adopt --step N
PATH`` records it.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import re
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import xxhash

from ckptkit.checkpoint.catalog import UNUSABLE, Catalog, CheckpointInfo, Status, refused_status
from ckptkit.errors import CkptkitError
from ckptkit.format.manifest import Manifest
from ckptkit.format.records import health_level
from ckptkit.run import Run
from ckptkit.run.framework import FrameworkLayout
from ckptkit.run.layout import Index, step_unknown_fix
from ckptkit.run.registry import register
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.adopted import load_adopted, needs_code_problem, unverifiable
from ckptkit.verify.foreign.scan import ADOPTED_SUFFIX
from ckptkit.verify.view import Expect

log = logging.getLogger("ckptkit")

Kind = Literal["hf-trainer", "accelerate"]
"""The two HF layouts."""

TRAINER_RE = re.compile(r"\Acheckpoint-([0-9]{1,19})\Z")
"""A Trainer checkpoint folder (``N`` = global step). As for native step names
(:data:`ckptkit.checkpoint.catalog.STEP_RE`): ASCII digits only, ``\\Z`` (``$`` matches before a
final newline), at most 19 digits."""
ACCELERATE_RE = re.compile(r"\Acheckpoint_([0-9]{1,19})\Z")
"""An Accelerate automatic-naming checkpoint folder (``I`` = save count); ASCII digits."""
_RNG_ACC = re.compile(r"^random_states_\d+\.pkl$")
_PATTERNS: dict[Kind, re.Pattern[str]] = {"hf-trainer": TRAINER_RE, "accelerate": ACCELERATE_RE}


def checkpoint_dirs(root: Path, layout: Kind) -> list[tuple[int, Path]]:
    """``(number in the name, folder)`` of every checkpoint folder of ``root``, by number.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoint-20").mkdir(); (d / "checkpoint-3").mkdir()
        >>> [n for n, _ in checkpoint_dirs(d, "hf-trainer")]
        [3, 20]
    """
    pat = _PATTERNS[layout]
    out = []
    with contextlib.suppress(OSError):
        for p in root.iterdir():
            m = pat.match(p.name)
            if m and p.is_dir() and not p.is_symlink():
                out.append((int(m.group(1)), p))
    return sorted(out)


def complete(path: Path, layout: Kind) -> bool:
    """Whether the framework finished writing ``path`` (its own last file is there).

    Example:
        >>> import tempfile
        >>> complete(Path(tempfile.mkdtemp()), "hf-trainer")
        False
    """
    if layout == "hf-trainer":
        return (path / "trainer_state.json").is_file()
    with contextlib.suppress(OSError):
        return any(_RNG_ACC.match(p.name) for p in path.iterdir())
    return False


def meta_dir(root: Path, layout: Kind) -> Path:
    """Where the run lock and index of a run live: ``root`` for a Trainer ``output_dir``;
    for an Accelerate ``checkpoints/``, its ``project_dir``.

    Accelerate lists ``checkpoints/`` and sorts every entry by the number in its name
    (``load_state()`` without a path, ``total_limit``), so a file without a number there
    would break it.

    Example:
        >>> meta_dir(Path("/p/checkpoints"), "accelerate"), meta_dir(Path("/o"), "hf-trainer")
        (PosixPath('/p'), PosixPath('/o'))
    """
    if layout == "accelerate" and root.name == "checkpoints":
        return root.parent
    return root


def detect(root: Location) -> tuple[Kind, Path] | None:
    """The HF layout of a run directory and the folder that holds its checkpoints.

    An Accelerate ``project_dir`` (holding ``checkpoints/checkpoint_I``) is recognised too.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoints" / "checkpoint_0").mkdir(parents=True)
        >>> detect(d) == ("accelerate", d / "checkpoints")
        True
    """
    p = fs.local_path(root)  # the frameworks write to a local disk only
    if p is None or not p.is_dir():
        return None
    if checkpoint_dirs(p, "hf-trainer"):
        return "hf-trainer", p
    if checkpoint_dirs(p, "accelerate"):
        return "accelerate", p
    sub = p / "checkpoints"
    if sub.is_dir() and checkpoint_dirs(sub, "accelerate"):
        return "accelerate", sub
    return None


class _HFLayout(FrameworkLayout):
    """What both HF layouts share: one folder per checkpoint, adopted inside it."""

    kind: Kind
    expect: Expect | None = "training"

    def entries(self, root: Location) -> builtins.list[tuple[int, Path]]:
        """``(number in the name, folder)`` of every checkpoint folder, by number."""
        return checkpoint_dirs(self.local(root), self.kind)

    def meta(self, root: Location) -> Location:
        return fs.location(meta_dir(self.local(root), self.kind))

    def checkpoints(self, root: Location, catalog: Catalog, index: Index) -> builtins.list[CheckpointInfo]:
        raw_rec, raw_pins = index.get("verified"), index.get("pins")
        recs: Mapping[str, Any] = raw_rec if isinstance(raw_rec, dict) else {}
        pins: Mapping[str, Any] = raw_pins if isinstance(raw_pins, dict) else {}
        out = []
        for number, p in self.entries(root):
            try:
                out.append(self._info(number, p, catalog, index, recs.get(p.name), pins.get(p.name)))
            except FileNotFoundError:
                continue  # removed while we looked (a live run rotating)
        return sorted(out, key=lambda c: (c.step, str(c.path)))

    def _info(
        self, number: int, p: Path, catalog: Catalog, index: Index, rec: Any, extra_pins: Any
    ) -> CheckpointInfo:
        size = sum(n for _, n in fs.walk_files(p))
        mtime = p.stat().st_mtime
        pins = {x for x in extra_pins if isinstance(x, str)} if isinstance(extra_pins, list) else set()
        status: Status
        problem: str | None = None
        health = None
        health_rec: Mapping[str, Any] | None = None
        verified_at = None
        try:
            man = load_adopted(p, key=catalog.key)
        except CkptkitError as e:
            # Unreadable (a permission or I/O error: not damage), invalid, or not signed
            # with the run's key: the manifest says no step worth trusting; the intent
            # record may (the save count in the name never does).
            step = self._step(p, None, catalog, index)
            return CheckpointInfo(
                number if step is None else step, p,
                refused_status(e), size, mtime,
                tuple(sorted(pins)), problem=f"{e.code}: adopted manifest: {e.what}",
                step_known=step is not None,
            )
        step = self._step(p, man, catalog, index)
        known = step is not None
        if not self.finished(p):
            return CheckpointInfo(
                number if step is None else step, p, "incomplete", size, mtime,
                tuple(sorted(pins)),
                problem=f"no {self.marker}: the framework did not finish this save",
                step_known=known,
            )
        if man is None:
            status, ident = "committed", fingerprint(p)
            problem = "not adopted: no digests yet ('ckptkit adopt RUN' records them)"
        else:
            ident = man.digest
            pins |= set(man.pins)
            if isinstance(man.health, Mapping):
                health_rec = dict(man.health)
                health = health_level(man.health)
            changed = _changed(p, man)
            code = unverifiable(man)
            if changed:
                status, problem = "corrupt", (
                    f"{', '.join(changed[:3])} missing or resized since it was adopted"
                )
            elif code:  # whole bytes that no resume may load
                status, problem = "unsound", needs_code_problem(code, self.format_of(p) or self.kind)
            else:
                status = "verified"
        verdict = catalog.verdict(p.name, ident, rec)
        if step is None:
            if status not in UNUSABLE and verdict.outcome in UNUSABLE:
                status, problem = verdict.outcome, verdict.problem or "verify failed"
            if status in UNUSABLE:  # unusable whatever its step: say what is wrong with it
                return CheckpointInfo(number, p, status, size, mtime, tuple(sorted(pins)),
                                      problem=problem, step_known=False)
            # Neither good nor damaged: never resumed at a guessed step, never deleted.
            return CheckpointInfo(
                number, p, "unreadable", size, mtime, tuple(sorted(pins)),
                problem=f"its step is unknown (no adopted manifest, no intent record): "
                f"{step_unknown_fix(p)}",
                step_known=False,
            )
        if verdict.outcome is not None:
            verified_at = verdict.at
            if verdict.outcome != "verified" and status not in UNUSABLE:
                status, problem = verdict.outcome, verdict.problem or "verify failed"
        return CheckpointInfo(step, p, status, size, mtime, tuple(sorted(pins)), health,
                              problem, verified_at, health_rec)

    def finished(self, p: Path) -> bool:
        """Whether the framework finished writing folder ``p`` (its own last file is there)."""
        return complete(p, self.kind)

    @property
    def marker(self) -> str:
        """The framework's last file of a save, as an incomplete checkpoint names it."""
        return "trainer_state.json" if self.kind == "hf-trainer" else "random_states_0.pkl"

    @abstractmethod
    def _step(self, p: Path, man: Manifest | None, catalog: Catalog, index: Index) -> int | None:
        """The step of folder ``p`` (``man``: its adopted manifest), None when unknown."""

    @abstractmethod
    def resume_hint(self, info: CheckpointInfo) -> str:
        """How to resume from ``info`` in the framework's own terms."""

    def step_of(self, path: Location, catalog: Catalog, index: Index) -> int | None:
        p = self.local(path)
        man = None
        with contextlib.suppress(CkptkitError, OSError):
            man = load_adopted(p, key=catalog.key)  # another key's step is no step
        return self._step(p, man, catalog, index)

    def identity(self, path: Location, catalog: Catalog) -> str | None:
        p = self.local(path)
        if not p.is_dir():
            return None
        with contextlib.suppress(CkptkitError, OSError):
            man = load_adopted(p)
            if man is not None:
                return man.digest
        return fingerprint(p)

    def remove(self, root: Location, path: Location) -> bool:
        return fs.remove_dir_aside(path, marker=ADOPTED_SUFFIX, aside=f"{atomic.TMP_SUFFIX}.del-")

    def leftovers(self, root: Location) -> builtins.list[Location]:
        """Folders of interrupted deletions (``*.ckptkit-tmp*``); never checkpoints."""
        return atomic.leftovers(root)

    def clean_leftovers(self, root: Location) -> builtins.list[str]:
        return Catalog(root).clean_leftovers()


class TrainerLayout(_HFLayout):
    """A Trainer ``output_dir``: ``checkpoint-N/`` with ``N`` the global step.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoint-5").mkdir()
        >>> with Run(d, TrainerLayout()) as run:
        ...     [(c.step, c.status) for c in run.checkpoints()]
        [(5, 'incomplete')]
    """

    name = "hf-trainer"
    kind: Kind = "hf-trainer"

    def _step(self, p: Path, man: Manifest | None, catalog: Catalog, index: Index) -> int | None:
        m = TRAINER_RE.match(p.name)
        return int(m.group(1)) if m else None

    def resume_hint(self, info: CheckpointInfo) -> str:
        return f'trainer.train(resume_from_checkpoint="{info.path}")'


class AccelerateLayout(_HFLayout):
    """An Accelerate ``checkpoints/``: ``checkpoint_I/`` with ``I`` the save count; the
    step is the adopted manifest's, else the intent record's (see the module docstring)."""

    name = "accelerate"
    kind: Kind = "accelerate"
    needs_step = True

    def _step(self, p: Path, man: Manifest | None, catalog: Catalog, index: Index) -> int | None:
        if man is not None and man.step is not None:
            return int(man.step)
        return catalog.intent(p.name, index)

    def order(self, info: CheckpointInfo) -> tuple[int, ...]:
        """Save order: the number in the name (what Accelerate's own resume sorts by)."""
        m = ACCELERATE_RE.match(info.path.name)
        return (int(m.group(1)) if m else -1, info.step)

    def resume_hint(self, info: CheckpointInfo) -> str:
        return (f'AccelerateCheckpoints(...).resume(path="{info.path}") '
                f'(or accelerator.load_state("{info.path}"))')

def fingerprint(path: Path) -> str:
    """Identity of a folder's files (names, sizes, modification times) without reading them.

    Example:
        >>> import tempfile
        >>> len(fingerprint(Path(tempfile.mkdtemp())))
        32
    """
    h = xxhash.xxh3_128()
    for rel, size in sorted(fs.walk_files(path)):
        with contextlib.suppress(OSError):
            h.update(f"{rel}\0{size}\0{(path / rel).stat().st_mtime_ns}\n".encode())
    return h.hexdigest()


def _changed(path: Path, man: Manifest) -> list[str]:
    """Files the adopted manifest lists that are missing or resized."""
    adopted = (man.user or {}).get("adopted")
    files = adopted.get("files") if isinstance(adopted, Mapping) else None
    out = []
    for f in files if isinstance(files, list) else []:
        if not isinstance(f, Mapping) or not isinstance(f.get("path"), str):
            continue
        try:
            if (path / f["path"]).stat().st_size != f.get("size"):
                out.append(f["path"])
        except OSError:
            out.append(f["path"])
    return out


LAYOUTS: dict[Kind, type[_HFLayout]] = {"hf-trainer": TrainerLayout, "accelerate": AccelerateLayout}
"""The layout strategy of each HF kind."""


def open_hf(root: str | Path, kind: Kind, **options: Any) -> Run:
    """The :class:`~ckptkit.run.Run` of a Trainer ``output_dir`` or an Accelerate
    ``checkpoints/`` (``options``: as :class:`~ckptkit.run.Run`).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoint-5").mkdir()
        >>> with open_hf(d, "hf-trainer") as run:
        ...     [(c.step, c.status) for c in run.checkpoints()]
        [(5, 'incomplete')]
    """
    return Run(root, LAYOUTS[kind](), **options)


def open_hf_run(root: Location, options: dict[str, Any]) -> Run | None:
    """The :func:`ckptkit.run.registry.register` detector for both layouts."""
    found = detect(root)
    if found is None:
        return None
    kind, where = found
    return open_hf(where, kind, **options)


register("hf", open_hf_run)

__all__ = [
    "ACCELERATE_RE",
    "LAYOUTS",
    "TRAINER_RE",
    "AccelerateLayout",
    "Kind",
    "TrainerLayout",
    "checkpoint_dirs",
    "complete",
    "detect",
    "fingerprint",
    "meta_dir",
    "open_hf",
    "open_hf_run",
]
