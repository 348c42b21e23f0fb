"""What every crash-matrix training script shares (tests/integrations/test_crash_matrix.py).

A script is a user's training loop (native, Trainer, Accelerate, Lightning, Fabric) with the
documented ckptkit lines, plus four calls into this module, none of which changes what the
loop computes:

* :meth:`Harness.arm` just before the save of step :data:`ARM_AT`: from then on the process
  stops dead at the crash point the test named (``CKPTKIT_CRASH_AT``). Earlier saves pass
  their points unarmed (:mod:`ckptkit.crashpoints` counts passes only while armed), so
  ``NAME@K`` counts within the save of step :data:`ARM_AT`.
* :func:`wrap_framework_writes` (framework scripts only): every ``torch.save`` and safetensors
  save, under whatever name a framework imported it, first passes ``framework.files``: ``@1``
  stops before the framework's first file of the save, ``@2`` after it, before the second.
* :meth:`Harness.batch` once per optimizer step: a digest of the batch that step trained on
  (the data position, compared step by step with the uninterrupted run).
* :meth:`Harness.finish` at the end: digests of the model, the optimizer state, the step and
  the global RNGs, with the step this process resumed from, written as JSON to the path the
  test gave. Digests, not tensors: the test compares without unpickling anything.

Usage of every script: ``python SCRIPT ROOT OUT_JSON [KILL_POINT]``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import sys
from typing import Any

import numpy as np
import torch

from ckptkit import crashpoints

STEPS = 8
"""Optimizer steps of a run (two epochs of :data:`SAMPLES` / :data:`BATCH` = 5 steps: the
resumes at step 4 and 6 are mid-epoch, and the run crosses an epoch boundary)."""
SAVE_EVERY = 2
KEEP = 2
"""Keep-last of verified rotation: the save of step 6 deletes step 2 (``rotate.deleted``)."""
ARM_AT = 6
"""The save that is interrupted: the third; steps 2 and 4 are complete before it."""
SAMPLES = 20
BATCH = 4


def digest(*tensors: Any) -> str:
    """sha256 of the raw bytes of ``tensors`` (dtype and shape included)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _tree(obj: Any) -> Any:
    """A JSON image of a state tree: tensors as digests, the rest as is (or its repr)."""
    if isinstance(obj, torch.Tensor):
        return "tensor:" + digest(obj)
    if isinstance(obj, dict):
        return {str(k): _tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_tree(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return repr(obj)


def _rng() -> dict[str, str]:
    """Digests of the global generators (torch, NumPy, Python)."""
    np_state = np.random.get_state()
    return {
        "torch": digest(torch.get_rng_state()),
        "numpy": hashlib.sha256(np_state[1].tobytes() + repr(np_state[2:]).encode()).hexdigest(),
        "python": hashlib.sha256(repr(random.getstate()).encode()).hexdigest(),
    }


class Harness:
    """One run of a crash-matrix script (see the module docstring)."""

    def __init__(self, argv: list[str]) -> None:
        self.root = argv[1]
        self.out = argv[2]
        self.kill = argv[3] if len(argv) > 3 else None
        self.resumed_from: int | None = None
        self.batches: list[list[Any]] = []

    @classmethod
    def from_argv(cls) -> Harness:
        return cls(sys.argv)

    def arm(self, step: int) -> None:
        """Call just before the save of ``step``: arm the kill at the save of :data:`ARM_AT`."""
        if step == ARM_AT and self.kill:
            os.environ[crashpoints.ENV] = self.kill

    def resumed(self, step: int) -> None:
        """The step the run starts from (0: fresh); only the first call counts."""
        if self.resumed_from is None:
            self.resumed_from = int(step)
            # For the test's message when the run fails later (its JSON is then not written).
            print(f"crash-matrix: resumed from step {step}", file=sys.stderr, flush=True)

    def batch(self, step: int, *tensors: Any) -> None:
        """The batch optimizer step ``step`` trains on (tensors, or one digest string)."""
        d = tensors[0] if len(tensors) == 1 and isinstance(tensors[0], str) else digest(*tensors)
        self.batches.append([int(step), d])

    def finish(self, step: int, *, model: Any, optimizer: Any, **extra: Any) -> None:
        """Write the final state's digests to the output JSON."""
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate / Fabric wrappers
        out = {
            "step": int(step),
            "resumed_from": self.resumed_from,
            "model": {k: digest(v) for k, v in model.state_dict().items()},
            "optimizer": _tree(opt.state_dict()),
            "rng": _rng(),
            "batches": self.batches,
            **{k: _tree(v) for k, v in extra.items()},
        }
        with open(self.out, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)


def synthetic_data() -> torch.utils.data.TensorDataset:
    """The matrix's training data: SAMPLES rows of 8 features and 1 target, the same in
    every script (so every framework trains on the same bytes)."""
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(SAMPLES, 8, generator=g), torch.randn(SAMPLES, 1, generator=g)
    )


def tiny_mlp() -> torch.nn.Module:
    """The matrix's model: small, with dropout (so a resumed RNG stream shows bitwise)."""
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )


def wrap_framework_writes() -> None:
    """Make every ``torch.save`` / safetensors save pass ``framework.files`` before writing.

    Frameworks import the savers under their own names (``safe_save_file`` in accelerate
    and transformers), so every loaded module's binding of the original is replaced too.
    """
    import safetensors.torch

    originals = {
        "torch.save": torch.save,
        "save_file": safetensors.torch.save_file,
        "save_model": safetensors.torch.save_model,
    }

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            crashpoints.reached("framework.files")
            return fn(*args, **kwargs)

        return wrapper

    wrapped = {id(fn): wrap(fn) for fn in originals.values()}
    for mod in list(sys.modules.values()):
        try:
            names = vars(mod)
        except TypeError:
            continue
        for name, value in list(names.items()):
            if id(value) in wrapped and callable(value):
                with contextlib.suppress(AttributeError, TypeError):  # a read-only binding
                    setattr(mod, name, wrapped[id(value)])
