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

from ckptkit.foreign._scan import Scan, adam_step, as_int, iter_state
from ckptkit.verify.findings import WARNING

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
    if not s.load_model(weights):
        s.missing("model", "CK-C101", "no model weights (model.safetensors / pytorch_model.bin)")

    # trainer_state.json: progress, sampler (batch skipping), metrics
    state = None
    if s.has("trainer_state.json"):
        used.add("trainer_state.json")
        try:
            state = json.loads(s.path("trainer_state.json").read_text("utf-8"))
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            s.add(
                "CK-F108",
                f"trainer_state.json is not valid JSON ({e})",
                path="trainer_state.json",
                component="progress",
            )
            state = None
    if state is not None:
        s.step = as_int(state.get("global_step"))
        s.comp(
            "progress",
            present=True,
            required=True,
            where=["trainer_state.json:global_step", "trainer_state.json:epoch"],
            summary={"global_step": s.step, "epoch": _number(state.get("epoch"))},
        )
        s.comp(
            "sampler",
            present=True,
            required=True,
            where=["trainer_state.json:global_step"],
            summary={"method": "skip global_step batches on resume"},
            reason="the Trainer has no sampler state: it re-seeds the sampler from "
            "args.seed and skips the batches already seen",
        )
        history = state.get("log_history")
        if isinstance(history, list) and history:
            s.comp(
                "metrics",
                present=True,
                where=["trainer_state.json:log_history"],
                summary={"entries": len(history)},
            )
        elif history is not None and not isinstance(history, list):
            s.add(
                "CK-F108",
                f"trainer_state.json: log_history is a {type(history).__name__}, not a list",
                path="trainer_state.json",
                component="metrics",
                severity=WARNING,
            )
    else:
        s.missing(
            "progress",
            "CK-C101",
            "no trainer_state.json: the Trainer cannot resume (no global_step, epoch "
            "or data position)",
        )
        s.missing(
            "sampler",
            "CK-C102",
            "no trainer_state.json: the Trainer cannot skip the batches already seen",
        )

    # optimizer
    opt_files = [f for f in ("optimizer.pt", "optimizer.bin") if s.has(f)]
    used |= set(opt_files)
    if opt_files:
        s.comp("optimizer", present=True, required=True, where=opt_files)
        obj = s.load(opt_files[0], component="optimizer")
        if isinstance(obj, dict):
            s.nonfinite(
                "optimizer", iter_state(obj.get("state", {})), path=opt_files[0], prefix="state."
            )
            step = adam_step(obj)
            if step is not None:
                s.comp(
                    "optimizer",
                    present=True,
                    required=True,
                    where=opt_files,
                    summary={"step": step},
                )
    else:
        s.missing(
            "optimizer",
            "CK-C101",
            "no optimizer.pt: the Trainer resumes silently with fresh Adam moments "
            "(and then skips scheduler.pt too): a loss spike after resume",
        )

    # scheduler
    if s.has("scheduler.pt"):
        used.add("scheduler.pt")
        sch = s.load("scheduler.pt", component="scheduler")
        summ = {"last_epoch": sch.get("last_epoch")} if isinstance(sch, dict) else {}
        s.comp("scheduler", present=True, required=True, where=["scheduler.pt"], summary=summ)
    else:
        s.missing(
            "scheduler",
            "CK-C101",
            "no scheduler.pt: the Trainer loads the optimizer and scheduler only as a "
            "pair, so it restarts both (learning-rate warmup replays)",
        )

    # scaler (fp16 AMP only)
    if s.load_present("scaler", [f for f in ("scaler.pt",) if s.has(f)]):
        used.add("scaler.pt")

    # rng, one file per process
    rng = [f for f in s.files if _RNG.match(f)]
    used |= set(rng)
    if s.load_present("rng", rng, summary={"files": len(rng)}):
        s.comp(
            "parallel",
            present=True,
            where=rng,
            summary={"world_size": len(rng)},
            reason="world size inferred from the per-process RNG files",
        )
    else:
        s.missing(
            "rng",
            "CK-C103",
            "no rng_state.pth: the Trainer logs one INFO line and resumes on fresh RNG "
            "streams (different dropout masks and shuffling)",
        )

    # env and config
    if s.has("training_args.bin"):
        s.load("training_args.bin", component="env", critical=False)
    if s.has("config.json"):
        s.comp("env", present=True, where=["config.json:transformers_version"])
    s.unrecognised("files", [f for f in s.files if f not in used and f not in KNOWN])


def _number(v: Any) -> int | float | None:
    """A finite JSON number (``epoch`` may be fractional), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return v if math.isfinite(v) else None
