"""The run catalog: which checkpoints a run directory holds, and what is known of each.

A run directory holds ``step-NNNNNNNN/`` checkpoint directories, the ``latest`` pointer,
the run index (``.ckptkit-index.json``: the outcome of every verify, and pins added after
a save) and the run lock. The catalog reads them and, for a caller that holds the run
lock, records verify outcomes, pins and the ``latest`` pointer. It never decides what to
keep (:mod:`ckptkit.run.rotation`) and never writes a checkpoint (:mod:`ckptkit.checkpoint.commit`).

What exists is decided by the commit marker, as in torchtitan's ``_find_load_step``: a
step directory with a valid ``manifest.json`` is a checkpoint; one without is an
interrupted save (``incomplete``) and is never loaded; temporary directories of an
unfinished save or delete are leftovers, not checkpoints.

A checkpoint's status:

``verified``
    verify passed for this exact manifest (its digest is recorded in the index) and every
    file it lists is there at its recorded size. File modification times do not count: a
    ``cp -r`` of a run keeps its checkpoints verified. Bit rot that keeps sizes is found
    by the re-verify that precedes every deletion, by ``ls --verify`` and by ``ckptkit
    scrub`` (:mod:`ckptkit.run.scrub`), which record what they find.
``committed``
    a valid manifest, not verified yet (or files missing or resized since).
``corrupt``
    verify failed (at save, restore or ``ls --verify``) or the manifest is invalid. A
    recorded ``corrupt`` is a claim of the index, not proof: a restore reads the
    checkpoint again before passing over it, and retention re-verifies it from its bytes
    before deleting it.
``unreadable``
    the last verify or restore could not read it for a reason that is not damage (a
    permission, an I/O error, the store unreachable: :func:`ckptkit.codes.transient`).
    Neither good nor corrupt: a restore tries it again, retention never deletes it.
``replica-divergent``
    whole bytes of a state the ranks did not agree on: at its save, the replicas of a
    tensor held different bytes (``CK-F120``, recorded in its manifest's ``replicas``;
    :mod:`ckptkit.checkpoint.replicas`). Never verified, never ``latest``, never restored or rolled
    back to; retention keeps it as evidence, like a corrupt one.
``untrusted``
    the run has a key and it does not vouch for this checkpoint: its manifest (or a rank
    manifest) is unsigned, signed with another key, or changed after it was signed
    (``CK-M010``/``CK-M011``). Never restored, loaded, rolled back to or counted as good
    under the key, and never deleted by retention: it says who wrote it, not that its bytes
    are damaged (delete it by hand once you know it is not yours).
``unsound``
    its bytes are intact but the state they hold cannot be resumed: a completeness or
    consistency finding (a component missing, values that disagree, a file that needs code
    to load). Never restored or counted as good, and no retention option deletes it: only
    damage is deleted.
``incomplete``
    a step directory without a manifest.

The index records one verdict per checkpoint, for the manifest digest it was made on.
With a key (the manifests' HMAC key), each record carries a MAC
(:func:`ckptkit.format.signing.sign_verdict`); a record without a valid one counts as no record
at all (``committed``): never as verified, never as corrupt.
"""

from __future__ import annotations

import builtins
import contextlib
import glob
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast, get_args

from ckptkit import codes
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.detect import detect as foreign_format
from ckptkit.errors import CkptkitError, IncompleteCheckpointError, UnreadableError
from ckptkit.format import digest, signing
from ckptkit.format import manifest as mf
from ckptkit.format.records import health_level, replica_problem
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location

log = logging.getLogger("ckptkit")

STEP_RE = re.compile(r"\Astep-([0-9]{1,19})\Z")
"""Name of a checkpoint directory in a run directory. ASCII digits only (``\\d`` and
``int()`` accept any Unicode digit, e.g. an Arabic-Indic nine), anchored with
``\\A``/``\\Z`` (``$`` matches before a final newline), at most 19 digits (``int()`` of
a longer string is slow, and past 4300 digits raises)."""
LATEST = "latest"
"""The pointer file: the name of the newest verified checkpoint, one line."""
INDEX = ".ckptkit-index.json"
"""Run-level record of verify outcomes (and pins added after a save); written under the lock."""
SIGNED = "signed"
"""The run index's record that the run is signed, and with which key (its id, and a MAC
under that key): :meth:`Catalog.mark_signed`."""

Status = Literal[
    "verified", "committed", "corrupt", "unreadable", "incomplete", "replica-divergent",
    "untrusted", "unsound",
]

UNUSABLE: frozenset[Status] = frozenset(
    {"corrupt", "incomplete", "replica-divergent", "untrusted", "unsound"}
)
"""Statuses a run never resumes from nor counts as good, known without reading bytes again:
damaged, unfinished, whole but with replicas that disagree (``CK-F120``), not vouched for
by the run's key, or whole but unsound. (``unreadable``: the step or manifest cannot be
read, so what it holds is unknown; never deleted, judged from its bytes when it matters.)"""
DELETABLE: frozenset[Status] = frozenset({"corrupt", "incomplete", "replica-divergent"})
"""Of :data:`UNUSABLE`, the statuses ``prune --delete-corrupt`` may delete (after a re-verify
from the bytes shows damage, for ``corrupt``): damaged, unfinished, or evidence of a
divergence. ``untrusted`` and ``unsound`` checkpoints have intact bytes: no retention
option deletes them."""


def refused_status(e: CkptkitError) -> Status:
    """The status of a checkpoint whose manifest (native or adopted) was refused with ``e``:
    ``unreadable`` when reading failed for a reason that is not damage, ``untrusted`` when
    the key does not vouch for it, else ``corrupt`` (:func:`ckptkit.codes.outcome`: the one
    classification of a finding).

    Example:
        >>> from ckptkit import codes
        >>> refused_status(codes.error(codes.M011, "x")), refused_status(codes.error(codes.M002, "x"))
        ('untrusted', 'corrupt')
    """
    if isinstance(e, UnreadableError):
        return "unreadable"
    return "untrusted" if codes.outcome([e.code]) == "untrusted" else "corrupt"


def step_dir_name(step: int) -> str:
    """Directory name of a step.

    Example:
        >>> step_dir_name(1000)
        'step-00001000'
    """
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory name, or None when it is not one.

    Example:
        >>> step_of("step-00000042"), step_of("step-00000042.ckptkit-tmp.ab12cd34")
        (42, None)
    """
    m = STEP_RE.match(name)
    return int(m.group(1)) if m else None


def misplaced(name: str, step: object) -> str | None:
    """Why a manifest recording ``step`` does not belong in the directory ``name``, or None.

    A step directory holds the checkpoint of its own step: a copy of step 40's checkpoint
    named ``step-00000050`` would otherwise count as step 50 (the newest, kept by
    retention while the real newest is deleted, and picked by restore). A directory that
    is not a step directory, or a manifest that records no step, makes no claim to check.
    The catalog lists a misplaced checkpoint as corrupt and verify reports it (``CK-S020``).

    Example:
        >>> print(misplaced("step-00000050", 40))
        the manifest records step 40 but the directory is step-00000050 (step 50)
        >>> misplaced("step-00000040", 40) is None, misplaced("ckpt", 40) is None
        (True, True)
    """
    where = step_of(name)
    if where is None or step is None or step == where:
        return None
    return f"the manifest records step {step} but the directory is {name} (step {where})"


def step_dirs(root: Location) -> dict[int, builtins.list[Location]]:
    """Every entry of ``root`` named as a step directory, by step; each step's entries are
    ordered with the one the run uses first (see :func:`canonical_first`).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.mkdir(d + "/step-3"); os.mkdir(d + "/step-00000003")
        >>> [p.name for p in step_dirs(fs.location(d))[3]]
        ['step-00000003', 'step-3']
    """
    out: dict[int, builtins.list[Location]] = {}
    for p in root.iterdir():
        step = step_of(p.name)
        if step is not None:
            out.setdefault(step, []).append(p)
    return {s: canonical_first(s, ps) for s, ps in out.items()}


def canonical_first(step: int, paths: Iterable[Location]) -> builtins.list[Location]:
    """Order directories named for one ``step``: the checkpoint of the step first.

    ckptkit names a step :func:`step_dir_name`; a second directory for the same step
    (``step-3`` beside ``step-00000003``: a hand copy or rename) is a duplicate. A
    directory comes before anything else of that name (a file is never a checkpoint),
    then the canonical name, then by name, so the choice never depends on listing order.
    """
    paths = builtins.list(paths)
    if len(paths) < 2:
        return paths  # the common case: no stat (one request each on an object store)
    canonical = step_dir_name(step)
    return sorted(paths, key=lambda p: (fs.kind(p) != "dir", p.name != canonical, p.name))


def native_evidence(root: Location) -> str | None:
    """What shows that ``root`` is a native ckptkit run (or checkpoint), or None.

    A run directory that holds a native run *is* that native run, whatever framework
    entries lie beside it (a stray ``checkpoint-3/``, an Accelerate ``checkpoints/``, a
    ``trainer_state.json``): :func:`ckptkit.run.directory.open_run` and ``ckptkit verify RUN`` ask
    this before any framework layout, and the strays are reported as ignored. Evidence,
    cheapest first:

    * ``manifest.json`` in ``root`` (one native checkpoint, not a framework's run);
    * the ``latest`` pointer, a regular file naming a step directory;
    * a step directory (:data:`STEP_RE`) holding ``manifest.json`` (a committed checkpoint),
      or, on a local disk, one without that holds no foreign checkpoint either and bears
      ckptkit's own zero-padded name (an interrupted native save; torchtitan names its DCP
      folders ``step-N`` too, unpadded, and creates them empty before it writes: those
      are no evidence).

    The run index and the run lock are no evidence: framework runs keep them too.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.mkdir(d + "/checkpoint-3")
        >>> native_evidence(fs.location(d)) is None
        True
        >>> os.mkdir(d + "/step-00000010"); open(d + "/step-00000010/manifest.json", "w").close()
        >>> native_evidence(fs.location(d))
        'step-00000010/manifest.json'
        >>> t = tempfile.mkdtemp(); os.mkdir(t + "/step-5")  # torchtitan, killed at once
        >>> native_evidence(fs.location(t)) is None
        True
        >>> os.mkdir(t + "/step-00000007"); native_evidence(fs.location(t))
        'step-00000007/ (an interrupted save)'
    """
    if fs.kind(root / atomic.MANIFEST_NAME) is not None:
        return atomic.MANIFEST_NAME
    if fs.kind(root / LATEST) == "file":
        with contextlib.suppress(OSError):
            name = fs.read_small(root / LATEST, 4096).decode(errors="replace").strip()
            if step_of(name) is not None:
                return LATEST
    if fs.kind(root) != "dir":
        return None
    interrupted: str | None = None
    with contextlib.suppress(OSError):
        for p in root.iterdir():
            if step_of(p.name) is None:
                continue
            if fs.kind(p / atomic.MANIFEST_NAME) is not None:
                return f"{p.name}/{atomic.MANIFEST_NAME}"
            local = fs.local_path(p)  # the foreign-format detector reads local files
            if (
                interrupted is None
                and p.name == step_dir_name(step_of(p.name) or 0)  # ckptkit names its own
                and local is not None
                and fs.kind(p) == "dir"
                and foreign_format(local) is None
            ):
                interrupted = f"{p.name}/ (an interrupted save)"
    return interrupted


@dataclass(frozen=True)
class Verdict:
    """What the run index says about one checkpoint, once its record has been checked."""

    outcome: codes.Outcome | None
    """``verified``, ``corrupt`` or ``unreadable``; None when no record counts (none, one
    made on other bytes, or one whose MAC does not check under the key)."""
    at: float | None = None
    """When that verify or restore ran (Unix seconds)."""
    problem: str | None = None
    """What it found, or why the record does not count."""


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a run directory, as ``ckptkit ls`` shows it."""

    step: int
    path: Location
    status: Status
    size: int
    """Bytes on disk (every file of the directory)."""
    time: float
    """When it was written (Unix seconds; informational, never used for ordering): the
    manifest's ``created_at``, else the store's modification time; 0.0 when unknown."""
    pins: tuple[str, ...] = ()
    health: str | None = None
    """Training health recorded at save: ``ok``, ``warn``, ``critical`` or None (no watch)."""
    problem: str | None = None
    """Why it is corrupt, unreadable, incomplete, or not counted as verified."""
    verified_at: float | None = None
    """When verify last read every byte of it (Unix seconds), None when never."""
    health_record: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    """The manifest's whole ``health`` record (signals, first warning step)."""
    step_known: bool = field(default=True, compare=False)
    """False when no file or record of the run says its step (an Accelerate
    ``checkpoint_N`` neither adopted nor announced by an intent record): ``step`` is then the
    number in its name, it is never resumed and never deleted by retention."""

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``ckptkit ls --json``."""
        return {
            "step": self.step,
            "path": str(self.path),
            "status": self.status,
            "size": self.size,
            "time": self.time,
            "pins": list(self.pins),
            "health": self.health,
            "problem": self.problem,
            "verified_at": self.verified_at,
        }


def _created_at(man: mf.Manifest) -> float | None:
    """The save time the manifest records (Unix seconds), None when unreadable."""
    try:
        return datetime.fromisoformat(man.created_at).timestamp()
    except (TypeError, ValueError):
        return None


def _stored_at(p: Location) -> float:
    """When the store last wrote checkpoint ``p``: its manifest's modification time, else
    its directory's (an object store has no directory time); 0.0 when neither says."""
    for q in (p / atomic.MANIFEST_NAME, p):
        with contextlib.suppress(OSError):
            if t := fs.mtime(q):
                return t
    return 0.0


class Catalog:
    """Read (and, under the run lock, record) the checkpoints of one run directory.

    Args:
        root: the run directory.

    Example:
        >>> import tempfile
        >>> Catalog(tempfile.mkdtemp()).list()
        []
    """

    def __init__(self, root: str | Location, *, key: bytes | None = None) -> None:
        self.root = fs.location(root)
        self.key = key
        """An HMAC key manifests must be signed with (a bad one lists as corrupt)."""
        self._manifests: dict[str, tuple[Any, mf.Manifest, str]] = {}

    # --- reading -----------------------------------------------------------------------------

    def manifest(self, ckpt: Location) -> tuple[mf.Manifest, str]:
        """Read and validate a checkpoint's manifest once per content of the file.

        Returns ``(manifest, manifest digest)``. A save lists the run several times; the
        cache keeps that to one validation per manifest content. It is keyed by a digest
        of the bytes read now, never by the file's inode, size and mtime: a manifest
        rewritten in place with its size and mtime kept (bit rot, an edit followed by
        ``touch -r``) must not be vouched for by what an earlier version said (retention
        decides deletions on this). Manifests are small: reading one is cheap.

        Of a multi-rank checkpoint it reads the root alone (a partial manifest without
        entries, :attr:`~ckptkit.format.manifest.Manifest.read_ranks` empty): what a listing
        needs is there (step, health, pins, replicas, its digest and every file's size,
        :meth:`~ckptkit.format.manifest.Manifest.file_sizes`), and the rank manifests, read by
        a restore or a verify, are checked here only by their size, as the data files
        are. A root that does not record its files' sizes is read whole.

        Raises:
            IncompleteCheckpointError: no manifest (``CK-M001``).
            ManifestError: the manifest is invalid (its ``CK-M`` code).
        """
        where = ckpt / atomic.MANIFEST_NAME
        try:
            data = fs.read_small(where, mf.MAX_MANIFEST_BYTES)
        except (OSError, CkptkitError):
            man = manifest_io.read(ckpt, key=self.key)  # raises the right CK-M001/M00x error
            return man, man.digest
        if len(data) > mf.MAX_MANIFEST_BYTES:
            man = manifest_io.read(ckpt, key=self.key)  # raises CK-M006
            return man, man.digest
        version = digest.hexdigest_bytes(data)
        hit = self._manifests.get(str(ckpt))
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        man = manifest_io.parse(ckpt, data, key=self.key, only=lambda _root: ())
        if man.file_sizes() is None:
            man = manifest_io.parse(ckpt, data, key=self.key)
        self._manifests[str(ckpt)] = (version, man, man.digest)
        return man, man.digest

    def index(self) -> dict[str, Any]:
        """The run index (``{}`` when absent or unreadable: it is advisory).

        Raises:
            UnsafeInputError: ``CK-F022``, the index is a FIFO, device, directory or
                symlink: never opened (a FIFO would block), never silently replaced.
        """
        try:
            data = json.loads(fs.read_small(self.root / INDEX, 64 << 20, hint=_INDEX_FIX))
        except CkptkitError:
            raise  # not a regular file (an UnsafeInputError is a ValueError too)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def list(self) -> builtins.list[CheckpointInfo]:
        """Every checkpoint directory of the run, oldest first, with its status.

        Cheap: reads manifests (cached) and stats files, never file contents. A
        checkpoint deleted while it is listed (a live run rotating) is left out. One
        directory per step: a second one for a step (``step-3`` beside
        ``step-00000003``) is not listed (:meth:`duplicates` names it), so it is never
        restored and never deleted by retention.
        """
        if fs.kind(self.root) != "dir":
            return []
        index = self.index()
        # Every restore, prune and save starts here and may end by rewriting ``latest``:
        # a pointer of the wrong kind stops them before they do anything.
        fs.check_regular(self.root / LATEST, hint=_LATEST_FIX)
        raw_rec, raw_pins = index.get("verified"), index.get("pins")
        records: dict[str, Any] = raw_rec if isinstance(raw_rec, dict) else {}
        extra_pins: dict[str, Any] = raw_pins if isinstance(raw_pins, dict) else {}
        out: builtins.list[CheckpointInfo] = []
        for step, paths in step_dirs(self.root).items():
            p = paths[0]
            try:
                info = self._info(p, step, records.get(p.name), extra_pins.get(p.name))
            except FileNotFoundError:
                if fs.kind(p) is not None:
                    raise
                continue  # deleted while we looked (rotation of a live run)
            if info is not None:
                out.append(info)
        return sorted(out, key=lambda c: c.step)

    def duplicates(self) -> builtins.list[tuple[Location, Location]]:
        """``(duplicate, the checkpoint of its step)`` for every second directory of a step.

        :meth:`list` lists the canonical one (:func:`canonical_first`); the others are
        reported here, never listed, restored or deleted: which copy is right is for a
        person to judge (``ckptkit verify`` checks both).

        Example:
            >>> import tempfile, os
            >>> d = tempfile.mkdtemp(); os.mkdir(d + "/step-3"); os.mkdir(d + "/step-00000003")
            >>> [(a.name, b.name) for a, b in Catalog(d).duplicates()]
            [('step-3', 'step-00000003')]
        """
        if fs.kind(self.root) != "dir":
            return []
        out = []
        for _step, paths in sorted(step_dirs(self.root).items()):
            if fs.kind(paths[0]) == "dir":
                out += [(p, paths[0]) for p in paths[1:] if fs.kind(p) == "dir"]
        return out

    def _info(self, p: Location, step: int, rec: Any, pins_extra: Any) -> CheckpointInfo | None:
        if fs.kind(p) != "dir":
            return None
        size = sum(n for _, n in fs.walk_files(p))
        try:
            man, digest = self.manifest(p)
        except IncompleteCheckpointError as e:
            if fs.kind(p) is None:
                raise FileNotFoundError(str(p)) from e
            return CheckpointInfo(step, p, "incomplete", size, _stored_at(p), problem=e.what)
        except UnreadableError as e:  # a permission or I/O error: not evidence of damage
            return CheckpointInfo(
                step, p, "unreadable", size, _stored_at(p), problem=f"{e.code}: {e.what}"
            )
        except CkptkitError as e:
            return CheckpointInfo(
                step, p, refused_status(e), size, _stored_at(p), problem=f"{e.code}: {e.what}"
            )
        mtime = _created_at(man) or _stored_at(p)
        status: Status = "committed"
        problem: str | None = None
        verdict = self.verdict(p.name, digest, rec)
        verified_at = verdict.at
        wrong_place = misplaced(p.name, man.step)
        if wrong_place is not None:
            # Not a checkpoint of this step, whatever a verify recorded for its bytes.
            status, problem = "unsound", f"{codes.S020}: {wrong_place}"
        elif verdict.outcome is None:
            problem = verdict.problem
        elif verdict.outcome != "verified":
            status, problem = verdict.outcome, verdict.problem
        else:
            changed = _changed_files(p, man)
            if changed:
                problem = (
                    f"files missing or resized since it was verified ({', '.join(changed[:3])}); "
                    "'ckptkit ls --verify' checks them again"
                )
            else:
                status = "verified"
        diverged = replica_problem(man.replicas)
        if diverged is not None and status in ("verified", "committed", "replica-divergent"):
            # Whole bytes of a state the replicas disagreed on: the manifest says so.
            status, problem = "replica-divergent", f"{codes.F120}: {diverged}"
        pins = set(man.pins)
        if isinstance(pins_extra, list):
            pins |= {x for x in pins_extra if isinstance(x, str)}
        health = health_level(man.health)
        return CheckpointInfo(
            step,
            p,
            status,
            size,
            mtime,
            tuple(sorted(pins)),
            health,
            problem,
            verified_at,
            dict(man.health) if isinstance(man.health, Mapping) else None,
        )

    def verdict(self, name: str, ident: str, rec: Any) -> Verdict:
        """The verdict the index record ``rec`` gives checkpoint ``name``, if it counts.

        It counts only while ``ident`` (the manifest digest, or a framework file's
        fingerprint) is the one it was made on, and, with a key, only if its MAC checks:
        whoever can write the run directory can edit the index, and an unsigned ``ok``
        must not make a checkpoint verified, nor an unsigned ``ok: false`` make one
        corrupt. Every layout reads its records through this method.

        Example:
            >>> import tempfile
            >>> Catalog(tempfile.mkdtemp()).verdict("step-1", "ab", {"digest": "ab", "ok": False})
            Verdict(outcome='corrupt', at=None, problem=None)
        """
        if not isinstance(rec, dict) or rec.get("digest") != ident:
            return Verdict(None)
        if self.key is not None:
            why = signing.check_verdict(name, rec, self.key)
            if why is not None:
                return Verdict(
                    None,
                    problem=f"its verify record in the run index does not count ({why}); "
                    "'ckptkit ls --verify' checks it again",
                )
        at = rec.get("at")
        raw = rec.get("outcome")
        outcome: codes.Outcome
        if raw in get_args(codes.Outcome):
            outcome = cast(codes.Outcome, raw)
        elif isinstance(rec.get("ok"), bool):  # written before outcomes had names
            outcome = "verified" if rec["ok"] else "corrupt"
        else:
            return Verdict(None, problem="its verify record in the run index is malformed")
        problem = rec.get("problem")
        return Verdict(
            outcome,
            at if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
            problem if isinstance(problem, str) else None,
        )

    def latest_name(self) -> str | None:
        """What the ``latest`` pointer names (None when there is no pointer).

        Raises:
            UnsafeInputError: ``CK-F022``, ``latest`` is not a regular file (never opened).
        """
        try:
            raw = fs.read_small(self.root / LATEST, 4096, hint=_LATEST_FIX)
        except OSError:
            return None
        name = raw.decode(errors="replace").strip()
        return name or None

    def leftovers(self) -> builtins.list[Location]:
        """Temporary directories of unfinished saves or deletions (never checkpoints)."""
        return atomic.leftovers(self.root)

    # --- recording (the caller holds the run lock) -------------------------------------------

    def record(
        self, path: Location, man: mf.Manifest, outcome: codes.Outcome, *, why: str | None
    ) -> None:
        """Record a verify outcome for this exact manifest (by its digest)."""
        self.note(path.name, man.digest, outcome, why=why)

    def note(self, name: str, digest: str, outcome: codes.Outcome, *, why: str | None) -> None:
        """Record a verify outcome for the checkpoint ``name`` as identified by ``digest``.

        The record counts only while ``digest`` still identifies what ``name`` holds (a
        native checkpoint: its manifest digest; a framework's file: its adopted manifest's
        digest, or a fingerprint of the file). With a key it is signed (see
        :meth:`verdict`). :meth:`record` calls it.

        Args:
            outcome: what was found (:func:`ckptkit.codes.outcome` of the error codes).
            why: the first findings, for ``ls``.
        """
        idx = self.index()
        ver = idx.get("verified")
        if not isinstance(ver, dict):
            ver = idx["verified"] = {}
        rec: dict[str, Any] = {
            "digest": digest,
            "ok": outcome == "verified",  # what readers before named outcomes look at
            "outcome": outcome,
            "at": time.time(),
            "problem": why,
        }
        if self.key is not None:
            rec["mac"] = signing.sign_verdict(name, rec, self.key)
        ver[name] = rec
        self._write_index(idx)

    def intend(self, name: str, step: int) -> None:
        """Record that the checkpoint ``name``, about to be written by a framework, will
        hold ``step`` (the *intent*): a kill before it is adopted still knows its step.

        With a key it is signed like a verdict (whoever can write the run directory must
        not be able to make a checkpoint resume at another step).
        """
        idx = self.index()
        intents = idx.get("intents")
        if not isinstance(intents, dict):
            intents = idx["intents"] = {}
        rec: dict[str, Any] = {"step": int(step), "at": time.time()}
        if self.key is not None:
            rec["mac"] = signing.sign_verdict(name, rec, self.key)
        intents[name] = rec
        self._write_index(idx)

    def intent(self, name: str, index: Mapping[str, Any] | None = None) -> int | None:
        """The step the intent record of ``name`` says it holds (see :meth:`intend`), None
        without one (or, with a key, with one whose MAC does not check).

        Example:
            >>> import tempfile
            >>> c = Catalog(tempfile.mkdtemp()); c.intend("checkpoint_1", 80)
            >>> c.intent("checkpoint_1"), c.intent("checkpoint_2")
            (80, None)
        """
        idx = self.index() if index is None else index
        intents = idx.get("intents")
        rec = intents.get(name) if isinstance(intents, dict) else None
        if not isinstance(rec, dict):
            return None
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return None
        if self.key is not None and signing.check_verdict(name, rec, self.key) is not None:
            return None
        return step

    # --- the run's signing record ----------------------------------------------------------

    def signed_by(self) -> str | None:
        """The id of the key this run is signed with, as far as its files say; None when
        nothing says it is signed.

        The run index records it (:meth:`mark_signed`, written by the first writer with a
        key); a run signed before that record existed, or whose record was removed, is
        still known by its checkpoints: the key id of the newest signed manifest. A record
        is a claim (whoever can write the directory can write one): it serves to refuse a
        writer without the run's key, never to trust a checkpoint. (Framework layouts keep
        their adopted manifests beside their own files: for them the record alone says it.)

        Example:
            >>> import tempfile
            >>> c = Catalog(tempfile.mkdtemp(), key=b"0123456789abcdef")
            >>> c.signed_by() is None
            True
            >>> c.mark_signed(); c.signed_by() == signing.key_id(b"0123456789abcdef")
            True
        """
        if fs.kind(self.root) != "dir":
            return None
        rec = self.index().get(SIGNED)
        if isinstance(rec, dict) and isinstance(rec.get("key_id"), str):
            return str(rec["key_id"])
        for _step, paths in sorted(step_dirs(self.root).items(), reverse=True):
            with contextlib.suppress(OSError, CkptkitError):
                man, _ = self.manifest(paths[0])
                if man.signature is not None:
                    return man.signature.key_id
        return None

    def mark_signed(self) -> None:
        """Record in the run index that this run is signed with the catalog's key (the
        caller holds the run lock); nothing without a key, or when a valid record of this
        key is there already."""
        if self.key is None:
            return
        idx = self.index()
        body = {"key_id": signing.key_id(self.key)}
        rec = idx.get(SIGNED)
        if (
            isinstance(rec, dict)
            and rec.get("key_id") == body["key_id"]
            and signing.check_verdict(SIGNED, rec, self.key) is None
        ):
            return
        idx[SIGNED] = {**body, "mac": signing.sign_verdict(SIGNED, body, self.key)}
        self._write_index(idx)

    def forget(self, names: Iterable[str]) -> None:
        """Drop the index records (verdicts, pins, intents) of deleted checkpoints."""
        idx = self.index()
        names = set(names)
        for key in ("verified", "pins", "intents"):
            sub = idx.get(key)
            if isinstance(sub, dict):
                for n in names & set(sub):
                    del sub[n]
        self._write_index(idx)

    def pin(self, path: Location, label: str) -> None:
        """Pin an existing checkpoint (it is never rotated away)."""
        idx = self.index()
        pins = idx.get("pins")
        if not isinstance(pins, dict):
            pins = idx["pins"] = {}
        mine = pins.setdefault(path.name, [])
        if label not in mine:
            mine.append(label)
        self._write_index(idx)

    def point_latest(
        self,
        infos: builtins.list[CheckpointInfo] | None = None,
        *,
        accept: tuple[Status, ...] = ("verified",),
    ) -> str | None:
        """Point ``latest`` at the newest checkpoint whose status is in ``accept``.

        With none, the pointer is removed: a pointer to a checkpoint that is not good
        would be worse than none. Returns the name pointed at.
        """
        infos = self.list() if infos is None else infos
        good = [c for c in infos if c.status in accept]
        target = self.root / LATEST
        if not good:
            if self.latest_name() is not None:
                fs.remove_file(target)
                self._sync_dir()
            return None
        name = good[-1].path.name
        if self.latest_name() != name:
            replace_text(target, name + "\n")
            self._sync_dir()
        return name

    def remove(self, path: Location) -> bool:
        """Delete a checkpoint directory so that it never looks committed half-deleted.

        Local: rename aside first, then remove; a crash mid-delete leaves a marked
        leftover (cleaned on the next open). Object store: delete the manifest first (the
        commit marker: the checkpoint is then an interrupted save, never loaded, cleaned
        on the next open), then the rest. Returns False when it was already gone.
        """
        return fs.remove_dir_aside(path, marker=atomic.MANIFEST_NAME, aside=f"{atomic.TMP_SUFFIX}.del-")

    def clean_leftovers(self) -> builtins.list[str]:
        """Remove leftovers of interrupted saves and deletions; call only under the lock.

        ``X.ckptkit-old.*`` is a committed checkpoint moved aside by an overwrite; if the
        crash came before the new ``X`` was renamed in, it is put back, never deleted.
        Half-written replacements of ``latest`` and the index go too. Returns what was
        done, one line each.
        """
        done: builtins.list[str] = []
        if fs.commits_in_place(self.root):
            return self._clean_remote()
        root = fs.local_path(self.root)
        assert root is not None  # a store with renames is a local disk
        for left in atomic.leftovers(self.root):
            p = fs.require_local(left, needs="cleaning up after an interrupted save")
            if atomic.OLD_SUFFIX in p.name:
                final = root / p.name.split(atomic.OLD_SUFFIX, 1)[0]
                if not final.exists() and whole(p):
                    os.rename(p, final)
                    atomic.fsync_dir(root)
                    done.append(
                        f"{p.name} was moved aside by an overwrite that never committed; "
                        f"restored it as {final.name}"
                    )
                    continue
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"removed {p.name} (left by an interrupted save or delete)")
        for name in (LATEST, INDEX):
            for f in root.glob(f"{glob.escape(name)}.*.tmp"):
                with contextlib.suppress(OSError):
                    f.unlink()
                    done.append(f"removed {f.name} (a half-written replacement)")
        for line in done:
            log.warning("ckptkit: %s", line)
        return done

    def _clean_remote(self) -> builtins.list[str]:
        """Object store: a step prefix without a manifest is an interrupted save (uploads
        go straight to the final prefix, the manifest last); remove it."""
        done = []
        for p in self.root.iterdir():
            if step_of(p.name) is not None and fs.kind(p / atomic.MANIFEST_NAME) is None:
                fs.remove_tree(p)
                done.append(f"removed {p.name} (an interrupted save: no manifest)")
        for line in done:
            log.warning("ckptkit: %s", line)
        return done

    def _sync_dir(self) -> None:
        fs.sync_dir(self.root)

    def _write_index(self, data: Mapping[str, Any]) -> None:
        replace_text(self.root / INDEX, json.dumps(data, indent=1, sort_keys=True))


# --- helpers ----------------------------------------------------------------------------------

_LATEST_FIX = (
    "ckptkit keeps the 'latest' pointer as a regular file holding one checkpoint name; "
    "remove this one while no ckptkit process writes to the run: the next save, restore or "
    "prune writes the pointer again"
)
_INDEX_FIX = (
    "ckptkit keeps its run index as a regular file; remove this one while no ckptkit "
    "process writes to the run: 'ckptkit ls --verify RUN' records the verify outcomes again"
)


def _changed_files(path: Location, man: mf.Manifest) -> list[str]:
    """Listed files (rank manifests too) that are missing or whose size differs from the
    manifest's (one listing of the checkpoint: a local walk, or one request on an object
    store)."""
    try:
        sizes = dict(fs.walk_files(path))
    except OSError:
        sizes = {}
    listed = man.file_sizes()
    assert listed is not None  # a manifest read in part records them (Catalog.manifest)
    return [p for p, n in listed.items() if sizes.get(p) != n]


def whole(path: Location) -> bool:
    """Return whether ``path`` holds a valid manifest and every file it lists, at full size."""
    try:
        man = manifest_io.read(path)
    except CkptkitError:
        return False
    return not _changed_files(path, man)


def replace_text(target: Location, text: str) -> None:
    """Replace a small file atomically (local: temp, fsync, rename; remote: one PUT)."""
    fs.replace_bytes(target, text.encode())


__all__ = [
    "INDEX",
    "LATEST",
    "STEP_RE",
    "Catalog",
    "CheckpointInfo",
    "Status",
    "Verdict",
    "canonical_first",
    "misplaced",
    "native_evidence",
    "replace_text",
    "step_dir_name",
    "step_dirs",
    "step_of",
    "whole",
]
