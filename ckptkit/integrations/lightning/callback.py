"""The Trainer side of the Lightning integration: a ``Callback`` that puts what an exact
resume needs into each checkpoint and makes the run drillable."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ckptkit.capture import rng as rng_capture
from ckptkit.capture import sampler as sampler_capture
from ckptkit.capture import tree_fingerprint
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.capture.state import TrainState
from ckptkit.errors import CkptkitError
from ckptkit.format.records import GUARD_KEY
from ckptkit.integrations.drill_env import DrillEnv
from ckptkit.integrations.lightning.checkpoint_io import (
    DRILL_PIN,
    CkptkitIO,
    local_dir,
    resume_checkpoint,
)
from ckptkit.integrations.lightning.extras import (
    STATE_KEY,
    capture_extras,
    restore_rng,
    restore_sampler,
    restore_watch,
)
from ckptkit.integrations.lightning.guard import lookahead, start_guard
from ckptkit.signals import guard as guard_mod
from ckptkit.signals import rngtrace
from ckptkit.signals.observe import row_hashes
from ckptkit.signals.recorder import Recorder
from ckptkit.signals.stability import StabilityWatch

log = logging.getLogger("ckptkit")


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
