"""Resume-compatibility family: what changed between the save and the resuming process.

Runs with ``ckptkit verify --against-env`` (and wherever a caller asks for the ``compat``
family). Each finding is a warning naming what changed and what it can break: a changed
environment is often deliberate, but it should never be silent.

What "now" is comes from ``CheckContext.options`` when the caller knows it (a restore
passes the live layout and data identity), else from this process:

- ``current_env``: an env record as :func:`ckptkit.capture.env.capture` returns (default:
  captured now);
- ``current_parallel``: a :class:`~ckptkit.capture.parallel.ParallelConfig` or its dict
  (default: the world size of this process, from torch.distributed or ``WORLD_SIZE``);
- ``current_data``: the data identity the resumed run declares (default: not compared).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ckptkit import codes
from ckptkit.capture import env as env_capture
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.errors import CkptkitError
from ckptkit.format import tree as tree_mod
from ckptkit.verify.checks import _state as st
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, Finding, check

# --- CK-R001 environment ---------------------------------------------------------------------

ENV_EFFECTS: dict[str, str] = {
    "torch": "kernels, default algorithms and RNG consumption can differ, so the resumed curve "
    "is not bitwise identical and optimizer/scheduler state may load differently",
    "cuda": "GPU kernels and the CUDA RNG differ: no bitwise-identical resume, small numeric drift",
    "cudnn": "convolution/attention algorithms differ: small numeric drift, no bitwise resume",
    "nccl": "collective algorithms (reduction order) differ: small numeric drift across ranks",
    "gpus": "another GPU model runs other kernels (and TF32/bf16 paths): numeric drift; "
    "throughput and memory limits change",
}
"""Environment fields compared, and what a change can break."""


def _current_env(ctx: CheckContext) -> Mapping[str, Any]:
    cur = ctx.options.get("current_env")
    if isinstance(cur, Mapping):
        return cur
    return env_capture.capture()


@check(codes.R001)
def env_changed(ctx: CheckContext) -> Iterator[Finding]:
    saved = st.manifest(ctx).env
    if not isinstance(saved, Mapping) or not saved:
        return
    now = _current_env(ctx)
    for key, effect in ENV_EFFECTS.items():
        before, after = saved.get(key), now.get(key)
        # None on either side means "not there" (a CPU-only process verifying a GPU run):
        # nothing to compare for CUDA-side fields, and "no GPU" is not a version change.
        if before in (None, [], "") or after in (None, [], "") or before == after:
            continue
        yield CODES[codes.R001].finding(
            f"{key} changed since the save: {_show(before)} -> {_show(after)}; {effect}"
        )


def _show(v: Any) -> str:
    if isinstance(v, list) and len(v) > 2:
        return f"{v[0]!r} ×{len(v)}" if len(set(map(str, v))) == 1 else repr(v[:2]) + "…"
    return repr(v) if not isinstance(v, str) else v


# --- CK-R002 layout --------------------------------------------------------------------------

LAYOUT_FIELDS = (
    "world_size",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero_stage",
    "fsdp",
    "global_batch_size",
    "micro_batch_size",
)

LAYOUT_EFFECTS: dict[str, str] = {
    "world_size": "per-rank sampler positions and RNG streams no longer map one to one (ranks "
    "without a saved state start fresh streams), and sharded state must be resharded",
    "dp": "each rank's share of the data and its RNG stream change; the sampler must re-split "
    "the epoch (ResumableSampler does) and dropout/augmentation streams differ",
    "tp": "tensor-parallel shards of weights and optimizer state must be resharded",
    "pp": "pipeline stages hold other layers: per-stage state must be resharded",
    "cp": "sequence shards and their RNG streams change",
    "ep": "experts move between ranks: expert weights and their optimizer state must follow",
    "zero_stage": "optimizer state is partitioned differently and must be resharded",
    "fsdp": "parameters and optimizer state switch between flat shards and full tensors",
    "global_batch_size": "samples per step change: the LR schedule, consumed-sample counts and "
    "the sampler position per step no longer line up with the saved run",
    "micro_batch_size": "gradient accumulation changes; numerics and throughput differ",
}
"""Layout fields compared, and what a change can break."""


def _current_parallel(ctx: CheckContext) -> tuple[dict[str, Any], bool]:
    """The current layout, and whether it is fully known (else: world size only)."""
    cur = ctx.options.get("current_parallel")
    if isinstance(cur, ParallelConfig):
        return cur.to_dict(), True
    if isinstance(cur, Mapping):
        try:
            return ParallelConfig.from_dict(cur).to_dict(), True
        except (CkptkitError, TypeError):
            return dict(cur), True
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return {"world_size": dist.get_world_size()}, False
    env_ws = os.environ.get("WORLD_SIZE", "")
    return {"world_size": int(env_ws) if env_ws.isdigit() else 1}, False


@check(codes.R002)
def layout_changed(ctx: CheckContext) -> Iterator[Finding]:
    saved = st.summary(ctx, "parallel") or st.mapping(st.tree_part(ctx, "parallel"))
    if not saved:
        return
    now, full = _current_parallel(ctx)
    fields = LAYOUT_FIELDS if full else ("world_size",)
    source = "" if full else " (this process; pass the resumed layout to compare degrees)"
    for key in fields:
        before, after = saved.get(key), now.get(key)
        if key not in saved or after is None or before is None or before == after:
            continue
        yield CODES[codes.R002].finding(
            f"{key} changed since the save: {before} -> {after}{source}; {LAYOUT_EFFECTS[key]}"
        )


# --- CK-R003 data identity -------------------------------------------------------------------

DATA_EFFECTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("tokenizer", "vocab"),
        "token ids change meaning: embeddings and the output layer no "
        "longer match the text, the loss jumps",
    ),
    (
        ("snapshot", "dataset", "data_id", "shard"),
        "the same sampler positions now hold other "
        "samples: the resumed run replays or skips data it never saw as a whole",
    ),
    (
        ("pack", "seq_len", "max_len"),
        "sequence boundaries shift: positions and token counts no longer match the saved cursor",
    ),
    (
        ("mixture", "weight", "ratio"),
        "sampling proportions change: the data distribution after resume differs from before",
    ),
)
_DATA_DEFAULT = "the data the resumed run reads differs from the saved run's"


def _data_effect(key: str) -> str:
    k = key.lower()
    for needles, effect in DATA_EFFECTS:
        if any(n in k for n in needles):
            return effect
    return _DATA_DEFAULT


@check(codes.R003)
def data_changed(ctx: CheckContext) -> Iterator[Finding]:
    cur = ctx.options.get("current_data")
    if not isinstance(cur, Mapping) or not cur:
        return
    raw = st.tree_part(ctx, "data")
    try:
        saved = tree_mod.decode(raw, {}) if raw is not None else None
    except (CkptkitError, KeyError, TypeError, ValueError):
        saved = None
    if not isinstance(saved, Mapping):
        saved = dict(st.summary(ctx, "data"))
    if not saved:
        yield CODES[codes.R003].finding(
            f"the checkpoint records no data identity; the resumed run declares "
            f"{sorted(map(str, cur))}: a change cannot be ruled out",
            hint="declare data= in TrainState so the next checkpoints can be compared",
        )
        return
    for key, after in cur.items():
        if key not in saved:
            continue
        before = saved[key]
        if before != after:
            yield CODES[codes.R003].finding(
                f"data {key!r} changed since the save: {before!r} -> {after!r}; "
                f"{_data_effect(str(key))}"
            )
