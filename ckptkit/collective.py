"""Collectives for the commit protocol: a world of one is the same protocol, trivially.

Every save and restore runs the same steps on every world size: rank 0 prepares, every
rank writes or reads its share, the ranks exchange their outcome, rank 0 commits, every
rank learns the result. :class:`Solo` is the world of one (no process group, identity
collectives); :class:`TorchGroup` uses ``torch.distributed`` (gloo or NCCL, object
collectives). Anything a rank fails at travels in a collective as a message, so every rank
raises together and nothing half-committed is left behind.

Example:
    >>> c = current()
    >>> c.world_size, c.all_gather("x"), c.broadcast(7)
    (1, ['x'], 7)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
        """Every rank's ``obj``, in rank order."""
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


class TorchGroup:
    """A ``torch.distributed`` process group (the default one unless ``group`` is given).

    Object collectives pickle only what ckptkit itself sends (file entries, messages,
    cursors) between the ranks of one job; nothing read from a checkpoint goes through them.
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
            torch.distributed.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self._world
        with peer_failure("all-gather"):
            torch.distributed.all_gather_object(out, obj, group=self.group)
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
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend(coll.group)).lower():
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    with peer_failure("all-reduce"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=coll.group)
    return bool(t.item())


def all_gather_fixed(coll: Collective, data: bytes) -> list[bytes]:
    """Every rank's ``data`` (the same length on every rank), in rank order: one tensor
    all-gather, no pickling; the identity for one rank.

    For small fixed-size records sent often (the replica check's digest of digests), where
    the object collectives' pickling and two-phase size exchange would cost more than the
    record. On NCCL the buffer lives on the current CUDA device, as in :func:`any_true`.

    Raises:
        ValueError: ``data`` is empty.
        DistributedError: the all-gather failed (a peer died or timed out).

    Example:
        >>> all_gather_fixed(Solo(), b"0123")
        [b'0123']
    """
    if not data:
        raise ValueError("all_gather_fixed needs at least one byte")
    if coll.world_size == 1:
        return [bytes(data)]
    if not isinstance(coll, TorchGroup):
        return [bytes(d) for d in coll.all_gather(bytes(data))]
    dist = torch.distributed
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend(coll.group)).lower():
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    out = [torch.empty_like(mine) for _ in range(coll.world_size)]
    with peer_failure("all-gather"):
        dist.all_gather(out, mine, group=coll.group)
    return [t.cpu().numpy().tobytes() for t in out]


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


def describe(exc: BaseException) -> str:
    """One-line description of an exception, to send to the other ranks."""
    return str(exc) if isinstance(exc, CkptkitError) else f"{type(exc).__name__}: {exc}"


def consensus(coll: Collective, error: BaseException | None, *, what: str) -> None:
    """All ranks share their outcome; raise on every rank if any failed.

    The rank that failed re-raises its own exception; the others raise a
    :class:`~ckptkit.errors.DistributedError` naming the failed ranks and their messages.

    Raises:
        DistributedError: another rank failed.

    Example:
        >>> consensus(Solo(), None, what="save")
    """
    outcomes = coll.all_gather(None if error is None else describe(error))
    failed = [(r, m) for r, m in enumerate(outcomes) if m is not None]
    if not failed:
        return
    if error is not None:
        raise error
    raise DistributedError(
        f"{what} failed on rank(s) {', '.join(str(r) for r, _ in failed)}: "
        + " | ".join(f"rank {r}: {m}" for r, m in failed),
        hint="see that rank's log for the cause",
    )


__all__ = [
    "Collective",
    "Solo",
    "TorchGroup",
    "all_gather_fixed",
    "any_true",
    "consensus",
    "current",
    "describe",
    "peer_failure",
]
