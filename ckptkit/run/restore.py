"""Restore one candidate checkpoint into a :class:`~ckptkit.TrainState`, or say why not.

:class:`~ckptkit.CheckpointManager.restore` walks the run's checkpoints newest first and
asks :func:`newest_restorable`, which calls :func:`restore_candidate` on each; a
:class:`Skip` sends it to the next older one.
What a candidate can fail at is a finding with a code: its bytes (integrity), its kind
(``CK-R011``: not a TrainState tree, or DCP storage for a run without it), or anything
else while reading it (``CK-F024``). A run that does not fit a good checkpoint
(``CK-R010``) is not a reason to fall back, and raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ckptkit import codes
from ckptkit.capture.state import (
    RestoreResult,
    TrainState,
    expect_train_state,
    manifests_to_read,
    read_together,
)
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.checkpoint.read import read_checkpoint
from ckptkit.collective import Collective, consensus, current
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.format import manifest as mf
from ckptkit.format.records import LookAhead
from ckptkit.run import rotation
from ckptkit.signals import guard as guard_mod
from ckptkit.storage.fs import Location
from ckptkit.verify.runner import verify_one

log = logging.getLogger("ckptkit")


class Skip(Exception):
    """A candidate checkpoint that cannot be restored; restore takes the next older one."""

    def __init__(self, error: CkptkitError, *, damaged: bool, mismatch: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.damaged = damaged
        """The fault is in its bytes (recorded corrupt), not only in its kind."""
        self.mismatch = mismatch
        """The checkpoint is whole but does not fit the run (``CK-R010``): the caller falls
        back only if an older checkpoint does fit, and raises this error otherwise."""


def restore_candidate(
    state: TrainState,
    path: Location,
    *,
    strict: bool,
    coll: Collective,
    key: bytes | None = None,
    manifest: mf.Manifest | None = None,
) -> RestoreResult:
    """Read and restore one candidate checkpoint on every rank, or raise :class:`Skip` on all.

    The manifest-level checks run first (completeness, consistency; stat-only proof of the
    files), then every safetensors byte is read and verified while it streams into the
    state's own tensors, then :meth:`TrainState.restore_tree` puts it back (DCP files are
    read and verified there). Every rank takes the candidate or skips it together.

    Of a multi-rank checkpoint each rank reads the root and only the rank manifests it
    needs (:func:`~ckptkit.capture.state.manifests_to_read`: those holding shared state,
    and the one holding the RNG state it restores), and verifies the files it reads; a
    failure on any rank, in a manifest or a file only it reads, is every rank's Skip.

    Args:
        key: an HMAC key the manifest must be signed with.
        manifest: the candidate's manifest when the caller already read it (read once).

    Raises:
        Skip: the candidate cannot be restored; the caller tries an older one (for a
            run that does not fit a whole checkpoint, ``Skip.mismatch``, only as long as
            an older one fits).
    """
    err: CkptkitError | None = None
    damaged = True
    obj: Any = None
    man: mf.Manifest | None = None
    rep = None
    try:
        # The trust decision first: the manifest (and every rank manifest this rank reads)
        # as the key vouches for it, or the error that says why not. Every check and read
        # below works on this manifest and never reads it again.
        if manifest is None:
            manifest = manifest_io.read(
                path, key=key, only=lambda root: manifests_to_read(root, coll.rank)
            )
        # Manifest-level checks only: the read below verifies every digest.
        rep = verify_one(
            path,
            families=("completeness", "consistency"),
            progress=False,
            options={"scan_values": False, "read_files": False},
            manifest=manifest,
            key=key,
        )
        if rep.gone:
            raise codes.error(codes.F020, "deleted while it was being restored", path=path)
        if rep.errors:
            raise rep.errors[0].to_error(base=str(path))
        # Targets are best effort here: restore_tree judges the fit, with its own codes.
        obj, man, _ = read_checkpoint(
            path,
            manifest=manifest,
            key=key,
            targets_from=state.targets(),
            strict=False,
            progress=False,
        )
    except CkptkitError as e:
        err = e
    except Exception as e:  # untrusted input: any failure is a finding, never a traceback
        if codes.transient(e):  # a permission, EIO, the store unreachable: not damage
            err = codes.read_error(e, path=path)
        else:
            err = codes.error(codes.F024, f"cannot be read: {type(e).__name__}: {e}", path=path)
    try:
        consensus(coll, err, what=f"restore of {path.name}")
    except CkptkitError as e:
        raise Skip(e, damaged=damaged) from None
    assert man is not None and rep is not None
    try:
        result = state.restore_tree(obj, man, strict=strict, path=path, coll=coll)
    except CkptkitError as e:
        err, damaged = e, e.code not in (codes.R010, codes.R011)
    except Exception as e:
        if codes.transient(e):
            err = codes.read_error(e, path=path)
        else:
            err = codes.error(codes.F024, f"cannot be restored: {type(e).__name__}: {e}", path=path)
    else:
        err = None
    try:
        consensus(coll, err, what=f"restore of {path.name}")
    except CkptkitError as e:
        raise Skip(e, damaged=damaged, mismatch=e.code == codes.R010) from None
    result.path = path
    result.proven = man.complete or read_together(man, coll.world_size)
    if not result.proven:
        result.notes.append(
            f"the {coll.world_size} restoring rank(s) read what they restore, not every "
            f"rank's files of this {len(man.ranks)}-rank checkpoint: it is not recorded as "
            "verified ('ckptkit verify' proves the rest)"
        )
    result.notes += [f"{f.code} {f.message}" for f in rep.findings]
    saved = LookAhead.of(man.lookahead).guard
    if saved and state.guard_k > 0:
        # Sample ids and the RNG fingerprint are rank 0's and only mean something at
        # the layout of the save; step, LR, scale, optimizer step and probe hold anywhere.
        try:
            rg = guard_mod.ResumeGuard(
                saved,
                probe=state.probe,
                per_rank=saved.get("world_size") == state.parallel.world_size
                and state.parallel.rank == 0,
            )
            result.notes += [f"{f.code} {f.message}" for f in rg.check_restored(state)]
        except Exception as e:
            # CK-S012 (verify, above) refuses every value the guard reads before the state
            # is touched; this is the net for a restored object the guard still cannot
            # read. The state was replaced: the older candidate the caller falls back to
            # replaces it again, and a restore that finds none raises, never a traceback.
            err = codes.error(
                codes.S012,
                f"the resume guard cannot read the restored state: {type(e).__name__}: {e}",
                path=path,
            )
        else:
            result.guard = rg
            state.session.guard = rg  # the run keeps it as ts.guard
            guard_mod.attach(state.recorder, rg)
            rg.watch(state)  # the first resumed step, with or without a Recorder
    try:
        consensus(coll, err, what=f"restore of {path.name}")
    except CkptkitError as e:
        raise Skip(e, damaged=True) from None
    return result


_CANDIDATE = frozenset({"verified", "committed", "corrupt", "unreadable", "untrusted", "unsound"})
"""Statuses a restore reads (again): all but an unfinished save and a divergent state."""


def candidates(
    infos: list[CheckpointInfo], *, step: int | None, healthy: bool, root: Location
) -> tuple[list[CheckpointInfo], list[str]]:
    """The checkpoints a restore may try, oldest first, and notes on those passed over.

    Every status but ``incomplete`` and ``replica-divergent`` is a candidate (the caller
    reads a recorded corrupt, untrusted or unsound one again: the record is a claim, not
    proof, and a restore under the key refuses what the key does not vouch for itself); ``healthy`` keeps those whose recorded health
    is ``ok`` (all of the newest good one when the run has no health data); ``step`` keeps
    that step only.

    Raises:
        IncompleteCheckpointError: none qualifies (``step`` missing, no healthy one, or
            every step directory incomplete).
    """
    diverged = [c for c in infos if c.status == "replica-divergent"]
    infos = [c for c in infos if c.status in _CANDIDATE]
    notes: list[str] = []
    if step is not None and any(c.step == step for c in diverged):
        c = next(c for c in diverged if c.step == step)
        why = (c.problem or "").removeprefix(f"{codes.F120}: ")
        raise codes.error(codes.F120, f"step {step} is replica-divergent: {why}", path=c.path)
    newest = max((c.step for c in infos), default=-1)
    for c in diverged:
        if c.step > newest:  # what a resume would have taken, had its replicas agreed
            log.warning("ckptkit: restore: %s passed over: %s", c.path.name, c.problem)
            notes.append(f"{c.path.name}: skipped, replica-divergent ({c.problem})")
    if healthy:
        pick = rotation.choose_rollback(infos)
        for why in pick.reasons[:-1] if pick.checkpoint is not None else pick.reasons:
            log.warning("ckptkit: restore(healthy=True): %s", why)
        notes += [f"{r} (healthy=True)" for r in pick.reasons if ": skipped" in r]
        allowed = {c.step for c in infos if c.health == "ok"}
        if not pick.health_data and pick.checkpoint is not None:
            allowed = {pick.checkpoint.step}
        infos = [c for c in infos if c.step in allowed]
        if not infos:
            raise IncompleteCheckpointError(
                "no checkpoint with health ok: " + " | ".join(pick.reasons or ["none saved"]),
                path=root,
                hint="restore without healthy=True to take the newest verified one anyway",
            )
    if step is not None:
        infos = [c for c in infos if c.step == step]
        if not infos:
            raise IncompleteCheckpointError(
                f"no committed checkpoint for step {step}",
                path=root,
                hint="'ckptkit ls RUN' lists the steps that exist",
            )
    elif not infos:
        raise IncompleteCheckpointError(
            "no committed checkpoint: every step directory is incomplete",
            path=root,
            hint="the saves were interrupted; start fresh",
        )
    return infos, notes


Note = Callable[[Location, codes.Outcome, str | None], None]
"""``note(path, outcome, why)``: record what a restore found out about a checkpoint."""


def newest_restorable(
    state: TrainState,
    infos: list[CheckpointInfo],
    *,
    exact: bool,
    strict: bool,
    coll: Collective,
    key: bytes | None,
    note: Note,
) -> tuple[CheckpointInfo, RestoreResult, list[str]]:
    """Restore the newest of ``infos`` (oldest first, from :func:`candidates`) that can be
    restored, falling back past each that cannot; return it, its result and one line per
    checkpoint skipped on the way.

    A recorded corrupt or unreadable candidate is read like any other: reading verifies
    every byte, and the record may be a transient failure or an edited index. Each skip
    whose fault is in the bytes is passed to ``note`` (``corrupt``, or ``unreadable`` for a
    failure that is not evidence of damage). With ``exact`` (one step was asked for) the
    first failure is raised instead of falling back.

    Raises:
        StateError: every whole candidate does not fit the run (``CK-R010``): the run
            differs from the one that saved, and no fallback would hide it.
        IncompleteCheckpointError: no candidate could be restored (each reason listed).
    """
    skipped: list[str] = []
    mismatch: CkptkitError | None = None
    for c in reversed(infos):
        try:
            result = restore_candidate(state, c.path, strict=strict, coll=coll, key=key)
        except Skip as s:
            if s.damaged:
                note(c.path, codes.outcome([s.error.code]), f"{s.error.code or 'error'}: {s.error.what}")
            if exact:
                raise s.error from None
            if s.mismatch and mismatch is None:
                mismatch = s.error
            skipped.append(f"{c.path.name}: {s.error}")
            log.warning("ckptkit: skipping %s", skipped[-1])
            continue
        if skipped:
            log.warning(
                "ckptkit: restored %s after skipping %d newer checkpoint(s)%s",
                c.path.name,
                len(skipped),
                "; a newer one did not fit this run although it is whole: check that "
                "the run is built as it was when it saved"
                if mismatch is not None
                else "",
            )
        return c, result, skipped
    if mismatch is not None:
        # No checkpoint fits: the run differs from what saved them. Say so, not "lost".
        raise mismatch
    root = infos[0].path.parent if infos else None
    raise IncompleteCheckpointError(
        "no checkpoint could be restored: " + " | ".join(skipped),
        path=root,
        hint="restore files from a replica, or start fresh",
    )


def restore_run(
    state: TrainState,
    listing: Callable[[], list[CheckpointInfo]],
    *,
    root: Location,
    key: bytes | None,
    note: Note,
    step: int | None = None,
    strict: bool = True,
    healthy: bool = False,
    watch: Any = None,
) -> tuple[CheckpointInfo, RestoreResult] | None:
    """Restore the newest checkpoint of a run that can be restored (or exactly ``step``).

    The restore of :meth:`CheckpointManager.restore <ckptkit.CheckpointManager.restore>`,
    on every rank, less the run's own records: rank 0 lists the checkpoints (``listing``)
    and every rank takes that list, :func:`candidates` keeps those that may be tried, and
    :func:`newest_restorable` tries them newest first, passing each skip whose fault is in
    the bytes to ``note``. With ``healthy``, ``watch`` (the run's stability watch, if any) is
    reset once a candidate exists: its windows describe the run rolled back from. The
    result's notes start with those on the checkpoints passed over.

    Args:
        listing: the run's checkpoints, oldest first (called on rank 0 only).
        root: the run directory (named in errors).
        key: an HMAC key every manifest must be signed with.
        note: ``note(path, outcome, why)``: record a candidate found damaged or unreadable.

    Returns:
        The checkpoint restored and the result; None when the run has no checkpoint and
        neither ``step`` nor ``healthy`` was asked for (a fresh start). The caller records
        the restored checkpoint as verified (every byte was verified while read).

    Raises:
        IncompleteCheckpointError: checkpoints exist but none could be restored, or
            ``step`` does not exist.
        StateError: the run does not fit any whole checkpoint (``CK-R010``).
        CkptkitError: ``step`` was given and that checkpoint fails.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> mgr = ckptkit.CheckpointManager(tempfile.mkdtemp())
        >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=4)
        >>> _ = mgr.save(ts); mgr.wait()
        >>> c, result = restore_run(ts, mgr.run.checkpoints, root=mgr.root, key=None,
        ...                         note=lambda path, outcome, why: None)
        >>> c.step, result.step
        (4, 4)
    """
    expect_train_state(state, "CheckpointManager.restore")
    coll = current()
    infos = coll.broadcast(listing() if coll.rank == 0 else None)
    if not infos and step is None and not healthy:
        return None  # a fresh start: the run has no checkpoint at all
    infos, notes = candidates(infos, step=step, healthy=healthy, root=root)
    if healthy and watch is not None:
        watch.reset()  # its windows describe the run we roll back from
    c, result, skipped = newest_restorable(
        state, infos, exact=step is not None, strict=strict, coll=coll, key=key, note=note
    )
    result.notes[:0] = [*notes, *(f"skipped {s}" for s in skipped)]
    return c, result


__all__ = ["Note", "Skip", "candidates", "newest_restorable", "restore_candidate", "restore_run"]
