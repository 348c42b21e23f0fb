"""Plain ``torch.save`` checkpoints: a dict of state written by hand.

Components are recognised by :mod:`ckptkit.verify.foreign.structure`: by the common key names
(``model``, ``optim``, ``lr_scheduler``, ``iter_num``, ``dataloader``, ``dist`` ...) when
the content fits, and by the shape of the content wherever it sits otherwise (an
optimizer-shaped subtree is an optimizer under any key, and is reported as *inferred*).
A file that is itself a dict of tensors (``torch.save(model.state_dict())``) is a
weights-only save.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ckptkit import codes
from ckptkit.verify.foreign.scan import Scan
from ckptkit.verify.foreign.structure import recognise


def scan(s: Scan) -> None:
    """Fill ``s`` for one ``torch.save`` file."""
    if not s.files:
        s.absent("model", f"{s.target.name} does not exist")
        return
    rel = s.files[0]
    obj = s.load(rel, component="model")
    if obj is None:
        if s.needs_code(rel):  # torch.save(model): one cause, not every component missing
            return
        why = s.why_unread(rel)
        for name in ("model", "optimizer", "progress"):
            s.absent(name, why)
        return
    if isinstance(obj, torch.Tensor):
        obj = {"<tensor>": obj}
    if not isinstance(obj, Mapping):
        s.add(codes.F108, f"holds a {type(obj).__name__}, not a dict of state", path=rel)
        return
    scan_tree(s, obj, file=rel, what=rel)


def scan_tree(s: Scan, obj: Mapping[object, object], *, file: str, what: str) -> None:
    """Recognise the components of a loaded dict and say what a training resume lacks."""
    rec = recognise(obj)
    s.recognised(rec, file=file)
    s.absent("model", f"no model state in {what} (no state-dict-shaped mapping of tensors)")
    s.absent(
        "optimizer",
        f"no optimizer state in {what} (no subtree with 'state' and 'param_groups'): a "
        "resume restarts the optimizer moments (a loss spike)",
    )
    s.absent(
        "progress",
        f"no step counter in {what} (step / global_step / iter_num / epoch, or a train_state "
        "holding one): schedules and logging restart at 0",
    )
    s.absent("rng", f"no RNG state in {what} (torch / numpy / python generator states)")
    s.absent(
        "sampler",
        f"no data-loader position in {what} (a sampler / dataloader state, or epoch with a "
        "batch index or samples seen): the data order restarts on resume",
    )
    s.unrecognised("keys", rec.unrecognised, path=file)
