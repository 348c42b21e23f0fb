"""Collectives for the commit protocol: a world of one is the same protocol, trivially.

Every save and restore runs the same steps on every world size: rank 0 prepares, every
rank writes or reads its share, the ranks exchange their outcome, rank 0 commits, every
rank learns the result. :class:`Solo` is the world of one (no process group, identity
collectives); :class:`TorchGroup` uses ``torch.distributed`` (gloo or NCCL, object
collectives). Anything a rank fails at travels in a collective as a message, so every rank
raises together and nothing half-committed is left behind.

What a save exchanges scales with the job: the ranks send their records to rank 0
(:meth:`Collective.gather`), rank 0 answers everyone with one small message
(:meth:`Collective.broadcast`), and a yes/no question is a 4-byte all-reduce
(:func:`any_true`). Every rank but rank 0 then sends and receives the same bytes at any
world size; rank 0 receives one record per rank. :func:`metered` counts those bytes.

Example:
    >>> c = current()
    >>> c.world_size, c.all_gather("x"), c.broadcast(7)
    (1, ['x'], 7)
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, runtime_checkable

import torch

from ckptkit.errors import CkptkitError, DistributedError


@runtime_checkable
class Collective(Protocol):
    """What the commit protocol needs from a group of ranks."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        ...

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (every rank receives all of them: keep it
        for what every rank needs; :meth:`gather` when only rank ``dst`` does)."""
        ...

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's ``obj``, in rank order, on rank ``dst``; None on the others."""
        ...


@dataclass(frozen=True)
class Solo:
    """The world of one: every collective is the identity."""

    rank: int = 0
    world_size: int = 1

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return [obj]


class TorchGroup:
    """A ``torch.distributed`` process group (the default one unless ``group`` is given).

    Object collectives pickle only what ckptkit's own ranks of one job send each other
    (records of what they wrote, messages, cursors, a rank-parallel verify's per-file scan
    records); they never unpickle bytes read from a file.
    """

    def __init__(self, group: Any = None) -> None:
        self.group = group
        dist = torch.distributed
        self._rank = dist.get_rank(group)
        self._world = dist.get_world_size(group)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        with peer_failure("broadcast"):
            torch.distributed.broadcast_object_list(box, group=self.group, group_src=src)
        if self._rank == src:
            _count("broadcast", sent=_size(obj))
        else:
            _count("broadcast", received=_size(box[0]))
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self._world
        with peer_failure("all-gather"):
            torch.distributed.all_gather_object(out, obj, group=self.group)
        others = sum(_size(o) for r, o in enumerate(out) if r != self._rank)
        _count("all_gather", sent=_size(obj), received=others)
        return out

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self._world if self._rank == dst else None
        with peer_failure("gather"):
            torch.distributed.gather_object(obj, out, group=self.group, group_dst=dst)
        if out is None:
            _count("gather", sent=_size(obj))
        else:
            _count("gather", received=sum(_size(o) for r, o in enumerate(out) if r != dst))
        return out

    def dedicated(self) -> TorchGroup:
        """A new gloo group over the same ranks, for collectives from a background thread.

        Collective itself: every rank must call it at the same point (the first async
        save does). Collectives of a background save on the training group would
        interleave with the training loop's own; DCP's async save does the same.
        """
        return TorchGroup(torch.distributed.new_group(backend="gloo"))


def current() -> Collective:
    """The default process group when one is initialised, else :class:`Solo`."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return TorchGroup()
    return Solo()


def any_true(coll: Collective, flag: bool) -> bool:
    """Whether ``flag`` is True on any rank: one small all-reduce, the identity for one rank.

    Cheap enough to call every step (a 4-byte ``all_reduce`` on the group's backend, on the
    current CUDA device for NCCL), unlike the pickling object collectives.

    Example:
        >>> any_true(Solo(), False), any_true(Solo(), True)
        (False, True)
    """
    if coll.world_size == 1:
        return bool(flag)
    if not isinstance(coll, TorchGroup):
        return any(coll.all_gather(bool(flag)))
    dist = torch.distributed
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device(coll))
    with peer_failure("all-reduce"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=coll.group)
    _count("all_reduce", sent=t.nbytes, received=t.nbytes)
    return bool(t.item())


def all_gather_fixed(coll: Collective, data: bytes) -> list[bytes]:
    """Every rank's ``data`` (the same length on every rank), in rank order: one tensor
    all-gather, no pickling; the identity for one rank.

    For small fixed-size records every rank needs, where the object collectives' pickling
    and two-phase size exchange would cost more than the record. On NCCL the buffer lives
    on the current CUDA device, as in :func:`any_true`. What only one rank needs:
    :func:`gather_fixed`.

    Raises:
        ValueError: ``data`` is empty.
        DistributedError: the all-gather failed (a peer died or timed out).

    Example:
        >>> all_gather_fixed(Solo(), b"0123")
        [b'0123']
    """
    out = _fixed(coll, data, None)
    assert out is not None  # an all-gather: every rank receives
    return out


def gather_fixed(coll: Collective, data: bytes, dst: int = 0) -> list[bytes] | None:
    """Every rank's ``data`` (the same length on every rank), in rank order, on rank
    ``dst`` (None on the others): one tensor gather, no pickling; each rank but ``dst``
    sends its record and receives nothing.

    For small fixed-size records sent often that one rank decides on (the replica
    check's digest of digests).

    Raises:
        ValueError: ``data`` is empty.
        DistributedError: the gather failed (a peer died or timed out).

    Example:
        >>> gather_fixed(Solo(), b"0123")
        [b'0123']
    """
    return _fixed(coll, data, dst)


def _fixed(coll: Collective, data: bytes, dst: int | None) -> list[bytes] | None:
    """:func:`all_gather_fixed` (``dst`` None) or :func:`gather_fixed` to ``dst``."""
    if not data:
        raise ValueError("a fixed-size record needs at least one byte")
    if coll.world_size == 1:
        return [bytes(data)]
    if not isinstance(coll, TorchGroup):
        if dst is None:
            return [bytes(d) for d in coll.all_gather(bytes(data))]
        got = coll.gather(bytes(data), dst)
        return None if got is None else [bytes(d) for d in got]
    dist = torch.distributed
    mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(_device(coll))
    n = len(data) * (coll.world_size - 1)
    if dst is None:
        out = [torch.empty_like(mine) for _ in range(coll.world_size)]
        with peer_failure("all-gather"):
            dist.all_gather(out, mine, group=coll.group)
        _count("all_gather", sent=len(data), received=n)
    elif coll.rank == dst:
        out = [torch.empty_like(mine) for _ in range(coll.world_size)]
        with peer_failure("gather"):
            dist.gather(mine, out, group=coll.group, group_dst=dst)
        _count("gather", received=n)
    else:
        with peer_failure("gather"):
            dist.gather(mine, None, group=coll.group, group_dst=dst)
        _count("gather", sent=len(data))
        return None
    return [t.cpu().numpy().tobytes() for t in out]


def _device(coll: TorchGroup) -> torch.device:
    """Where a tensor collective's buffer lives: the current CUDA device on NCCL."""
    dist = torch.distributed
    if "nccl" in str(dist.get_backend(coll.group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextlib.contextmanager
def peer_failure(op: str) -> Iterator[None]:
    """Raise a backend's failure of collective ``op`` as a :class:`DistributedError`.

    When a peer dies (gloo: "Connection closed by peer"), times out, or aborts, the
    backend raises a bare ``RuntimeError`` (``DistBackendError``) at whichever collective
    each survivor happens to be in. Callers catch one error type with the cause kept.
    """
    try:
        yield
    except DistributedError:
        raise
    except (RuntimeError, TimeoutError) as e:
        raise DistributedError(
            f"the {op} with the other ranks failed ({describe(e)}); a rank died, timed out "
            "or left the group",
            hint="see the other ranks' logs for the first failure",
        ) from e


@dataclass
class Traffic:
    """The payload bytes this process sent and received in collectives, per operation
    (object collectives: as pickled; tensor ones: the tensor's bytes)."""

    sent: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        """Bytes sent and received, all operations together."""
        return sum(self.sent.values()) + sum(self.received.values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"sent": dict(self.sent), "received": dict(self.received), "calls": dict(self.calls)}


_meter: Traffic | None = None


@contextlib.contextmanager
def metered() -> Iterator[Traffic]:
    """Count the collectives' bytes of this process inside the block (benchmarks and the
    tests that keep a save's traffic per rank independent of the world size). Off, the
    collectives count nothing (no second pickling).

    Example:
        >>> with metered() as t:
        ...     _ = Solo().broadcast(1)
        >>> t.total  # a world of one exchanges nothing
        0
    """
    global _meter
    outer, _meter = _meter, Traffic()
    try:
        yield _meter
    finally:
        _meter = outer


def _count(op: str, *, sent: int = 0, received: int = 0) -> None:
    if _meter is not None:
        _meter.sent[op] += sent
        _meter.received[op] += received
        _meter.calls[op] += 1


def _size(obj: Any) -> int:
    """The pickled size of ``obj`` when a meter is on (what an object collective sends)."""
    return len(pickle.dumps(obj)) if _meter is not None else 0


def describe(exc: BaseException) -> str:
    """One-line description of an exception, to send to the other ranks."""
    return str(exc) if isinstance(exc, CkptkitError) else f"{type(exc).__name__}: {exc}"


def consensus(coll: Collective, error: BaseException | None, *, what: str) -> None:
    """All ranks share their outcome; raise on every rank if any failed.

    The rank that failed re-raises its own exception; the others raise a
    :class:`~ckptkit.errors.DistributedError` naming the failed ranks and their messages.
    Whether any rank failed is one 4-byte all-reduce; only then do the messages travel
    (gathered to rank 0, which tells everyone): a rank's traffic stays the same at any
    world size.

    Raises:
        DistributedError: another rank failed.

    Example:
        >>> consensus(Solo(), None, what="save")
    """
    if not any_true(coll, error is not None):
        return
    outcomes = coll.gather(None if error is None else describe(error))
    failed = coll.broadcast(
        [(r, m) for r, m in enumerate(outcomes) if m is not None] if outcomes is not None else None
    )
    if error is not None:
        raise error
    raise DistributedError(
        f"{what} failed on rank(s) {', '.join(str(r) for r, _ in failed)}: "
        + " | ".join(f"rank {r}: {m}" for r, m in failed),
        hint="see that rank's log for the cause",
    )


def leave(code: int = 0) -> NoReturn:
    """End this process now with ``code``, its output flushed, skipping the interpreter's
    teardown: for a rank of a gloo job whose work is done (written and printed).

    Freeing a gloo process group joins its worker threads while holding the GIL, and a
    worker freeing a finished collective whose tensors lost their Python owner waits for
    that GIL: the rank hangs, or aborts (SIGABRT) at interpreter shutdown, after all its
    work is done, and torchrun reports it failed (pytorch/pytorch#179291).
    ``destroy_process_group()`` does not help while a DDP model still holds the group.
    Call this with the process group still initialised, instead of returning.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


__all__ = [
    "Collective",
    "Solo",
    "TorchGroup",
    "Traffic",
    "all_gather_fixed",
    "any_true",
    "consensus",
    "current",
    "describe",
    "gather_fixed",
    "leave",
    "metered",
    "peer_failure",
]
