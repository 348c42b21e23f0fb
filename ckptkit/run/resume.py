"""What a run resumes from, chosen once for every rank of a job.

Every integration (Trainer, Accelerate, Lightning, Fabric) asks :func:`resume_target`, not
:meth:`Run.resume_target <ckptkit.run.core.Run.resume_target>` itself. On more than one
rank a choice made by each rank on its own goes wrong: whichever rank wins the run lock
adopts an unadopted checkpoint (and cleans leftovers), the others cannot adopt it, read it
again while it may still be unadopted, and pass it over when that read fails; the ranks then
load different states. So one rank chooses and the others are told:

* **rank 0** opens the run writable when it can (read-only while another live process holds
  it: then nothing is adopted) and asks :meth:`~ckptkit.run.core.Run.resume_target`: the
  newest complete state, adopted on the spot when a kill came before its adoption; every
  newer one passed over is named;
* it **broadcasts** the choice (:func:`ckptkit.collective.current`: a ``torch.distributed``
  group when one is initialised, else the world of one), or its failure, which every rank
  then raises;
* **every other rank** opens nothing writable and adopts nothing: it returns rank 0's choice.

Before a process group exists (a Lightning ``Trainer`` script asks for ``ckpt_path`` before
``fit`` sets one up), a process the launcher started as ``RANK`` > 0 opens the run
read-only: it may read, never adopt or take the lock.

Example:
    >>> import tempfile
    >>> from ckptkit.run.native import NativeLayout
    >>> resume_target(tempfile.mkdtemp(), NativeLayout()).info is None
    True
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.collective import Collective, current, describe
from ckptkit.errors import CkptkitError, DistributedError, LockHeldError
from ckptkit.format import signing
from ckptkit.run.core import Resume, Run
from ckptkit.run.layout import Layout
from ckptkit.storage import fs
from ckptkit.storage.fs import Location


def resume_target(
    root: str | os.PathLike[str] | Location,
    layout: Layout,
    *,
    run: Run | None = None,
    key: signing.KeyLike | None = None,
    coll: Collective | None = None,
    reject: Callable[[CheckpointInfo], str | None] | None = None,
) -> Resume:
    """The checkpoint of ``root`` every rank resumes from (the same one on every rank).

    Args:
        root: the run directory.
        layout: its layout strategy (:mod:`ckptkit.run.layout`).
        run: rank 0's own writable run of ``root`` (an integration that holds the lock
            from its start); else rank 0 opens one for the choice. Other ranks ignore it.
        key: the HMAC key of a run opened here (default: ``CKPTKIT_HMAC_KEY``).
        coll: the ranks (default: :func:`ckptkit.collective.current`). Collective: every
            rank must call this at the same point.
        reject: the caller's own test of a candidate (asked on rank 0 only, before its
            bytes are read): a reason it cannot be resumed from, which passes it over like
            a damaged one (:meth:`Run.resume_target <ckptkit.run.core.Run.resume_target>`);
            None to consider it.

    Returns:
        Rank 0's :class:`~ckptkit.run.core.Resume` (``info`` None: a fresh start). On the
        other ranks ``adopted`` says that rank 0 adopted it, and ``info`` carries no
        ``health_record`` (nothing read from a checkpoint travels between the ranks).

    Raises:
        CkptkitError: the newest complete checkpoint's step is unknown (the fix named), or
            any other refusal of rank 0's choice: raised on every rank.
        DistributedError: rank 0 failed otherwise, or a rank left the group.
    """
    coll = current() if coll is None else coll
    if coll.world_size == 1:
        return _choose(root, layout, run=run, key=key, writable=_launch_rank() == 0, reject=reject)
    if coll.rank != 0:
        return _received(coll.broadcast(None))
    try:
        chosen = _choose(root, layout, run=run, key=key, writable=True, reject=reject)
    except Exception as e:
        coll.broadcast(_failure(e))
        raise
    info = chosen.info
    sent = dataclasses.replace(info, health_record=None) if info is not None else None
    coll.broadcast({"info": sent, "passed": list(chosen.passed), "adopted": chosen.adopted})
    return chosen


def _choose(
    root: str | os.PathLike[str] | Location,
    layout: Layout,
    *,
    run: Run | None,
    key: signing.KeyLike | None,
    writable: bool,
    reject: Callable[[CheckpointInfo], str | None] | None = None,
) -> Resume:
    """The choice itself (one process): through ``run``, else a run opened here."""
    if run is not None:
        return run.resume_target(reject)
    where = fs.location(root)
    if fs.kind(fs.resolved(where)) != "dir":  # a symlinked run directory counts
        return Resume(None)  # nothing saved yet (and no directory made for a reader)
    mine: Run | None = None
    if writable:
        try:
            mine = Run(where, layout, readonly=False, key=key)
        except LockHeldError:
            mine = None  # another live process writes this run: choose without adopting
    if mine is None:
        mine = Run(where, layout, key=key)
    with mine:
        return mine.resume_target(reject)


def _launch_rank() -> int:
    """This process's rank as its launcher set it (``RANK``; 0 when unset or unreadable)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _failure(e: Exception) -> dict[str, Any]:
    """What the other ranks need to raise rank 0's failure themselves."""
    if isinstance(e, CkptkitError):
        path = None if e.path is None else str(e.path)
        return {"error": e.what, "path": path, "code": e.code, "hint": e.hint}
    return {"error": describe(e), "path": None, "code": None, "hint": None, "foreign": True}


def _received(msg: dict[str, Any]) -> Resume:
    """Rank 0's broadcast choice on another rank, or its failure raised here."""
    if "error" in msg:
        if msg.get("foreign"):
            raise DistributedError(
                f"choosing the checkpoint to resume from failed on rank 0: {msg['error']}",
                hint="see rank 0's log for the cause",
            )
        raise CkptkitError(msg["error"], path=msg["path"], code=msg["code"], hint=msg["hint"])
    return Resume(msg["info"], list(msg["passed"]), bool(msg["adopted"]))


__all__ = ["resume_target"]
