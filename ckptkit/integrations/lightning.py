"""Lightning (Trainer and Fabric): verified ``.ckpt`` saves, verified rotation, exact resumes.

Lightning writes one ``.ckpt`` file per checkpoint and leaves out what an exact resume
needs: no RNG state (``seed_everything`` only re-applies the first seed), no position in
a plain data loader, no digests (a flipped bit loads silently), and ``ModelCheckpoint``
deletes files by ``save_top_k`` without looking at them. Three pieces fill that in:

:class:`CkptkitIO`
    a ``CheckpointIO`` plugin (``Trainer(plugins=[...])`` / ``Fabric(plugins=[...])``):
    after each save it verifies the file and records its digests and component table
    beside it (``<file>.ckptkit-manifest.json``, as ``ckptkit adopt``), records the outcome
    in the run index, and applies verified rotation (:mod:`ckptkit.run.retain`: keep the last
    K / every N / a byte budget, never the newest good one); before each load it verifies
    the file and refuses a damaged one with the finding's code; a removal Lightning asks
    for (``save_top_k``) goes through the same rules and takes the manifest with it.
:class:`CkptkitCallback`
    a Trainer ``Callback``: saves every rank's RNG and the data cursor (a
    :class:`~ckptkit.ResumableSampler`, a torchdata ``StatefulDataLoader`` or any object
    with ``state_dict``) in the checkpoint and restores them at the first step after a
    resume; writes the step records drills compare (:class:`~ckptkit.Recorder`), feeds a
    :class:`~ckptkit.StabilityWatch` (its level goes into the manifest for ``rollback``),
    and follows the drill contract (``CKPTKIT_DRILL_SAVE_AT`` / ``STOP_AT`` /
    ``RESUME_FROM`` / ``CKPT_DIR``).
:class:`FabricCheckpoints`
    the same for a Fabric loop, around ``fabric.save`` / ``fabric.load``.

Lightning is imported here, so this module needs the ``lightning`` extra; the run layout
(:mod:`ckptkit.run.layouts.lightning`) does not.

Example:
    >>> import tempfile, lightning as L
    >>> cb = CkptkitCallback()
    >>> trainer = L.Trainer(plugins=[CkptkitIO(keep_last=2)], callbacks=[cb], logger=False,
    ...                     enable_checkpointing=False, enable_progress_bar=False,
    ...                     default_root_dir=tempfile.mkdtemp())
    >>> isinstance(trainer.strategy.checkpoint_io, CkptkitIO)
    True
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

try:
    import lightning as L
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.callbacks import Callback
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(
        "ckptkit.integrations.lightning needs Lightning: pip install 'ckptkit[lightning]' "
        "(or pip install lightning)"
    ) from e

from ckptkit import codes
from ckptkit.capture import rng as rng_capture
from ckptkit.capture import sampler as sampler_capture
from ckptkit.capture import tree_fingerprint
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.capture.state import TrainState
from ckptkit.errors import CkptkitError, IntegrityError, StateError
from ckptkit.format.ranks import rank_key
from ckptkit.format.records import GUARD_KEY
from ckptkit.integrations.drill_env import DrillEnv
from ckptkit.run import Run, resume_target, retain
from ckptkit.run.layouts.lightning import LightningLayout
from ckptkit.signals import guard as guard_mod
from ckptkit.signals import rngtrace
from ckptkit.signals.observe import row_hashes
from ckptkit.signals.recorder import Recorder
from ckptkit.signals.stability import StabilityWatch
from ckptkit.storage import fs
from ckptkit.verify.findings import ERROR
from ckptkit.verify.foreign.adopt import Notes
from ckptkit.verify.foreign.report import verify_foreign

log = logging.getLogger("ckptkit")

STATE_KEY = "ckptkit"
"""Top-level key of the checkpoint dict that holds what ckptkit adds (RNG, data cursor)."""
DRILL_PIN = "drill"
"""Pin of the checkpoint a drill asked for (``CKPTKIT_DRILL_SAVE_AT``): never rotated away."""


# --- the CheckpointIO plugin ------------------------------------------------------------------


class CkptkitIO(TorchCheckpointIO):
    """A ``CheckpointIO`` that verifies and records each ``.ckpt`` and rotates with verification.

    Args:
        keep_last: after each save, keep this many newest verified checkpoints of the
            directory and delete older ones (verified rotation); None deletes nothing
            (Lightning's ``save_top_k`` removals still pass :meth:`remove_checkpoint`).
        keep_every: also keep every checkpoint whose step is a multiple of this.
        max_bytes: byte budget for the kept checkpoints.
        verify_on_load: verify a file before Lightning loads it (refuse a damaged one).
        expect: ``training`` (a resume point: optimizer, step... required) or ``weights``.
        lock_timeout: seconds to wait for the run lock when training starts
            (:meth:`CkptkitCallback.on_fit_start`, :class:`FabricCheckpoints`), or at the
            first save of a directory opened no earlier; another live writer is refused
            after that, holder named: two runs must not rotate one directory.

    Example:
        >>> import tempfile, pathlib, torch
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> io = CkptkitIO()
        >>> io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 3,
        ...                     "pytorch-lightning_version": "2.6"}, d / "step=3.ckpt")
        >>> sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
        ['step=3.ckpt', 'step=3.ckpt.ckptkit-manifest.json']
        >>> io.teardown()
    """

    def __init__(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        verify_on_load: bool = True,
        expect: str = "training",
        lock_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self.lock_timeout = lock_timeout
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"CkptkitIO: keep_last must be >= 1 (or None), got {keep_last}")
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.max_bytes = max_bytes
        self.verify_on_load = verify_on_load
        self.expect = expect
        self._runs: dict[Path, Run] = {}
        self.last_outcome: retain.Outcome | None = None
        """What the last rotation did (deleted, re-checked)."""

    def run(self, directory: str | os.PathLike[str]) -> Run:
        """The run of ``directory``, opened as its writer once (the lock is held until
        :meth:`teardown`)."""
        d = local_dir(directory, "the checkpoint directory").resolve()
        run = self._runs.get(d)
        if run is None:
            # A reader (ls --verify) may hold the lock for a moment to record a verify.
            run = self._runs[d] = Run(
                d, LightningLayout(), readonly=False, lock_timeout=self.lock_timeout
            )
        return run

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write the file (Lightning's way), then settle it: the run verifies it, records
        its digests beside it (signed with the run's key), records the outcome and rotates
        (:meth:`ckptkit.run.Run.settle`)."""
        p = Path(path)
        self.run(p.parent).overwriting(p)  # last.ckpt: its old digests go before its bytes
        super().save_checkpoint(checkpoint, path, storage_options)
        extra = checkpoint.get(STATE_KEY)
        extra = extra if isinstance(extra, Mapping) else {}
        health = extra.get("health")
        policy = None
        if self.keep_last is not None:
            policy = retain.Policy(
                keep_last=self.keep_last, keep_every=self.keep_every, max_bytes=self.max_bytes
            )
        settled = self.run(p.parent).settle(
            p,
            step=None,  # the file says it (its name, or its global_step)
            policy=policy,
            notes=Notes(health=health if isinstance(health, Mapping) else None),
            force=True,
            expect=self.expect,  # type: ignore[arg-type]
        )
        if settled.errors:
            bad = settled.errors
            log.error(
                "ckptkit: %s failed its verify after save (%s %s); it is recorded corrupt "
                "and no rotation counts on it",
                p.name,
                bad[0].code,
                bad[0].message,
            )
            return
        if settled.rotation is not None:
            self.last_outcome = settled.rotation

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Verify the file, then load it (Lightning's way); a damaged file is refused."""
        if self.verify_on_load:
            check_before_load(path, expect=self.expect)
        if map_location is None:
            return super().load_checkpoint(path, weights_only=weights_only)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete a file Lightning asks to remove (``save_top_k``) with verified-rotation rules.

        The newest good checkpoint is never deleted, the newest kept good one is verified
        again before anything goes, and the adopted manifest goes with its file
        (:meth:`ckptkit.run.Run.discard`).
        """
        p = Path(path).resolve()  # the run lists resolved paths; Lightning's may be relative
        self.run(p.parent).discard(p)

    def teardown(self) -> None:
        """Release the run locks."""
        for run in self._runs.values():
            run.close()
        self._runs.clear()
        super().teardown()


def local_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a local directory, or refuse an object-store URL before any training.

    The run's lock, index and adopted manifests live beside the checkpoint files, and this
    integration keeps them on a local (or shared POSIX) filesystem only; Lightning would
    write an ``s3://`` checkpoint itself, but nothing of ckptkit's safety would hold there,
    and a plain ``Path`` of the URL silently becomes a local ``s3:/`` directory.

    Raises:
        CkptkitError: ``path`` is a URL (``s3://``, ``gs://``, ...), naming the fix.

    Example:
        >>> local_dir("/tmp/ckpt", "dirpath"), local_dir("file:///tmp/ckpt", "dirpath")
        (PosixPath('/tmp/ckpt'), PosixPath('/tmp/ckpt'))
    """
    local = fs.local_path(fs.location(path))
    if local is None:
        raise CkptkitError(
            f"{what} {os.fspath(path)} is on an object store: the Lightning and Fabric "
            "integrations keep the run's lock, index and adopted manifests on a local "
            "filesystem only",
            path=os.fspath(path),
            hint="checkpoint to a local or shared POSIX directory (and copy it out after), or "
            "save through CheckpointManager, which runs on s3:// with a lease lock",
        )
    return local  # file:///tmp/ckpt is /tmp/ckpt, not a relative "file:" directory


def resume_checkpoint(dirpath: str | os.PathLike[str]) -> str | None:
    """The checkpoint of ``dirpath`` to pass to ``trainer.fit(..., ckpt_path=...)``.

    The newest complete state, adopted on the spot: a file a kill left unadopted (after
    Lightning wrote it, before its adoption) is verified and adopted now; every newer file
    passed over is named in a warning. None for a fresh start. On several ranks rank 0
    chooses and every rank gets its choice (:func:`ckptkit.run.resume_target`; call it on
    every rank).

    Raises:
        CkptkitError: the newest complete file's step is unknown (the fix named), or
            ``dirpath`` is on an object store.

    Example:
        >>> import tempfile
        >>> resume_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    chosen = resume_target(local_dir(dirpath, "dirpath"), LightningLayout())
    return None if chosen.path is None else str(chosen.path)


def check_before_load(path: str | os.PathLike[str], *, expect: str | None = None) -> None:
    """Verify a ``.ckpt`` before it is loaded; raise the first error finding's code.

    Raises:
        IntegrityError: the file is damaged, or its digests differ from those recorded at
            save (the message names the file, the finding and what to do).

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.ckpt"
        >>> torch.save({"state_dict": {"w": torch.ones(1)}, "global_step": 1}, p)
        >>> check_before_load(p, expect="weights")
    """
    rep = verify_foreign(Path(path), "lightning", expect=expect)  # type: ignore[arg-type]
    bad = [f for f in rep.findings if f.severity is ERROR]
    if bad:
        first = bad[0]
        more = f" ({len(bad) - 1} more)" if len(bad) > 1 else ""
        raise IntegrityError(
            f"refusing to load: {first.message}{more}",
            path=Path(path),
            code=first.code,
            hint=(first.hint + "; " if first.hint else "")
            + "resume from an older checkpoint ('ckptkit ls DIR' lists the verified ones; "
            "'ckptkit rollback DIR' picks one)",
        )


# --- what Lightning leaves out ------------------------------------------------------------------


def capture_extras(sampler: Any = None, *, watch: StabilityWatch | None = None) -> dict[str, Any]:
    """What ckptkit adds to a Lightning checkpoint: every rank's RNG, the data cursor and,
    with a ``watch``, its health and its state (:meth:`StabilityWatch.state_dict`, this
    rank's: the rank that writes the checkpoint).

    Collective when ``torch.distributed`` is initialised with several ranks (the RNG of
    every rank is gathered; call it on every rank).

    Example:
        >>> sorted(capture_extras(ResumableSampler(8)))
        ['rng', 'sampler']
    """
    rank, world = _rank_world()
    mine = rng_capture.capture(rank=rank, world_size=world)
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, mine)
        rngs = {rank_key(i): s for i, s in enumerate(gathered)}
    else:
        rngs = {rank_key(rank): mine}
    out: dict[str, Any] = {"rng": rngs}
    if sampler is not None:
        out["sampler"] = sampler_capture.capture(sampler)
    if watch is not None:
        out["health"] = watch.snapshot()
        out["watch"] = {"rank": rank, "state": watch.state_dict()}
    return out


def restore_rng(extras: Mapping[str, Any]) -> bool:
    """Put this rank's RNG back from :func:`capture_extras`' tree; False when it has none.

    Raises:
        StateError: the checkpoint has no RNG state for this rank.
    """
    rngs = extras.get("rng")
    if not isinstance(rngs, Mapping) or not rngs:
        return False
    rank, _world = _rank_world()
    key = rank_key(rank)
    if key not in rngs:
        raise StateError(
            f"the checkpoint holds RNG state of {sorted(rngs)}, not of {key}",
            hint="resume at the world size it was saved with (RNG state is per rank)",
        )
    rng_capture.restore(rngs[key], rank=rank)
    return True


def restore_watch(watch: StabilityWatch | None, extras: Mapping[str, Any], *, where: str) -> bool:
    """Put the watch's windows back from :func:`capture_extras`' tree, so it goes on judging
    instead of warming up again; False when there is no watch, the checkpoint holds no
    state of this rank's watch, or the state does not fit (a warning naming ``where``:
    the watch starts afresh)."""
    saved = extras.get("watch")
    if watch is None or not isinstance(saved, Mapping):
        return False
    if saved.get("rank") != _rank_world()[0]:
        return False  # another rank's windows: this rank's watch starts afresh
    return watch.load_state_dict(saved.get("state"), where=where)


def restore_sampler(sampler: Any, extras: Mapping[str, Any]) -> bool:
    """Put the data cursor back; False when the checkpoint has none."""
    st = extras.get("sampler")
    if sampler is None or not isinstance(st, Mapping):
        return False
    sampler_capture.restore(sampler, st)
    return True


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _loaders(obj: Any) -> list[Any]:
    if isinstance(obj, torch.utils.data.DataLoader):
        return [obj]
    if isinstance(obj, Mapping):
        return [x for v in obj.values() for x in _loaders(v)]
    if isinstance(obj, list | tuple):
        return [x for v in obj for x in _loaders(v)]
    return []


def _quiet_loaders(loaders: list[Any], seed: int, epoch: int) -> None:
    """Give loaders without a generator one seeded by ``(seed, epoch)``: ``iter(loader)``
    then draws its workers' base seed from it, not from the global torch RNG, so starting
    an epoch (or a resume) does not shift the training streams."""
    for dl in loaders:
        gen = getattr(dl, "_ckptkit_generator", None)
        if getattr(dl, "generator", None) is None or gen is not None:
            if gen is None:
                gen = torch.Generator()
                dl._ckptkit_generator = gen
                dl.generator = gen
            gen.manual_seed((seed * 1_000_003 + epoch) & 0x7FFF_FFFF_FFFF_FFFF)


def _loss(outputs: Any) -> Any:
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor):
        return float(outputs.detach().float().cpu())
    return outputs


def _batch_hash(batch: Any) -> str | None:
    """Digest of the batch the step receives (tensors by dtype, shape and bytes), or None
    for a batch that is not a tree of tensors and plain values."""
    try:
        with torch.random.fork_rng(devices=[]):
            return tree_fingerprint(batch)
    except (CkptkitError, TypeError, ValueError, RuntimeError):
        return None


# --- the resume guard, as the native path has it ----------------------------------------------


def lookahead(
    ts: TrainState, *, step: int, sampler: Any = None, k: int = guard_mod.DEFAULT_K
) -> dict[str, Any]:
    """The resume guard's look-ahead of a framework save: what the next step will use.

    The same record the native path writes into the manifest (:func:`ckptkit.signals.guard.compute`:
    next step, LRs, optimizer step, scheduler position, RNG fingerprint, the next ``k``
    sample ids), computed from ``ts`` at global step ``step`` with ``sampler`` as the data
    cursor. Call it at the instant the RNG is captured (nothing may draw in between). Per-
    rank facts (sample ids, RNG) are this rank's; ``world_size`` says for which layout.

    Example:
        >>> m = torch.nn.Linear(2, 1)
        >>> ts = TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
        >>> la = lookahead(ts, step=4, sampler=ResumableSampler(8, shuffle=False), k=2)
        >>> la["next_step"], la["sample_ids"]
        (5, [0, 1])
    """
    la = guard_mod.compute(_as_of(ts, step, sampler), k=min(max(k, 0), guard_mod.MAX_K))
    la["world_size"] = _rank_world()[1]
    return la


def start_guard(
    saved: Any, ts: TrainState, *, step: int, sampler: Any = None, recorder: Any = None
) -> guard_mod.ResumeGuard | None:
    """Check a restored framework run against its checkpoint's look-ahead; watch its first steps.

    ``saved`` is what :func:`lookahead` returned at the save (None: an older checkpoint
    without one, nothing to check). Compares the restored objects now (call it once the
    RNG and the data cursor are back, before the first step draws or fetches), then,
    through ``recorder`` (:func:`ckptkit.signals.guard.attach`), the first step records: the
    step, the LR used, the sample ids each step receives. Every mismatch is a ``CK-D``
    finding, logged at WARNING and written into the next step record (``guard``).

    Raises:
        StateError: ``CK-S012``, the look-ahead holds a value of the wrong type (before
            any step ran).

    Example:
        >>> m = torch.nn.Linear(2, 1)
        >>> ts = TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
        >>> saved = lookahead(ts, step=4, sampler=ResumableSampler(8, shuffle=False, seed=0))
        >>> fresh = ResumableSampler(8, shuffle=False, seed=0)
        >>> g = start_guard(saved, ts, step=4, sampler=fresh)
        >>> [f.code for f in g.findings]
        []
    """
    if not saved:
        return None
    found = guard_mod.problems(saved, {})
    if found:
        raise codes.error(
            codes.S012, "the checkpoint's resume look-ahead cannot be read: " + "; ".join(found[:3])
        )
    rank, world = _rank_world()
    g = guard_mod.ResumeGuard(saved, per_rank=saved.get("world_size") == world and rank == 0)
    g.check_restored(_as_of(ts, step, sampler))
    if recorder is not None:
        guard_mod.attach(recorder, g)
    return g


def _as_of(ts: TrainState, step: int, sampler: Any) -> TrainState:
    """``ts`` as the guard reads it at global step ``step``: a shallow copy (the recorder
    stays bound to ``ts``), with the data cursor and the bare optimizer a framework wraps
    (Fabric's ``_FabricOptimizer``: the guard compares the one that steps)."""
    view = copy.copy(ts)
    view.progress = replace(ts.progress, step=int(step))
    view.sampler = sampler
    opt = ts.optimizer
    inner = getattr(opt, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        view.optimizer = inner
    return view


def _next_epoch_if_done(sampler: ResumableSampler) -> None:
    """Start the next epoch when the restored cursor is at the end of its epoch.

    A checkpoint saved after an epoch's last batch resumes at the next epoch: the Trainer
    counts the epoch done. But it builds the loader's iterator before it calls
    ``set_epoch(next)``, and with ``num_workers > 0`` the workers pull indices at once:
    from the restored, exhausted cursor, an empty pass (see "Resuming an epoch loop" in
    :class:`~ckptkit.ResumableSampler`). The Trainer took that empty pass for the next
    epoch and trained on the one after it (an epoch skipped; the resume guard reported
    CK-D002). Started here, the pass is the next epoch's, and the Trainer's ``set_epoch``
    of the same epoch leaves it running.
    """
    if sampler.state_dict()["position"] >= sampler.num_samples > 0:
        sampler.set_epoch(sampler.epoch + 1)


def _train_loader_of(trainer: L.Trainer, sampler: Any) -> Any:
    """The training DataLoader that draws from ``sampler`` (None: not found)."""
    for dl in _loaders(trainer.train_dataloader):
        if dl.sampler is sampler or getattr(dl.batch_sampler, "sampler", None) is sampler:
            return dl
    return None


# --- the Trainer callback ---------------------------------------------------------------------


class CkptkitCallback(Callback):
    """Add to Lightning checkpoints what an exact resume needs, and make the run drillable.

    Args:
        sampler: the training data cursor: a :class:`~ckptkit.ResumableSampler` (build the
            DataLoader with ``sampler=``), a torchdata ``StatefulDataLoader`` or any object
            with ``state_dict``/``load_state_dict``. None saves no position (a mid-epoch
            resume then restarts the epoch's order: Lightning's own behaviour).
        recorder: a :class:`~ckptkit.Recorder` for step records; None makes one that writes
            to ``$CKPTKIT_METRICS`` when set (drills), else keeps them in memory.
        watch: a :class:`~ckptkit.StabilityWatch` fed every step; its snapshot is the
            checkpoint's recorded health (``ckptkit rollback`` reads it).
        restore_rng: restore every rank's RNG on resume (turn off only to see the drift).
        seed: seeds the data loaders' own generators (see :func:`_quiet_loaders`).
        guard_k: how many next sample ids and first steps the resume guard checks (0 turns
            it off). Each save records a look-ahead (:func:`lookahead`); a resume compares
            the restored run with it and watches the first step records
            (:func:`start_guard`): a resume that replays or skips data, restarts the LR
            schedule or loses the optimizer state is a ``CK-D`` finding (:attr:`guard`).

    With a :class:`~ckptkit.ResumableSampler` the cursor counts the batches the training
    step *received* (:meth:`~ckptkit.ResumableSampler.track_delivery`), not the ones the
    loader's workers or Lightning fetched ahead, so ``num_workers > 0`` resumes exactly.

    Example:
        >>> cb = CkptkitCallback(sampler=ResumableSampler(16, seed=0))
        >>> cb.state_key
        'CkptkitCallback'
    """

    def __init__(
        self,
        *,
        sampler: Any = None,
        recorder: Recorder | None = None,
        watch: StabilityWatch | None = None,
        restore_rng: bool = True,
        seed: int | None = None,
        guard_k: int = guard_mod.DEFAULT_K,
    ) -> None:
        super().__init__()
        self.sampler = sampler
        self.guard_k = int(guard_k)
        self.guard: guard_mod.ResumeGuard | None = None
        """The resume guard of the last resume (its ``findings``); None before one."""
        self._saved_lookahead: Any = None
        self._batch_size: int | None = None
        self.recorder = recorder if recorder is not None else Recorder(None)
        self.watch = watch
        if watch is not None:
            watch.attach(self.recorder)
        self.restore_rng = restore_rng
        self.seed = seed if seed is not None else int(getattr(sampler, "seed", 0) or 0)
        self.env = DrillEnv.from_env()
        self._dir: str | None = None
        """The checkpoint directory :meth:`dirpath` gave out."""
        self._pending: Mapping[str, Any] | None = None
        self._state: TrainState | None = None
        self._fp: str | None = None
        self._ids: list[list[Any]] = []
        self._hash: str | None = None
        self._rows: list[str] = []
        self._workers: int | None = None
        self._outside: dict[str, Any] | None = None

    # the drill contract ---------------------------------------------------------------

    def dirpath(self, default: str | os.PathLike[str]) -> str:
        """Where checkpoints go: ``$CKPTKIT_CKPT_DIR`` in a drill, else ``default``
        (pass it to ``ModelCheckpoint(dirpath=...)``); :meth:`ckpt_path` resumes from there."""
        d = self.env.ckpt_dir if self.env.ckpt_dir is not None else default
        self._dir = str(local_dir(d, "dirpath"))
        return self._dir

    def ckpt_path(self, default: str | None = None) -> str | None:
        """What to resume from (pass it to ``trainer.fit(..., ckpt_path=...)``).

        ``$CKPTKIT_DRILL_RESUME_FROM`` in a drill. Else, for ``"last"`` once :meth:`dirpath`
        named the directory: the newest complete checkpoint there
        (:func:`resume_checkpoint`; None for a fresh start), not Lightning's ``last.ckpt``,
        which a kill between the step file and ``last.ckpt`` leaves one save behind. Any
        other ``default`` is returned as it is.
        """
        if self.env.resume_from is not None:
            return str(self.env.resume_from)
        if default == "last" and self._dir is not None:
            return resume_checkpoint(self._dir)
        return default

    # Lightning hooks --------------------------------------------------------------------

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Refused before the first step, not at a save: an object-store directory, and a
        # directory another live writer holds (rank 0 takes the run lock of each directory
        # CkptkitIO will write now; LockHeldError names the holder).
        dirs = []
        for mc in trainer.checkpoint_callbacks:
            where = getattr(mc, "dirpath", None)
            if where:
                dirs.append(local_dir(where, "ModelCheckpoint(dirpath=...)"))
        if self._dir is not None:
            dirs.append(Path(self._dir))  # the drill's saves go there
        io = trainer.strategy.checkpoint_io
        if trainer.is_global_zero and isinstance(io, CkptkitIO):
            for d in dirs:
                io.run(d)
        # Before the fit loop builds the loader's iterator: workers pull indices at once.
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.track_delivery()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        opts = trainer.optimizers
        configs = trainer.lr_scheduler_configs
        self._state = TrainState(
            model=pl_module,
            optimizer=opts[0] if opts else None,
            scheduler=configs[0].scheduler if configs else None,
            recorder=self.recorder,
            guard_k=self.guard_k,
        )
        self._ids_hook()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loaders = _loaders(trainer.train_dataloader)
        _quiet_loaders(loaders, self.seed, trainer.current_epoch)
        self._workers = max((int(dl.num_workers) for dl in loaders), default=None)

    # Validation runs in its own RNG bubble: its loader's iter() (and any draw of the
    # validation steps) leaves the training streams as they were. Otherwise a resumed run,
    # which skips the sanity check, would draw differently from the uninterrupted one.

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._outside = rng_capture.capture()

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._back_inside()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._back_inside()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is not None:
            # Restored here, at the first step after the resume, not at load: loading and
            # building the data iterators in between draw from the global generators.
            if self.restore_rng:
                restore_rng(self._pending)
            self._pending = None
            if self._saved_lookahead is not None and self._state is not None:
                # Before this batch counts as delivered: the look-ahead's next ids start
                # with it.
                self.guard = start_guard(
                    self._saved_lookahead, self._state, step=trainer.global_step,
                    sampler=self.sampler, recorder=self.recorder,
                )
            self._saved_lookahead = None
        self._deliver(trainer)
        self._hash = _batch_hash(batch)
        self._rows = row_hashes(batch)
        self._fp = rngtrace.RngSnapshot.take().fingerprint()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        fields: dict[str, Any] = {"rng": self._fp, "rng_at": "batch"}
        if self._hash is not None:
            fields["batch_hash"] = self._hash
        if self._rows:
            fields["rows"] = self._rows
        if self._workers is not None:
            fields["num_workers"] = self._workers
        if self._ids:
            fields["sample_ids"] = self._ids
        cursor = self._cursor()
        if cursor is not None:
            fields["cursor"] = cursor
        self.recorder.log(step, loss=_loss(outputs), **fields)
        self._ids = []
        if self.env.should_save(step):
            d = Path(self.dirpath(Path(trainer.default_root_dir) / "checkpoints"))
            p = d / f"epoch={trainer.current_epoch}-step={step}.ckpt"
            trainer.save_checkpoint(p)
            io = trainer.strategy.checkpoint_io
            if trainer.is_global_zero and isinstance(io, CkptkitIO):
                io.run(d).pin(p, DRILL_PIN)  # rotation must not take it before the drill does
        if self.env.should_stop(step):
            trainer.should_stop = True
        self._outside = rng_capture.capture()  # what a validation run now must leave as is

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.recorder.flush()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        obs = self.recorder.observer
        if obs is not None:
            obs.close()
            self.recorder.observer = None
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.remove_observer(self._on_sample)
        self.recorder.flush()

    def state_dict(self) -> dict[str, Any]:
        return capture_extras(self.sampler, watch=self.watch)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Health at the top level as well, where CkptkitIO records it in the manifest.
        extra: dict[str, Any] = {}
        if self.watch is not None:
            extra["health"] = self.watch.snapshot()
        if self.guard_k > 0 and self._state is not None:
            # The same instant as state_dict()'s RNG capture: nothing drew in between.
            extra[GUARD_KEY] = lookahead(
                self._state, step=trainer.global_step, sampler=self.sampler, k=self.guard_k
            )
        if extra:
            checkpoint[STATE_KEY] = extra

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        extra = checkpoint.get(STATE_KEY)
        saved = extra.get(GUARD_KEY) if isinstance(extra, Mapping) else None
        self._saved_lookahead = saved if self.guard_k > 0 else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if restore_sampler(self.sampler, state_dict) and isinstance(self.sampler, ResumableSampler):
            _next_epoch_if_done(self.sampler)
        restore_watch(self.watch, state_dict, where="the checkpoint's CkptkitCallback state")
        self._pending = state_dict

    # details ---------------------------------------------------------------------------

    def _back_inside(self) -> None:
        if self._outside is not None:
            rng_capture.restore(self._outside)
            self._outside = None

    def _deliver(self, trainer: L.Trainer) -> None:
        """The step received its batch: its indices count as consumed from now on."""
        if not isinstance(self.sampler, ResumableSampler):
            return
        if self._batch_size is None:
            loader = _train_loader_of(trainer, self.sampler)
            size = getattr(loader, "batch_size", None)
            if size is None:
                # No loader batching over this sampler that says its batch size (a custom
                # batch_sampler): indices count when handed out, as without tracking.
                log.warning(
                    "ckptkit: the training DataLoader over this ResumableSampler has no "
                    "batch_size; the saved cursor counts batches fetched ahead as consumed "
                    "(use num_workers=0, or DataLoader(batch_size=...))"
                )
                self.sampler.track_delivery(False)
                self._batch_size = 0
                return
            self._batch_size = int(size)
        if self._batch_size:
            self.sampler.delivered(self._batch_size)

    def _ids_hook(self) -> None:
        if isinstance(self.sampler, ResumableSampler):
            self.sampler.remove_observer(self._on_sample)
            self.sampler.add_observer(self._on_sample)

    def _on_sample(self, epoch: int, index: int | None) -> None:
        if index is None or not isinstance(self.sampler, ResumableSampler):
            return
        h = self.sampler.sample_hash(index)
        self._ids.append([epoch, index] if h is None else [epoch, index, h])

    def _cursor(self) -> str | None:
        obs = self.recorder.observer
        if self.sampler is None or obs is None:
            return None
        try:
            with torch.random.fork_rng(devices=[]):
                return tree_fingerprint(sampler_capture.capture(self.sampler)["state"])
        except CkptkitError:
            return None


# --- Fabric -----------------------------------------------------------------------------------


class FabricCheckpoints:
    """Verified saves, rotation and exact resumes around ``fabric.save`` / ``fabric.load``.

    Installs :class:`CkptkitIO` as the Fabric strategy's ``CheckpointIO`` (unless one is
    there), names files ``step=N.ckpt`` in ``dirpath`` (``$CKPTKIT_CKPT_DIR`` in a drill),
    adds every rank's RNG and the data cursor to the saved state, and restores them.

    Args:
        fabric: the ``lightning.Fabric``.
        dirpath: the checkpoint directory.
        sampler: the data cursor (as for :class:`CkptkitCallback`).
        keep_last, keep_every, max_bytes: verified rotation after each save.
        watch: a :class:`~ckptkit.StabilityWatch` whose snapshot is saved as health.
        restore_rng: restore the RNG on resume.
        recorder: the :class:`~ckptkit.Recorder` of the loop's step records (bound to a
            ``TrainState``): the resume guard watches the first records after a resume.
        guard_k: how many next sample ids and first steps the resume guard checks (0 turns
            it off): each save records a look-ahead (:func:`lookahead`) of the saved
            ``model``/``optimizer``/``scheduler`` and the sampler, each resume compares
            the restored run with it (:attr:`guard`, :func:`start_guard`).

    Example:
        >>> import tempfile, torch, lightning as L
        >>> fabric = L.Fabric(accelerator="cpu", devices=1)
        >>> m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        >>> ck = FabricCheckpoints(fabric, tempfile.mkdtemp(), keep_last=2)
        >>> ck.save(5, {"model": m, "optimizer": opt, "step": 5}).name
        'step=5.ckpt'
        >>> ck.resume({"model": m, "optimizer": opt})["step"]
        5
        >>> ck.close()
    """

    def __init__(
        self,
        fabric: L.Fabric,
        dirpath: str | os.PathLike[str],
        *,
        sampler: Any = None,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        watch: StabilityWatch | None = None,
        restore_rng: bool = True,
        recorder: Recorder | None = None,
        guard_k: int = guard_mod.DEFAULT_K,
    ) -> None:
        self.fabric = fabric
        self.recorder = recorder
        self.guard_k = int(guard_k)
        self.guard: guard_mod.ResumeGuard | None = None
        """The resume guard of the last :meth:`resume` (its ``findings``); None before one."""
        self.env = DrillEnv.from_env()
        self.dir = local_dir(self.env.ckpt_dir if self.env.ckpt_dir is not None else dirpath,
                             "FabricCheckpoints dirpath")
        self.sampler = sampler
        self.watch = watch
        self.restore_rng = restore_rng
        io = fabric.strategy.checkpoint_io
        if not isinstance(io, CkptkitIO):
            io = CkptkitIO(keep_last=keep_last, keep_every=keep_every, max_bytes=max_bytes)
            fabric.strategy.checkpoint_io = io  # type: ignore[misc]
        self.io: CkptkitIO = io
        if fabric.is_global_zero:
            # The run lock now, before any step: a second live writer of this directory
            # is refused here (LockHeldError names the holder), not at its first save.
            io.run(self.dir)

    def path(self, step: int) -> Path:
        """The file of ``step`` (``step=N.ckpt``: the run layout reads the step from the name)."""
        return self.dir / f"step={step}.ckpt"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """``fabric.save`` of ``state`` plus RNG and data cursor; verified, then rotated.

        Call it on every rank (as ``fabric.save``).
        """
        full = dict(state)
        full[STATE_KEY] = capture_extras(self.sampler, watch=self.watch)
        self._add_lookahead(full[STATE_KEY], step, state)
        p = self.path(step)
        self.fabric.save(p, full)
        if self.env.should_save(step) and self.fabric.is_global_zero:
            self.io.run(self.dir).pin(p, DRILL_PIN)  # rotation must not take it first
        return p

    def should_save(self, step: int) -> bool:
        """Whether the drill asks for a checkpoint after ``step`` (``CKPTKIT_DRILL_SAVE_AT``)."""
        return self.env.should_save(step)

    def latest(self) -> Path | None:
        """The checkpoint to resume from (None: a fresh start): the newest complete state,
        adopted on the spot when a kill came between ``fabric.save`` and its adoption;
        every newer one passed over is named in a warning. Rank 0 chooses, every rank gets
        its choice (:func:`ckptkit.run.resume_target`; call it on every rank).

        Raises:
            CkptkitError: the newest complete file's step is unknown (the fix named).
        """
        run = self.io.run(self.dir) if self.fabric.is_global_zero else None
        chosen = resume_target(self.dir, LightningLayout(), run=run)
        return None if chosen.path is None else Path(str(chosen.path))

    def resume(self, state: dict[str, Any], path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """Verify and load the checkpoint to resume from into ``state``; restore RNG and cursor.

        ``path`` defaults to ``$CKPTKIT_DRILL_RESUME_FROM`` in a drill, else the newest
        complete state of the directory, adopted on the spot; newer ones passed over are
        named (:meth:`latest`). Returns what ``fabric.load`` returns (the remainder:
        ``step`` and the like), or None for a fresh start.

        Raises:
            IntegrityError: the file fails its verify (never loaded).
            CkptkitError: the newest complete file's step is unknown (no adopted manifest):
                it is never resumed with the step counter at 0; the message names the fix.
        """
        if path is None:
            src = self.env.resume_from if self.env.resume_from is not None else self.latest()
            path = None if src is None else str(src)
        if path is None:
            return None
        remainder = self.fabric.load(Path(path), state)
        extras = remainder.pop(STATE_KEY, None) or {}
        restore_sampler(self.sampler, extras)
        restore_watch(self.watch, extras, where=str(path))
        if self.restore_rng:
            restore_rng(extras)
        self._start_guard(extras, state, remainder)
        return remainder

    def close(self) -> None:
        """Release the run lock."""
        self.io.teardown()

    # the resume guard ------------------------------------------------------------------

    def _guarded(self, state: Mapping[str, Any]) -> TrainState | None:
        """A TrainState of the objects in the saved ``state`` dict, for the guard only
        (no recorder: the loop's own TrainState keeps its binding)."""
        model = state.get("model")
        if self.guard_k <= 0 or not isinstance(model, torch.nn.Module):
            return None
        opt = state.get("optimizer")
        return TrainState(
            model=model,
            optimizer=opt if hasattr(opt, "param_groups") else None,
            scheduler=state.get("scheduler"),
            guard_k=self.guard_k,
        )

    def _add_lookahead(self, extras: dict[str, Any], step: int, state: Mapping[str, Any]) -> None:
        ts = self._guarded(state)
        if ts is not None:  # right after capture_extras: the RNG is the one it captured
            extras[GUARD_KEY] = lookahead(ts, step=step, sampler=self.sampler,
                                                    k=self.guard_k)

    def _start_guard(
        self, extras: Mapping[str, Any], state: Mapping[str, Any], remainder: Mapping[str, Any]
    ) -> None:
        saved = extras.get(GUARD_KEY)
        ts = self._guarded(state)
        if ts is None or not isinstance(saved, Mapping):
            return
        step = state.get("step", remainder.get("step"))
        if not isinstance(step, int) or isinstance(step, bool):
            # The step is not in the saved dict: the guard checks everything but it.
            nxt = saved.get("next_step")
            step = nxt - 1 if isinstance(nxt, int) and not isinstance(nxt, bool) else 0
        self.guard = start_guard(saved, ts, step=step, sampler=self.sampler,
                                 recorder=self.recorder)


__all__ = [
    "DRILL_PIN",
    "STATE_KEY",
    "CkptkitCallback",
    "CkptkitIO",
    "FabricCheckpoints",
    "capture_extras",
    "check_before_load",
    "local_dir",
    "lookahead",
    "restore_rng",
    "restore_sampler",
    "restore_watch",
    "resume_checkpoint",
    "start_guard",
]
