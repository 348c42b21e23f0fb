"""The layout strategy of a run: how files map to checkpoints, and how to read one.

A :class:`~ckptkit.run.core.Run` owns everything that makes a run safe (the lock, the run
index, ``latest``, retention, the settle step); a layout owns nothing. It answers, from
the files alone:

* where the run lock and the run index live (:meth:`Layout.meta`: an Accelerate
  ``checkpoints/`` keeps them in its ``project_dir``, because Accelerate parses every name
  in ``checkpoints/``);
* which checkpoints the run directory holds, each with its status and its *real* step
  (:meth:`Layout.checkpoints`, :meth:`Layout.step_of`);
* how to verify one from its bytes, how to adopt one (record its digests beside it), what
  a verify record is keyed by, and how to delete one so that it never looks whole
  half-deleted.

The built-in layouts: :class:`ckptkit.run.native.NativeLayout` (``step-N/`` directories
of a :class:`~ckptkit.CheckpointManager`), :class:`ckptkit.run.layouts.hf.TrainerLayout`
(``checkpoint-N/``), :class:`ckptkit.run.layouts.hf.AccelerateLayout` (``checkpoint_N/``) and
:class:`ckptkit.run.layouts.lightning.LightningLayout` (``*.ckpt``).
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckptkit.checkpoint.catalog import Catalog, CheckpointInfo
from ckptkit.codes import Finding
from ckptkit.errors import CkptkitError
from ckptkit.storage import fs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.adopt import Adoption, Notes
from ckptkit.verify.view import Expect

Index = Mapping[str, Any]
"""The run index as read (:meth:`ckptkit.checkpoint.catalog.Catalog.index`)."""


@dataclass(frozen=True)
class AdoptRequest:
    """What :meth:`Layout.adopt` is asked to do, built once by
    :meth:`ckptkit.run.core.Run.adopt`."""

    notes: Notes
    """What the adopted manifest records (the step among them)."""
    key: bytes | None
    """The run's key that signs the adopted manifest (None: unsigned)."""
    force: bool = False
    """Adopt again over an existing adopted manifest."""
    expect: Expect | None = None
    """What the checkpoint must hold (None: the layout's own expectation)."""


@dataclass
class Checked:
    """What a layout's verify of one checkpoint found."""

    errors: builtins.list[Finding] = field(default_factory=list)
    """The error findings (empty: it verified)."""
    ident: str | None = None
    """What a verify record of it is keyed by (:meth:`Layout.identity` of the bytes read);
    None: nothing to record (it is gone, or its manifest cannot be read)."""


class Layout(Protocol):
    """A run layout (see the module docstring). Every method reads files only; none writes
    the run index, takes a lock or decides what to keep."""

    name: str
    """``ckptkit`` (native), ``hf-trainer``, ``accelerate`` or ``lightning``."""
    keeps_latest: bool
    """The run keeps a ``latest`` pointer file (native runs)."""
    adopts: bool
    """Checkpoints are adopted (digests recorded beside the framework's files) when they
    settle; False for native checkpoints, whose commit writes their manifest."""

    def meta(self, root: Location) -> Location:
        """Where the run lock and the run index of the run at ``root`` live."""
        ...

    def checkpoints(self, root: Location, catalog: Catalog, index: Index) -> builtins.list[CheckpointInfo]:
        """Every checkpoint under ``root``, oldest first, with its status (from its files
        and the verdicts of ``index``, read through ``catalog.verdict``) and its real step
        (:attr:`CheckpointInfo.step_known` False when no file or record says it)."""
        ...

    def step_of(self, path: Location, catalog: Catalog, index: Index) -> int | None:
        """The real step of the checkpoint at ``path``: what its files say (its name, its
        adopted manifest, the file itself), else its intent record; None when unknown."""
        ...

    def order(self, info: CheckpointInfo) -> tuple[int, ...]:
        """Sort key, oldest first, of the order in which checkpoints were written."""
        ...

    def identity(self, path: Location, catalog: Catalog) -> str | None:
        """What a verify record of ``path`` is keyed by (its manifest's digest, else a
        fingerprint of its files); None when it is gone."""
        ...

    def verify(
        self, path: Location, catalog: Catalog, *, key: bytes | None, scan_values: bool = True
    ) -> Checked:
        """Verify one checkpoint from its bytes (its adopted manifest checked under ``key``)."""
        ...

    def adopt(self, path: Location, request: AdoptRequest) -> Adoption:
        """Verify ``path`` and record its digests beside it, signed with ``request.key``."""
        ...

    def remove(self, root: Location, path: Location) -> bool:
        """Delete one checkpoint so that it never looks whole half-deleted; False if gone."""
        ...

    def leftovers(self, root: Location) -> builtins.list[Location]:
        """What interrupted saves or deletions left under ``root`` (never checkpoints)."""
        ...

    def clean_leftovers(self, root: Location) -> builtins.list[str]:
        """Remove :meth:`leftovers` (the caller holds the run lock); one line each."""
        ...

    def resume_hint(self, info: CheckpointInfo) -> str:
        """How to resume from ``info`` in the framework's own terms."""
        ...


def step_unknown_fix(path: Location) -> str:
    """The fix for a checkpoint whose step no file or record says (one place: ``ls``,
    ``adopt`` and resume name it alike).

    Example:
        >>> step_unknown_fix("p/checkpoints/checkpoint_1")
        "'ckptkit adopt --step N p/checkpoints/checkpoint_1' with N the optimizer step it holds"
    """
    return f"'ckptkit adopt --step N {path}' with N the optimizer step it holds"


def step_unknown(
    path: str | Location, *, resuming: bool = False, passed: Sequence[str] = ()
) -> CkptkitError:
    """The refusal for a checkpoint whose step no file or record says (one place: an
    adoption, a resume and the integrations refuse it alike, naming the same fix).

    Args:
        resuming: a resume would load it (the newest complete checkpoint, or the one
            named): the message says it is never resumed at step 0, and the fix also
            offers moving it out of the run.
        passed: ``"name: why"`` per newer checkpoint already passed over.

    Example:
        >>> print(step_unknown("p/checkpoints/checkpoint_1"))  # doctest: +ELLIPSIS
        p/checkpoints/checkpoint_1: its step is unknown: no adopted manifest and no intent ...
    """
    path = fs.location(path)
    what = (
        "its step is unknown: no adopted manifest and no intent record say it, and its "
        "name counts saves, not steps"
    )
    hint = step_unknown_fix(path)
    if resuming:
        what += ": it is never resumed with the step counter at 0"
        hint += ", or move it out of the run to resume from an older checkpoint"
    if passed:
        what += f"; passed over before it: {'; '.join(passed)}"
    return CkptkitError(what, path=path, hint=hint)


__all__ = ["AdoptRequest", "Checked", "Index", "Layout", "step_unknown", "step_unknown_fix"]
