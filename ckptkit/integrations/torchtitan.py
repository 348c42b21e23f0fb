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
  it (``ckptkit adopt``: its digests recorded beside it);
* **which step to load** (``_find_load_step``): the newest step that verifies from its
  bytes (:func:`ckptkit.run.resume_target`, the choice every ckptkit integration makes,
  made once on rank 0 for every rank): a truncated or flipped newer step is passed over,
  and a WARNING names each one and why. A whole step saved without ckptkit (``.metadata``,
  no manifest) is verified and adopted on the spot. When steps exist but none verifies,
  the load is refused (torchtitan would start fresh, and its ``keep_latest_k`` would then
  delete the new steps, numbered below the damaged ones, first);
* **load** (``dcp_load``): through :class:`ckptkit.dcp.Reader`, which checks every byte
  it loads against the manifest. An ``initial_load_path`` without a manifest (weights
  converted elsewhere) is loaded by plain DCP, with a WARNING that nothing vouches for it.

The folders stay torchtitan's: plain torchtitan loads them, ``ckptkit ls/verify/prune/
rollback`` read them (:mod:`ckptkit.layouts.torchtitan`).

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
from torchtitan.components.checkpointer import MODEL
from torchtitan.components.checkpointer import CheckpointManager as TitanCheckpointManager
from torchtitan.components.checkpointer.dcp import AsyncMode
from torchtitan.tools.utils import GarbageCollection

from ckptkit import dcp as ckdcp
from ckptkit import signing
from ckptkit.catalog import STEP_RE
from ckptkit.errors import CkptkitError
from ckptkit.foreign.adopt import adopt_checkpoint
from ckptkit.layouts.torchtitan import TorchtitanLayout
from ckptkit.run import resume_target

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
        super().__init__(config, **kwargs)

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
        if async_mode == AsyncMode.ASYNC:
            ret = ckdcp.async_save(state_dict, checkpoint_id, key=key, step=step, process_group=self.pg)
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            # ckdcp.async_save takes no stager: DCP's own call, with ckptkit's writer.
            ret = tdcp.async_save(
                state_dict,
                storage_writer=ckdcp.Writer(checkpoint_id, key=key, step=step),
                process_group=self.pg,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.stager,
            )
        else:
            ckdcp.save(state_dict, checkpoint_id, key=key, step=step)
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

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
        chosen = resume_target(folder, TorchtitanLayout(), key=self._ck_key)
        if chosen.info is not None:
            if chosen.passed:
                log.warning(
                    "ckptkit: loading step-%d, the newest step that verifies, instead of "
                    "%s", chosen.info.step, "; ".join(chosen.passed),
                )
            return chosen.info.step
        if chosen.passed:
            raise CkptkitError(
                f"no step of this checkpoint folder verifies: {'; '.join(chosen.passed)}",
                path=folder,
                hint="restore the damaged steps from a copy, or move them out of the folder "
                "(ckptkit ls FOLDER lists them) to start fresh",
            )
        return -1

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
        ckdcp.load(state_dict, checkpoint_id, key=self._ck_key)
        # As torchtitan: the model's entries are flattened into the state dict.
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)

    def _manifested(self, checkpoint_id: str) -> bool:
        """A step of this run (always checked: a missing manifest is refused), or another
        checkpoint that carries a ckptkit manifest."""
        inside = Path(checkpoint_id).parent == Path(self.folder)
        return inside or (Path(checkpoint_id) / ckdcp.MANIFEST_NAME).exists()


__all__ = ["CheckpointManager", "step_of"]
