"""DCP's exceptions and warnings turned into ckptkit errors and silence.

``CheckpointException`` is a ``BaseException``: every DCP call of ckptkit runs under
:func:`translated`, so restore can fall back and no ``BaseException`` leaves a ckptkit API.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from ckptkit import codes
from ckptkit.errors import CkptkitError, DistributedError


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn DCP's ``CheckpointException`` (a ``BaseException``) into a ckptkit error."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        raise translate(e, what) from None
    except CkptkitError:
        raise
    except OSError as e:
        if codes.transient(e):
            raise codes.read_error(e, path=what) from None
        raise DistributedError(
            f"{what} failed: {type(e).__name__}: {e}",
            hint="the DCP files do not fit this model/optimizer or are damaged; restore "
            "another checkpoint",
        ) from e
    except (RuntimeError, ValueError, KeyError, AssertionError) as e:
        raise DistributedError(
            f"{what} failed: {type(e).__name__}: {e}",
            hint="the DCP files do not fit this model/optimizer or are damaged; restore "
            "another checkpoint",
        ) from e


def translate(exc: BaseException, what: str) -> CkptkitError:
    """The ckptkit error for a DCP ``CheckpointException``: the first ckptkit error inside
    it (raised by our reader on some rank), else a :class:`DistributedError` naming each
    rank's failure."""
    failures: Mapping[int, Any] = getattr(exc, "failures", {}) or {}
    for rank, wrapped in sorted(failures.items()):
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, CkptkitError):
            if len(failures) > 1 or rank != 0:
                inner.what += f" (on rank {rank})"
                inner.args = (inner._render(),)
            return inner
    parts = []
    for rank, wrapped in sorted(failures.items()):
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        parts.append(f"rank {rank}: {type(inner).__name__}: {inner}")
    return DistributedError(
        f"{what} failed: " + (" | ".join(parts) or str(exc)),
        hint="the DCP files do not fit this model/optimizer, or a rank failed; see the "
        "message, then restore another checkpoint",
    )


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    # DCP warns once per call without a process group ("assuming the intent is to load in a
    # single process"): that is exactly the world-size-1 save/resume we mean to do.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*process group.*")
        warnings.filterwarnings("ignore", message=".*single process.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        yield


__all__ = [
    "translate",
]
