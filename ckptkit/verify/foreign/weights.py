"""Weights-only safetensors checkpoints: one ``.safetensors`` file, or a folder of them.

What ``safetensors.torch.save_file(model.state_dict(), ...)`` and Hugging Face
``save_pretrained`` write: the model's tensors (``model.safetensors``, or shards
``model-0000x-of-0000y.safetensors`` with an index) and, in a folder, ``config.json`` and
tokenizer files. Nothing of a training run, so verify checks it as a weights checkpoint
(``--expect weights``, inferred) unless told otherwise.
"""

from __future__ import annotations

from ckptkit.verify.foreign.scan import Scan

KNOWN_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".md", ".tiktoken")
"""Config, tokenizer and card files that sit beside the weights."""


def scan(s: Scan) -> None:
    """Fill ``s`` for a safetensors file or a folder of safetensors weights."""
    weights = [f for f in s.files if f.endswith(".safetensors")]
    if not weights:
        s.absent("model", f"{s.target.name} holds no .safetensors file")
        return
    read = [f for f in weights if s.model_file(f)]
    if not read:
        s.absent("model", "; ".join(s.why_unread(f) for f in weights))
    if s.has("config.json"):
        s.present("env", ["config.json"])
    s.unrecognised(
        "files",
        [f for f in s.files if f not in weights and not f.endswith(KNOWN_SUFFIXES)],
    )
