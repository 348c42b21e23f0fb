"""Lightning ``.ckpt`` files (lightning / pytorch-lightning 2.x).

One torch zip archive holding a dict: ``state_dict`` (model), ``optimizer_states``,
``lr_schedulers``, ``epoch``, ``global_step``, ``loops`` (fit-loop progress),
``callbacks`` (e.g. ModelCheckpoint, whose ``kth_value`` may be ``+inf`` and whose paths
are absolute), the precision plugin's state (the AMP scaler, under the plugin's class
name), ``hyper_parameters`` and ``pytorch-lightning_version``. ``save_weights_only=True``
drops optimizer, schedulers and callbacks. Lightning stores **no RNG state** and **no
data-loader position** (a mid-epoch resume restarts the loader unless it is stateful);
state a user adds in ``on_save_checkpoint`` (or a callback's ``state_dict``) is recognised
wherever it sits, by name or by structure.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckptkit import codes
from ckptkit.verify.foreign.scan import Scan
from ckptkit.verify.foreign.structure import CONFIG_KEYS, NAMES, recognise

KNOWN = frozenset(
    {
        "epoch",
        "global_step",
        "pytorch-lightning_version",
        "state_dict",
        "loops",
        "callbacks",
        "optimizer_states",
        "lr_schedulers",
        "hparams_name",
        "hyper_parameters",
        "datamodule_hparams_name",
        "datamodule_hyper_parameters",
    }
)
"""Top-level keys Lightning writes (never reported as unrecognised)."""

SCALER_KEYS = (
    "MixedPrecision",
    "MixedPrecisionPlugin",
    "native_amp_scaling_state",
    "amp_scaling_state",
)
"""Where Lightning's precision plugins keep the GradScaler state."""

_NAMES = {
    **NAMES,
    **{k.lower(): "scaler" for k in SCALER_KEYS},
    "pytorch-lightning_version": "env",
}


def scan(s: Scan) -> None:
    """Fill ``s`` for one Lightning ``.ckpt`` file."""
    rel = s.files[0] if s.files else s.target.name
    if not s.files:
        s.absent("model", f"{rel} does not exist")
        return
    ck = s.load(rel, component="model")
    if ck is None:
        why = s.why_unread(rel)
        for name in ("model", "optimizer", "progress"):
            s.absent(name, why)
        return  # the container finding says why
    if not isinstance(ck, Mapping):
        s.add(codes.F108, f"holds a {type(ck).__name__}, not a Lightning checkpoint dict", path=rel)
        return
    rec = recognise(ck, names=_NAMES, ignore=CONFIG_KEYS)
    s.recognised(rec, file=rel)
    s.absent("model", "no state_dict: the file holds no model weights")
    s.absent(
        "optimizer",
        "no optimizer_states: a weights-only save (save_weights_only=True); "
        "Trainer.fit(ckpt_path=...) would fail, and loading the weights alone restarts "
        "Adam moments and the LR schedule; save with save_weights_only=False "
        "(ModelCheckpoint default), or resume from a full checkpoint",
    )
    s.absent("progress", "no global_step: the step counter is lost")
    s.absent(
        "rng",
        "Lightning stores no RNG state: seed_everything only re-applies the initial seed, so "
        "a resumed run draws different dropout masks and augmentations; save "
        "torch/numpy/python RNG in on_save_checkpoint (checkpoint['rng'] = ...) and restore "
        "it in on_load_checkpoint",
    )
    s.absent(
        "sampler",
        "Lightning stores no data-loader position: a mid-epoch resume restarts the epoch's "
        "data order (fit_loop counts batches, it does not skip them); use a torchdata "
        "StatefulDataLoader (Lightning saves its state_dict), or save only at epoch ends",
    )
    s.unrecognised("keys", [k for k in rec.unrecognised if k not in KNOWN], path=rel)
