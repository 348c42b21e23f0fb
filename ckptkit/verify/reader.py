"""A check context filled by a reader other than the manifest (foreign checkpoints).

The native runner builds a :class:`~ckptkit.verify.context.CheckContext` from
``manifest.json``; a foreign reader (:mod:`ckptkit.verify.foreign`) builds a
:class:`ReaderContext` instead: no manifest, but the same two things the checks read —
a :class:`~ckptkit.verify.view.StateView` of the state and the scans of the checkpoint's
files — so the registered checks that need only those (``needs=("state",)`` or
``("files",)``) run on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptkit.verify.context import CheckContext, FileScan
from ckptkit.verify.view import StateView


@dataclass
class ReaderContext(CheckContext):
    """A context whose state and file scans come from a reader, not a manifest."""

    state: StateView | None = None
    """The reader's view of the checkpoint's state."""
    files: dict[str, FileScan] = field(default_factory=dict)
    """One scan per file of the checkpoint (relative path → scan), made by the reader."""

    @property
    def has(self) -> frozenset[str]:
        out = {"files"}
        if self.state is not None:
            out.add("state")
        return frozenset(out)

    def scan_all(self) -> dict[str, FileScan]:
        """The reader's scans (nothing is listed in a manifest to scan here)."""
        return self.files


__all__ = ["ReaderContext"]
