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

import array
import ctypes
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import xxhash

from ckptkit.capture import is_int, refuse, show, tree_fingerprint
from ckptkit.errors import StateError

_NDARRAY_TAG = "__ndarray__"

_MAX_KEYS = 1 << 16
"""More NumPy legacy keys than this are refused unread (MT19937 has 624)."""


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

    All checks run before any generator is touched, so a failed restore changes nothing:
    :func:`problems` first applies each saved state to a throwaway generator of its kind
    (the same operation as below), then the states are built, then set.

    Args:
        state: a tree returned by :func:`capture` (after a storage round trip is fine).
        rank: this process's rank; when given it must equal the captured rank.
        numpy_generators: the generators to restore, under the names used at capture.
        on_cuda_mismatch: ``"error"`` (default) or ``"overlap"``, see the module docstring.

    Raises:
        StateError: ``CK-S013`` a saved state no generator accepts (see :func:`problems`);
            another rank's state, missing or extra NumPy generators, a CUDA state on a
            machine without CUDA, or a different CUDA device count.

    Example:
        >>> state = capture()
        >>> x = random.random()
        >>> restore(state)
        >>> random.random() == x
        True
    """
    refuse("rng", problems(state))
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

    # Everything is built before the first generator is set: past this point nothing raises.
    py = _python_state(state["python"])
    npst = _numpy_state(state["numpy"], state["numpy"]["keys"].numpy())
    gens = {name: _from_tree(saved_gens[name]) for name in given}
    cpu = state["torch_cpu"].to("cpu", torch.uint8)
    cuda = [cuda_states[device].to("cpu", torch.uint8) for device in range(n_restore_cuda)]
    random.setstate(py)
    np.random.set_state(npst)
    for name, gen in given.items():
        gen.bit_generator.state = gens[name]
    torch.set_rng_state(cpu)
    for device, dev_state in enumerate(cuda):
        torch.cuda.set_rng_state(dev_state, device)


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not set as saved (empty: nothing).

    No guessing at what the generators accept: each saved state is applied to a throwaway
    generator of its kind (``random.Random()``, ``np.random.RandomState()``, a fresh NumPy
    bit generator of the saved class, ``torch.Generator()``) by the same operation
    :func:`restore` applies it with. Only the snapshot is read: this is the rule verify
    (CK-S013) and restore share.

    A tensor may be a stand-in on the ``meta`` device (verify reading the manifest without
    the files): NumPy's legacy keys are then applied as zeros of the saved shape and dtype
    (``set_state`` accepts any key values, so only the shape decides), and torch's CPU state
    is held to the size ``torch.get_rng_state()`` has (its bytes are checked when real).
    CUDA states are checked for shape only (no throwaway CUDA generator on a CPU machine).

    Args:
        state: a snapshot as :func:`capture` returns it, or as a manifest decodes it.

    Example:
        >>> s = capture()
        >>> problems(s)
        []
        >>> s["python"]["state"] = [1, 2, 3]
        >>> problems(s)
        ['python: state vector is the wrong size']
    """
    if not isinstance(state, Mapping):
        return [f"the snapshot is {show(state)}, not an object"]
    out: list[str] = []
    for key, lo in (("rank", 0), ("world_size", 1)):
        if not is_int(state.get(key), lo=lo):
            out.append(f"{key} is {show(state.get(key))}, not an integer from {lo}")
    py = state.get("python")
    out += _applied("python", lambda: random.Random().setstate(_python_state(py)))
    gauss = py.get("gauss_next") if isinstance(py, Mapping) else None
    if not (gauss is None or (type(gauss) is float and math.isfinite(gauss))):
        # setstate stores any object here; random.gauss() would return it as a sample.
        out.append(f"python: gauss_next is {show(gauss)}, not null or a finite float")
    npst = state.get("numpy")
    out += _applied(
        "numpy", lambda: np.random.RandomState().set_state(_numpy_state(npst, _keys(npst)))
    )
    gens = state.get("numpy_generators")
    if gens is not None and not isinstance(gens, Mapping):
        out.append(f"numpy_generators is {show(gens)}, not an object")
    for name, gen_state in (gens or {}).items() if isinstance(gens, Mapping) else ():
        out += _applied(f"numpy generator {show(name)}", lambda g=gen_state: _set_generator(g))
    cpu = state.get("torch_cpu")
    out += _applied("torch_cpu", lambda: _set_torch(cpu))
    cuda = state.get("cuda")
    if cuda is not None and not (
        isinstance(cuda, list) and all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in cuda)
    ):
        out.append(f"cuda is {show(cuda)}, not a list of generator states")
    return out


def _applied(what: str, apply: Any) -> list[str]:
    """Run ``apply`` (one state set on a throwaway generator); its failure is the problem."""
    try:
        apply()
    except Exception as e:  # whatever the generator refuses with, restore would raise
        return [f"{what}: {_reason(e)}"]
    return []


def _reason(e: Exception) -> str:
    text = str(e) if type(e) is not KeyError else f"no {e}"
    if len(text) > 120:
        text = text[:117] + "..."
    return text or type(e).__name__


def _python_state(py: Any) -> tuple[Any, ...]:
    """The ``random.setstate`` argument :func:`restore` builds from the saved entry."""
    return (int(py["version"]), tuple(int(v) for v in py["state"]), py["gauss_next"])


def _numpy_state(npst: Any, keys: np.ndarray) -> tuple[Any, ...]:
    """The ``np.random.set_state`` argument :func:`restore` builds from the saved entry."""
    return (
        npst["bit_generator"],
        keys.astype(np.uint32),
        int(npst["pos"]),
        int(npst["has_gauss"]),
        float(npst["cached_gaussian"]),
    )


def _keys(npst: Any) -> np.ndarray:
    keys = npst["keys"]
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys is {show(keys)}, not a tensor")
    if keys.is_meta:
        if keys.numel() > _MAX_KEYS:
            raise ValueError(f"keys holds {keys.numel()} values (MT19937 has 624)")
        keys = torch.zeros(keys.shape, dtype=keys.dtype)
    return keys.numpy()


def _set_generator(saved: Any) -> None:
    """Set a saved ``bit_generator.state`` on a fresh bit generator of the saved class."""
    kind = saved["bit_generator"] if isinstance(saved, Mapping) else None
    cls = getattr(np.random, kind, None) if isinstance(kind, str) else None
    if not (isinstance(cls, type) and issubclass(cls, np.random.BitGenerator)):
        raise ValueError(f"bit_generator is {show(kind)}, not a NumPy bit generator")
    cls().state = _from_tree(saved)


def _set_torch(saved: Any) -> None:
    if not isinstance(saved, torch.Tensor):
        raise TypeError(f"{show(saved)} is not a tensor")
    if saved.is_meta:
        size = torch.get_rng_state().numel()
        if saved.dim() != 1 or saved.numel() != size:
            raise ValueError(f"shape {list(saved.shape)} is not the [{size}] bytes of a state")
        saved.to(torch.uint8)  # refused dtypes raise here as in the real conversion
        return
    torch.Generator().set_state(saved.to("cpu", torch.uint8))


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


def generators(state: Mapping[str, Any]) -> list[str]:
    """The generators a snapshot holds, named as :func:`summary` names them (no tensor read).

    Example:
        >>> generators(capture(cuda=False))
        ['python', 'numpy', 'torch_cpu']
    """
    names = ["python", "numpy", "torch_cpu"]
    names += [f"numpy:{name}" for name in sorted(state.get("numpy_generators") or {})]
    names += [f"cuda:{i}" for i in range(len(state.get("cuda") or []))]
    return names


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
            # Bit generator states hold integer words only (_to_tree writes no other kind);
            # any other dtype name (a 10 GB void type) is refused before NumPy builds it.
            dtype = np.dtype(str(value[_NDARRAY_TAG]))
            if dtype.kind not in "iu" or dtype.itemsize > 8:
                raise ValueError(f"a bit generator word of dtype {dtype} (integers only)")
            return np.array([int(v) for v in value["values"]], dtype=dtype)
        return {k: _from_tree(v) for k, v in value.items()}
    return value


# --- live snapshots of the global generators (fingerprinted by look-aheads and step records) ---

FINGERPRINT_VERSION = 2
"""Version of :meth:`RngSnapshot.fingerprint` (1: the v0.1 ``repr``-based fingerprint)."""


NUMPY_STATE_BYTES = 624 * 4 + 4
"""Size of numpy's ``mt19937_state``: ``uint32_t key[624]; int pos;``."""


def _numpy_raw() -> bytes:
    """NumPy's global MT19937 key and position, copied from the C state (~1 us)."""
    bitgen = np.random.mtrand._rand._bit_generator  # type: ignore[attr-defined]
    return ctypes.string_at(bitgen.ctypes.state_address, NUMPY_STATE_BYTES)


@dataclass(frozen=True)
class RngSnapshot:
    """The state of every global generator of this process, as cheap copies.

    ``take()`` costs about as much as one fingerprint (tens of microseconds): no hashing.
    """

    python: tuple[Any, ...]
    """``random.getstate()``."""
    numpy: bytes
    """NumPy's global MT19937: its 624 key words and position, read straight from the
    bit generator (``np.random.get_state()`` costs ~100x more; the cached second value of a
    legacy Gaussian pair is not included)."""
    torch_cpu: bytes
    """``torch.get_rng_state()`` as bytes."""
    cuda: tuple[bytes, ...] = ()
    """One state per CUDA device, when CUDA is initialised."""

    @classmethod
    def take(cls) -> RngSnapshot:
        """Snapshot the global generators now.

        Example:
            >>> RngSnapshot.take() == RngSnapshot.take()
            True
        """
        cuda: tuple[bytes, ...] = ()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = tuple(s.numpy().tobytes() for s in torch.cuda.get_rng_state_all())
        return cls(
            python=random.getstate(),
            numpy=_numpy_raw(),
            torch_cpu=torch.get_rng_state().numpy().tobytes(),
            cuda=cuda,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RngSnapshot):
            return NotImplemented
        return (
            self.python == other.python
            and self.torch_cpu == other.torch_cpu
            and self.cuda == other.cuda
            and self.numpy == other.numpy
        )

    __hash__ = None  # type: ignore[assignment]

    def fingerprint(self) -> str:
        """Return a 16-hex-digit digest of every generator's state (version 2).

        Example:
            >>> s = RngSnapshot.take()
            >>> len(s.fingerprint()), s.fingerprint() == RngSnapshot.take().fingerprint()
            (16, True)
        """
        h = xxhash.xxh3_64()
        h.update(b"ckptkit.rng.v2|")
        h.update(array.array("Q", self.python[1]).tobytes())
        h.update(repr(self.python[2]).encode())
        h.update(self.numpy)
        h.update(self.torch_cpu)
        for c in self.cuda:
            h.update(c)
        return h.hexdigest()


__all__ = [
    "FINGERPRINT_VERSION",
    "NUMPY_STATE_BYTES",
    "RngSnapshot",
    "capture",
    "fingerprint",
    "generators",
    "problems",
    "restore",
    "summary",
]
