"""The native layout: ``step-NNNNNNNN/`` directories of a :class:`~ckptkit.CheckpointManager`.

The commit writes each checkpoint's manifest (:mod:`ckptkit.checkpoint.commit`), so a native
checkpoint is never adopted; its status, duplicates and misplaced steps are the
catalog's (:meth:`ckptkit.checkpoint.catalog.Catalog.list`).
"""

from __future__ import annotations

import builtins
import contextlib
from dataclasses import replace

from ckptkit.checkpoint.catalog import Catalog, CheckpointInfo
from ckptkit.errors import CkptkitError
from ckptkit.run.layout import AdoptRequest, Checked, Index
from ckptkit.storage.fs import Location
from ckptkit.verify import atsave
from ckptkit.verify.foreign.adopt import Adoption
from ckptkit.verify.runner import verify_one


class NativeLayout:
    """``step-N/`` directories with a ``manifest.json`` each (see the module docstring)."""

    name = "ckptkit"
    keeps_latest = True
    adopts = False

    def meta(self, root: Location) -> Location:
        return root

    def checkpoints(self, root: Location, catalog: Catalog, index: Index) -> builtins.list[CheckpointInfo]:
        """The catalog's listing, with what a saver accepted (``on_inconsistent='warn'``)
        said as the ``problem`` of a good checkpoint."""
        out = []
        for c in catalog.list():
            if c.status in ("verified", "committed") and c.problem is None:
                with contextlib.suppress(CkptkitError, OSError):
                    note = atsave.summary(catalog.manifest(c.path)[0])
                    if note is not None:
                        c = replace(c, problem=note)
            out.append(c)
        return out

    def step_of(self, path: Location, catalog: Catalog, index: Index) -> int | None:
        with contextlib.suppress(CkptkitError, OSError):
            step = catalog.manifest(path)[0].step
            return int(step) if step is not None else None
        return None

    def order(self, info: CheckpointInfo) -> tuple[int, ...]:
        return (info.step,)

    def identity(self, path: Location, catalog: Catalog) -> str | None:
        try:
            return catalog.manifest(path)[1]
        except CkptkitError:
            return None  # an invalid manifest is listed corrupt without a record

    def verify(
        self, path: Location, catalog: Catalog, *, key: bytes | None, scan_values: bool = True
    ) -> Checked:
        rep = verify_one(path, progress=False, options={"scan_values": scan_values}, key=key)
        if rep.gone:
            return Checked()
        return Checked(
            errors=list(rep.errors),
            ident=rep.manifest.digest if rep.manifest is not None else None,
        )

    def adopt(self, path: Location, request: AdoptRequest) -> Adoption:
        raise CkptkitError(
            "a native checkpoint is never adopted: its commit wrote its manifest",
            path=path,
            hint="'ckptkit verify' checks it against that manifest",
        )

    def remove(self, root: Location, path: Location) -> bool:
        return Catalog(root).remove(path)

    def leftovers(self, root: Location) -> builtins.list[Location]:
        return Catalog(root).leftovers()

    def clean_leftovers(self, root: Location) -> builtins.list[str]:
        return Catalog(root).clean_leftovers()

    def resume_hint(self, info: CheckpointInfo) -> str:
        return (
            "mgr.restore(ts, healthy=True) picks this one "
            f"(or mgr.restore(ts, step={info.step}))"
        )


__all__ = ["NativeLayout"]
