"""Where the random streams went: cheap snapshots of every global generator, and who drew.

A resume is exact only if the first step after the restore starts from the very RNG state
the uninterrupted run had there. Two snapshots of the process's global generators (Python
``random``, NumPy's legacy global state, torch's CPU generator, every initialised CUDA
device) say *whether* anything drew in between; for the three Mersenne Twister streams they
also say *how much*: :func:`draws_between` replays the stream from the first snapshot until
it meets the second (a few microseconds per 624 words), and when it never does, looks for
the seed the stream was reset to. :func:`explain` turns that into the call that most likely
drew and the fix, e.g. "the torch CPU generator advanced 2 words (one 64-bit draw): typically
``iter(DataLoader)`` drawing its workers' base seed from the global RNG".

torch's CPU generator is the standard MT19937 (the same recurrence as Python's ``random``
and NumPy's legacy ``RandomState``): its serialized state holds the seed it was last seeded
with, the count of words ``left`` before the next twist, and the 624-word state, so it is
replayed with Python's own ``random.Random``.

The snapshot itself and its fingerprint (:class:`RngSnapshot`, :data:`FINGERPRINT_VERSION`)
live in :mod:`ckptkit.capture.rng`, so that a save's look-ahead
(:mod:`ckptkit.checkpoint.lookahead`) fingerprints the generators without this module.

Example:
    >>> import torch
    >>> a = RngSnapshot.take()
    >>> _ = torch.empty((), dtype=torch.int64).random_()
    >>> d = draws_between(a, RngSnapshot.take())
    >>> d["torch"].words
    2
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ckptkit.capture.rng import FINGERPRINT_VERSION, NUMPY_STATE_BYTES, RngSnapshot

_MT_N = 624
_TORCH_HEAD = struct.Struct("<QiiQ")  # the_initial_seed, left, seeded, next
_TORCH_WORDS = slice(_TORCH_HEAD.size, _TORCH_HEAD.size + _MT_N * 8)
DEFAULT_LIMIT = 1 << 20
"""Most 32-bit words :func:`draws_between` replays before calling a stream re-seeded."""
COMMON_SEEDS = (0, 1, 42, 1234, 2024, 3407, 12345)
"""Seeds tried (besides the ones the streams reveal) when a stream cannot be reached."""
_SEED_LIMIT = 4 * _MT_N
"""Words replayed after a candidate seed (a re-seed is usually the last thing before step 1)."""


def fingerprint() -> str:
    """Fingerprint the global generators now (see :meth:`RngSnapshot.fingerprint`).

    Example:
        >>> fingerprint() == fingerprint()
        True
    """
    return RngSnapshot.take().fingerprint()


@dataclass(frozen=True)
class Draws:
    """How one generator moved between two snapshots.

    Example:
        >>> Draws("torch", 2).summary()
        'torch: 2 words'
    """

    generator: str
    """``python``, ``numpy``, ``torch`` or ``cuda``."""
    words: int | None
    """32-bit words drawn from the first state to the second; None: not reachable by drawing
    (the stream was re-seeded, replaced, or moved further than the replay limit)."""
    seed: int | None = None
    """When not reachable: the seed the stream was reset to, if one was found."""
    after_seed: int | None = None
    """Words drawn after that re-seed."""

    def summary(self) -> str:
        if self.words is not None:
            return f"{self.generator}: {self.words} words"
        if self.seed is not None:
            return f"{self.generator}: re-seeded with {self.seed} (+{self.after_seed} words)"
        return f"{self.generator}: replaced (not reachable by drawing)"

    def to_dict(self) -> dict[str, Any]:
        return {"words": self.words, "seed": self.seed, "after_seed": self.after_seed}


def _mt_from_torch(state: bytes) -> tuple[tuple[int, ...], int, int]:
    """(624 words, Python-style index, seed) of a torch CPU generator state."""
    seed, left, _seeded, _next = _TORCH_HEAD.unpack_from(state)
    words = tuple(np.frombuffer(state[_TORCH_WORDS], dtype="<u8").tolist())
    # ATen twists when ``left`` drops to 0, so ``left == 1`` is Python's index 624.
    return words, _MT_N + 1 - left, int(seed)


def _mt_distance(
    a: tuple[tuple[int, ...], int], b: tuple[tuple[int, ...], int], limit: int
) -> int | None:
    """Words drawn from MT state ``a`` to ``b`` (``(words, index)`` pairs), or None."""
    words, idx = a
    target, tidx = b
    if words == target and tidx >= idx:
        return tidx - idx
    r = random.Random()
    consumed = 0
    while consumed <= limit:
        n = _MT_N - idx + 1  # to the end of this block, then one word past the twist
        r.setstate((3, (*words, idx), None))
        r.getrandbits(32 * n)
        st = r.getstate()[1]
        words, idx = st[:_MT_N], st[_MT_N]
        consumed += n
        if words == target and tidx >= idx:
            return consumed + tidx - idx
    return None


def _python_mt(state: tuple[Any, ...]) -> tuple[tuple[int, ...], int]:
    inner = state[1]
    return tuple(inner[:_MT_N]), int(inner[_MT_N])


def _numpy_mt(state: bytes) -> tuple[tuple[int, ...], int]:
    words = tuple(np.frombuffer(state[: _MT_N * 4], dtype="<u4").tolist())
    return words, int.from_bytes(state[_MT_N * 4 : NUMPY_STATE_BYTES], "little", signed=True)


def _seeded_python(seed: int) -> tuple[tuple[int, ...], int]:
    return _python_mt(random.Random(seed).getstate())


def _seeded_numpy(seed: int) -> tuple[tuple[int, ...], int] | None:
    if not 0 <= seed < 2**32:
        return None
    st = np.random.RandomState(seed).get_state(legacy=False)["state"]
    return tuple(np.asarray(st["key"], dtype=np.uint64).tolist()), int(st["pos"])


def _seeded_torch(seed: int) -> tuple[tuple[int, ...], int] | None:
    try:
        g = torch.Generator().manual_seed(seed)
    except RuntimeError:
        return None
    w, i, _ = _mt_from_torch(g.get_state().numpy().tobytes())
    return w, i


def _find_seed(
    now: tuple[tuple[int, ...], int], seeded: Any, candidates: Iterable[int]
) -> tuple[int, int] | None:
    for s in dict.fromkeys(candidates):
        start = seeded(s)
        if start is None:
            continue
        d = _mt_distance(start, now, _SEED_LIMIT)
        if d is not None:
            return s, d
    return None


def _moved(
    generator: str,
    now: tuple[tuple[int, ...], int],
    words: int | None,
    seeded: Any,
    candidates: Iterable[int],
) -> Draws:
    """How ``generator`` reached ``now``: by drawing ``words``, else (None) by a re-seed with
    one of ``candidates`` (see :class:`Draws`), else replaced."""
    if words is not None:
        return Draws(generator, words)
    hit = _find_seed(now, seeded, candidates)
    return Draws(generator, None, *(hit or (None, None)))


def draws_between(
    before: RngSnapshot,
    after: RngSnapshot,
    *,
    limit: int = DEFAULT_LIMIT,
    seeds: Sequence[int] = (),
) -> dict[str, Draws]:
    """Say how each generator moved from ``before`` to ``after`` (only those that moved).

    Args:
        before: the earlier snapshot (e.g. right after a restore).
        after: the later one (e.g. at the start of the first resumed step).
        limit: most words replayed per stream before it counts as not reachable.
        seeds: extra seeds to try for a stream that cannot be reached by drawing (the
            script's own seed, when known); torch's own recorded seed and
            :data:`COMMON_SEEDS` are always tried.

    Returns:
        ``{"python" | "numpy" | "torch" | "cuda": Draws}`` for every generator whose state
        differs; empty when nothing drew.

    Example:
        >>> import random
        >>> a = RngSnapshot.take(); _ = random.random(); random.seed(7); _ = random.random()
        >>> draws_between(a, RngSnapshot.take(), seeds=[7])["python"].summary()
        'python: re-seeded with 7 (+2 words)'
    """
    out: dict[str, Draws] = {}
    t_words, t_idx, t_seed = _mt_from_torch(after.torch_cpu)
    cands = [*seeds, t_seed, *COMMON_SEEDS]
    if before.torch_cpu != after.torch_cpu:
        b_words, b_idx, b_seed = _mt_from_torch(before.torch_cpu)
        d = None
        if b_seed == t_seed:  # manual_seed() rewrites the recorded seed: same seed, same stream
            d = _mt_distance((b_words, b_idx), (t_words, t_idx), limit)
        out["torch"] = _moved("torch", (t_words, t_idx), d, _seeded_torch, [t_seed])
    if before.python != after.python:
        now = _python_mt(after.python)
        d = _mt_distance(_python_mt(before.python), now, limit)
        out["python"] = _moved("python", now, d, _seeded_python, cands)
    if before.numpy != after.numpy:
        now = _numpy_mt(after.numpy)
        d = _mt_distance(_numpy_mt(before.numpy), now, limit)
        out["numpy"] = _moved("numpy", now, d, _seeded_numpy, cands)
    if before.cuda != after.cuda:
        out["cuda"] = Draws("cuda", None)
    return out


def pattern(draws: Mapping[str, Draws]) -> dict[str, int | None]:
    """The comparable part of :func:`draws_between`: words per generator that moved.

    Example:
        >>> pattern({"torch": Draws("torch", 2)})
        {'torch': 2}
    """
    return {k: v.words for k, v in sorted(draws.items())}


_FIX_LOADER = (
    "pass generator=torch.Generator() to the DataLoader, iterate it with "
    "ResumableSampler.batches(loader), or create the iterator before mgr.restore()"
)


def explain(draws: Mapping[str, Draws]) -> tuple[str, str]:
    """Name the call that most likely drew, and the fix.

    Returns:
        ``(what happened, fix)``.

    Example:
        >>> explain({"torch": Draws("torch", 2)})[0][:60]
        'the torch CPU generator advanced 2 words (one 64-bit draw): '
    """
    reseeded = [d for d in draws.values() if d.words is None]
    if reseeded:
        parts = []
        for d in reseeded:
            if d.seed is not None:
                call = {"torch": "torch.manual_seed", "python": "random.seed",
                        "numpy": "np.random.seed"}.get(d.generator, "seed")
                parts.append(f"{d.generator} was re-seeded ({call}({d.seed})"
                             + (f", then {d.after_seed} words drawn)" if d.after_seed else ")"))
            elif d.generator == "cuda":
                parts.append("a CUDA generator was re-seeded or drew")
            else:
                parts.append(f"{d.generator} was re-seeded or its state replaced")
        return (
            "; ".join(parts) + ": a seed_everything()/manual_seed() call, or a state load, "
            "after the restore",
            "seed before mgr.restore() only: the restore puts every generator back, and a "
            "seed after it replaces the saved streams",
        )
    t = draws.get("torch")
    if t is not None and t.words == 2 and len(draws) == 1:
        return (
            "the torch CPU generator advanced 2 words (one 64-bit draw): typically "
            "iter(DataLoader) drawing its workers' base seed from the global RNG (or a "
            "RandomSampler/StatefulDataLoader seeding itself)",
            _FIX_LOADER,
        )
    parts = [f"{d.generator} advanced {d.words} words" for d in draws.values()]
    calls = {
        "torch": "a torch random op (torch.rand*/randperm, dropout in a forward outside the "
        "training step, a module re-initialised)",
        "python": "random.* (e.g. random.shuffle of a file list)",
        "numpy": "np.random.* (e.g. a NumPy augmentation or shuffle)",
    }
    who = "; ".join(calls[d.generator] for d in draws.values() if d.generator in calls)
    return (
        ", ".join(parts) + f" more than the saved run drew there: {who} ran between the "
        "restore and the first step",
        "move the call before mgr.restore() (or give it its own torch.Generator / "
        "np.random.default_rng), so the restored streams reach the first step untouched",
    )


__all__ = [
    "COMMON_SEEDS",
    "DEFAULT_LIMIT",
    "FINGERPRINT_VERSION",
    "Draws",
    "RngSnapshot",
    "draws_between",
    "explain",
    "fingerprint",
    "pattern",
]
