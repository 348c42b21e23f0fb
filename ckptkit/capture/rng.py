"""Capture and restore every random number generator a training process draws from.

Covers Python ``random``, NumPy's legacy global state, any named ``np.random.Generator`` the
caller passes in, torch's CPU generator and, when CUDA is available, the generator of every
CUDA device. RNG state is per rank: each rank captures its own snapshot and records its rank.

CUDA device-count policy: restoring a snapshot taken with N CUDA devices on a process that sees
M != N devices raises :class:`~ckptkit.errors.StateError` by default, before anything is
restored. Pass ``on_cuda_mismatch="overlap"`` to restore the first ``min(N, M)`` devices and
leave the others as they are (the resumed run then differs in GPU-side randomness there).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch

from ckptkit.capture import tree_fingerprint
from ckptkit.errors import StateError

_NDARRAY_TAG = "__ndarray__"


def capture(
    *,
    rank: int = 0,
    world_size: int = 1,
    numpy_generators: Mapping[str, np.random.Generator] | None = None,
    cuda: bool | None = None,
) -> dict[str, Any]:
    """Snapshot all generators of this process.

    Args:
        rank: this process's rank, recorded so a restore can refuse another rank's state.
        world_size: the number of ranks, recorded for verify.
        numpy_generators: named ``np.random.Generator`` objects to include (e.g. an
            augmentation generator); restore needs the same names.
        cuda: capture CUDA generators; None means "when ``torch.cuda.is_available()``".

    Returns:
        A snapshot tree with keys ``rank``, ``world_size``, ``python``, ``numpy``,
        ``numpy_generators``, ``torch_cpu`` and, when captured, ``cuda`` (a list of tensors,
        one per device). All tensors are fresh copies.

    Example:
        >>> state = capture(rank=0)
        >>> a = torch.rand(1)
        >>> restore(state)
        >>> bool(torch.equal(a, torch.rand(1)))
        True
    """
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "rank": int(rank),
        "world_size": int(world_size),
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
        "numpy": {
            "bit_generator": str(np_name),
            # uint32 keys widened to int64: safetensors and every torch build support int64.
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "numpy_generators": {
            name: _to_tree(gen.bit_generator.state)
            for name, gen in sorted((numpy_generators or {}).items())
        },
        "torch_cpu": torch.get_rng_state().clone(),
    }
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        state["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return state


def restore(
    state: Mapping[str, Any],
    *,
    rank: int | None = None,
    numpy_generators: Mapping[str, np.random.Generator] | None = None,
    on_cuda_mismatch: Literal["error", "overlap"] = "error",
) -> None:
    """Put every generator back to the captured state.

    All checks run before any generator is touched, so a failed restore changes nothing.

    Args:
        state: a tree returned by :func:`capture` (after a storage round trip is fine).
        rank: this process's rank; when given it must equal the captured rank.
        numpy_generators: the generators to restore, under the names used at capture.
        on_cuda_mismatch: ``"error"`` (default) or ``"overlap"``, see the module docstring.

    Raises:
        StateError: another rank's state, missing or extra NumPy generators, a CUDA state
            on a machine without CUDA, or a different CUDA device count.

    Example:
        >>> state = capture()
        >>> x = random.random()
        >>> restore(state)
        >>> random.random() == x
        True
    """
    if rank is not None and int(state["rank"]) != rank:
        raise StateError(
            f"rng state belongs to rank {state['rank']}, not rank {rank}",
            hint="load the rng-rank file of this rank; RNG state is per rank",
        )
    saved_gens = dict(state.get("numpy_generators") or {})
    given = dict(numpy_generators or {})
    if set(saved_gens) != set(given):
        raise StateError(
            f"rng state has numpy generators {sorted(saved_gens)}, restore was given {sorted(given)}",
            hint="pass the same named np.random.Generator objects that were captured",
        )
    for name, gen in given.items():
        saved_kind = saved_gens[name].get("bit_generator")
        if saved_kind != type(gen.bit_generator).__name__:
            raise StateError(
                f"numpy generator {name!r} was a {saved_kind}, now a "
                f"{type(gen.bit_generator).__name__}",
                hint="construct the generator with the same bit generator as the saved run",
            )
    cuda_states: list[torch.Tensor] = list(state.get("cuda") or [])
    n_restore_cuda = 0
    if cuda_states:
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0 and on_cuda_mismatch == "error":
            raise StateError(
                f"rng state holds {len(cuda_states)} CUDA generator(s) but CUDA is not available",
                hint="resume on a CUDA machine, or pass on_cuda_mismatch='overlap' to restore "
                "only the CPU-side generators (GPU randomness will differ)",
            )
        if available != len(cuda_states) and on_cuda_mismatch == "error":
            raise StateError(
                f"rng state holds {len(cuda_states)} CUDA generator(s) but {available} "
                "device(s) are visible",
                hint="resume with the same CUDA_VISIBLE_DEVICES, or pass "
                "on_cuda_mismatch='overlap' to restore the devices both have",
            )
        n_restore_cuda = min(available, len(cuda_states))

    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(v) for v in py["state"]), py["gauss_next"]))
    npst = state["numpy"]
    np.random.set_state(
        (
            npst["bit_generator"],
            npst["keys"].numpy().astype(np.uint32),
            int(npst["pos"]),
            int(npst["has_gauss"]),
            float(npst["cached_gaussian"]),
        )
    )
    for name, gen in given.items():
        gen.bit_generator.state = _from_tree(saved_gens[name])
    torch.set_rng_state(state["torch_cpu"].to("cpu", torch.uint8))
    for device in range(n_restore_cuda):
        torch.cuda.set_rng_state(cuda_states[device].to("cpu", torch.uint8), device)


def fingerprint(state: Any) -> str:
    """Return the xxh3-64 hex digest of an RNG snapshot (or any part of one).

    Drills compare fingerprints to tell whether two processes hold the same RNG state.

    Args:
        state: a tree from :func:`capture`, or one generator's entry of it.

    Returns:
        16 hex characters; equal states give equal digests across a storage round trip.

    Example:
        >>> s = capture()
        >>> fingerprint(s) == fingerprint(capture())
        True
    """
    return tree_fingerprint(state)


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return which generators were captured and a fingerprint of each.

    Args:
        state: a tree from :func:`capture`.

    Returns:
        ``{"rank", "world_size", "generators": [...], "fingerprints": {generator: hex}}``
        where CUDA generators are named ``cuda:0``... and NumPy generators ``numpy:NAME``.

    Example:
        >>> summary(capture())["generators"][:3]
        ['python', 'numpy', 'torch_cpu']
    """
    prints: dict[str, str] = {
        "python": tree_fingerprint(state["python"]),
        "numpy": tree_fingerprint(state["numpy"]),
        "torch_cpu": tree_fingerprint(state["torch_cpu"]),
    }
    for name, gen_state in sorted((state.get("numpy_generators") or {}).items()):
        prints[f"numpy:{name}"] = tree_fingerprint(gen_state)
    for i, dev_state in enumerate(state.get("cuda") or []):
        prints[f"cuda:{i}"] = tree_fingerprint(dev_state)
    return {
        "rank": int(state["rank"]),
        "world_size": int(state["world_size"]),
        "generators": list(prints),
        "fingerprints": prints,
    }


def _to_tree(value: Any) -> Any:
    # bit_generator.state holds ndarrays (MT19937 key, Philox counter); uint64 words do not fit
    # int64 tensors, so store them as exact JSON ints tagged with their dtype.
    if isinstance(value, np.ndarray):
        return {_NDARRAY_TAG: str(value.dtype), "values": [int(v) for v in value.ravel()]}
    if isinstance(value, dict):
        return {k: _to_tree(v) for k, v in value.items()}
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _from_tree(value: Any) -> Any:
    if isinstance(value, dict):
        if _NDARRAY_TAG in value:
            return np.array([int(v) for v in value["values"]], dtype=value[_NDARRAY_TAG])
        return {k: _from_tree(v) for k, v in value.items()}
    return value


__all__ = ["capture", "fingerprint", "restore", "summary"]
