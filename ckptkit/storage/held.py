"""The ``with`` block of both run locks: acquire on entry, release on exit.

:class:`ckptkit.storage.lock.RunLock` (a flock) and :class:`ckptkit.storage.lease.LeaseLock`
(an object-store lease) differ in how they take and give back a run; a ``with`` block
means the same for both, so it is written once, here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Held(ABC):
    """A lock that a ``with`` block holds: :meth:`acquire` on entry, :meth:`release` on
    exit, also when the block raises.

    Example:
        >>> class Demo(Held):
        ...     def acquire(self) -> None: print("acquire")
        ...     def release(self) -> None: print("release")
        >>> with Demo():
        ...     print("inside")
        acquire
        inside
        release
    """

    @abstractmethod
    def acquire(self) -> object:
        """Take the lock, waiting as long as the lock's ``timeout`` says."""

    @abstractmethod
    def release(self) -> None:
        """Give the lock back."""

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["Held"]
