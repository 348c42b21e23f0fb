"""RNG capture: every generator continues identically after restore."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import numpy as np
import pytest
import torch

from ckptkit.capture import check_tree, rng
from ckptkit.errors import StateError


def roundtrip(tree: Any) -> Any:
    """Simulate the storage engine: tree must be storable; give back an equal, unaliased copy."""
    check_tree(tree, what="test")

    def strip(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return None
        if isinstance(x, dict):
            return {str(k): strip(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [strip(v) for v in x]
        return x

    json.dumps(strip(tree))
    return copy.deepcopy(tree)


def draw(gens: dict[str, np.random.Generator] | None = None) -> list[Any]:
    out: list[Any] = [
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.standard_normal(),
        torch.rand(4).tolist(),
        torch.randn(2).tolist(),
    ]
    for gen in (gens or {}).values():
        out.append(gen.random(3).tolist())
    return out


def test_restore_replays_every_generator() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    # Leave a cached gaussian in python and numpy to check those bits too.
    random.gauss(0, 1)
    np.random.standard_normal()
    gens = {
        "aug": np.random.default_rng(5),
        "mt": np.random.Generator(np.random.MT19937(6)),
        "philox": np.random.Generator(np.random.Philox(7)),
        "sfc": np.random.Generator(np.random.SFC64(8)),
    }
    state = roundtrip(rng.capture(numpy_generators=gens))
    expected = draw(gens)
    draw(gens)  # move every generator on
    rng.restore(state, numpy_generators=gens)
    assert draw(gens) == expected


def test_capture_returns_fresh_tensors_and_summary() -> None:
    state = rng.capture(rank=3, world_size=8)
    before = state["torch_cpu"].clone()
    torch.rand(10)
    assert torch.equal(state["torch_cpu"], before)
    assert state["numpy"]["keys"].dtype == torch.int64
    s = rng.summary(state)
    assert s["rank"] == 3 and s["world_size"] == 8
    assert s["generators"][:3] == ["python", "numpy", "torch_cpu"]
    assert all(len(v) == 16 for v in s["fingerprints"].values())
    json.dumps(s)


def test_fingerprint_stable_across_roundtrip_and_sensitive() -> None:
    state = rng.capture()
    assert rng.fingerprint(state) == rng.fingerprint(roundtrip(state))
    torch.rand(1)
    assert rng.fingerprint(rng.capture()) != rng.fingerprint(state)
    # Tuples and lists hash alike (the storage engine may hand either back).
    assert rng.fingerprint({"a": (1, 2)}) == rng.fingerprint({"a": [1, 2]})


def test_restore_refuses_other_rank() -> None:
    state = rng.capture(rank=1, world_size=2)
    with pytest.raises(StateError, match="rank 1"):
        rng.restore(state, rank=0)


def test_numpy_generator_names_must_match() -> None:
    state = rng.capture(numpy_generators={"aug": np.random.default_rng(0)})
    with pytest.raises(StateError, match="numpy generators") as err:
        rng.restore(state)
    assert err.value.hint
    with pytest.raises(StateError, match="PCG64"):
        rng.restore(state, numpy_generators={"aug": np.random.Generator(np.random.MT19937(0))})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_cuda_state_on_cpu_machine() -> None:
    state = rng.capture()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    with pytest.raises(StateError, match="CUDA is not available") as err:
        rng.restore(state)
    assert "overlap" in (err.value.hint or "")
    torch.rand(3)
    rng.restore(state, on_cuda_mismatch="overlap")  # CPU generators only
    assert rng.capture(cuda=False)["torch_cpu"].equal(state["torch_cpu"])


def test_failed_restore_changes_nothing() -> None:
    state = rng.capture(rank=0)
    random.random()
    after = random.getstate()
    with pytest.raises(StateError):
        rng.restore(state, rank=1)
    assert random.getstate() == after
