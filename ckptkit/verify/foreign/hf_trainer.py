"""Hugging Face Trainer ``checkpoint-N/`` folders (transformers 4.x/5.x).

What the Trainer writes: model weights (``model.safetensors``, sharded
``model-0000x-of-0000y.safetensors`` + index, or ``pytorch_model*.bin``; PEFT
``adapter_model.*``), ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` (fp16 only),
``rng_state.pth`` (or ``rng_state_<rank>.pth``), ``trainer_state.json`` and
``training_args.bin``. On resume the Trainer re-creates the data position by skipping
``global_step`` batches; a missing ``optimizer.pt`` makes it resume *silently* with fresh
Adam state and skip ``scheduler.pt`` as well; a missing RNG file is an INFO log line.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ckptkit import codes
from ckptkit.verify.findings import WARNING
from ckptkit.verify.foreign.scan import Scan
from ckptkit.verify.foreign.structure import as_int

WEIGHT_PATTERNS = (
    "model.safetensors",
    "model-*-of-*.safetensors",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
    "adapter_model.bin",
)
KNOWN = {
    "config.json",
    "generation_config.json",
    "trainer_state.json",
    "training_args.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "README.md",
}
_RNG = re.compile(r"^rng_state(_\d+)?\.pth$")


def scan(s: Scan) -> None:
    """Fill ``s`` for a Trainer checkpoint folder."""
    used: set[str] = set()

    # model
    weights = sorted({f for pat in WEIGHT_PATTERNS for f in s.glob(pat)})
    used |= set(weights)
    read = [f for f in weights if s.model_file(f)]
    if weights and not read:
        s.absent("model", "; ".join(s.why_unread(f) for f in weights))
    s.absent("model", "no model weights (model.safetensors / pytorch_model.bin)")

    # trainer_state.json: progress, sampler (batch skipping), metrics
    state = _trainer_state(s)
    if state is not None:
        used.add("trainer_state.json")
        s.counter("global_step", state.get("global_step"))
        s.counter("epoch", _number(state.get("epoch")))
        s.present(
            "progress",
            ["trainer_state.json:global_step", "trainer_state.json:epoch"],
            summary={"epoch": _number(state.get("epoch"))},
        )
        s.present(
            "sampler",
            ["trainer_state.json:global_step"],
            summary={"method": "skip global_step batches on resume"},
            evidence="the Trainer has no sampler state: it re-seeds the sampler from "
            "args.seed and skips the batches already seen",
        )
        history = state.get("log_history")
        if isinstance(history, list) and history:
            s.present("metrics", ["trainer_state.json:log_history"], summary={"entries": len(history)})
        elif history is not None and not isinstance(history, list):
            s.add(
                codes.F108,
                f"trainer_state.json: log_history is a {type(history).__name__}, not a list",
                path="trainer_state.json",
                component="metrics",
                severity=WARNING,
            )
    elif not s.has("trainer_state.json"):
        why = "no trainer_state.json: the Trainer cannot resume (no global_step, epoch or data position)"
        s.absent("progress", why)
        s.require("sampler", "no trainer_state.json: the Trainer cannot skip the batches already seen")

    # optimizer
    opt_files = [f for f in ("optimizer.pt", "optimizer.bin") if s.has(f)]
    used |= set(opt_files)
    for f in opt_files:
        if s.optimizer_file(f):
            break
    s.absent(
        "optimizer",
        ("; ".join(s.why_unread(f) for f in opt_files) + ": " if opt_files else "no optimizer.pt: ")
        + "the Trainer resumes silently with fresh Adam moments (and then skips "
        "scheduler.pt too): a loss spike after resume",
    )

    # scheduler: the Trainer loads optimizer and scheduler only as a pair
    if s.has("scheduler.pt"):
        used.add("scheduler.pt")
        s.scheduler_file("scheduler.pt")
    s.require(
        "scheduler",
        "no scheduler.pt: the Trainer loads the optimizer and scheduler only as a pair, so "
        "it restarts both (learning-rate warmup replays)",
    )

    # scaler (fp16 AMP only)
    if s.has("scaler.pt"):
        used.add("scaler.pt")
        s.scaler_file("scaler.pt")

    # rng, one file per process
    rng = [f for f in s.files if _RNG.match(f)]
    used |= set(rng)
    ok = [f for f in rng if s.load(f, component="rng") is not None]
    if ok:
        s.present("rng", ok, summary={"files": len(ok)})
        s.world_from_rng(rng)
    s.absent(
        "rng",
        "no rng_state.pth: the Trainer logs one INFO line and resumes on fresh RNG streams "
        "(different dropout masks and shuffling)",
    )

    # env and config
    if s.has("training_args.bin"):
        s.load("training_args.bin", component="env")
    if s.has("config.json"):
        s.present("env", ["config.json:transformers_version"])
    s.unrecognised("files", [f for f in s.files if f not in used and f not in KNOWN])


def _trainer_state(s: Scan) -> dict[str, Any] | None:
    if not s.readable("trainer_state.json"):
        return None
    try:
        state = json.loads(s.path("trainer_state.json").read_text("utf-8"))
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        s.add(
            codes.F108,
            f"trainer_state.json is not valid JSON ({e})",
            path="trainer_state.json",
            component="progress",
        )
        s.absent("progress", "trainer_state.json is unreadable: the Trainer cannot resume")
        return None
    if as_int(state.get("global_step")) is None:
        s.absent("progress", "trainer_state.json holds no integer global_step")
    return state


def _number(v: Any) -> int | float | None:
    """A finite JSON number (``epoch`` may be fractional), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return v if math.isfinite(v) else None
