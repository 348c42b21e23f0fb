"""Plain ``torch.save`` checkpoints: a dict whose keys follow common conventions.

Top-level keys are mapped to spec §1 components by name (:data:`KEY_COMPONENTS`, case-
insensitive); keys known to hold run configuration (``config``, ``args`` ...) are
accepted silently; everything else is reported as not recognised. A file that is itself a
flat dict of tensors is a weights-only save.
"""

from __future__ import annotations

from typing import Any

import torch

from ckptkit.foreign._scan import Scan, adam_step, as_int, iter_state

KEY_COMPONENTS: dict[str, str] = {
    **dict.fromkeys(
        (
            "model",
            "state_dict",
            "model_state_dict",
            "model_state",
            "net",
            "network",
            "module",
            "weights",
            "params",
        ),
        "model",
    ),
    **dict.fromkeys(
        (
            "optimizer",
            "optim",
            "opt",
            "optimizer_state_dict",
            "optimizer_state",
            "optimizers",
            "optimizer_states",
        ),
        "optimizer",
    ),
    **dict.fromkeys(
        (
            "scheduler",
            "lr_scheduler",
            "sched",
            "scheduler_state_dict",
            "lr_scheduler_state_dict",
            "lr_schedulers",
            "schedulers",
        ),
        "scheduler",
    ),
    **dict.fromkeys(("scaler", "grad_scaler", "amp", "scaler_state_dict", "amp_state"), "scaler"),
    **dict.fromkeys(
        (
            "iter_num",
            "iter",
            "iteration",
            "iterations",
            "step",
            "steps",
            "global_step",
            "num_updates",
            "epoch",
            "epochs",
            "consumed_samples",
            "tokens_seen",
            "progress",
        ),
        "progress",
    ),
    **dict.fromkeys(
        (
            "rng",
            "rng_state",
            "rng_states",
            "random_state",
            "random_states",
            "torch_rng_state",
            "cuda_rng_state",
            "numpy_rng_state",
            "python_rng_state",
            "np_rng_state",
            "cpu_rng_state",
        ),
        "rng",
    ),
    **dict.fromkeys(
        (
            "sampler",
            "sampler_state",
            "dataloader",
            "data_loader",
            "dataloader_state",
            "data_state",
            "data_iter",
            "train_loader",
        ),
        "sampler",
    ),
    **dict.fromkeys(("fp8", "fp8_meta", "fp8_state"), "fp8"),
    **dict.fromkeys(("torch_version", "versions", "env", "environment"), "env"),
    **dict.fromkeys(("metrics", "history", "log_history", "losses"), "metrics"),
}
"""Key → component, for the conventions of nanoGPT, torchvision references, fairseq ..."""

CONFIG_KEYS = frozenset(
    {
        "config",
        "model_args",
        "args",
        "hparams",
        "hyper_parameters",
        "cfg",
        "best_val_loss",
        "best_metric",
        "best_loss",
        "best_acc",
        "arch",
        "model_config",
        "train_config",
    }
)
"""Run configuration and bookkeeping: recognised, not resume state."""

PROGRESS_KEYS = ("global_step", "step", "iter_num", "iteration", "num_updates", "iter", "steps")


def classify(keys: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Split top-level keys into ``{component: [keys]}`` and the unrecognised rest.

    Example:
        >>> classify(["model", "optimizer", "iter_num", "foo"])
        ({'model': ['model'], 'optimizer': ['optimizer'], 'progress': ['iter_num']}, ['foo'])
    """
    comps: dict[str, list[str]] = {}
    rest = []
    for k in keys:
        c = KEY_COMPONENTS.get(k.lower())
        if c is not None:
            comps.setdefault(c, []).append(k)
        elif k.lower() not in CONFIG_KEYS:
            rest.append(k)
    return comps, rest


def require_training_state(s: Scan, comps: dict[str, list[str]], *, what: str) -> None:
    """Report the required components that ``comps`` lacks (torch.save and DCP)."""
    if "model" not in comps:
        s.missing("model", "CK-C101", f"no model state in {what} (keys model / state_dict)")
    if "optimizer" not in comps:
        s.missing(
            "optimizer",
            "CK-C101",
            f"no optimizer state in {what} (keys optimizer / optim): a resume restarts "
            "the optimizer moments (a loss spike), or this is a weights-only save",
        )
    if "progress" not in comps:
        s.missing(
            "progress",
            "CK-C101",
            f"no step counter in {what} (keys step / global_step / iter_num / epoch): "
            "schedules and logging restart at 0",
        )
    if "rng" not in comps:
        s.missing("rng", "CK-C103", f"no RNG state in {what} (keys rng / rng_state)")
    if "sampler" not in comps:
        s.missing(
            "sampler",
            "CK-C102",
            f"no data-loader position in {what} (keys sampler / dataloader): the data "
            "order restarts on resume",
        )


def scan(s: Scan) -> None:
    """Fill ``s`` for one ``torch.save`` file."""
    if not s.files:
        s.missing("model", "CK-C101", f"{s.target.name} does not exist")
        return
    rel = s.files[0]
    obj = s.load(rel, component="model")
    if obj is None:
        return
    if not isinstance(obj, dict):
        if isinstance(obj, torch.Tensor):
            obj = {"<tensor>": obj}
        else:
            s.add("CK-F108", f"holds a {type(obj).__name__}, not a dict of state", path=rel)
            return
    keys = [str(k) for k in obj]
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        # A flat state_dict: the whole file is model weights.
        s.comp("model", present=True, required=True, where=[rel], summary={"tensors": len(obj)})
        s.nonfinite("model", iter_state(obj), path=rel)
        require_training_state(s, {"model": [rel]}, what=rel)
        return
    comps, rest = classify(keys)
    for comp, ks in comps.items():
        summary: dict[str, Any] = {}
        if comp == "progress":
            summary = {k: as_int(obj[k]) for k in ks if as_int(obj[k]) is not None}
            s.step = next((as_int(obj[k]) for k in PROGRESS_KEYS if k in ks), None)
        if comp == "optimizer" and isinstance(obj[ks[0]], dict):
            st = adam_step(obj[ks[0]])
            if st is not None:
                summary["step"] = st
        required = comp in (
            "model",
            "optimizer",
            "progress",
            "rng",
            "sampler",
            "scheduler",
            "scaler",
            "fp8",
        )
        s.comp(
            comp, present=True, required=required, where=[f"{rel}:{k}" for k in ks], summary=summary
        )
        for k in ks:
            if comp == "optimizer":
                v = obj[k]
                state = v.get("state", v) if isinstance(v, dict) else v
                s.nonfinite("optimizer", iter_state(state), path=rel, prefix=f"{k}.")
            elif comp == "model":
                s.nonfinite("model", iter_state(obj[k]), path=rel, prefix=f"{k}.")
    require_training_state(s, comps, what=rel)
    s.unrecognised("keys", rest, path=rel)
