"""Verified retention for any run: decide, re-check from bytes, then delete.

:mod:`ckptkit.run.rotation` decides (pure policies, no I/O). This module applies a decision to
a run, whatever its layout, with the rules that make deletion safe:

1. nothing is deleted unless the plan deletes something, and only by the run's lock
   holder (``run.fence()`` raises otherwise);
2. before deleting, the newest checkpoint the plan keeps as good (the one whose survival
   justifies the deletions) is verified again from its bytes, unless it was just verified
   (``fresh``); if it fails, it is recorded corrupt by the run, the plan is made again, and
   nothing it would have justified is deleted;
3. the newest good checkpoint is never deleted, whatever the plan says;
4. a checkpoint is deleted *as corrupt* only after it failed a verify from its bytes
   just now, with evidence of damage (:func:`ckptkit.codes.damage`): a recorded
   ``corrupt`` is a claim of the run index (unsigned without a key, and possibly a
   transient failure). If it verifies now, or cannot be read for a reason that is not
   damage (``unreadable``), or its bytes are intact but it is ``untrusted`` or ``unsound``
   (:data:`KEPT_BECAUSE`), it is kept;
5. an ``untrusted`` or ``unsound`` checkpoint (intact bytes) is never deleted by any
   option, and the newest checkpoint whose bytes are intact is never deleted either
   (:func:`rotation.plan`);
6. an ``unreadable`` checkpoint is never deleted (:func:`rotation.plan` keeps it);
7. the loop of rule 2 always ends: when a failed re-verify did not change the plan (the
   checkpoint that failed is still the newest the plan counts good: the run could not
   record the failure, e.g. a manifest it cannot parse or an index it cannot write),
   nothing is deleted and :attr:`Outcome.stopped` says why. Each round that goes on has
   ruled out one more checkpoint, so there are at most as many rounds as checkpoints.

Every run (:class:`ckptkit.run.Run`, of any layout: a native run, a Trainer output
directory, a Lightning ``checkpoints/`` directory) is a :class:`RunStore`: the same
retention code deletes their checkpoints, and a removal a framework asks for goes through
it too (:attr:`Policy.only`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from ckptkit import codes, crashpoints
from ckptkit.checkpoint.catalog import DELETABLE, UNUSABLE, CheckpointInfo
from ckptkit.codes import Finding
from ckptkit.run import rotation

log = logging.getLogger("ckptkit")


class RunStore(Protocol):
    """What verified retention needs from a run directory of any layout."""

    def checkpoints(self) -> Sequence[CheckpointInfo]:
        """Every checkpoint, with its recorded status (no bytes read)."""
        ...

    def reverify(self, info: CheckpointInfo) -> list[Finding]:
        """Verify one checkpoint from its bytes, record the outcome, return error findings."""
        ...

    def remove(self, info: CheckpointInfo) -> bool:
        """Delete one checkpoint so that it never looks whole half-deleted; False if gone."""
        ...

    def fence(self) -> None:
        """Raise unless this process may delete (it holds the run's lock)."""
        ...


@dataclass(frozen=True)
class Policy:
    """A retention policy: what :func:`rotation.plan` takes."""

    keep_last: int
    keep_every: int | None = None
    max_bytes: int | None = None
    delete_corrupt: bool = False
    good: tuple[str, ...] = ("verified",)
    """Statuses that count as good (``committed`` too when the run does not verify)."""
    only: str | None = None
    """The name of the one checkpoint this plan may delete (a removal a framework asks
    for: Lightning's ``save_top_k``); every other one is kept. The rules still hold: the
    newest good checkpoint is never deleted, the newest kept good one is verified first."""


@dataclass
class Outcome:
    """What :func:`apply` did."""

    plan: rotation.RetentionPlan
    deleted: list[str] = field(default_factory=list)
    """``"name: why"`` per deleted checkpoint."""
    rechecked: list[str] = field(default_factory=list)
    """Checkpoints verified again before deleting (and what was found)."""
    stopped: str | None = None
    """Why nothing was deleted although the policy asked for deletions (rule 7), else None."""


def plan(run: RunStore, policy: Policy) -> rotation.RetentionPlan:
    """The retention plan for ``run`` as it is now (nothing is read or deleted)."""
    return rotation.plan(
        [_info(c, policy) for c in run.checkpoints()],
        keep_last=policy.keep_last,
        keep_every=policy.keep_every,
        max_bytes=policy.max_bytes,
        delete_corrupt=policy.delete_corrupt,
    )


def apply(
    run: RunStore,
    policy: Policy,
    *,
    recheck: bool = True,
    fresh: Collection[int] = (),
    dry_run: bool = False,
) -> Outcome:
    """Apply ``policy`` to ``run`` with the safety rules of the module docstring.

    Args:
        recheck: verify the newest kept good checkpoint from its bytes before deleting.
        fresh: steps verified from their bytes moments ago (not read again).
        dry_run: plan (and re-check) only; delete nothing.
    """
    rechecked: list[str] = []
    failed: dict[int, str] = {}
    """Steps whose re-verify failed in this call, and how (rule 7)."""
    stopped: str | None = None
    while True:
        p = plan(run, policy)
        if not p.delete or not recheck:
            break
        keep = [d.ckpt for d in p.decisions if d.keep and d.ckpt.good]
        if not keep:
            break
        newest = max(keep, key=lambda c: c.step)
        if newest.step in fresh:
            break
        if newest.step in failed:
            # The failure did not change the plan: replanning would re-verify the same
            # checkpoint forever, and deleting on this plan would trust a verdict its bytes
            # just contradicted.
            stopped = (
                f"{failed[newest.step]} failed its re-verify, but the run still counts it "
                "good (the failure could not be recorded); nothing is deleted until it is "
                "verified again ('ckptkit ls --verify RUN')"
            )
            log.error("ckptkit: %s", stopped)
            p = _hold(p, stopped)
            break
        info = next(c for c in run.checkpoints() if c.step == newest.step)
        bad = run.reverify(info)
        if not bad:
            rechecked.append(f"{_name(info)}: verified again, ok")
            break
        failed[newest.step] = _name(info)
        rechecked.append(f"{_name(info)}: {bad[0].code} {bad[0].message}")
        log.error(
            "ckptkit: %s failed its re-verify before deleting (%s %s); it is recorded "
            "corrupt and nothing it would have justified is deleted",
            _name(info),
            bad[0].code,
            bad[0].message,
        )
    out = Outcome(plan=p, rechecked=rechecked, stopped=stopped)
    if dry_run or not p.delete:
        return out
    run.fence()
    newest_good = max((c.step for c in p.keep if c.good), default=None)
    by_step = {c.step: c for c in run.checkpoints()}
    for d in p.decisions:
        if d.keep:
            continue
        if d.ckpt.good and (newest_good is None or d.ckpt.step > newest_good):
            log.error("ckptkit: refusing to delete step %d: newest verified", d.ckpt.step)
            continue
        doomed = by_step.get(d.ckpt.step)
        if doomed is not None and doomed.status == "corrupt":
            kept = _recheck_corrupt(run, doomed, out)
            if kept is not None:
                out.plan = _kept(out.plan, d.ckpt.step, *kept)
                continue
        if doomed is not None and run.remove(doomed):
            why = d.reason.removeprefix("delete: ")
            log.info("ckptkit: deleted %s: %s", _name(doomed), why)
            out.deleted.append(f"{_name(doomed)}: {why}")
            crashpoints.reached("rotate.deleted")
    return out


KEPT_BECAUSE: dict[str, str] = {
    "verified": "it verified from its bytes before deleting",
    "unreadable": "unreadable now (not evidence of damage)",
    "untrusted": "the key in use does not vouch for it, which says who wrote it, not that "
    "its bytes are damaged (a new key?); never restored under this key, delete it by hand "
    "if it is not yours",
    "unsound": "its bytes are intact; what they hold cannot be resumed (a component "
    "missing, values inconsistent, a file that needs code, a manifest of another step): "
    "fix or delete it by hand",
    "replica-divergent": "its bytes are intact; kept as evidence of a divergence",
}
"""Why a checkpoint recorded corrupt is kept after all, by what its re-verify found: only
damage (:func:`ckptkit.codes.damage`) is deleted as corrupt (a wrong key must not empty a
run; a renamed checkpoint may be the only copy of its step; a file that needs code is
evidence to keep, never run)."""


def _recheck_corrupt(
    run: RunStore, info: CheckpointInfo, out: Outcome
) -> tuple[str, codes.Outcome] | None:
    """Verify a checkpoint recorded corrupt from its bytes before it is deleted as corrupt.

    Returns None when its bytes show damage now (delete it); else why it is kept and what
    its re-verify found: it verifies, it cannot be read now (a permission, EIO:
    ``CK-F025``), or its bytes are intact (:data:`KEPT_BECAUSE`). The run records the outcome.
    """
    bad = run.reverify(info)
    found = codes.outcome(f.code for f in bad)
    if found == "corrupt":
        out.rechecked.append(f"{_name(info)}: {bad[0].code} {bad[0].message}")
        return None
    why = f"keep: recorded corrupt, but {KEPT_BECAUSE[found]}"
    first = f"{bad[0].code} {bad[0].message}" if bad else "verified again, ok"
    out.rechecked.append(f"{_name(info)}: {first}; kept")
    log.warning("ckptkit: %s is not deleted as corrupt: %s", _name(info), why.removeprefix("keep: "))
    return why, found


def _kept(
    plan: rotation.RetentionPlan, step: int, reason: str, found: codes.Outcome
) -> rotation.RetentionPlan:
    """``plan`` with the checkpoint of ``step``, recorded corrupt, kept after all for
    ``reason`` (its bytes, read again before deleting, showed no damage)."""
    decisions = tuple(
        replace(
            d, keep=True, reason=reason,
            ckpt=replace(
                d.ckpt,
                corrupt=False,
                unreadable=found == "unreadable",
                intact=found in ("untrusted", "unsound"),
            ),
        )
        if d.ckpt.step == step
        else d
        for d in plan.decisions
    )
    return replace(plan, decisions=decisions)


def _hold(p: rotation.RetentionPlan, why: str) -> rotation.RetentionPlan:
    """``p`` with every deletion turned into a keep that says ``why``."""
    held = tuple(
        d if d.keep else replace(d, keep=True, reason=f"keep: not deleted: {why}")
        for d in p.decisions
    )
    return replace(p, decisions=held)


ONLY_PIN = "not-asked-for"
"""The pin :attr:`Policy.only` gives every checkpoint but the one asked for."""


def _info(c: CheckpointInfo, policy: Policy) -> rotation.CkptInfo:
    spared = policy.only is not None and _name(c) != policy.only
    return rotation.CkptInfo(
        step=c.step,
        size=c.size,
        verified=c.status in policy.good,
        # A replica-divergent checkpoint is whole but not trustworthy: kept as evidence
        # like a corrupt one (delete_corrupt removes it), never counted as good.
        corrupt=c.status in DELETABLE,
        unreadable=c.status == "unreadable",
        # Intact bytes the run cannot use (untrusted, unsound): never counted, never deleted.
        intact=c.status in UNUSABLE and c.status not in DELETABLE,
        pinned=frozenset({*c.pins, ONLY_PIN} if spared else c.pins),
        health=c.health,
        time=c.time,
    )


def _name(c: CheckpointInfo) -> str:
    return getattr(c.path, "name", None) or str(c.path)


__all__ = ["Outcome", "Policy", "RunStore", "apply", "plan"]
