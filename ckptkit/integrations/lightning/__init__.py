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

Each piece has its module: :mod:`.checkpoint_io` (the plugin, and the choice of the
checkpoint to resume from), :mod:`.callback`, :mod:`.fabric`, :mod:`.extras` (what they
add to a checkpoint) and :mod:`.guard` (the resume guard's look-ahead); this package
re-exports the names ``docs/lightning.md`` uses. Lightning is imported here, so this
package needs the ``lightning`` extra; the run layout (:mod:`ckptkit.run.layouts.lightning`)
does not.

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

try:
    import lightning  # noqa: F401  (the extra's check, before a module below imports it)
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(
        "ckptkit.integrations.lightning needs Lightning: pip install 'ckptkit[lightning]' "
        "(or pip install lightning)"
    ) from e

from ckptkit.integrations.lightning.callback import CkptkitCallback
from ckptkit.integrations.lightning.checkpoint_io import CkptkitIO, resume_checkpoint
from ckptkit.integrations.lightning.fabric import FabricCheckpoints

__all__ = [
    "CkptkitCallback",
    "CkptkitIO",
    "FabricCheckpoints",
    "resume_checkpoint",
]
