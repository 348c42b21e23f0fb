"""Accelerate ``Accelerator.save_state`` folders (accelerate 1.x).

What it writes: ``model.safetensors`` (or ``pytorch_model.bin``; ``model_<i>`` for extra
models), ``optimizer.bin`` (``optimizer_<i>.bin``), ``scheduler.bin``, ``scaler.pt`` (fp16),
``random_states_<rank>.pkl`` (python, numpy, torch CPU and CUDA RNG plus ``step``) and
``custom_checkpoint_<i>.pkl`` for registered objects (whose content is recognised by name
or structure: a registered step counter or data cursor counts). The ``.bin``/``.pkl``
files are torch zip archives. By default it writes **no sampler state** (only
``sampler.bin`` for a ``SeedableRandomSampler`` over an iterable shard,
``dl_state_dict.bin`` with ``use_stateful_dataloader``), and the ``step`` in
``random_states_0.pkl`` counts micro-steps (``accumulate`` calls), not optimizer steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ckptkit import codes
from ckptkit.verify.foreign.scan import Scan
from ckptkit.verify.foreign.structure import as_int, recognise

_MODEL = re.compile(r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin)$")
_OPT = re.compile(r"^optimizer(_\d+)?\.bin$")
_SCHED = re.compile(r"^scheduler(_\d+)?\.bin$")
_SAMPLER = re.compile(r"^(sampler(_\d+)?\.bin|dl_state_dict(_\d+)?\.bin)$")
_RNG = re.compile(r"^random_states_(\d+)\.pkl$")
_CUSTOM = re.compile(r"^custom_checkpoint_\d+\.pkl$")


def scan(s: Scan) -> None:
    """Fill ``s`` for an Accelerate ``save_state`` folder."""
    used: set[str] = set()

    models = [f for f in s.files if _MODEL.match(f)]
    used |= set(models)
    if models and not [f for f in models if s.model_file(f)]:
        s.absent("model", "; ".join(s.why_unread(f) for f in models))
    s.absent("model", "no model weights (model.safetensors / pytorch_model.bin)")

    opts = [f for f in s.files if _OPT.match(f)]
    used |= set(opts)
    for f in opts:
        s.optimizer_file(f)
    s.absent(
        "optimizer",
        "no optimizer.bin: load_state restores no optimizer, so training continues with "
        "fresh moments (a loss spike after resume)",
    )

    for f in (f for f in s.files if _SCHED.match(f)):
        used.add(f)
        s.scheduler_file(f)

    if s.has("scaler.pt"):
        used.add("scaler.pt")
        s.scaler_file("scaler.pt")

    for f in (f for f in s.files if _SAMPLER.match(f)):
        used.add(f)
        obj = s.load(f, component="sampler")
        if obj is not None:
            s.present("sampler", [f])
        if isinstance(obj, Mapping) and _count_only(obj):
            s.add(
                codes.C105,
                f"{f} holds {obj.get('_num_yielded')} batch(es) yielded and no sampler state: "
                "the resumed epoch's order is drawn again",
                path=f,
            )
    s.absent(
        "sampler",
        "no sampler.bin / dl_state_dict.bin: Accelerate saves no data-loader position by "
        "default, so a resumed epoch replays from its start unless the loop skips the "
        "batches seen (accelerator.skip_first_batches(dl, n)) over an order that is a "
        "function of (seed, epoch): DataLoaderConfiguration(use_seedable_sampler=True) and "
        "dl.set_epoch(epoch); or use_stateful_dataloader=True with the seedable sampler "
        "(docs/hf.md)",
    )

    rng = sorted((f for f in s.files if _RNG.match(f)), key=lambda f: int(_RNG.match(f)[1]))  # type: ignore[index]
    used |= set(rng)
    micro = None
    ok = []
    for f in rng:
        obj = s.load(f, component="rng")
        if isinstance(obj, Mapping):
            ok.append(f)
            if micro is None:
                micro = as_int(obj.get("step"))
    if ok:
        s.present("rng", ok, summary={"ranks": len(ok)})
        s.world_from_rng(rng)
        if micro is not None:
            # Micro-steps (accumulate calls), not optimizer steps: not the checks' "step".
            s.present("progress", [f"{ok[0]}:step"], summary={"micro_steps": micro})
    s.absent(
        "rng",
        "no random_states_<rank>.pkl: load_state leaves the RNG as it is, so the resumed run "
        "draws different dropout masks and shuffles",
    )
    s.absent(
        "progress",
        "no step counter: neither random_states_0.pkl nor a custom checkpoint holds the "
        "global step",
    )

    for f in (f for f in s.files if _CUSTOM.match(f)):
        used.add(f)
        obj = s.load(f, component="progress")
        if isinstance(obj, Mapping):
            rec = recognise(obj)
            s.recognised(rec, file=f)
    s.unrecognised("files", [f for f in s.files if f not in used])


def _count_only(state: Mapping[str, object]) -> bool:
    """A StatefulDataLoader state that holds a batch count but no sampler state."""
    keys = ("_index_sampler_state", "_sampler_iter_state", "_num_yielded")
    return (
        all(k in state for k in keys)
        and state["_index_sampler_state"] is None
        and state["_sampler_iter_state"] is None
    )
