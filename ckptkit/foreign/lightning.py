"""Lightning ``.ckpt`` files (lightning / pytorch-lightning 2.x).

One torch zip archive holding a dict: ``state_dict`` (model), ``optimizer_states``,
``lr_schedulers``, ``epoch``, ``global_step``, ``loops`` (fit-loop progress),
``callbacks`` (e.g. ModelCheckpoint, whose ``kth_value`` may be ``+inf`` and whose paths
are absolute), the precision plugin's state (the AMP scaler, under the plugin's class
name), ``hyper_parameters`` and ``pytorch-lightning_version``. ``save_weights_only=True``
drops optimizer, schedulers and callbacks. Lightning stores **no RNG state** and **no
data-loader position** (a mid-epoch resume restarts the loader unless it is stateful).
"""

from __future__ import annotations

from ckptkit.foreign._scan import Scan, adam_step, as_int, iter_state

KNOWN = {
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
_SCALER_KEYS = (
    "MixedPrecision",
    "MixedPrecisionPlugin",
    "native_amp_scaling_state",
    "amp_scaling_state",
)


def scan(s: Scan) -> None:
    """Fill ``s`` for one Lightning ``.ckpt`` file."""
    rel = s.files[0] if s.files else s.target.name
    if not s.files:
        s.missing("model", "CK-C101", f"{rel} does not exist")
        return
    ck = s.load(rel, component="model")
    if ck is None:
        return  # the integrity finding says why
    if not isinstance(ck, dict):
        s.add("CK-F108", f"holds a {type(ck).__name__}, not a Lightning checkpoint dict", path=rel)
        return
    s.step = as_int(ck.get("global_step"))

    sd = ck.get("state_dict")
    if isinstance(sd, dict) and sd:
        s.comp(
            "model",
            present=True,
            required=True,
            where=[f"{rel}:state_dict"],
            summary={"tensors": len(sd)},
        )
        s.nonfinite("model", iter_state(sd), path=rel, prefix="state_dict.")
    else:
        s.missing("model", "CK-C101", "no state_dict: the file holds no model weights")

    opts = ck.get("optimizer_states")
    if isinstance(opts, list) and opts:
        summary = {"optimizers": len(opts)}
        step = adam_step(opts[0]) if isinstance(opts[0], dict) else None
        if step is not None:
            summary["step"] = step
        s.comp(
            "optimizer",
            present=True,
            required=True,
            where=[f"{rel}:optimizer_states"],
            summary=summary,
        )
        for i, o in enumerate(opts):
            if isinstance(o, dict):
                s.nonfinite(
                    "optimizer",
                    iter_state(o.get("state", {})),
                    path=rel,
                    prefix=f"optimizer_states.{i}.state.",
                )
    else:
        s.missing(
            "optimizer",
            "CK-C101",
            "no optimizer_states: a weights-only save (save_weights_only=True); "
            "Trainer.fit(ckpt_path=...) would fail, and loading the weights alone "
            "restarts Adam moments and the LR schedule",
            hint="save with save_weights_only=False (ModelCheckpoint default), or resume "
            "from a full checkpoint",
        )

    scheds = ck.get("lr_schedulers")
    if isinstance(scheds, list) and scheds:
        s.comp(
            "scheduler",
            present=True,
            required=True,
            where=[f"{rel}:lr_schedulers"],
            summary={"last_epoch": scheds[0].get("last_epoch")}
            if isinstance(scheds[0], dict)
            else {},
        )
    elif "optimizer_states" not in ck:
        s.comp(
            "scheduler",
            present=False,
            required=False,
            reason="weights-only save: schedulers were not saved",
        )

    for k in _SCALER_KEYS:
        if isinstance(ck.get(k), dict):
            s.comp("scaler", present=True, required=True, where=[f"{rel}:{k}"])

    loops = ck.get("loops")
    where = [f"{rel}:global_step", f"{rel}:epoch"]
    if isinstance(loops, dict) and "fit_loop" in loops:
        where.append(f"{rel}:loops.fit_loop")
    if "global_step" in ck:
        s.comp(
            "progress",
            present=True,
            required=True,
            where=where,
            summary={"global_step": s.step, "epoch": as_int(ck.get("epoch"))},
        )
    else:
        s.missing("progress", "CK-C101", "no global_step: the step counter is lost")

    s.missing(
        "rng",
        "CK-C103",
        "Lightning stores no RNG state: seed_everything only re-applies the initial "
        "seed, so a resumed run draws different dropout masks and augmentations",
        hint="save torch/numpy/python RNG in on_save_checkpoint (checkpoint['rng'] = "
        "...) and restore it in on_load_checkpoint",
    )
    s.missing(
        "sampler",
        "CK-C102",
        "Lightning stores no data-loader position: a mid-epoch resume restarts the "
        "epoch's data order (fit_loop counts batches, it does not skip them)",
        hint="use a torchdata StatefulDataLoader (Lightning saves its state_dict), or "
        "save only at epoch ends",
    )
    if "pytorch-lightning_version" in ck:
        s.comp(
            "env",
            present=True,
            where=[f"{rel}:pytorch-lightning_version"],
            summary={"lightning": str(ck["pytorch-lightning_version"])},
        )
    s.unrecognised(
        "keys", [str(k) for k in ck if k not in KNOWN and k not in _SCALER_KEYS], path=rel
    )
