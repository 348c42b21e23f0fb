"""Foreign checkpoints: Hugging Face Trainer, Accelerate, Lightning, DCP and torch.save.

``ckptkit verify`` / ``inspect`` / ``adopt`` read these layouts without a ckptkit manifest
and report the same spec §1 component table as for native checkpoints. One module per
format (``hf_trainer``, ``accelerate``, ``lightning``, ``dcp``, ``torch_save``) fills a
:class:`~ckptkit.foreign._scan.Scan`; :mod:`ckptkit.foreign.report` turns it into the
``Report`` the native verify returns; :mod:`ckptkit.foreign.adopt` writes a manifest beside.

This package only re-exports detection (import-light). Their finding codes are declared
with every other code in :mod:`ckptkit.codes`.
"""

from ckptkit.foreign.detect import FORMATS, detect

__all__ = ["FORMATS", "detect"]
