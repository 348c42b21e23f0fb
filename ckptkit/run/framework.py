"""What the framework layouts share: their checkpoints are adopted, verified as foreign ones.

A framework writes its own files; the run adopts each checkpoint (records its digests and
component table beside it, :mod:`ckptkit.verify.foreign.adopt`) when it settles, and verifies it
as a foreign checkpoint (:func:`ckptkit.verify.foreign.report.verify_foreign`), its adopted
manifest checked under the run's key. The subclasses say how files map to checkpoints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from ckptkit.checkpoint.catalog import Catalog, CheckpointInfo
from ckptkit.run.layout import AdoptRequest, Checked
from ckptkit.storage import fs
from ckptkit.storage.fs import Location
from ckptkit.verify.findings import ERROR
from ckptkit.verify.foreign.adopt import Adoption, adopt_checkpoint
from ckptkit.verify.foreign.report import verify_foreign
from ckptkit.verify.view import Expect


class FrameworkLayout(ABC):
    """Verify and adopt for a layout whose checkpoints a framework writes (local files)."""

    name: str = ""
    keeps_latest = False
    adopts = True
    needs_step = False
    """A checkpoint whose step no file or record says is refused (its name counts saves)."""
    expect: Expect | None = None
    """What its checkpoints must hold (``training``: a resume point)."""

    def order(self, info: CheckpointInfo) -> tuple[int, ...]:
        return (info.step,)

    def format_of(self, path: Location) -> str | None:
        """The foreign format (:data:`ckptkit.checkpoint.detect.FORMATS`) of the checkpoint
        at ``path``: the layout's name; None: detected from its files."""
        return self.name

    def local(self, path: Location) -> Path:
        """The local file or folder ``path`` names: a framework writes to a local disk, and
        its files are read there.

        Raises:
            CkptkitError: ``path`` is in an object store (the message names it and the fix).

        Example:
            >>> from ckptkit.run.layouts.hf import TrainerLayout
            >>> TrainerLayout().local(fs.location("/tmp/out/checkpoint-5"))
            PosixPath('/tmp/out/checkpoint-5')
        """
        return fs.require_local(path, needs=f"the {self.name} layout")

    @abstractmethod
    def identity(self, path: Location, catalog: Catalog) -> str | None:
        """What a verify record of ``path`` is keyed by (see :class:`ckptkit.run.Layout`)."""

    def verify(
        self, path: Location, catalog: Catalog, *, key: bytes | None, scan_values: bool = True
    ) -> Checked:
        rep = verify_foreign(self.local(path), self.format_of(path), expect=self.expect, key=key)
        return Checked(
            errors=[f for f in rep.findings if f.severity is ERROR],
            ident=self.identity(path, catalog),
        )

    def adopt(self, path: Location, request: AdoptRequest) -> Adoption:
        return adopt_checkpoint(
            self.local(path), self.format_of(path), force=request.force,
            expect=request.expect or self.expect, notes=request.notes, key=request.key,
        )


__all__ = ["FrameworkLayout"]
