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
    integration records the optimizer step), else ``I``.

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

:class:`HFRun` is a :class:`ckptkit.runs.Run`: ``ls``, ``prune``, ``rollback``, ``verify
RUN`` and ``adopt RUN`` use it, and the integrations rotate with it
(:func:`ckptkit.retain.apply`). Deleting renames the folder aside first (a crash leaves a
marked leftover, never a checkpoint that looks whole) and needs the run lock
(``.ckptkit.lock`` in the Trainer ``output_dir`` or the Accelerate ``project_dir``: never
inside ``checkpoints/``, which Accelerate parses), which a training run holds while it
trains.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import xxhash

from ckptkit import codes, runs
from ckptkit import manifest as mf
from ckptkit.catalog import Catalog, CheckpointInfo, Status
from ckptkit.checkpoint import manifest_io
from ckptkit.codes import Finding
from ckptkit.errors import CkptkitError, UnreadableError
from ckptkit.foreign._scan import ADOPTED_SUFFIX
from ckptkit.foreign.adopted import needs_code_problem, unverifiable
from ckptkit.foreign.report import verify_foreign
from ckptkit.records import health_level
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location
from ckptkit.storage.lock import Lock, lock_for
from ckptkit.verify.findings import ERROR

log = logging.getLogger("ckptkit")

Layout = Literal["hf-trainer", "accelerate"]

TRAINER_RE = re.compile(r"\Acheckpoint-([0-9]{1,19})\Z")
"""A Trainer checkpoint folder (``N`` = global step). As for native step names
(:data:`ckptkit.catalog.STEP_RE`): ASCII digits only, ``\\Z`` (``$`` matches before a
final newline), at most 19 digits."""
ACCELERATE_RE = re.compile(r"\Acheckpoint_([0-9]{1,19})\Z")
"""An Accelerate automatic-naming checkpoint folder (``I`` = save count); ASCII digits."""
_RNG_ACC = re.compile(r"^random_states_\d+\.pkl$")
_PATTERNS: dict[Layout, re.Pattern[str]] = {"hf-trainer": TRAINER_RE, "accelerate": ACCELERATE_RE}


def checkpoint_dirs(root: Path, layout: Layout) -> list[tuple[int, Path]]:
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


def complete(path: Path, layout: Layout) -> bool:
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


def meta_dir(root: Path, layout: Layout) -> Path:
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


def detect(root: Location) -> tuple[Layout, Path] | None:
    """The HF layout of a run directory and the folder that holds its checkpoints.

    An Accelerate ``project_dir`` (holding ``checkpoints/checkpoint_I``) is recognised too.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoints" / "checkpoint_0").mkdir(parents=True)
        >>> detect(d) == ("accelerate", d / "checkpoints")
        True
    """
    if not fs.is_local(root):
        return None
    p = Path(str(root))
    if not p.is_dir():
        return None
    if checkpoint_dirs(p, "hf-trainer"):
        return "hf-trainer", p
    if checkpoint_dirs(p, "accelerate"):
        return "accelerate", p
    sub = p / "checkpoints"
    if sub.is_dir() and checkpoint_dirs(sub, "accelerate"):
        return "accelerate", sub
    return None


class HFRun:
    """A Trainer ``output_dir`` or an Accelerate ``checkpoints/`` folder as a run.

    Args:
        root: the folder holding the checkpoint folders.
        layout: ``hf-trainer`` or ``accelerate``.
        readonly: True (default) lists and verifies only; False takes the run lock at once
            (``LockHeldError`` while a training run or another prune holds it) so that
            checkpoints may be removed and verify outcomes recorded.
        lock_timeout: seconds to wait for the lock.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "checkpoint-5").mkdir()
        >>> run = HFRun(d, "hf-trainer"); [(c.step, c.status) for c in run.checkpoints()]
        [(5, 'incomplete')]
    """

    def __init__(
        self,
        root: str | Path,
        layout: Layout,
        *,
        readonly: bool = True,
        lock_timeout: float = 0.0,
    ) -> None:
        self._root = Path(root)
        self._layout: Layout = layout
        self.readonly = readonly
        self.meta = meta_dir(self._root, layout)
        """Where the run lock and the run index live (see :func:`meta_dir`)."""
        self.catalog = Catalog(self.meta)
        self._lock: Lock | None = None
        if not readonly:
            self._root.mkdir(parents=True, exist_ok=True)
            lock = lock_for(fs.location(self.meta), timeout=lock_timeout)
            lock.acquire()
            self._lock = lock
            self.clean_leftovers()

    @property
    def root(self) -> Location:
        return self._root

    @property
    def layout(self) -> str:
        return self._layout

    def __enter__(self) -> HFRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- listing -----------------------------------------------------------------------------

    def checkpoints(self) -> builtins.list[CheckpointInfo]:
        """Every checkpoint folder with its status, ordered by step (no contents read)."""
        idx = self.catalog.index()
        raw_rec, raw_pins = idx.get("verified"), idx.get("pins")
        recs: Mapping[str, Any] = raw_rec if isinstance(raw_rec, dict) else {}
        pins: Mapping[str, Any] = raw_pins if isinstance(raw_pins, dict) else {}
        out = []
        for number, p in checkpoint_dirs(self._root, self._layout):
            try:
                out.append(self._info(number, p, recs.get(p.name), pins.get(p.name)))
            except FileNotFoundError:
                continue  # removed while we looked (a live run rotating)
        return sorted(out, key=lambda c: (c.step, str(c.path)))

    def _info(self, number: int, p: Path, rec: Any, extra_pins: Any) -> CheckpointInfo:
        size = sum(n for _, n in fs.walk_files(p))
        mtime = p.stat().st_mtime
        pins = {x for x in extra_pins if isinstance(x, str)} if isinstance(extra_pins, list) else set()
        status: Status
        problem: str | None = None
        step = number
        health = None
        health_rec: Mapping[str, Any] | None = None
        verified_at = None
        man_path = p / ADOPTED_SUFFIX
        if not complete(p, self._layout):
            marker = "trainer_state.json" if self._layout == "hf-trainer" else "random_states_0.pkl"
            return CheckpointInfo(
                step, p, "incomplete", size, mtime, tuple(sorted(pins)),
                problem=f"no {marker}: the framework did not finish this save",
            )
        if fs.kind(man_path) is None:  # a FIFO or a symlink there is read (refused) below
            status, key = "committed", fingerprint(p)
            problem = "not adopted: no digests yet ('ckptkit adopt RUN' records them)"
        else:
            try:
                man = manifest_io.read_path(man_path)
            except UnreadableError as e:  # a permission or I/O error: not damage
                return CheckpointInfo(step, p, "unreadable", size, mtime, tuple(sorted(pins)),
                                      problem=f"{e.code}: adopted manifest: {e.what}")
            except CkptkitError as e:
                return CheckpointInfo(step, p, "corrupt", size, mtime, tuple(sorted(pins)),
                                      problem=f"{e.code}: adopted manifest: {e.what}")
            key = man.digest
            if man.step is not None:
                step = int(man.step)
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
            elif code:
                status, problem = "corrupt", needs_code_problem(code, self._layout)
            else:
                status = "verified"
        verdict = self.catalog.verdict(p.name, key, rec)
        if verdict.outcome is not None:
            verified_at = verdict.at
            if verdict.outcome != "verified" and status != "corrupt":
                status, problem = verdict.outcome, verdict.problem or "verify failed"
        return CheckpointInfo(step, p, status, size, mtime, tuple(sorted(pins)), health,
                              problem, verified_at, health_rec)

    def leftovers(self) -> builtins.list[Location]:
        """Folders of interrupted deletions (``*.ckptkit-tmp*``); never checkpoints."""
        return atomic.leftovers(self._root)

    # --- verify, remove (retain.RunStore) --------------------------------------------------

    def reverify(self, info: CheckpointInfo) -> builtins.list[Finding]:
        """Verify one checkpoint from its bytes, record the outcome, return its errors."""
        p = Path(str(info.path))
        rep = verify_foreign(p, self._layout, expect="training")
        bad = [f for f in rep.findings if f.severity is ERROR]
        self.record(
            p,
            codes.outcome(f.code for f in bad),
            why="; ".join(f"{f.code} {f.message}" for f in bad[:3]) or None,
        )
        return bad

    def record(self, path: Path, outcome: codes.Outcome, *, why: str | None) -> None:
        """Record a verify outcome of ``path`` in the run index (only the lock holder)."""
        if self._lock is None:
            return
        man_path = path / ADOPTED_SUFFIX
        key = fingerprint(path)
        with contextlib.suppress(CkptkitError):
            if man_path.is_file():
                key = manifest_io.read_path(man_path).digest
        self.catalog.note(path.name, key, outcome, why=why)

    def pin(self, path: Path, label: str) -> None:
        """Pin a checkpoint in the run index (rotation never deletes it); needs the lock."""
        self.fence()
        self.catalog.pin(fs.location(path), label)

    def remove(self, info: CheckpointInfo) -> bool:
        """Delete a checkpoint folder (renamed aside first); False when it was gone."""
        self.fence()
        gone = Catalog(self._root).remove(info.path)  # renamed aside within its folder
        with contextlib.suppress(OSError, ValueError):
            self.catalog.forget([info.path.name])
        return gone

    def fence(self) -> None:
        """Raise unless this process holds the run lock."""
        if self._lock is None:
            raise CkptkitError(
                "this run was opened read-only",
                path=self._root,
                hint="open it with readonly=False (it takes the run lock) to delete or pin",
            )
        self._lock.check()

    def clean_leftovers(self) -> builtins.list[str]:
        """Remove what interrupted deletions left (under the lock); one line each."""
        self.fence()
        done = Catalog(self._root).clean_leftovers()
        if self.meta != self._root:
            done += self.catalog.clean_leftovers()  # half-written index replacements
        return done

    def resume_hint(self, info: CheckpointInfo) -> str:
        """How to resume this run from ``info``, in the framework's own terms."""
        if self._layout == "hf-trainer":
            return f'trainer.train(resume_from_checkpoint="{info.path}")'
        return (f'AccelerateCheckpoints(...).resume(path="{info.path}") '
                f'(or accelerator.load_state("{info.path}"))')

    # --- resume selection ---------------------------------------------------------------------

    def newest_verified(self) -> tuple[CheckpointInfo | None, builtins.list[str]]:
        """The newest checkpoint that verifies from its bytes, and why newer ones were skipped.

        Checkpoints are tried newest first; each is verified (digests when adopted,
        structure and completeness otherwise); a failing one is recorded corrupt (when
        this process holds the lock) and named in the returned reasons.
        """
        skipped: builtins.list[str] = []
        for info in reversed(self.checkpoints()):
            name = info.path.name
            if info.status in ("incomplete", "corrupt") and info.problem:
                skipped.append(f"{name}: {info.status}: {info.problem}")
                continue
            bad = self.reverify(info)
            if bad:
                skipped.append(f"{name}: {bad[0].code} {bad[0].message}")
                continue
            return info, skipped
        return None, skipped


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


def _changed(path: Path, man: mf.Manifest) -> list[str]:
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


def open_hf_run(root: Location, options: dict[str, Any]) -> HFRun | None:
    """The :func:`ckptkit.runs.register` detector for both layouts."""
    found = detect(root)
    if found is None:
        return None
    layout, where = found
    return HFRun(
        where,
        layout,
        readonly=bool(options.get("readonly", True)),
        lock_timeout=float(options.get("lock_timeout", 0.0)),
    )


runs.register("hf", open_hf_run)

__all__ = [
    "ACCELERATE_RE",
    "TRAINER_RE",
    "HFRun",
    "Layout",
    "checkpoint_dirs",
    "complete",
    "detect",
    "fingerprint",
    "meta_dir",
    "open_hf_run",
]

