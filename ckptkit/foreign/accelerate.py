"""Accelerate ``Accelerator.save_state`` folders (accelerate 1.x).

What it writes: ``model.safetensors`` (or ``pytorch_model.bin``; ``model_<i>`` for extra
models), ``optimizer.bin`` (``optimizer_<i>.bin``), ``scheduler.bin``, ``scaler.pt`` (fp16),
``random_states_<rank>.pkl`` (python, numpy, torch CPU and CUDA RNG plus ``step``) and
``custom_checkpoint_<i>.pkl`` for registered objects. The ``.bin``/``.pkl`` files are torch
zip archives. By default it writes **no sampler state** (only ``sampler.bin`` for a
``SeedableRandomSampler`` over an iterable shard, ``dl_state_dict.bin`` with
``use_stateful_dataloader``), and the ``step`` in ``random_states_0.pkl`` counts
micro-steps (``accumulate`` calls), not optimizer steps.
"""

from __future__ import annotations

import re

from ckptkit.foreign._scan import Scan, adam_step, as_int, iter_state

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
    if not s.load_model(models):
        s.missing("model", "CK-C101", "no model weights (model.safetensors / pytorch_model.bin)")

    opts = [f for f in s.files if _OPT.match(f)]
    used |= set(opts)
    if opts:
        summary = {}
        for f in opts:
            obj = s.load(f, component="optimizer")
            if isinstance(obj, dict):
                s.nonfinite("optimizer", iter_state(obj.get("state", {})), path=f, prefix="state.")
                step = adam_step(obj)
                if step is not None and "step" not in summary:
                    summary["step"] = step
        s.comp("optimizer", present=True, required=True, where=opts, summary=summary)
    else:
        s.missing(
            "optimizer",
            "CK-C101",
            "no optimizer.bin: load_state restores no optimizer, so training continues "
            "with fresh moments (a loss spike after resume)",
        )

    scheds = [f for f in s.files if _SCHED.match(f)]
    used |= set(scheds)
    s.load_present("scheduler", scheds)

    if s.load_present("scaler", [f for f in ("scaler.pt",) if s.has(f)]):
        used.add("scaler.pt")

    samplers = [f for f in s.files if _SAMPLER.match(f)]
    used |= set(samplers)
    if not s.load_present("sampler", samplers):
        s.missing(
            "sampler",
            "CK-C102",
            "no sampler.bin / dl_state_dict.bin: Accelerate saves no data-loader "
            "position by default, so a resumed epoch replays from its start unless you "
            "call skip_first_batches",
            hint="use Accelerator(dataloader_config=DataLoaderConfiguration("
            "use_stateful_dataloader=True)) or skip_first_batches(dl, n) on resume",
        )

    rng = sorted((f for f in s.files if _RNG.match(f)), key=lambda f: int(_RNG.match(f)[1]))  # type: ignore[index]
    used |= set(rng)
    if rng:
        micro = None
        for f in rng:
            obj = s.load(f, component="rng")
            if isinstance(obj, dict) and micro is None:
                micro = as_int(obj.get("step"))
        s.comp("rng", present=True, required=True, where=rng, summary={"ranks": len(rng)})
        s.comp(
            "parallel",
            present=True,
            where=rng,
            summary={"world_size": len(rng)},
            reason="world size inferred from the per-process RNG files",
        )
        if micro is not None:
            s.comp(
                "progress",
                present=True,
                required=True,
                where=[f"{rng[0]}:step"],
                summary={"micro_steps": micro},
                reason="Accelerate's step counts micro-steps (accumulate calls), not "
                "optimizer steps; keep your own optimizer step in a custom checkpoint",
            )
    else:
        s.missing(
            "rng",
            "CK-C103",
            "no random_states_<rank>.pkl: load_state leaves the RNG as it is, so the "
            "resumed run draws different dropout masks and shuffles",
        )
    if not s.components["progress"].present:
        s.missing(
            "progress",
            "CK-C101",
            "no step counter: neither random_states_0.pkl nor a custom checkpoint "
            "holds the global step",
        )

    customs = [f for f in s.files if _CUSTOM.match(f)]
    used |= set(customs)
    for f in customs:
        s.load(f, component="progress")
    s.unrecognised("files", [f for f in s.files if f not in used])
