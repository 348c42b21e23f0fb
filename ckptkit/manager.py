"""``CheckpointManager``: step directories, the lock, commit, verify, ``latest``, then rotate.

The public methods keep the guard and commit logic (as torchtitan's
``BaseCheckpointManager.save`` does); bytes go through the storage engine. Order of a
save, each step only after the previous one succeeded:

1. take the run lock (one writer per run directory; a dead writer's lock is taken over);
2. write into a temporary sibling directory, manifest last, rename into place;
3. verify the new checkpoint (digests, completeness, consistency);
4. point ``latest`` at it (atomic replace);
5. rotate: delete what the retention policy releases, never the newest verified one.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import glob
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from ckptkit import guard as guard_mod
from ckptkit import manifest as mf
from ckptkit import rotation
from ckptkit.capture.state import RestoreResult, TrainState, grouper, rank_key
from ckptkit.errors import (
    CkptkitError,
    DistributedError,
    IncompleteCheckpointError,
    LockHeldError,
    StateError,
)
from ckptkit.storage import atomic, checkpoint, codec
from ckptkit.storage import dist as dist_mod
from ckptkit.storage import tree as tree_mod
from ckptkit.storage.lock import RunLock

log = logging.getLogger("ckptkit")

STEP_RE = re.compile(r"^step-(\d+)$")
LATEST = "latest"
INDEX = ".ckptkit-index.json"
"""Run-level record of which checkpoints verified (and extra pins); written under the lock."""

Status = Literal["verified", "committed", "corrupt", "incomplete"]


def step_dir_name(step: int) -> str:
    """Directory name of a step (``step-00001000``)."""
    return f"step-{step:08d}"


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a run directory, as ``ls`` shows it."""

    step: int
    path: Path
    status: Status
    size: int
    time: float
    pins: tuple[str, ...] = ()
    health: str | None = None
    problem: str | None = None
    """Why it is corrupt or incomplete."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "path": str(self.path),
            "status": self.status,
            "size": self.size,
            "time": self.time,
            "pins": list(self.pins),
            "health": self.health,
            "problem": self.problem,
        }


@dataclass
class _Pending:
    thread: threading.Thread
    step: int
    error: BaseException | None = None


@dataclass
class SaveStats:
    """Timings of the last save (seconds): what the caller waited for, and the total."""

    step: int = -1
    blocked: float = 0.0
    capture: float = 0.0
    write: float = 0.0
    verify: float = 0.0
    total: float = 0.0
    deleted: list[str] = field(default_factory=list)


class CheckpointManager:
    """Save, verify, restore and rotate the checkpoints of one run directory.

    Args:
        root: the run's checkpoint directory (``runs/exp1/ckpt``).
        keep_last: keep the newest K good checkpoints.
        keep_every: also keep every checkpoint whose step is a multiple of this.
        max_bytes: drop the oldest unprotected checkpoints to stay under this many bytes.
        compress: ``"zstd"`` to compress every file.
        lock_timeout: seconds a save waits for another writer's lock before failing.
        verify_after_save: verify each new checkpoint before it becomes ``latest`` and
            before rotation (turn off only if you verify elsewhere).
        readonly: open for listing and restoring only: create nothing, clean nothing,
            refuse ``save``/``prune`` (what ``ckptkit ls`` uses).

    On open, temporary directories left by an interrupted save are reported and, when
    no live writer holds the run, removed under the writer lock; a committed checkpoint
    is never touched (one caught mid-overwrite is put back in place).

    Example:
        >>> import tempfile, torch, ckptkit
        >>> model = torch.nn.Linear(2, 2)
        >>> ts = ckptkit.TrainState(model=model, step=10)
        >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), keep_last=2)
        >>> mgr.save(ts).name
        'step-00000010'
        >>> mgr.restore(ts).step
        10
    """

    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int = 3,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        compress: codec.Compression | None = None,
        lock_timeout: float = 0.0,
        verify_after_save: bool = True,
        readonly: bool = False,
        watch: Any = None,
        emergency: Any = None,
    ) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1: the newest checkpoint is always kept")
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.max_bytes = max_bytes
        self.compress = compress
        self.lock_timeout = lock_timeout
        self.verify_after_save = verify_after_save
        self.readonly = readonly
        # Stability integration (ckptkit.stability): the watch's snapshot goes into every
        # manifest's health field; observe() saves a pinned emergency checkpoint.
        self.watch = watch
        if emergency is None and watch is not None:
            from ckptkit.stability import EmergencyPolicy

            emergency = EmergencyPolicy()
        self.emergency = emergency
        self._lock: RunLock | None = None
        self._pending: _Pending | None = None
        self._staging: dict[str, torch.Tensor] = {}
        self._manifests: dict[str, tuple[tuple[int, int, int], mf.Manifest, str]] = {}
        self.last_save = SaveStats()
        if not readonly:
            self.root.mkdir(parents=True, exist_ok=True)
        self._clean_on_open()

    def _clean_on_open(self) -> None:
        """Report leftovers of an interrupted save; remove them if no live writer runs."""
        g = dist_mod.group()
        if g is not None and g.rank != 0:
            return  # rank 0 owns the run directory's housekeeping in a multi-rank run
        left = atomic.leftovers(self.root)
        if not left:
            return
        what = (
            f"{len(left)} leftover temporary director{'y' if len(left) == 1 else 'ies'} in "
            f"{self.root} from an interrupted save: {', '.join(p.name for p in left)}"
        )
        if self.readonly:
            log.warning("ckptkit: %s (left in place: opened read-only)", what)
            return
        lock = RunLock(self.root, timeout=0.0)
        try:
            lock.acquire()
        except LockHeldError as e:
            # A live writer may be writing them right now: they are its business.
            log.warning("ckptkit: %s (left in place: %s)", what, e.what)
            return
        try:
            log.warning("ckptkit: %s; cleaning up", what)
            self._clean_leftovers()
        finally:
            lock.release()

    def _clean_leftovers(self) -> None:
        """Remove leftovers of interrupted saves and deletions; call only under the lock.

        ``X.ckptkit-old.*`` is a committed checkpoint moved aside by an overwrite; if the
        crash came before the new ``X`` was renamed in, it is put back, never deleted.
        """
        for p in atomic.leftovers(self.root):
            if atomic.OLD_SUFFIX in p.name:
                final = self.root / p.name.split(atomic.OLD_SUFFIX, 1)[0]
                if not final.exists() and _whole(p):
                    os.rename(p, final)
                    atomic.fsync_dir(self.root)
                    log.warning(
                        "ckptkit: %s was moved aside by an overwrite that never committed; "
                        "restored it as %s",
                        p.name,
                        final.name,
                    )
                    continue
            log.warning(
                "ckptkit: removing %s (left by an interrupted save or delete; "
                "never a committed checkpoint)",
                p.name,
            )
            shutil.rmtree(p, ignore_errors=True)
        # Half-written replacements of the run's small files (``latest``, the index).
        for name in (LATEST, INDEX):
            for f in self.root.glob(f"{glob.escape(name)}.*.tmp"):
                with contextlib.suppress(OSError):
                    f.unlink()

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Wait for a pending async save, then release the writer lock."""
        try:
            self.wait()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._lock is not None:
                self._lock.release()

    def _writer(self) -> None:
        """Become the run's single writer (once), then clean leftovers nobody else owns."""
        if self._lock is not None:
            return
        if self.readonly:
            raise CkptkitError(
                "this CheckpointManager was opened read-only",
                path=self.root,
                hint="open it without readonly=True to save or prune",
            )
        lock = RunLock(self.root, timeout=self.lock_timeout)
        lock.acquire()
        self._lock = lock
        self._clean_leftovers()

    @contextlib.contextmanager
    def _maybe_writer(self) -> Iterator[bool]:
        """Yield True while this process may update the run's records (it holds the lock).

        Readers (restore, ``ls --verify``) record what they found only when no other
        writer runs; otherwise they report it and leave the records to the writer.
        """
        if self._lock is not None:
            yield True
            return
        if self.readonly:
            yield False
            return
        g = dist_mod.group()
        if g is not None and g.rank != 0:
            yield False  # only rank 0 records (one writer per run directory)
            return
        lock = RunLock(self.root, timeout=0.0)
        try:
            lock.acquire()
        except LockHeldError:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    # --- listing -------------------------------------------------------------------------

    def _index(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / INDEX).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write_index(self, data: Mapping[str, Any]) -> None:
        _replace_text(self.root / INDEX, json.dumps(data, indent=1, sort_keys=True))

    def _record(self, path: Path, man: mf.Manifest, ok: bool, why: str | None) -> None:
        """Record a verify outcome for this exact manifest and these exact files."""
        idx = self._index()
        ver = idx.setdefault("verified", {})
        ver[path.name] = {
            "digest": man.to_dict()["manifest_digest"],
            "ok": ok,
            "at": time.time(),
            "problem": why,
            "files": _fingerprint(path, man),
        }
        self._write_index(idx)

    def _manifest(self, ckpt: Path) -> tuple[mf.Manifest, str]:
        """Read (and validate) a checkpoint's manifest once per version of the file.

        A save lists the run three times (latest, plan, rotate); re-validating every
        manifest each time dominated saves of models with many tensors. The cache key
        is the manifest file's inode, size and mtime, so a rewrite is read again.
        """
        p = ckpt / atomic.MANIFEST_NAME
        try:
            st_ = p.stat()
        except OSError:
            return mf.read(ckpt), ""  # raises IncompleteCheckpointError (CK-M001)
        key = (st_.st_ino, st_.st_size, st_.st_mtime_ns)
        hit = self._manifests.get(str(ckpt))
        if hit is not None and hit[0] == key:
            return hit[1], hit[2]
        man = mf.read(ckpt)
        digest = man.to_dict()["manifest_digest"]
        self._manifests[str(ckpt)] = (key, man, digest)
        return man, digest

    def list(self, *, verify: bool = False) -> list[CheckpointInfo]:
        """Every checkpoint directory of the run, oldest first, with its status.

        ``verified``: verify passed for this exact manifest and its files have not changed
        since (size and mtime); ``committed``: has a valid manifest, not verified yet (or
        its files changed since); ``corrupt``: verify failed (at save, restore or
        ``verify=True``) or the manifest is invalid; ``incomplete``: a step directory
        without a manifest. Temporary directories of unfinished saves are not listed.

        Args:
            verify: re-verify every committed checkpoint now (reads every byte) and
                record the outcome when no other writer holds the run.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp())
            >>> _ = mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=3))
            >>> [(c.step, c.status) for c in mgr.list()]
            [(3, 'verified')]
        """
        if verify:
            self.wait()
        index = self._index()
        idx = index.get("verified", {})
        extra_pins = index.get("pins", {})
        out: list[CheckpointInfo] = []
        if not self.root.is_dir():
            return out
        for p in self.root.iterdir():
            m = STEP_RE.match(p.name)
            if not m or not p.is_dir():
                continue
            step = int(m.group(1))
            size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            mtime = p.stat().st_mtime
            try:
                man, digest = self._manifest(p)
            except IncompleteCheckpointError as e:
                out.append(CheckpointInfo(step, p, "incomplete", size, mtime, problem=e.what))
                continue
            except CkptkitError as e:
                out.append(
                    CheckpointInfo(step, p, "corrupt", size, mtime, problem=f"{e.code}: {e.what}")
                )
                continue
            rec = idx.get(p.name)
            status: Status = "committed"
            problem = None
            if verify:
                from ckptkit.verify.runner import verify_one

                bad = verify_one(p, progress=False).errors
                status = "corrupt" if bad else "verified"
                problem = _why(bad)
                with self._maybe_writer() as can_record:
                    if can_record:
                        self._record(p, man, not bad, problem)
            elif rec and rec.get("digest") == digest:
                if rec.get("files") not in (None, _fingerprint(p, man)):
                    problem = (
                        "files changed since it was verified; 'ckptkit ls --verify' "
                        "checks them again"
                    )
                else:
                    status = "verified" if rec.get("ok") else "corrupt"
                    problem = rec.get("problem")
            pins = tuple(sorted(set(man.pins) | set(extra_pins.get(p.name, []))))
            health = (man.health or {}).get("level") if man.health else None
            out.append(CheckpointInfo(step, p, status, size, mtime, pins, health, problem))
        return sorted(out, key=lambda c: c.step)

    def latest(self) -> CheckpointInfo | None:
        """The newest verified checkpoint (None when there is none).

        Example:
            >>> import tempfile, torch, ckptkit
            >>> ckptkit.CheckpointManager(tempfile.mkdtemp()).latest() is None
            True
        """
        good = [c for c in self.list() if c.status == "verified"]
        return good[-1] if good else None

    def leftovers(self) -> builtins.list[Path]:
        """Temporary directories of unfinished saves or deletions (never checkpoints)."""
        return atomic.leftovers(self.root)

    # --- save ----------------------------------------------------------------------------

    def save(
        self,
        state: TrainState,
        step: int | None = None,
        *,
        pin: str | Iterable[str] | None = None,
        async_: bool = False,
        health: Mapping[str, Any] | None = None,
        lookahead: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Path:
        """Save ``state`` as ``step-NNNNNNNN``: commit, verify, point ``latest``, rotate.

        Args:
            state: the :class:`TrainState` to capture.
            step: the step label (default: ``state.step``).
            pin: label(s) that protect this checkpoint from rotation (``"best"``,
                ``"emergency"``).
            async_: copy the state to host memory now (a consistent snapshot), write it
                in a background thread and return; the next save, :meth:`wait` or
                :meth:`close` joins it and raises its error if it failed.
            health: stability level and window statistics recorded in the manifest.
            lookahead: what the run will do next (resume guard), recorded in the manifest.
            overwrite: replace an existing checkpoint of the same step.

        Returns:
            The checkpoint directory (it exists once the save has committed; for an
            async save, after :meth:`wait`).

        With a process group of more than one rank initialised, ``save`` is collective:
        call it on every rank. Every rank writes its own files (its RNG state, a share
        of the replicated model/optimizer shards, its DCP shards); rank 0 gathers the
        file digests and every rank's cursor, writes the manifest last and commits. A
        failure on any rank commits nothing and raises on every rank.

        Raises:
            LockHeldError: another live writer holds the run directory.
            CkptkitError: the write or verification failed; older checkpoints are intact.
            DistributedError: the save failed on another rank.
        """
        t0 = time.perf_counter()
        step = state.step if step is None else int(step)
        pins = (pin,) if isinstance(pin, str) else tuple(pin or ())
        g = dist_mod.group()
        if g is not None:
            if async_:
                log.info(
                    "ckptkit: async_=True is not supported for multi-rank saves; saving "
                    "synchronously"
                )
            fields0: dict[str, Any] = {"pins": pins}
            if health is None and self.watch is not None:
                health = self.watch.snapshot()
            if health is not None:
                fields0["health"] = dict(health)
            fields0["lookahead"] = self._lookahead(state, lookahead)
            return self._save_dist(state, g, step, fields0, overwrite=overwrite, t0=t0)
        self.wait()  # one save in flight at most; surfaces a failed async save
        self._writer()
        guard_la = self._lookahead(state, lookahead)
        tree, comps = state.capture()
        t_cap = time.perf_counter()
        encoded = tree_mod.encode(tree)
        final = self.root / step_dir_name(step)
        fields: dict[str, Any] = {"pins": pins}
        if health is None and self.watch is not None:
            health = self.watch.snapshot()
        if health is not None:
            fields["health"] = dict(health)
        fields["lookahead"] = guard_la
        env = state.env()
        stats = SaveStats(step=step, capture=t_cap - t0)
        if async_:
            job = (self._stage(encoded), final, comps, env, step, fields, overwrite, stats, t0)

            def run() -> None:
                # The error goes on this save's own record (not self._pending, which
                # wait() may have cleared already) so wait() always sees it.
                try:
                    self._commit(*job)
                except BaseException as e:
                    pending.error = e
                    log.error("ckptkit: async save of step %d failed: %s", step, e)

            th = threading.Thread(target=run, name=f"ckptkit-save-{step}", daemon=False)
            pending = _Pending(thread=th, step=step)
            self._pending = pending
            stats.blocked = time.perf_counter() - t0
            th.start()
            self.last_save = stats
            return final
        self._commit(encoded, final, comps, env, step, fields, overwrite, stats, t0)
        stats.blocked = stats.total
        self.last_save = stats
        return final

    @staticmethod
    def _lookahead(
        state: TrainState, user: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The user's look-ahead plus the automatic resume-guard one (``guard`` key).

        Computed before capture, from the same instant: peeking the sampler and hashing
        the RNG consume nothing. Per-rank facts (sample ids, RNG) are rank 0's.
        """
        out = dict(user or {})
        if state.guard_k > 0:
            la = guard_mod.compute(state, k=state.guard_k, probe=state.probe)
            la["world_size"] = state.parallel.world_size
            out[guard_mod.GUARD_KEY] = la
        return out

    def _save_dist(
        self,
        state: TrainState,
        g: dist_mod.Group,
        step: int,
        fields: dict[str, Any],
        *,
        overwrite: bool,
        t0: float,
    ) -> Path:
        """The collective save (see :meth:`save`); every rank returns or raises together."""
        final = self.root / step_dir_name(step)
        stats = SaveStats(step=step)
        pending: atomic.PendingCheckpoint | None = None
        what = f"multi-rank save of {final.name}"
        # 1. rank 0 takes the run lock and makes the temporary directory; all learn its name.
        err: BaseException | None = None
        if g.rank == 0:
            try:
                self.wait()
                self._writer()
                pending = atomic.PendingCheckpoint.create(final, overwrite=overwrite)
            except BaseException as e:
                err = e
        tmp_name, msg = dist_mod.broadcast(
            (str(pending.tmp), None)
            if pending is not None
            else (None, dist_mod.describe(err) if err else None)
        )
        if tmp_name is None:
            if err is not None:
                raise err
            raise DistributedError(
                f"{what} failed on rank 0: {msg}",
                path=final,
                hint="see rank 0's log; nothing was written",
            )
        tmp = Path(tmp_name)
        try:
            payload = self._write_rank(state, g, tmp, stats)
        except BaseException as e:
            payload, err = None, e
        # 2. every rank's files and cursors to rank 0; a dead rank fails this gather.
        try:
            gathered = dist_mod.all_gather(
                (None if err is None else dist_mod.describe(err), payload)
            )
        except BaseException as e:
            if pending is not None:
                pending.abort()
            raise DistributedError(
                f"{what}: the gather of per-rank results failed ({dist_mod.describe(e)}); "
                "a rank died or timed out mid-save",
                path=final,
                hint="nothing was committed; the previous checkpoints are intact",
            ) from e
        failed = [(r, m) for r, (m, _) in enumerate(gathered) if m is not None]
        if failed:
            if pending is not None:
                pending.abort()
            if err is not None:
                raise err
            raise DistributedError(
                f"{what} failed on rank(s) {', '.join(str(r) for r, _ in failed)}: "
                + " | ".join(f"rank {r}: {m}" for r, m in failed),
                path=final,
                hint="nothing was committed; see that rank's log for the cause",
            )
        # 3. rank 0 merges, writes the manifest (the commit), verifies, points latest, rotates.
        outcome: str | None = None
        if g.rank == 0:
            assert pending is not None
            try:
                self._commit_dist(state, pending, [p for _, p in gathered], step, fields, stats)
            except BaseException as e:
                err = e
                outcome = dist_mod.describe(e)
        outcome = dist_mod.broadcast(outcome)
        if outcome is not None:
            if err is not None:
                raise err
            raise DistributedError(
                f"{what} failed on rank 0 at commit: {outcome}", path=final, hint="see rank 0's log"
            )
        stats.total = stats.blocked = time.perf_counter() - t0
        self.last_save = stats
        return final

    def _write_rank(
        self, state: TrainState, g: dist_mod.Group, tmp: Path, stats: SaveStats
    ) -> dict[str, Any]:
        """One rank's part of a multi-rank save: capture, write and hash its own files."""
        if (state.parallel.world_size, state.parallel.rank) != (g.world_size, g.rank):
            raise StateError(
                f"TrainState.parallel says rank {state.parallel.rank} of "
                f"{state.parallel.world_size}, the process group rank {g.rank} of "
                f"{g.world_size}",
                hint="build the TrainState after init_process_group, or pass "
                "parallel=ckptkit.ParallelConfig.from_env(...)",
            )
        tc = time.perf_counter()
        err: BaseException | None = None
        try:
            tree, comps = state.capture()
        except BaseException as e:
            err = e
        # Agree that every rank captured before entering DCP's collective save.
        dist_mod.consensus(err, what="capture")
        stats.capture = time.perf_counter() - tc
        tw = time.perf_counter()
        files: list[mf.FileEntry] = []
        if state.uses_dcp:
            dist_mod.dcp_save(state.dcp_state(), tmp)
            files += dist_mod.hash_files(
                tmp,
                dist_mod.dcp_files_of(tmp, g.rank),
                component=dist_mod.DCP_COMPONENT,
                rank=g.rank,
            )
        encoded = tree_mod.encode(tree)
        mine = rank_key(g.rank)
        spread = {k: t for k, t in encoded.tensors.items() if k.split("/", 1)[0] in _SPREAD}
        own = {k: t for k, t in encoded.tensors.items() if k.startswith(f"rng/{mine}/")}
        rest = {k: t for k, t in encoded.tensors.items() if k not in spread and k not in own}
        # Replicated model/optimizer shards: every rank holds the same bytes (DDP), so the
        # files are planned identically everywhere and split over the ranks to write in
        # parallel. Other replicated state comes from rank 0; per-rank state from its rank.
        total = sum(t.numel() * t.element_size() for t in spread.values())
        shard = min(
            checkpoint.DEFAULT_SHARD_BYTES, max(_MIN_SPREAD_SHARD, -(-total // (2 * g.world_size)))
        )
        plan_spread = checkpoint.plan_shards(
            tree_mod.Encoded(encoded.tree, spread),
            grouper=grouper,
            shard_bytes=shard,
            compress=self.compress,
        )
        owner = dist_mod.assign(
            [
                (n, sum(spread[k].numel() * spread[k].element_size() for k in ks))
                for n, ks in plan_spread.files.items()
            ],
            g.world_size,
        )
        parts: builtins.list[tuple[checkpoint.ShardPlan, builtins.list[str] | None]] = [
            (plan_spread, [n for n, r in owner.items() if r == g.rank])
        ]
        parts.append(
            (
                checkpoint.plan_shards(
                    tree_mod.Encoded(encoded.tree, own), grouper=grouper, compress=self.compress
                ),
                None,
            )
        )
        if g.rank == 0:
            parts.append(
                (
                    checkpoint.plan_shards(
                        tree_mod.Encoded(encoded.tree, rest),
                        grouper=grouper,
                        compress=self.compress,
                    ),
                    None,
                )
            )
        tensors: list[mf.TensorEntry] = []
        for plan, names in parts:
            fes, tes = checkpoint.write_shards(
                encoded, plan, tmp, names=names, compress=self.compress, rank=g.rank
            )
            files += fes
            tensors += tes
        stats.write = time.perf_counter() - tw
        samp = encoded.tree.get("sampler")
        out: dict[str, Any] = {
            "files": files,
            "tensors": tensors,
            "rng": encoded.tree.get("rng", {}).get(mine),
            "rng_fingerprint": comps["rng"].summary.get("fingerprints", {}).get(mine),
            "sampler": samp.get("state") if isinstance(samp, dict) else None,
        }
        if g.rank == 0:
            out.update(tree=encoded.tree, comps=comps, env=state.env())
        return out

    def _commit_dist(
        self,
        state: TrainState,
        pending: atomic.PendingCheckpoint,
        parts: builtins.list[dict[str, Any]],
        step: int,
        fields: Mapping[str, Any],
        stats: SaveStats,
    ) -> None:
        """Rank 0: merge every rank's entries into one manifest and commit it."""
        try:
            head = parts[0]
            tree = dict(head["tree"])
            comps: dict[str, mf.Component] = dict(head["comps"])
            files = [fe for p in parts for fe in p["files"]]
            tensors = [te for p in parts for te in p["tensors"]]
            rng_tree = dict(tree.get("rng") or {})
            prints: dict[str, Any] = {}
            for r, p in enumerate(parts):
                if p["rng"] is not None:
                    rng_tree[rank_key(r)] = p["rng"]
                if p["rng_fingerprint"] is not None:
                    prints[rank_key(r)] = p["rng_fingerprint"]
            tree["rng"] = rng_tree
            rc = comps["rng"]
            comps["rng"] = replace(
                rc,
                summary={
                    **dict(rc.summary),
                    "ranks": sorted(int(k[4:]) for k in rng_tree),
                    "fingerprints": prints,
                },
            )
            if isinstance(tree.get("sampler"), dict):
                tree["sampler"] = {
                    **tree["sampler"],
                    "ranks": {
                        rank_key(r): p["sampler"]
                        for r, p in enumerate(parts)
                        if p["sampler"] is not None
                    },
                }
            by_comp: dict[str, list[str]] = {}
            for fe in files:
                if fe.component == dist_mod.DCP_COMPONENT:
                    for c in (tree.get("dcp") or {}).get("keys", []):
                        by_comp.setdefault(c, []).append(fe.path)
                elif fe.component:
                    by_comp.setdefault(fe.component, []).append(fe.path)
            for name, c in comps.items():
                if c.present and not c.where:
                    comps[name] = replace(
                        c, where=tuple(by_comp.get(name, ())) or (f"manifest:tree/{name}",)
                    )
            man = mf.Manifest(
                files=tuple(sorted(files, key=lambda f: f.path)),
                tensors=tuple(tensors),
                tree=tree,
                components=comps,
                env=dict(head["env"]),
                step=step,
                **{**fields, "pins": tuple(fields.get("pins", ()))},
            )
            mf.write(pending.tmp, man)
            pending.finalize()
        except OSError as e:
            pending.abort()
            if isinstance(e, CkptkitError):
                raise
            raise _save_error(e, pending.final) from e
        except BaseException:
            pending.abort()
            raise
        final = pending.final
        self._verify_then_rotate(final, man, stats)

    def _verify_then_rotate(self, final: Path, man: mf.Manifest, stats: SaveStats) -> None:
        """Verify a just-committed checkpoint, then point ``latest`` and rotate.

        Rotation runs only after the new checkpoint committed and verified: a failed
        verify raises here, so nothing is deleted on its account.
        """
        tv = time.perf_counter()
        if self.verify_after_save:
            from ckptkit.verify.runner import verify_one

            bad = verify_one(final, progress=False).errors
            self._record(final, man, not bad, _why(bad))
            if bad:
                raise bad[0].to_error(base=str(final))
        stats.verify = time.perf_counter() - tv
        self._update_latest()
        stats.deleted = self._rotate()

    def _stage(self, encoded: tree_mod.Encoded) -> tree_mod.Encoded:
        """Copy tensors into reusable host buffers: one staging copy, reused across saves."""
        staged: dict[str, torch.Tensor] = {}
        pin = torch.cuda.is_available()
        for k, t in encoded.tensors.items():
            buf = self._staging.get(k)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin and t.is_cuda)
                self._staging[k] = buf
            buf.copy_(t.detach(), non_blocking=t.is_cuda)
            staged[k] = buf
        for dev in {t.device for t in encoded.tensors.values() if t.is_cuda}:
            torch.cuda.synchronize(dev)  # every device copied from, not only the current one
        for k in set(self._staging) - set(encoded.tensors):
            del self._staging[k]  # keys gone from the state: free their buffers
        return tree_mod.Encoded(tree=encoded.tree, tensors=staged)

    def _commit(
        self,
        encoded: tree_mod.Encoded,
        final: Path,
        comps: dict[str, mf.Component],
        env: Mapping[str, Any],
        step: int,
        fields: Mapping[str, Any],
        overwrite: bool,
        stats: SaveStats,
        t0: float,
    ) -> None:
        tw = time.perf_counter()
        try:
            man = checkpoint.write_checkpoint(
                None,
                final,
                encoded=encoded,
                compress=self.compress,
                grouper=grouper,
                components=lambda enc, plan: checkpoint.fill_where(comps, enc, plan),
                env=env,
                step=step,
                overwrite=overwrite,
                progress=False,
                manifest_fields=fields,
            )
        except OSError as e:
            if isinstance(e, CkptkitError):
                raise
            raise _save_error(e, final) from e
        stats.write = time.perf_counter() - tw
        self._verify_then_rotate(final, man, stats)
        stats.total = time.perf_counter() - t0

    def _update_latest(self) -> None:
        """Point ``latest`` at the newest verified checkpoint (atomic replace); under the lock."""
        infos = self.list()
        ok = ("verified",) if self.verify_after_save else ("verified", "committed")
        good = [c for c in infos if c.status in ok]
        target = self.root / LATEST
        if not good:
            # A pointer to a checkpoint that is not good would be worse than none.
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            return
        name = good[-1].path.name
        with contextlib.suppress(OSError):
            if target.read_text().strip() == name:
                return
        _replace_text(target, name + "\n")
        atomic.fsync_dir(self.root)

    def wait(self) -> None:
        """Join a pending async save; raise its error if it failed."""
        p, self._pending = self._pending, None
        if p is None:
            return
        p.thread.join()
        if p.error is not None:
            raise p.error

    def observe(self, state: TrainState, verdict: Any = None) -> Path | None:
        """Act on a stability verdict: save and pin an emergency checkpoint when due.

        Call once per step after feeding the watch (``verdict`` defaults to
        ``self.watch.last``). On the first ``warn`` of an episode (see
        :class:`ckptkit.stability.EmergencyPolicy`: level, rate limit, pin label) the
        current state is saved synchronously and pinned, with the watch's snapshot as its
        health. If a checkpoint of this step exists already, it is pinned instead.

        Returns:
            The emergency checkpoint's directory, or None when nothing was saved.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> from ckptkit.stability import StabilityWatch
            >>> w = StabilityWatch()
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), watch=w)
            >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=7)
            >>> _ = w.update(7, loss=float("nan"))
            >>> mgr.observe(ts).name, mgr.list()[0].pins
            ('step-00000007', ('emergency',))
        """
        v = verdict if verdict is not None else (self.watch.last if self.watch else None)
        policy = self.emergency
        if v is None or policy is None or not policy.should_save(v):
            return None
        self.wait()  # an async save of this very step may still be renaming into place
        existing = self.root / step_dir_name(state.step)
        if existing.exists():
            self._writer()
            idx = self._index()
            pins = idx.setdefault("pins", {}).setdefault(existing.name, [])
            if policy.pin not in pins:
                pins.append(policy.pin)
            self._write_index(idx)
            path = existing
        else:
            path = self.save(state, pin=policy.pin)
        policy.saved(v.step)
        log.warning("ckptkit: emergency checkpoint %s (%s)", path.name, v.summary())
        return path

    # --- rotation ------------------------------------------------------------------------

    def plan(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        delete_corrupt: bool = False,
    ) -> rotation.RetentionPlan:
        """The retention plan for the run as it is now (nothing is deleted)."""
        infos = self.list()
        ck = [
            rotation.CkptInfo(
                step=c.step,
                size=c.size,
                # With verify_after_save off, a committed checkpoint is as good as it gets.
                verified=c.status == "verified"
                or (not self.verify_after_save and c.status == "committed"),
                corrupt=c.status in ("corrupt", "incomplete"),
                pinned=frozenset(c.pins),
                health=c.health,
                time=c.time,
            )
            for c in infos
        ]
        return rotation.plan(
            ck,
            keep_last=self.keep_last if keep_last is None else keep_last,
            keep_every=self.keep_every if keep_every is None else keep_every,
            max_bytes=self.max_bytes if max_bytes is None else max_bytes,
            delete_corrupt=delete_corrupt,
        )

    def prune(self, *, dry_run: bool = False, **policy: Any) -> rotation.RetentionPlan:
        """Apply the retention plan (or only return it with ``dry_run``).

        Takes the writer lock first (``LockHeldError`` while a training run holds it),
        so the plan is made and applied with no save in between.

        Example:
            >>> import tempfile, torch, ckptkit
            >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp(), keep_last=5)
            >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
            >>> for s in (1, 2, 3):
            ...     ts.step = s; _ = mgr.save(ts)
            >>> [d.reason for d in mgr.prune(keep_last=1).decisions if not d.keep]
            ['delete: beyond keep_last=1', 'delete: beyond keep_last=1']
        """
        if dry_run:
            return self.plan(**policy)
        self.wait()
        self._writer()
        plan = self.plan(**policy)
        self._delete(plan)
        return plan

    def _rotate(self) -> builtins.list[str]:
        if self.verify_after_save:
            # A checkpoint that committed but was never verified (its writer died in
            # between) is verified now, so keep_last counts it instead of deleting it.
            from ckptkit.verify.runner import verify_one

            for c in self.list():
                if c.status == "committed":
                    bad = verify_one(c.path, progress=False).errors
                    with contextlib.suppress(CkptkitError):
                        self._record(c.path, mf.read(c.path), not bad, _why(bad))
        return self._delete(self.plan())

    def _delete(self, plan: rotation.RetentionPlan) -> builtins.list[str]:
        newest_good = max((c.step for c in plan.keep if c.good), default=None)
        deleted = []
        for d in plan.decisions:
            if d.keep:
                continue
            if d.ckpt.good and (newest_good is None or d.ckpt.step > newest_good):
                # Belt and braces: the plan never releases the newest verified checkpoint.
                log.error("ckptkit: refusing to delete step %d: newest verified", d.ckpt.step)
                continue
            path = self.root / step_dir_name(d.ckpt.step)
            if not path.exists():
                continue
            # Rename first: a crash mid-delete leaves a marked leftover, never a
            # half-deleted directory that still looks committed. The temporary suffix
            # (not the overwrite one) tells cleanup to finish the delete, not undo it.
            doomed = path.with_name(f"{path.name}{atomic.TMP_SUFFIX}.del-{uuid.uuid4().hex[:8]}")
            os.rename(path, doomed)
            atomic.fsync_dir(self.root)
            shutil.rmtree(doomed, ignore_errors=True)
            why = d.reason.removeprefix("delete: ")
            log.info("ckptkit: deleted %s: %s", path.name, why)
            deleted.append(f"{path.name}: {why}")
        return deleted

    # --- restore -------------------------------------------------------------------------

    def restore(
        self,
        state: TrainState,
        step: int | None = None,
        *,
        strict: bool = True,
        healthy: bool = False,
    ) -> RestoreResult | None:
        """Restore the newest checkpoint that verifies (or exactly ``step``).

        Candidates are tried newest first; one that fails verification while it is read
        (digest, size, header) or lacks a required component is skipped with a warning
        saying why, and the next older one is tried. One that failed verification before
        (status ``corrupt``) is skipped without reading it. A failure found here is
        recorded (``ls`` then shows it corrupt, rotation no longer counts it as good) and
        ``latest`` re-pointed, when no other writer holds the run. Returns None when the
        run has no checkpoint at all (a fresh start).

        With ``healthy=True`` only checkpoints whose recorded health level is ``ok`` are
        candidates (the rollback after an instability; see :mod:`ckptkit.stability`): each
        newer one passed over is logged with its health signals, and an attached watch is
        reset.

        Tensors are read into ``state``'s own tensors; if a candidate fails halfway, the
        next one overwrites them, and if every candidate fails ``state`` must not be used.

        Raises:
            IncompleteCheckpointError: checkpoints exist but none could be restored
                (each reason listed), or ``step`` does not exist.
            CkptkitError: ``step`` was given and that checkpoint fails.
        """
        self.wait()
        infos = [c for c in self.list() if c.status in ("verified", "committed", "corrupt")]
        unhealthy: list[str] = []
        if healthy:
            # healthy=True: only checkpoints whose recorded health is "ok" (the rollback
            # target); each one passed over is logged with why (ckptkit.stability.rollback).
            from ckptkit.stability import choose_healthy

            pick = choose_healthy(infos)
            for why in pick.reasons[:-1] if pick.checkpoint is not None else pick.reasons:
                log.warning("ckptkit: restore(healthy=True): %s", why)
            unhealthy = [f"{r} (healthy=True)" for r in pick.reasons if ": skipped" in r]
            infos = [c for c in infos if c.health == "ok"]
            if not infos:
                raise IncompleteCheckpointError(
                    "no checkpoint with health ok: " + " | ".join(pick.reasons or ["none saved"]),
                    path=self.root,
                    hint="restore without healthy=True to take the newest verified one anyway",
                )
            if self.watch is not None:
                self.watch.reset()  # its windows describe the run we are rolling back from
        if step is not None:
            infos = [c for c in infos if c.step == step]
            if not infos:
                raise IncompleteCheckpointError(
                    f"no committed checkpoint for step {step}",
                    path=self.root,
                    hint="'ckptkit ls RUN' lists the steps that exist",
                )
        elif not infos:
            if any(True for _ in self.list()):
                raise IncompleteCheckpointError(
                    "no committed checkpoint: every step directory is incomplete",
                    path=self.root,
                    hint="the saves were interrupted; start fresh",
                )
            return None
        skipped: list[str] = []
        for c in reversed(infos):
            if c.status == "corrupt" and step is None:
                msg = f"{c.path.name}: failed verification earlier ({c.problem})"
                skipped.append(msg)
                log.warning("ckptkit: skipping %s", msg)
                continue
            try:
                result = self._restore_one(state, c.path, strict=strict)
            except _RunMismatch as m:
                # The checkpoint is fine, the run differs from it (strict mismatch): not
                # corruption, and an older checkpoint would not match either.
                raise m.error from None
            except CkptkitError as e:
                self._note(c.path, ok=False, why=f"{e.code or 'error'}: {e.what}")
                if step is not None:
                    raise
                msg = f"{c.path.name}: {e}"
                skipped.append(msg)
                log.warning("ckptkit: skipping %s", msg)
                continue
            if c.status == "committed":
                self._note(c.path, ok=True, why=None)  # every byte was verified while read
            if skipped:
                log.warning(
                    "ckptkit: restored %s after skipping %d newer checkpoint%s",
                    c.path.name,
                    len(skipped),
                    "" if len(skipped) == 1 else "s",
                )
            result.notes[:0] = [f"skipped {s}" for s in [*unhealthy, *skipped]]
            return result
        raise IncompleteCheckpointError(
            "no checkpoint could be restored: " + " | ".join(skipped),
            path=self.root,
            hint="restore files from a replica, or start fresh",
        )

    def _note(self, path: Path, *, ok: bool, why: str | None) -> None:
        """Record what a restore found and re-point ``latest``, if no other writer runs."""
        try:
            man = mf.read(path)
        except CkptkitError:
            return  # an invalid manifest is listed as corrupt without a record
        with self._maybe_writer() as can_record:
            if can_record:
                self._record(path, man, ok, why)
                self._update_latest()

    def _restore_one(self, state: TrainState, path: Path, *, strict: bool) -> RestoreResult:
        from ckptkit.verify.runner import verify_one

        g = dist_mod.group()
        err: CkptkitError | None = None
        try:
            # Manifest-level checks only: the read below verifies every digest, and the
            # values were scanned when the checkpoint was verified after its save.
            rep = verify_one(
                path,
                families=("completeness", "consistency"),
                progress=False,
                options={"scan_values": False},
            )
            if rep.errors:
                raise rep.errors[0].to_error(base=str(path))
            obj, man = checkpoint.read_checkpoint(
                path, targets_from=state.targets(), progress=False
            )
            # DCP files are not read through the verifying reader: check their digests
            # first (split over the ranks of a multi-rank restore).
            dcp_files = [f for f in man.files if f.component == dist_mod.DCP_COMPONENT]
            if g is not None:
                dcp_files = dcp_files[g.rank :: g.world_size]
            dist_mod.verify_files(path, dcp_files)
        except CkptkitError as e:
            err = e
        if g is not None:
            # Every rank takes the same candidate or skips it together.
            dist_mod.consensus(err, what=f"restore of {path.name}")
        elif err is not None:
            raise err
        mismatch: CkptkitError | None = None
        try:
            result = state.restore_tree(obj, man, strict=strict, path=path)
        except CkptkitError as e:
            mismatch = e
        if g is not None:
            try:
                dist_mod.consensus(mismatch, what=f"restore of {path.name}")
            except CkptkitError as e:
                raise _RunMismatch(e) from e
        elif mismatch is not None:
            raise _RunMismatch(mismatch) from mismatch
        result.path = path
        for f in rep.findings:
            result.notes.append(f"{f.code} {f.message}")
        saved = (man.lookahead or {}).get(guard_mod.GUARD_KEY)
        if saved and state.guard_k > 0:
            # Sample ids and the RNG fingerprint are rank 0's and only mean something at
            # the layout of the save; step, LR, scale, optimizer step and probe hold anywhere.
            rg = guard_mod.ResumeGuard(
                saved,
                probe=state.probe,
                per_rank=saved.get("world_size") == state.parallel.world_size
                and state.parallel.rank == 0,
            )
            for f in rg.check_restored(state):
                result.notes.append(f"{f.code} {f.message}")
            result.guard = rg
            guard_mod.attach(state.recorder, rg)
        return result


# --- helpers ------------------------------------------------------------------------------

_SPREAD = ("model", "optimizer")
"""Top-level state whose replicated shards every rank of a multi-rank save helps write."""
_MIN_SPREAD_SHARD = 64 << 20
"""Smallest shard when replicated state is split over ranks (tiny models stay one file)."""


class _RunMismatch(Exception):
    """A good checkpoint that does not fit the run (``restore_tree`` refused it)."""

    def __init__(self, error: CkptkitError) -> None:
        super().__init__(str(error))
        self.error = error


def _why(bad: Iterable[Any]) -> str | None:
    """Summarise error findings (at most three) for the run index and ``ls``."""
    return "; ".join(f"{f.code} {f.message}" for f in list(bad)[:3]) or None


def _fingerprint(path: Path, man: mf.Manifest) -> dict[str, list[int]]:
    """Size and mtime of the manifest and every file it lists: a change means re-verify."""
    out: dict[str, list[int]] = {}
    for rel in [atomic.MANIFEST_NAME, *(f.path for f in man.files)]:
        try:
            st = (path / rel).stat()
        except OSError:
            out[rel] = [-1, -1]
            continue
        out[rel] = [st.st_size, st.st_mtime_ns]
    return out


def _whole(path: Path) -> bool:
    """Return whether ``path`` holds a valid manifest and every file it lists, at full size."""
    try:
        man = mf.read(path)
    except CkptkitError:
        return False
    for f in man.files:
        try:
            if (path / f.path).stat().st_size != f.size:
                return False
        except OSError:
            return False
    return True


def _replace_text(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` atomically (temp file, fsync, replace); no temp left behind."""
    tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text)
        atomic.fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


_SAVE_ERRNO = {
    errno.ENOSPC: ("disk full", "free space on that filesystem, or lower keep_last/max_bytes"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota"),
    errno.EACCES: ("permission denied", "make the run directory writable by this user"),
    errno.EPERM: ("operation not permitted", "make the run directory writable by this user"),
    errno.EROFS: ("read-only filesystem", "save to a writable filesystem"),
}


def _save_error(e: OSError, final: Path) -> OSError:
    """Restate an OS error of a save: what failed, that nothing was lost, and the fix.

    Stays an ``OSError`` of the same errno (``PermissionError`` for EACCES), so
    existing ``except OSError`` clauses keep working.
    """
    what, fix = _SAVE_ERRNO.get(e.errno or 0, (e.strerror or str(e), "see the OS error"))
    where = f" ({e.filename})" if e.filename else ""
    msg = (
        f"{what} while saving {final.name}{where}; the partial save was removed and older "
        f"checkpoints are intact. Fix: {fix}"
    )
    return OSError(e.errno if e.errno is not None else errno.EIO, msg, str(final))
