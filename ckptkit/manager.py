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

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ckptkit import manifest as mf
from ckptkit import rotation
from ckptkit.capture.state import RestoreResult, TrainState, grouper
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.storage import atomic, checkpoint, codec
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
        self._lock: RunLock | None = None
        self._pending: _Pending | None = None
        self._staging: dict[str, torch.Tensor] = {}
        self.last_save = SaveStats()
        self.root.mkdir(parents=True, exist_ok=True)
        left = atomic.leftovers(self.root)
        if left:
            log.warning(
                "ckptkit: %d leftover temporary director%s in %s from an interrupted save: %s "
                "(removed when this manager first takes the writer lock)",
                len(left), "y" if len(left) == 1 else "ies", self.root,
                ", ".join(p.name for p in left),
            )

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
        lock = RunLock(self.root, timeout=self.lock_timeout)
        lock.acquire()
        self._lock = lock
        for p in atomic.leftovers(self.root):
            log.warning("ckptkit: removing leftover %s of an interrupted save", p)
            shutil.rmtree(p, ignore_errors=True)

    # --- listing -------------------------------------------------------------------------

    def _index(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / INDEX).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write_index(self, data: Mapping[str, Any]) -> None:
        tmp = self.root / f"{INDEX}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        atomic.fsync_file(tmp)
        os.replace(tmp, self.root / INDEX)

    def _record(self, name: str, manifest_digest: str | None, ok: bool, why: str | None) -> None:
        idx = self._index()
        ver = idx.setdefault("verified", {})
        ver[name] = {"digest": manifest_digest, "ok": ok, "at": time.time(), "problem": why}
        self._write_index(idx)

    def list(self) -> list[CheckpointInfo]:
        """Every checkpoint directory of the run, oldest first, with its status.

        ``verified``: verify passed for this exact manifest; ``committed``: has a valid
        manifest, not verified yet; ``corrupt``: verify failed or the manifest is invalid;
        ``incomplete``: a step directory without a manifest (an interrupted save).
        """
        idx = self._index().get("verified", {})
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
                man = mf.read(p)
            except IncompleteCheckpointError as e:
                out.append(CheckpointInfo(step, p, "incomplete", size, mtime, problem=e.what))
                continue
            except CkptkitError as e:
                out.append(CheckpointInfo(step, p, "corrupt", size, mtime,
                                          problem=f"{e.code}: {e.what}"))
                continue
            rec = idx.get(p.name)
            digest = man.to_dict()["manifest_digest"]
            status: Status = "committed"
            problem = None
            if rec and rec.get("digest") == digest:
                status = "verified" if rec.get("ok") else "corrupt"
                problem = rec.get("problem")
            pins = tuple(sorted(set(man.pins) | set(self._index().get("pins", {}).get(p.name, []))))
            health = (man.health or {}).get("level") if man.health else None
            out.append(CheckpointInfo(step, p, status, size, mtime, pins, health, problem))
        return sorted(out, key=lambda c: c.step)

    def latest(self) -> CheckpointInfo | None:
        """The newest verified checkpoint (None when there is none)."""
        good = [c for c in self.list() if c.status == "verified"]
        return good[-1] if good else None

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

        Raises:
            LockHeldError: another live writer holds the run directory.
            CkptkitError: the write or verification failed; older checkpoints are intact.
        """
        t0 = time.perf_counter()
        self.wait()  # one save in flight at most; surfaces a failed async save
        self._writer()
        step = state.step if step is None else int(step)
        pins = (pin,) if isinstance(pin, str) else tuple(pin or ())
        tree, comps = state.capture()
        t_cap = time.perf_counter()
        encoded = tree_mod.encode(tree)
        final = self.root / step_dir_name(step)
        fields: dict[str, Any] = {"pins": pins}
        if health is not None:
            fields["health"] = dict(health)
        if lookahead is not None:
            fields["lookahead"] = dict(lookahead)
        env = state.env()
        stats = SaveStats(step=step, capture=t_cap - t0)
        if async_:
            encoded = self._stage(encoded)
            th = threading.Thread(
                target=self._run_async,
                args=(encoded, final, comps, env, step, fields, overwrite, stats, t0),
                name=f"ckptkit-save-{step}",
                daemon=False,
            )
            self._pending = _Pending(thread=th, step=step)
            stats.blocked = time.perf_counter() - t0
            th.start()
            self.last_save = stats
            return final
        self._commit(encoded, final, comps, env, step, fields, overwrite, stats, t0)
        stats.blocked = stats.total
        self.last_save = stats
        return final

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
        if pin:
            torch.cuda.synchronize()
        for k in set(self._staging) - set(encoded.tensors):
            del self._staging[k]  # keys gone from the state: free their buffers
        return tree_mod.Encoded(tree=encoded.tree, tensors=staged)

    def _run_async(self, *args: Any) -> None:
        assert self._pending is not None
        try:
            self._commit(*args)
        except BaseException as e:  # surfaced by wait(); never silent
            self._pending.error = e
            log.error("ckptkit: async save of step %d failed: %s", self._pending.step, e)

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
        stats.write = time.perf_counter() - tw
        tv = time.perf_counter()
        if self.verify_after_save:
            from ckptkit.verify.runner import verify_one

            rep = verify_one(final, progress=False)
            bad = rep.errors
            self._record(final.name, man.to_dict()["manifest_digest"], not bad,
                         "; ".join(f"{f.code} {f.message}" for f in bad[:3]) or None)
            if bad:
                raise bad[0].to_error(base=str(final))
        stats.verify = time.perf_counter() - tv
        self._point_latest(final.name)
        stats.deleted = self._rotate()
        stats.total = time.perf_counter() - t0

    def _point_latest(self, name: str) -> None:
        tmp = self.root / f"{LATEST}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_text(name + "\n")
        atomic.fsync_file(tmp)
        os.replace(tmp, self.root / LATEST)
        atomic.fsync_dir(self.root)

    def wait(self) -> None:
        """Join a pending async save; raise its error if it failed."""
        p, self._pending = self._pending, None
        if p is None:
            return
        p.thread.join()
        if p.error is not None:
            raise p.error

    # --- rotation ------------------------------------------------------------------------

    def plan(self, *, keep_last: int | None = None, keep_every: int | None = None,
             max_bytes: int | None = None, delete_corrupt: bool = False) -> rotation.RetentionPlan:
        """The retention plan for the run as it is now (nothing is deleted)."""
        infos = self.list()
        ck = [
            rotation.CkptInfo(
                step=c.step, size=c.size, verified=c.status == "verified",
                corrupt=c.status in ("corrupt", "incomplete"), pinned=frozenset(c.pins),
                health=c.health, time=c.time,
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
        """Apply the retention plan (or only return it with ``dry_run``)."""
        plan = self.plan(**policy)
        if not dry_run:
            self._writer()
            self._delete(plan)
        return plan

    def _rotate(self) -> list[str]:
        return self._delete(self.plan())

    def _delete(self, plan: rotation.RetentionPlan) -> list[str]:
        deleted = []
        for d in plan.decisions:
            if d.keep:
                continue
            path = self.root / step_dir_name(d.ckpt.step)
            if not path.exists():
                continue
            # Rename first: a crash mid-delete leaves a marked leftover, never a
            # half-deleted directory that still looks committed.
            doomed = path.with_name(f"{path.name}{atomic.OLD_SUFFIX}.{uuid.uuid4().hex[:8]}")
            os.rename(path, doomed)
            atomic.fsync_dir(self.root)
            shutil.rmtree(doomed, ignore_errors=True)
            log.info("ckptkit: deleted %s (%s)", path.name, d.reason)
            deleted.append(f"{path.name}: {d.reason}")
        return deleted

    # --- restore -------------------------------------------------------------------------

    def restore(
        self, state: TrainState, step: int | None = None, *, strict: bool = True
    ) -> RestoreResult | None:
        """Restore the newest checkpoint that verifies (or exactly ``step``).

        Candidates are tried newest first; one that fails verification while it is read
        (digest, size, header) or lacks a required component is skipped with a warning
        saying why, and the next older one is tried. Returns None when the run has no
        checkpoint at all (a fresh start).

        Raises:
            IncompleteCheckpointError: checkpoints exist but none could be restored
                (each reason listed), or ``step`` does not exist.
            CkptkitError: ``step`` was given and that checkpoint fails.
        """
        self.wait()
        infos = [c for c in self.list() if c.status in ("verified", "committed", "corrupt")]
        if step is not None:
            infos = [c for c in infos if c.step == step]
            if not infos:
                raise IncompleteCheckpointError(
                    f"no committed checkpoint for step {step}", path=self.root,
                    hint="'ckptkit ls RUN' lists the steps that exist",
                )
        elif not infos:
            if any(True for _ in self.list()):
                raise IncompleteCheckpointError(
                    "no committed checkpoint: every step directory is incomplete",
                    path=self.root, hint="the saves were interrupted; start fresh",
                )
            return None
        skipped: list[str] = []
        for c in reversed(infos):
            try:
                result = self._restore_one(state, c.path, strict=strict)
            except CkptkitError as e:
                if step is not None:
                    raise
                msg = f"{c.path.name}: {e}"
                skipped.append(msg)
                log.warning("ckptkit: skipping %s", msg)
                continue
            result.notes[:0] = [f"skipped {s}" for s in skipped]
            return result
        raise IncompleteCheckpointError(
            "no checkpoint could be restored: " + " | ".join(skipped),
            path=self.root,
            hint="restore files from a replica, or start fresh",
        )

    def _restore_one(self, state: TrainState, path: Path, *, strict: bool) -> RestoreResult:
        from ckptkit.verify.runner import verify_one

        rep = verify_one(path, families=("completeness", "consistency"), progress=False)
        if rep.errors:
            raise rep.errors[0].to_error(base=str(path))
        obj, man = checkpoint.read_checkpoint(path, targets_from=state.targets(), progress=False)
        result = state.restore_tree(obj, man, strict=strict)
        result.path = path
        for f in rep.findings:
            result.notes.append(f"{f.code} {f.message}")
        return result
