"""A run of small checkpoints, one harm each, that every reader of it must judge alike.

Used where two ways of verifying are compared (``--workers``, ranks as threads, torchrun):
a checkpoint per kind of damage a shard-parallel reader could get wrong.
"""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

from small_model import trained_state

import ckptkit
from ckptkit.cli.render import RENDERERS

SHARD_BYTES = 4096
"""Small shards: the tiny model's checkpoint is 7 files, so every split has work to share."""


def shard(d: Path, prefix: str) -> Path:
    """The first shard file of ``prefix`` (``model``, ``optimizer``) in checkpoint ``d``."""
    return sorted(d.glob(f"{prefix}-*.safetensors"))[0]


def _flip_data_byte(d: Path) -> None:
    p = shard(d, "model")
    data = bytearray(p.read_bytes())
    data[-5] ^= 0xFF  # tensor bytes, past the header
    p.write_bytes(bytes(data))


def _retype_header(d: Path) -> None:
    """Same size, same JSON length: the header now says a float tensor is int32."""
    p = shard(d, "model")
    data = p.read_bytes()
    assert b'"F32"' in data
    p.write_bytes(data.replace(b'"F32"', b'"I32"', 1))


def make_damaged_run(run: Path) -> Path:
    """A run whose steps are: good, a flipped byte, a truncated shard, a missing shard, a
    missing manifest, a NaN in the model, a retyped header (one kind of harm each)."""
    trained = trained_state()
    for step in range(1, 8):
        state = copy.deepcopy(trained)
        if step == 6:
            next(iter(state["model"].values()))[0] = float("nan")
        ckptkit.save(state, run / f"step-{step:08d}", step=step, shard_bytes=SHARD_BYTES)
    _flip_data_byte(run / "step-00000002")
    opt = shard(run / "step-00000003", "optimizer")
    os.truncate(opt, opt.stat().st_size // 2)
    shard(run / "step-00000004", "model").unlink()
    (run / "step-00000005" / "manifest.json").unlink()
    _retype_header(run / "step-00000007")
    return run


def report_json(result: Any) -> dict[str, Any]:
    """A verify result's ``--json`` report without its timings: what two ways of verifying
    must agree on."""
    buf = io.StringIO()
    RENDERERS["json"](result, buf)
    out: dict[str, Any] = json.loads(buf.getvalue())
    for rep in out["reports"]:
        rep.pop("seconds")
    return out
