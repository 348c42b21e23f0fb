"""Foreign checkpoints: Hugging Face Trainer, Accelerate, Lightning, DCP, torch.save, safetensors.

``ckptkit verify`` / ``inspect`` / ``adopt`` read these layouts without a ckptkit manifest.
Each format is a *reader*, not a verifier: one module per format (``hf_trainer``,
``accelerate``, ``lightning``, ``dcp``, ``torch_save``, ``weights``) fills a
:class:`~ckptkit.verify.foreign.scan.Scan` (components found by the tool's conventions, or by
the shape of their content: :mod:`ckptkit.verify.foreign.structure`), which becomes the
:class:`~ckptkit.verify.view.StateView` the registered checks read
(:mod:`ckptkit.verify.foreign.report`); :mod:`ckptkit.verify.foreign.adopt` writes a manifest beside.

This package only re-exports detection (import-light). Their finding codes are declared
with every other code in :mod:`ckptkit.codes`.
"""

from ckptkit.checkpoint.detect import FORMATS, detect

__all__ = ["FORMATS", "detect"]
