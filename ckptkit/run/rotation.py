"""Retention policies: which checkpoints to keep, which to delete, and why.

Pure functions over :class:`CkptInfo` records, no I/O, in the shape of orbax's
``preservation_policy.py``: every policy answers ``should_preserve(ckpts)`` with one
bool per checkpoint, in input order, plus a human reason for each keep. Policies
combine with :class:`AnyOf` (a checkpoint survives if any policy keeps it).
:func:`plan` adds the safety rules the manager and ``ckptkit prune`` rely on and
returns a :class:`RetentionPlan` that says, for every checkpoint, keep or delete
*and why*. The caller (``CheckpointManager``, the CLI) does the deleting.

Conventions shared by every policy:

* "newest" means highest ``step``; ``time`` is informational and never used for
  ordering, so a clock jump cannot change what is kept.
* A *good* checkpoint is ``verified and not corrupt``. ``corrupt`` also stands for
  incomplete (no valid manifest): neither is a resume target.
* An ``unreadable`` checkpoint (its last read failed for a reason that is not damage: a
  permission, an I/O error) is neither good nor corrupt, and no rule deletes it.
* Results never depend on the order of the input sequence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ckptkit._repr import brief
from ckptkit.format import records
from ckptkit.signals.stability import HINTS
from ckptkit.signals.verdicts import NOT_JUDGED

Health = Literal["ok", "warn", "critical"]
_BAD_HEALTH = frozenset({"warn", "critical"})


@dataclass(frozen=True)
class CkptInfo:
    """What rotation needs to know about one checkpoint (no paths, no I/O).

    Example:
        >>> CkptInfo(step=1000, size=2_000_000, verified=True, pinned=frozenset({"best"}))
        CkptInfo(step=1000, size=2000000, verified=True, corrupt=False, pinned=frozenset({'best'}), health=None, time=0.0, unreadable=False, intact=False)
    """

    step: int
    """Global step the checkpoint was saved at; unique within a run directory."""
    size: int
    """Bytes on disk (all files of the checkpoint directory)."""
    verified: bool
    """True once verify found no error (digests, completeness, consistency)."""
    corrupt: bool = False
    """True if verify found an error, or the directory has no valid manifest (incomplete)."""
    pinned: frozenset[str] = frozenset()
    """Pin labels (``"emergency"``, ``"best"``...). Pinned checkpoints are never deleted."""
    health: str | None = None
    """Training health at save time: ``"ok"``, ``"not judged"`` (saved during the watch's
    warm-up: not healthy), ``"warn"``, ``"critical"`` or unknown (None)."""
    time: float = 0.0
    """Save time (Unix seconds). Informational only: ordering always uses ``step``."""
    unreadable: bool = False
    """True when its last read failed for a reason that is not damage (``CK-F025``): it
    may be whole, so no rule deletes it; it does not count toward ``keep_last`` either."""
    intact: bool = False
    """True when its bytes are intact but the run cannot use it (``untrusted``: the key does
    not vouch for it; ``unsound``: a completeness or consistency finding): no rule deletes
    it, and it does not count toward ``keep_last``. Only damage is deleted."""

    @property
    def good(self) -> bool:
        """True for a verified, non-corrupt checkpoint: a valid resume target."""
        return self.verified and not self.corrupt


@runtime_checkable
class Policy(Protocol):
    """A retention policy: one keep-reason (or None) per checkpoint, in input order."""

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return why each checkpoint is kept by this policy, None where it is not."""
        ...

    def should_preserve(self, ckpts: Sequence[CkptInfo]) -> list[bool]:
        """Return one bool per checkpoint: True where this policy keeps it."""
        ...


class _Base:
    """Derives ``should_preserve`` from ``reasons`` so the two never disagree."""

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:  # pragma: no cover
        raise NotImplementedError

    def should_preserve(self, ckpts: Sequence[CkptInfo]) -> list[bool]:
        """Return one bool per checkpoint, True where this policy keeps it.

        Example:
            >>> KeepLast(1).should_preserve([CkptInfo(1, 10, True), CkptInfo(2, 10, True)])
            [False, True]
        """
        return [r is not None for r in self.reasons(ckpts)]


@dataclass(frozen=True)
class KeepLast(_Base):
    """Keep the ``k`` newest good (verified, non-corrupt) checkpoints.

    Unverified and corrupt checkpoints do not count toward ``k``: a run whose last
    three saves are corrupt still keeps its three newest good ones.

    Example:
        >>> cks = [CkptInfo(s, 1, True) for s in (1, 2, 3)] + [CkptInfo(4, 1, True, corrupt=True)]
        >>> KeepLast(2).should_preserve(cks)
        [False, True, True, False]
    """

    k: int
    """How many good checkpoints to keep; 0 keeps none (the newest verified survives anyway in :func:`plan`)."""

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"KeepLast: k must be >= 0, got {self.k}")

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return ``"last k"`` for the k newest good checkpoints, None elsewhere."""
        good = sorted((c.step for c in ckpts if c.good), reverse=True)
        kept = set(good[: self.k])
        return [f"last {self.k}" if c.good and c.step in kept else None for c in ckpts]


@dataclass(frozen=True)
class KeepEvery(_Base):
    """Keep every non-corrupt checkpoint whose step is a multiple of ``n`` (step 0 included).

    Example:
        >>> KeepEvery(10).should_preserve([CkptInfo(10, 1, True), CkptInfo(15, 1, True)])
        [True, False]
    """

    n: int
    """The period in steps; must be positive."""

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError(f"KeepEvery: n must be > 0, got {self.n}")

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return ``"multiple of n"`` where the step divides by n, None elsewhere."""
        # A corrupt milestone is no milestone: it cannot be resumed from.
        return [
            f"multiple of {self.n}" if c.step % self.n == 0 and not c.corrupt else None
            for c in ckpts
        ]


@dataclass(frozen=True)
class Pinned(_Base):
    """Keep every checkpoint with at least one pin, corrupt or not.

    Example:
        >>> Pinned().reasons([CkptInfo(5, 1, True, pinned=frozenset({"emergency"})), CkptInfo(6, 1, True)])
        ['pinned emergency', None]
    """

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return ``"pinned <labels>"`` for pinned checkpoints, None elsewhere."""
        return [f"pinned {','.join(sorted(c.pinned))}" if c.pinned else None for c in ckpts]


@dataclass(frozen=True)
class KeepHealthy(_Base):
    """Keep the newest ``"ok"`` checkpoint when any later one is ``"warn"``/``"critical"``.

    This is the rollback target after a loss spike or divergence: keep-last alone
    would rotate it out while the unhealthy saves pile up. Corrupt checkpoints are
    never a rollback target and are skipped.

    Example:
        >>> cks = [CkptInfo(1, 1, True, health="ok"), CkptInfo(2, 1, True, health="critical")]
        >>> KeepHealthy().should_preserve(cks)
        [True, False]
    """

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return ``"newest healthy ..."`` for the rollback target, None elsewhere."""
        healthy = [c.step for c in ckpts if c.health == "ok" and not c.corrupt]
        if not healthy:
            return [None] * len(ckpts)
        target = max(healthy)
        later_bad = sorted(c.step for c in ckpts if c.step > target and c.health in _BAD_HEALTH)
        if not later_bad:
            return [None] * len(ckpts)
        why = f"newest healthy (step {later_bad[0]} and later not ok)"
        return [why if c.step == target else None for c in ckpts]


@dataclass(frozen=True)
class KeepNewestGood(_Base):
    """Keep the newest good checkpoint: the one a restore would pick.

    Example:
        >>> KeepNewestGood().should_preserve([CkptInfo(1, 1, True), CkptInfo(2, 1, False)])
        [True, False]
    """

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return ``"newest verified"`` for the newest good checkpoint, None elsewhere."""
        newest = _newest_good(ckpts)
        return ["newest verified" if c.step == newest else None for c in ckpts]


@dataclass(frozen=True)
class KeepPending(_Base):
    """Keep unverified, non-corrupt checkpoints newer than the newest good one.

    Such a checkpoint was committed but not verified yet (a save in flight, or a
    ``prune`` run before ``verify``); it may become the newest good one, so
    deleting it could throw away the only copy of the latest state.

    Example:
        >>> KeepPending().should_preserve([CkptInfo(1, 1, True), CkptInfo(2, 1, False)])
        [False, True]
    """

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return ``"not yet verified, newer than newest verified"`` where it applies."""
        newest = _newest_good(ckpts)
        floor = -1 if newest is None else newest
        return [
            "not yet verified, newer than newest verified"
            if not c.verified and not c.corrupt and c.step > floor
            else None
            for c in ckpts
        ]


@dataclass(frozen=True, init=False)
class AnyOf(_Base):
    """Keep a checkpoint if any of the policies keeps it; the reasons are joined.

    Example:
        >>> cks = [CkptInfo(s, 1, True) for s in (10, 15, 20)]
        >>> AnyOf(KeepLast(1), KeepEvery(10)).reasons(cks)
        ['multiple of 10', None, 'last 1; multiple of 10']
    """

    policies: tuple[Policy, ...] = field(default=())
    """The combined policies, in the order their reasons are listed."""

    def __init__(self, *policies: Policy) -> None:
        object.__setattr__(self, "policies", tuple(policies))

    def reasons(self, ckpts: Sequence[CkptInfo]) -> list[str | None]:
        """Return the joined reasons of every policy that keeps each checkpoint."""
        per_policy = [p.reasons(ckpts) for p in self.policies]
        out: list[str | None] = []
        for i in range(len(ckpts)):
            why = [r[i] for r in per_policy if r[i] is not None]
            out.append("; ".join(w for w in why if w is not None) or None)
        return out


@dataclass(frozen=True)
class Decision:
    """Keep or delete one checkpoint, and why."""

    ckpt: CkptInfo
    """The checkpoint decided on."""
    keep: bool
    """True to keep, False to delete."""
    reason: str
    """``"keep: last 3"``, ``"delete: beyond keep_last=3"``, ... (always starts with keep/delete)."""

    @property
    def flagged(self) -> bool:
        """True for a corrupt or incomplete checkpoint kept for inspection."""
        return self.keep and self.ckpt.corrupt


@dataclass(frozen=True)
class RetentionPlan:
    """The outcome of :func:`plan`: one :class:`Decision` per checkpoint, in input order."""

    decisions: tuple[Decision, ...]
    """One decision per input checkpoint, same order as the input."""
    max_bytes: int | None = None
    """The budget asked for, if any."""
    budget_note: str | None = None
    """Set when ``max_bytes`` cannot be met, saying what blocks it."""

    @property
    def keep(self) -> list[CkptInfo]:
        """Checkpoints to keep, oldest first."""
        return sorted((d.ckpt for d in self.decisions if d.keep), key=lambda c: c.step)

    @property
    def delete(self) -> list[CkptInfo]:
        """Checkpoints to delete, oldest first."""
        return sorted((d.ckpt for d in self.decisions if not d.keep), key=lambda c: c.step)

    @property
    def flagged(self) -> list[CkptInfo]:
        """Corrupt or incomplete checkpoints kept for inspection, oldest first."""
        return sorted((d.ckpt for d in self.decisions if d.flagged), key=lambda c: c.step)

    @property
    def bytes_kept(self) -> int:
        """Total size of the checkpoints kept."""
        return sum(d.ckpt.size for d in self.decisions if d.keep)

    @property
    def over_budget(self) -> bool:
        """True when ``max_bytes`` was given and the kept set still exceeds it."""
        return self.max_bytes is not None and self.bytes_kept > self.max_bytes

    def by_step(self) -> dict[int, Decision]:
        """Return the decisions keyed by step.

        Example:
            >>> p = plan([CkptInfo(1, 1, True)], keep_last=1)
            >>> p.by_step()[1].reason
            'keep: newest verified; last 1'
        """
        return {d.ckpt.step: d for d in self.decisions}

    def __repr__(self) -> str:
        return brief(
            "RetentionPlan",
            keep=[c.step for c in self.keep],
            delete=[c.step for c in self.delete],
            budget_note=self.budget_note,
        )


def plan(
    ckpts: Sequence[CkptInfo],
    *,
    keep_last: int,
    keep_every: int | None = None,
    max_bytes: int | None = None,
    keep_healthy: bool = True,
    delete_corrupt: bool = False,
) -> RetentionPlan:
    """Decide, for every checkpoint, keep or delete, with the reason.

    Rules, in order of precedence:

    1. Pinned checkpoints are always kept (even corrupt, even over budget): unpin to delete.
    2. The newest good (verified, non-corrupt) checkpoint is always kept, whatever
       the policy or budget: it is what a restore falls back to.
    3. Corrupt or incomplete checkpoints are kept and flagged unless
       ``delete_corrupt=True``: they are evidence, and deleting them must be asked
       for. They never count toward ``keep_last`` and ``max_bytes`` never drops them
       (it does count their bytes). Unreadable ones are always kept, with the same
       protection: they may be whole, and nothing has shown otherwise; so are intact
       ones the run cannot use (``intact``: untrusted or unsound), whatever the options:
       only damage is deleted.
    4. Otherwise a checkpoint is kept if any policy keeps it: :class:`KeepLast`
       (``keep_last``), :class:`KeepEvery` (``keep_every``), :class:`KeepHealthy`
       (``keep_healthy``) and :class:`KeepPending` (unverified ones newer than the
       newest good one, which may be a save still being verified).
    5. ``max_bytes``: while the kept set is over budget, the oldest kept checkpoint
       not protected by rules 1-3 is deleted. If the budget still cannot be met the
       plan's ``budget_note`` says which checkpoints block it.

    Args:
        ckpts: the checkpoints of one run directory, in any order; steps must be unique.
        keep_last: how many of the newest good checkpoints to keep (>= 0).
        keep_every: also keep every checkpoint whose step is a multiple of this.
        max_bytes: total size budget for the kept checkpoints, in bytes.
        keep_healthy: keep the newest ``"ok"`` checkpoint when later ones are warn/critical.
        delete_corrupt: delete corrupt and incomplete checkpoints (not pinned ones).

    Returns:
        A :class:`RetentionPlan` with one decision per input checkpoint, in input order.

    Raises:
        ValueError: on duplicate steps or negative/zero arguments.

    Example:
        >>> cks = [CkptInfo(s, 10, True) for s in (1000, 2000, 3000, 4000)]
        >>> [d.reason for d in plan(cks, keep_last=2, keep_every=2000).decisions]
        ['delete: beyond keep_last=2', 'keep: multiple of 2000', 'keep: last 2', 'keep: newest verified; last 2; multiple of 2000']
    """
    steps = [c.step for c in ckpts]
    if len(set(steps)) != len(steps):
        dupes = sorted(s for s, n in Counter(steps).items() if n > 1)
        raise ValueError(f"plan: duplicate checkpoint steps {dupes}; each step is one directory")
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"plan: max_bytes must be >= 0, got {max_bytes}")

    policies: list[Policy] = [Pinned(), KeepNewestGood(), KeepLast(keep_last)]
    if keep_every is not None:
        policies.append(KeepEvery(keep_every))
    if keep_healthy:
        policies.append(KeepHealthy())
    policies.append(KeepPending())
    reasons = AnyOf(*policies).reasons(ckpts)
    newest = _newest_good(ckpts)

    keep: list[bool] = []
    why: list[str] = []
    protected: list[bool] = []  # never dropped by max_bytes
    for c, r in zip(ckpts, reasons, strict=True):
        if c.pinned or c.step == newest:
            keep.append(True)
            why.append(f"keep: {r}" + ("; corrupt, flagged" if c.corrupt else ""))
            protected.append(True)
        elif c.unreadable and not c.corrupt:
            keep.append(True)
            why.append(
                "keep: unreadable now (not evidence of damage); retried later, never "
                "deleted by retention"
            )
            protected.append(True)
        elif c.intact and not c.corrupt:
            keep.append(True)
            why.append(
                "keep: its bytes are intact but it cannot be resumed (untrusted or unsound); "
                "never deleted by retention, delete it by hand"
            )
            protected.append(True)
        elif c.corrupt:
            keep.append(not delete_corrupt)
            why.append(
                "delete: corrupt or incomplete (delete_corrupt=True)"
                if delete_corrupt
                else "keep: corrupt or incomplete, flagged (pass delete_corrupt=True to remove)"
            )
            protected.append(True)
        elif r is not None:
            keep.append(True)
            why.append(f"keep: {r}")
            protected.append(False)
        else:
            keep.append(False)
            why.append(
                f"delete: beyond keep_last={keep_last}"
                if c.verified
                else f"delete: not verified, older than the newest verified step {newest}"
            )
            protected.append(True)

    note: str | None = None
    if max_bytes is not None:
        total = sum(c.size for c, k in zip(ckpts, keep, strict=True) if k)
        droppable = sorted(
            (i for i in range(len(ckpts)) if keep[i] and not protected[i]),
            key=lambda i: ckpts[i].step,
        )
        for i in droppable:
            if total <= max_bytes:
                break
            keep[i] = False
            # Say what the checkpoint was kept for: dropping a milestone should be visible.
            why[i] = (
                f"delete: over max_bytes budget ({_fmt_bytes(total)} > {_fmt_bytes(max_bytes)}); "
                f"was {why[i].removeprefix('keep: ')}"
            )
            total -= ckpts[i].size
        if total > max_bytes:
            blockers = [
                f"step {ckpts[i].step} ({why[i].removeprefix('keep: ')}, {_fmt_bytes(ckpts[i].size)})"
                for i in sorted(range(len(ckpts)), key=lambda i: ckpts[i].step)
                if keep[i]
            ]
            note = (
                f"max_bytes budget cannot be met: {_fmt_bytes(total)} > {_fmt_bytes(max_bytes)} "
                f"in checkpoints that are never deleted: {', '.join(blockers)}. "
                "Unpin checkpoints, pass delete_corrupt=True, or raise max_bytes."
            )

    decisions = tuple(Decision(c, k, w) for c, k, w in zip(ckpts, keep, why, strict=True))
    return RetentionPlan(decisions=decisions, max_bytes=max_bytes, budget_note=note)


def _newest_good(ckpts: Sequence[CkptInfo]) -> int | None:
    good = [c.step for c in ckpts if c.good]
    return max(good) if good else None


def _fmt_bytes(n: int) -> str:
    """Format a byte count with decimal units (GB = 1e9), as disks are sold and ``df -H`` shows."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"



# --- rollback -------------------------------------------------------------------------------------


class Candidate(Protocol):
    """What rollback selection reads of a checkpoint (``ckptkit.checkpoint.catalog.CheckpointInfo``)."""

    @property
    def step(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def health(self) -> str | None: ...
    @property
    def problem(self) -> str | None: ...
    @property
    def pins(self) -> tuple[str, ...]: ...
    @property
    def health_record(self) -> Mapping[str, Any] | None: ...
    @property
    def path(self) -> Any: ...


@dataclass(frozen=True)
class RollbackChoice:
    """What :func:`choose_rollback` picked and why."""

    checkpoint: Any
    """The checkpoint to resume from (None when none qualifies)."""
    reasons: list[str]
    """One line per newer checkpoint passed over, then why this one was picked."""
    hints: list[str]
    """Recovery suggestions for the signals that fired; ckptkit never applies them."""
    health_data: bool = True
    """False when no checkpoint of the run carries a health record (no StabilityWatch)."""
    resume: str | None = None
    """How to resume from ``checkpoint`` in the run's own terms (set by
    :func:`ckptkit.run.directory.rollback`: ``mgr.restore(...)``, a framework's resume call)."""
    recoveries: tuple[Mapping[str, Any], ...] = ()
    """The run's automatic recoveries and refusals (:mod:`ckptkit.signals.recovery_log`), oldest first."""

    def __repr__(self) -> str:
        c = self.checkpoint
        return brief(
            "RollbackChoice",
            step=c.step if c is not None else None,
            path=getattr(c, "path", None),
            reasons=self.reasons,
            hints=len(self.hints),
            health_data=self.health_data,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict."""
        c = self.checkpoint
        return {
            "checkpoint": c.to_dict() if c is not None and hasattr(c, "to_dict") else None,
            "reasons": list(self.reasons),
            "hints": list(self.hints),
            "health_data": self.health_data,
            "resume": self.resume,
            "recoveries": [dict(r) for r in self.recoveries],
        }


def choose_rollback(ckpts: Iterable[Candidate]) -> RollbackChoice:
    """Pick the checkpoint to roll back to: the newest good one whose health is ``ok``.

    Pure: reads the records it is given, no I/O. Corrupt and incomplete checkpoints and
    those whose recorded health is ``warn``/``critical`` or ``not judged`` (saved before
    the watch could judge the run) are passed over, each with the reason. When no checkpoint of the run has a health record at all (saved without a
    :class:`~ckptkit.StabilityWatch`), there is nothing to judge health by: the newest
    good checkpoint is picked and the choice says that no health data exists. Hints name
    fixes only for signals that actually fired.

    Example:
        >>> from types import SimpleNamespace as C
        >>> c = lambda s, h: C(step=s, status="verified", health=h, problem=None, pins=(),
        ...                    health_record={"level": h} if h else None, path=f"step-{s}")
        >>> choose_rollback([c(1, "ok"), c(2, "warn")]).checkpoint.step
        1
        >>> r = choose_rollback([c(1, None), c(2, None)]); r.checkpoint.step, r.health_data
        (2, False)
    """
    order = sorted(ckpts, key=lambda c: c.step, reverse=True)
    usable = [c for c in order if c.status in ("verified", "committed")]
    fired: list[str] = []
    reasons: list[str] = []
    if usable and all(c.health is None and not c.health_record for c in order):
        pick = usable[0]
        for c in order:
            if c is pick:
                break
            reasons.append(f"{_name(c)}: skipped, {c.status} ({c.problem or 'no detail'})")
        reasons.append(
            f"{_name(pick)}: picked, the newest {pick.status} checkpoint; no checkpoint of "
            "this run has health data (saved without a StabilityWatch), so health was not judged"
        )
        return RollbackChoice(pick, reasons, [], health_data=False)
    for c in order:
        if c.status not in ("verified", "committed"):
            reasons.append(f"{_name(c)}: skipped, {c.status} ({c.problem or 'no detail'})")
            continue
        if c.health == "ok":
            pins = f", pinned {','.join(c.pins)}" if c.pins else ""
            reasons.append(
                f"{_name(c)}: picked, the newest {c.status} checkpoint with health ok{pins}"
            )
            return RollbackChoice(c, reasons, _hints(fired))
        rec = records.Health.of(c.health_record) or records.Health(c.health)
        fired.extend(rec.signal_names)
        if c.health is None:
            why = "no health record (saved without a StabilityWatch): cannot vouch for it"
        elif c.health == NOT_JUDGED:
            wait = rec.not_judging or "saved before the watch could judge the run"
            why = f"health not judged ({wait}): cannot vouch for it"
        else:
            named = "; ".join(
                f"{n}: {rec.detail(n)}" for n in rec.signal_names[:3]
            ) or "no signal recorded"
            first = rec.first_warn_step
            since = f", first warning at step {first}" if first is not None else ""
            why = f"health {c.health}{since} ({named})"
        reasons.append(f"{_name(c)}: skipped, {why}")
    return RollbackChoice(None, reasons, _hints(fired))


def _name(c: Candidate) -> str:
    p = c.path
    return getattr(p, "name", None) or str(p)


def _hints(signal_names: Iterable[str]) -> list[str]:
    """Fixes for the signals that fired (none when none fired), then the one standing note."""
    out: list[str] = []
    for name in signal_names:
        metric, _, test = name.partition(".")
        for k in (test, metric):
            if k in HINTS and HINTS[k] not in out:
                out.append(HINTS[k])
    if out:
        out.append(
            "ckptkit changes no hyper-parameter: apply a fix deliberately, and keep the run's "
            "metrics file for the post-mortem"
        )
    return out

__all__ = [
    "AnyOf",
    "Candidate",
    "CkptInfo",
    "Decision",
    "KeepEvery",
    "KeepHealthy",
    "KeepLast",
    "KeepNewestGood",
    "KeepPending",
    "Pinned",
    "Policy",
    "RetentionPlan",
    "RollbackChoice",
    "choose_rollback",
    "plan",
]
