"""Ranks as threads of one process, for library code that takes a ``Collective``.

Each collective meets at a barrier with a deadline, so a rank that skips one fails the
test instead of hanging it. Real gloo ranks (subprocesses) are for the integration tests;
these exercise the rank logic of a function in milliseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

DEADLINE_S = 60.0


class _World:
    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=DEADLINE_S)
        self.slots: list[Any] = [None] * n


class ThreadRank:
    """One rank of a :class:`_World`: the ``ckptkit.collective.Collective`` protocol."""

    def __init__(self, world: _World, rank: int) -> None:
        self._w = world
        self.rank = rank
        self.world_size = world.n

    def _meet(self, obj: Any) -> list[Any]:
        self._w.slots[self.rank] = obj
        self._w.barrier.wait()
        out = list(self._w.slots)
        self._w.barrier.wait()
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self._meet(obj)[src]

    def all_gather(self, obj: Any) -> list[Any]:
        return self._meet(obj)

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        out = self._meet(obj)
        return out if self.rank == dst else None


def on_ranks(n: int, fn: Callable[[ThreadRank], Any]) -> list[Any]:
    """``fn(rank)`` on ``n`` thread ranks; their results in rank order (a rank's
    exception is raised here, after every rank has stopped)."""
    world = _World(n)
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def one(r: int) -> None:
        try:
            out[r] = fn(ThreadRank(world, r))
        except BaseException as e:
            errors.append(e)
            world.barrier.abort()  # the others stop waiting for this rank

    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S * 2)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank is stuck in a collective"
    return out
