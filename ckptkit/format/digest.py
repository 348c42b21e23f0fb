"""The digest a manifest records for every file and for itself: xxh3-128, hex.

Only the algorithm lives here (hashing bytes already in memory); streaming a file or a
write through it is :mod:`ckptkit.storage.digest`.
"""

from __future__ import annotations

from typing import Any

import xxhash

ALGORITHM = "xxh3_128"


def new() -> Any:
    """Return a fresh xxh3-128 hasher.

    Example:
        >>> h = new(); h.update(b"abc"); len(h.hexdigest())
        32
    """
    return xxhash.xxh3_128()


def hexdigest_bytes(data: bytes | memoryview) -> str:
    """Return the xxh3-128 hex digest of ``data`` in one call.

    Example:
        >>> hexdigest_bytes(b"") == new().hexdigest()
        True
    """
    return xxhash.xxh3_128_hexdigest(data)
