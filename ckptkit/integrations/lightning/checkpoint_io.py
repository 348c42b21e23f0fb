"""The ``CheckpointIO`` plugin: verified ``.ckpt`` saves and loads, verified rotation,
and the choice of the checkpoint to resume from."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ckptkit.errors import CkptkitError, IntegrityError
from ckptkit.integrations.lightning.extras import STATE_KEY
from ckptkit.run import Run, resume_target, retain
from ckptkit.run.layouts.lightning import LightningLayout
from ckptkit.storage import fs
from ckptkit.verify.findings import ERROR
from ckptkit.verify.foreign.adopt import Notes
from ckptkit.verify.foreign.report import verify_foreign

log = logging.getLogger("ckptkit")

DRILL_PIN = "drill"
"""Pin of the checkpoint a drill asked for (``CKPTKIT_DRILL_SAVE_AT``): never rotated away."""


class CkptkitIO(TorchCheckpointIO):
    """A ``CheckpointIO`` that verifies and records each ``.ckpt`` and rotates with verification.

    Args:
        keep_last: after each save, keep this many newest verified checkpoints of the
            directory and delete older ones (verified rotation); None deletes nothing
            (Lightning's ``save_top_k`` removals still pass :meth:`remove_checkpoint`).
        keep_every: also keep every checkpoint whose step is a multiple of this.
        max_bytes: byte budget for the kept checkpoints.
        verify_on_load: verify a file before Lightning loads it (refuse a damaged one).
        expect: ``training`` (a resume point: optimizer, step... required) or ``weights``.
        lock_timeout: seconds to wait for the run lock when training starts
            (:meth:`CkptkitCallback.on_fit_start`, :class:`FabricCheckpoints`), or at the
            first save of a directory opened no earlier; another live writer is refused
            after that, holder named: two runs must not rotate one directory.

    Example:
        >>> import tempfile, pathlib, torch
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> io = CkptkitIO()
        >>> io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 3,
        ...                     "pytorch-lightning_version": "2.6"}, d / "step=3.ckpt")
        >>> sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
        ['step=3.ckpt', 'step=3.ckpt.ckptkit-manifest.json']
        >>> io.teardown()
    """

    def __init__(
        self,
        *,
        keep_last: int | None = None,
        keep_every: int | None = None,
        max_bytes: int | None = None,
        verify_on_load: bool = True,
        expect: str = "training",
        lock_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        self.lock_timeout = lock_timeout
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"CkptkitIO: keep_last must be >= 1 (or None), got {keep_last}")
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.max_bytes = max_bytes
        self.verify_on_load = verify_on_load
        self.expect = expect
        self._runs: dict[Path, Run] = {}
        self.last_outcome: retain.Outcome | None = None
        """What the last rotation did (deleted, re-checked)."""

    def run(self, directory: str | os.PathLike[str]) -> Run:
        """The run of ``directory``, opened as its writer once (the lock is held until
        :meth:`teardown`)."""
        d = local_dir(directory, "the checkpoint directory").resolve()
        run = self._runs.get(d)
        if run is None:
            # A reader (ls --verify) may hold the lock for a moment to record a verify.
            run = self._runs[d] = Run(
                d, LightningLayout(), readonly=False, lock_timeout=self.lock_timeout
            )
        return run

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write the file (Lightning's way), then settle it: the run verifies it, records
        its digests beside it (signed with the run's key), records the outcome and rotates
        (:meth:`ckptkit.run.Run.settle`)."""
        p = Path(path)
        self.run(p.parent).overwriting(p)  # last.ckpt: its old digests go before its bytes
        super().save_checkpoint(checkpoint, path, storage_options)
        extra = checkpoint.get(STATE_KEY)
        extra = extra if isinstance(extra, Mapping) else {}
        health = extra.get("health")
        policy = None
        if self.keep_last is not None:
            policy = retain.Policy(
                keep_last=self.keep_last, keep_every=self.keep_every, max_bytes=self.max_bytes
            )
        settled = self.run(p.parent).settle(
            p,
            step=None,  # the file says it (its name, or its global_step)
            policy=policy,
            notes=Notes(health=health if isinstance(health, Mapping) else None),
            force=True,
            expect=self.expect,  # type: ignore[arg-type]
        )
        if settled.errors:
            bad = settled.errors
            log.error(
                "ckptkit: %s failed its verify after save (%s %s); it is recorded corrupt "
                "and no rotation counts on it",
                p.name,
                bad[0].code,
                bad[0].message,
            )
            return
        if settled.rotation is not None:
            self.last_outcome = settled.rotation

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Verify the file, then load it (Lightning's way); a damaged file is refused."""
        if self.verify_on_load:
            check_before_load(path, expect=self.expect)
        if map_location is None:
            return super().load_checkpoint(path, weights_only=weights_only)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete a file Lightning asks to remove (``save_top_k``) with verified-rotation rules.

        The newest good checkpoint is never deleted, the newest kept good one is verified
        again before anything goes, and the adopted manifest goes with its file
        (:meth:`ckptkit.run.Run.discard`).
        """
        p = Path(path).resolve()  # the run lists resolved paths; Lightning's may be relative
        self.run(p.parent).discard(p)

    def teardown(self) -> None:
        """Release the run locks."""
        for run in self._runs.values():
            run.close()
        self._runs.clear()
        super().teardown()


def local_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a local directory, or refuse an object-store URL before any training.

    The run's lock, index and adopted manifests live beside the checkpoint files, and this
    integration keeps them on a local (or shared POSIX) filesystem only; Lightning would
    write an ``s3://`` checkpoint itself, but nothing of ckptkit's safety would hold there,
    and a plain ``Path`` of the URL silently becomes a local ``s3:/`` directory.

    Raises:
        CkptkitError: ``path`` is a URL (``s3://``, ``gs://``, ...), naming the fix.

    Example:
        >>> local_dir("/tmp/ckpt", "dirpath"), local_dir("file:///tmp/ckpt", "dirpath")
        (PosixPath('/tmp/ckpt'), PosixPath('/tmp/ckpt'))
    """
    local = fs.local_path(fs.location(path))
    if local is None:
        raise CkptkitError(
            f"{what} {os.fspath(path)} is on an object store: the Lightning and Fabric "
            "integrations keep the run's lock, index and adopted manifests on a local "
            "filesystem only",
            path=os.fspath(path),
            hint="checkpoint to a local or shared POSIX directory (and copy it out after), or "
            "save through CheckpointManager, which runs on s3:// with a lease lock",
        )
    return local  # file:///tmp/ckpt is /tmp/ckpt, not a relative "file:" directory


def resume_checkpoint(dirpath: str | os.PathLike[str]) -> str | None:
    """The checkpoint of ``dirpath`` to pass to ``trainer.fit(..., ckpt_path=...)``.

    The newest complete state, adopted on the spot: a file a kill left unadopted (after
    Lightning wrote it, before its adoption) is verified and adopted now; every newer file
    passed over is named in a warning. None for a fresh start. On several ranks rank 0
    chooses and every rank gets its choice (:func:`ckptkit.run.resume_target`; call it on
    every rank).

    Raises:
        CkptkitError: the newest complete file's step is unknown (the fix named), or
            ``dirpath`` is on an object store.

    Example:
        >>> import tempfile
        >>> resume_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    chosen = resume_target(local_dir(dirpath, "dirpath"), LightningLayout())
    return None if chosen.path is None else str(chosen.path)


def check_before_load(path: str | os.PathLike[str], *, expect: str | None = None) -> None:
    """Verify a ``.ckpt`` before it is loaded; raise the first error finding's code.

    Raises:
        IntegrityError: the file is damaged, or its digests differ from those recorded at
            save (the message names the file, the finding and what to do).

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.ckpt"
        >>> torch.save({"state_dict": {"w": torch.ones(1)}, "global_step": 1}, p)
        >>> check_before_load(p, expect="weights")
    """
    rep = verify_foreign(Path(path), "lightning", expect=expect)  # type: ignore[arg-type]
    bad = [f for f in rep.findings if f.severity is ERROR]
    if bad:
        first = bad[0]
        more = f" ({len(bad) - 1} more)" if len(bad) > 1 else ""
        raise IntegrityError(
            f"refusing to load: {first.message}{more}",
            path=Path(path),
            code=first.code,
            hint=(first.hint + "; " if first.hint else "")
            + "resume from an older checkpoint ('ckptkit ls DIR' lists the verified ones; "
            "'ckptkit rollback DIR' picks one)",
        )
