"""ckptkit for torchtitan's own ``CheckpointManager``: checksummed saves, a verified resume.

torchtitan (0.3.0) saves each step with ``torch.distributed.checkpoint`` into
``checkpoint/step-N/`` and, at start, loads the highest ``N`` whose folder holds
``.metadata``: a flipped bit loads silently, and a step whose ``.distcp`` a crash or a
full disk truncated is picked as the newest. :class:`CheckpointManager` here is
torchtitan's, with three hooks changed:

* **save** (``dcp_save``): the same ``dcp.save`` / ``dcp.async_save`` calls, through
  :class:`ckptkit.dcp.Writer`, which hashes every byte as DCP writes it and commits
  ``step-N/ckptkit-manifest.json`` after ``.metadata`` (signed when a key is configured).
  A ``last_save_in_hf`` step (Hugging Face safetensors) is adopted after torchtitan wrote
  it (``ckptkit adopt``: its digests recorded beside it). The manifest records the
  look-ahead of the step (:func:`ckptkit.checkpoint.lookahead.record`: next step, LR of every param
  group, scheduler position, optimizer step count) of the first optimizer and LR
  scheduler of torchtitan's containers (one per model part; the first speaks for all);
* **which step to load** (``_find_load_step``): the newest step that verifies from its
  bytes (:func:`ckptkit.run.resume_target`, the choice every ckptkit integration makes,
  made once on rank 0 for every rank): a truncated or flipped newer step is passed over,
  and a WARNING names each one and why. A model-only step (torchtitan's default last
  step, ``last_save_model_only``), which a full-state load cannot take, is passed over the
  same way. A whole step saved without ckptkit (``.metadata``, no manifest) is verified and
  adopted on the spot. When steps exist but none can be resumed, the load is refused
  (torchtitan would start fresh, and its ``keep_latest_k`` would then delete the new
  steps, numbered below the damaged ones, first);
* **load** (``dcp_load``): through :class:`ckptkit.dcp.Reader`, which checks every byte
  it loads against the manifest. An ``initial_load_path`` without a manifest (weights
  converted elsewhere) is loaded by plain DCP, with a WARNING that nothing vouches for it.
  The load leaves the global generators as it found them (torchtitan saves none, and its
  dataloader's restore draws a DataLoader base seed: a resumed run's workers would then
  be seeded unlike an uninterrupted run's). Then the restored optimizer and scheduler
  are compared with the step's look-ahead (the resume guard, :mod:`ckptkit.signals.guard`, as the
  Hugging Face integration does), at the load and at the first optimizer step after it: a
  changed LR or schedule position (``CK-D003``: a scheduler left out of the load, an LR
  set by hand), an optimizer step count that moved (``CK-D005``) is logged at WARNING and
  kept in :attr:`CheckpointManager.guard`. RNG and sample ids are not compared: torchtitan saves
  no generator state, and the drill compares the steps themselves.

While it trains, rank 0 holds the run's writer lock (``.ckptkit.lock`` in the checkpoint
folder, taken when the manager is built, released at ``close``): ``ckptkit prune`` and
``rollback --apply`` are refused meanwhile, as for every ckptkit integration.

Under ``ckptkit drill`` it honours the drill contract (:mod:`ckptkit.integrations.drill_env`):
checkpoints go to ``$CKPTKIT_CKPT_DIR``, a full step is saved after
``$CKPTKIT_DRILL_SAVE_AT``, the run stops after ``$CKPTKIT_DRILL_STOP_AT`` (the
``Trainer``'s ``training.steps`` is lowered to it; the LR schedule, already built, is
unchanged), the resumed run loads ``$CKPTKIT_DRILL_RESUME_FROM`` (checked byte by byte),
and rank 0 records every step to ``$CKPTKIT_METRICS`` (RNG, LR, optimizer step, batch
hash; the parameters' digest at the stop step) for the drill to compare.

The folders stay torchtitan's: plain torchtitan loads them, ``ckptkit ls/verify/prune/
rollback/drill`` work on them (:mod:`ckptkit.run.layouts.torchtitan`).

Use (two lines: the import, and the checkpoint config's class)::

    from ckptkit.integrations.torchtitan import CheckpointManager
    checkpoint=CheckpointManager.Config(enable=True, folder="checkpoint", interval=500)

It imports torchtitan (and ``ckptkit.dcp``) only when this module is imported.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint.state_dict_saver import (
    AsyncCheckpointerType,
    AsyncSaveResponse,
)
from torchtitan.components.checkpointer import LR_SCHEDULER, MODEL, OPTIMIZER
from torchtitan.components.checkpointer import CheckpointManager as TitanCheckpointManager
from torchtitan.components.checkpointer.dcp import AsyncMode
from torchtitan.tools.utils import GarbageCollection

from ckptkit.capture import rng as rng_capture
from ckptkit.capture import tree_fingerprint
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint import dcp as ckdcp
from ckptkit.checkpoint.catalog import STEP_RE, CheckpointInfo
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format import signing
from ckptkit.format.records import LookAhead
from ckptkit.integrations.drill_env import DrillEnv
from ckptkit.run import Run, resume_target
from ckptkit.run.layouts.torchtitan import TorchtitanLayout, holds_any, open_torchtitan
from ckptkit.signals import guard as guard_mod
from ckptkit.signals.recorder import Recorder
from ckptkit.storage import fs
from ckptkit.verify.foreign.adopt import adopt_checkpoint

log = logging.getLogger("ckptkit")


def step_of(checkpoint_id: str) -> int | None:
    """The step a torchtitan checkpoint id (``…/step-N``) names, or None.

    Example:
        >>> step_of("/dump/checkpoint/step-40"), step_of("/weights/llama")
        (40, None)
    """
    m = STEP_RE.match(os.path.basename(os.path.normpath(checkpoint_id)))
    return int(m.group(1)) if m else None


class CheckpointManager(TitanCheckpointManager):
    """torchtitan's ``CheckpointManager`` with manifests at save and a verified resume.

    Built from its ``Config`` like torchtitan's (``config.checkpoint.build(...)`` in the
    ``Trainer``); takes the same arguments. The HMAC key that signs and checks manifests
    is the configured one (``CKPTKIT_HMAC_KEY`` / ``CKPTKIT_HMAC_KEY_FILE``), if any.

    Example:
        >>> cfg = CheckpointManager.Config(enable=False)
        >>> type(cfg.build(dataloader=None, model_parts=[], optimizers=None,
        ...     lr_schedulers=None, states={}, sd_adapter=None)).__name__
        'CheckpointManager'
    """

    @dataclass(kw_only=True, slots=True)
    class Config(TitanCheckpointManager.Config):
        """torchtitan's checkpoint config, unchanged (its class picks this manager)."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        self._ck_key = signing.resolve_key(None)
        self._drill = DrillEnv.from_env()
        self._run: Run | None = None
        self._recorder: Recorder | None = None
        self._drill_state: TrainState | None = None
        self._built: dict[str, Any] = {}
        self._loaded: mf.Manifest | None = None
        self._first_step_hook: Any = None
        self.guard: guard_mod.ResumeGuard | None = None
        """The resume guard of the last load, when its step recorded a look-ahead (its
        ``findings``: what the restored run does unlike the saved one's next step)."""
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        if self._drill.ckpt_dir is not None:
            log.info("ckptkit drill: checkpoints go to %s", self._drill.ckpt_dir)
            self.folder = str(self._drill.ckpt_dir)
        local = fs.local_path(fs.location(self.folder))  # the layout reads local folders
        if not self.load_only and local is not None:
            # Every rank sees the folder before torchtitan's load asks whether it exists: a
            # rank that asked before rank 0's run lock created it would skip the choice of
            # the step, a collective the others make (a gloo lock-up, fresh-clone CI).
            local.mkdir(parents=True, exist_ok=True)
        if not self.load_only and _rank() == 0 and local is not None:
            # As every ckptkit integration: no prune deletes while this run saves. The
            # lock holder also adopts a step a kill left without its manifest.
            self._run = open_torchtitan(self.folder, readonly=False, key=self._ck_key)
        if self._drill.active or self._drill.metrics is not None:
            self._drill_setup(kwargs)

    # --- the drill contract -------------------------------------------------------------------

    def _drill_setup(self, built: dict[str, Any]) -> None:
        """Stop at ``$CKPTKIT_DRILL_STOP_AT``; record every step to ``$CKPTKIT_METRICS``."""
        if self._drill.stop_at is not None:
            # torchtitan's Trainer is its own ``train_state``; its loop runs while
            # ``step < config.training.steps``, and the last step is the one equal to it.
            trainer = self.states.get("train_state")
            training = getattr(getattr(trainer, "config", None), "training", None)
            if training is not None and hasattr(training, "steps"):
                training.steps = self._drill.stop_at
                log.info("ckptkit drill: training.steps=%d", self._drill.stop_at)
            else:
                log.warning(
                    "ckptkit drill: no Trainer config to stop the run at step %d: the "
                    "script must stop after $CKPTKIT_DRILL_STOP_AT itself",
                    self._drill.stop_at,
                )
        if self._drill.metrics is None or _rank() != 0:
            return
        self._recorder = Recorder(None)  # $CKPTKIT_METRICS: the drill's records
        self._built = built

    def _observe(self) -> None:
        """Bind the drill's recorder to the model and optimizer: every record then gets
        the RNG, LR, optimizer step and batch hash. Bound after the load, not before:
        torchtitan's load steps each optimizer once at lr 0 to create its state, which
        is no training step."""
        if self._recorder is None or self._drill_state is not None:
            return
        parts = self._built.get("model_parts") or []
        opts = getattr(self._built.get("optimizers"), "optimizers", None) or [None]
        scheds = getattr(self._built.get("lr_schedulers"), "schedulers", None) or [None]
        if parts:
            self._drill_state = TrainState(
                model=parts[0], optimizer=opts[0], scheduler=scheds[0], recorder=self._recorder
            )

    def _record(self, step: int) -> None:
        """Record ``step`` (the Trainer calls ``save`` after every step)."""
        if self._recorder is None:
            return
        self._observe()  # a loop that never called load(): from the next step on
        fields: dict[str, Any] = {}
        if self._drill.should_stop(step) and self._drill_state is not None:
            fields["param_hash"] = _param_hash(self._drill_state.model)
        self._recorder.log(step, **fields)

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        drill = not self.load_only and self._drill.should_save(curr_step)
        return drill or bool(super()._should_save(curr_step, last_step))

    def _should_purge(self) -> bool:
        # The drill copies step W a moment after it is written: keep_latest_k must not
        # take it first (a drill's checkpoint folder is its own, thrown away after).
        return not self._drill.active and bool(super()._should_purge())

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        self._record(curr_step)
        return bool(super()._save(curr_step, last_step))

    def _load(self, step: int = -1) -> bool:
        # torchtitan checkpoints no generator state, and its load draws from the global
        # ones (the dataloader's restore builds an iterator: a DataLoader base seed): the
        # resumed run would then draw differently from an uninterrupted one (its workers'
        # seeds first). The load leaves every generator as it found it.
        outside = rng_capture.capture()
        self._loaded = None
        try:
            if step != -1 or self._drill.resume_from is None:
                loaded = bool(super()._load(step))
            else:
                # The drill's resumed run: its checkpoint, not the newest of its (empty) folder.
                checkpoint_id = str(self._drill.resume_from)
                log.info("ckptkit drill: loading %s", checkpoint_id)
                states = self._states_to_load(model_only=step_of(checkpoint_id) == 0)
                self.dcp_load(states, checkpoint_id=checkpoint_id, from_hf=False, from_quantized=False)
                loaded = True
            if loaded:
                self._check_lookahead()
            return loaded
        finally:
            rng_capture.restore(outside)
            self._observe()

    def _close(self) -> None:
        super()._close()
        self._unwatch()  # the first-step hook, if the run never stepped
        if self._drill_state is not None and self._recorder is not None:
            if self._recorder.observer is not None:
                self._recorder.observer.close()
            self._drill_state = None
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None
        if self._run is not None:
            self._run.close()  # releases the run lock
            self._run = None

    # --- save -------------------------------------------------------------------------------

    @torch.no_grad()
    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Future[Any] | AsyncSaveResponse | None:
        """torchtitan's save, through :class:`ckptkit.dcp.Writer` (see the module docstring)."""
        ret: Future[Any] | AsyncSaveResponse | None = None
        if to_hf:
            ret = super().dcp_save(
                state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf
            )
            self._adopt_hf(checkpoint_id)
            return ret
        key, step = self._ck_key, step_of(checkpoint_id)
        la = self._lookahead(step)  # now: an async save returns before the bytes are out
        if async_mode == AsyncMode.ASYNC:
            ret = ckdcp.async_save(
                state_dict, checkpoint_id, key=key, step=step, lookahead=la, process_group=self.pg
            )
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            # ckdcp.async_save takes no stager: DCP's own call, with ckptkit's writer.
            ret = tdcp.async_save(
                state_dict,
                storage_writer=ckdcp.Writer(checkpoint_id, key=key, step=step, lookahead=la),
                process_group=self.pg,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.stager,
            )
        else:
            ckdcp.save(state_dict, checkpoint_id, key=key, step=step, lookahead=la)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def _live(self) -> TrainState | None:
        """The live objects the look-ahead reads, as a TrainState: the first optimizer and
        LR scheduler of torchtitan's containers (one per model part, built alike and
        stepped together: the first speaks for all). No model: the look-ahead reads none
        without a probe. None when there is no optimizer (a model-only manager)."""
        opts = getattr(self.states.get(OPTIMIZER), "optimizers", None) or []
        opt = next((o for o in opts if isinstance(o, torch.optim.Optimizer)), None)
        if opt is None:
            return None
        scheds = getattr(self.states.get(LR_SCHEDULER), "schedulers", None) or [None]
        return TrainState(model=torch.nn.Module(), optimizer=opt, scheduler=scheds[0])

    def _lookahead(self, step: int | None) -> dict[str, Any] | None:
        """The look-ahead of the checkpoint of ``step``, from the live objects (None: a
        checkpoint id that names no step, or nothing to read it from; the writer then
        records what it can)."""
        live = self._live() if step is not None else None
        if live is None:
            return None
        try:
            return guard_mod.lookahead_of(live, step=step)
        except Exception as e:  # an exotic optimizer or scheduler: no look-ahead, never a crash
            log.info("ckptkit: no look-ahead for step %s: %s", step, e)
            return None

    def _check_lookahead(self) -> None:
        """Compare the restored optimizer and scheduler with the look-ahead the loaded
        step recorded (the resume guard without a Recorder, as the Hugging Face
        integration's): next step, LR of every group, scheduler position, optimizer step
        count. Each mismatch is logged at WARNING and kept in :attr:`guard`."""
        man, self._loaded = self._loaded, None
        saved = LookAhead.of(man.lookahead if man is not None else None).guard
        live = self._live()
        if man is None or not saved or live is None or man.step is None:
            return  # an unverified or older step, or a model-only load: nothing to compare
        if guard_mod.problems(saved, {}):
            return  # unreadable: verify says CK-S012
        # The step the Trainer resumes at (its train_state, restored by this load).
        restored = getattr(self.states.get("train_state"), "step", None)
        live.step = restored if isinstance(restored, int) else man.step
        self._unwatch()
        g = guard_mod.ResumeGuard(saved, per_rank=False)
        g.check_restored(live)
        self.guard = g
        # The first resumed step too: an LR or an optimizer state changed by hand between
        # this load and the first step. A one-shot pre-hook on the first inner optimizer,
        # not the guard's own global one (ResumeGuard.watch): torchtitan's container is a
        # torch Optimizer too and steps first, which that hook would take for an optimizer
        # rebuilt after the restore.
        opt = live.optimizer
        assert opt is not None  # _live() holds one

        def first_step(o: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self._unwatch()
            try:
                g.on_first_step(o)
            except Exception as e:  # a check inside optimizer.step(): never break training
                log.debug("ckptkit resume guard: first-step check skipped: %s", e)

        self._first_step_hook = opt.register_step_pre_hook(first_step)

    def _unwatch(self) -> None:
        """Remove the first-step hook of the last resume, if it is still armed."""
        if self._first_step_hook is not None:
            self._first_step_hook.remove()
            self._first_step_hook = None

    def _adopt_hf(self, checkpoint_id: str) -> None:
        """Record the digests of a Hugging Face last step torchtitan wrote (rank 0)."""
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        a = adopt_checkpoint(Path(checkpoint_id), key=self._ck_key)
        if a.manifest is None:
            log.warning("ckptkit: %s was not adopted: %s", checkpoint_id, a.refused)

    # --- choose and load ----------------------------------------------------------------------

    def _find_load_step(self, folder: str = "") -> int:
        """The newest step of ``folder`` that verifies (-1: none saved yet).

        Raises:
            CkptkitError: steps exist and none verifies (each named with why).
        """
        folder = folder or self.folder
        run = self._run if folder == self.folder else None
        chosen = resume_target(
            folder, TorchtitanLayout(), run=run, key=self._ck_key, reject=self._not_full
        )
        if chosen.info is not None:
            if chosen.passed:
                log.warning(
                    "ckptkit: loading step-%d, the newest full step that verifies, instead of "
                    "%s", chosen.info.step, "; ".join(chosen.passed),
                )
            return chosen.info.step
        if chosen.passed:
            raise CkptkitError(
                "no step of this checkpoint folder verifies as a full training state: "
                f"{'; '.join(chosen.passed)}",
                path=folder,
                hint="restore the damaged steps from a copy, or move them out of the folder "
                "(ckptkit ls FOLDER lists them) to start fresh; to start from a model-only "
                "step's weights, move it out and name it in checkpoint.initial_load_path",
            )
        return -1

    def _not_full(self, info: CheckpointInfo) -> str | None:
        """Why the full-state load torchtitan makes of a step > 0 cannot take ``info``:
        it holds the model only (``last_save_model_only``: none of the other states this
        load asks for); None otherwise, or when its ``.metadata`` cannot be read (its
        verify then says why)."""
        if info.step == 0:
            return None  # torchtitan loads step 0 (the seed checkpoint) as the model only
        needed = sorted(k for k in self.states if k != MODEL and k not in self.exclude_from_loading)
        if not needed:
            return None
        if holds_any(TorchtitanLayout().local(info.path), needed) is not False:
            return None
        return (
            "holds the model only (torchtitan's last_save_model_only): a full-state "
            f"resume needs {', '.join(needed)}"
        )

    def dcp_load(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        from_hf: bool,
        from_quantized: bool,
    ) -> None:
        """torchtitan's load, through :class:`ckptkit.dcp.Reader` (see the module docstring)."""
        if from_hf or not self._manifested(checkpoint_id):
            if not from_hf:
                log.warning(
                    "ckptkit: %s has no ckptkit manifest: loaded unverified (nothing "
                    "vouches for its bytes; 'ckptkit adopt %s' records its digests)",
                    checkpoint_id, checkpoint_id,
                )
            super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
            return
        self._loaded = ckdcp.load(state_dict, checkpoint_id, key=self._ck_key)
        # As torchtitan: the model's entries are flattened into the state dict.
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)

    def _manifested(self, checkpoint_id: str) -> bool:
        """A step of this run (always checked: a missing manifest is refused), or another
        checkpoint that carries a ckptkit manifest."""
        inside = Path(checkpoint_id).parent == Path(self.folder)
        return inside or (Path(checkpoint_id) / ckdcp.MANIFEST_NAME).exists()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _param_hash(model: torch.nn.Module) -> str:
    """A digest of this rank's parameters and buffers (its local shards)."""
    return tree_fingerprint(
        {k: v.to_local() if hasattr(v, "to_local") else v for k, v in model.state_dict().items()}
    )


__all__ = ["CheckpointManager", "step_of"]
