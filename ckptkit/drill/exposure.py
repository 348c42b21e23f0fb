"""The drill's *exposure* check: which samples the resumed run saw against the reference.

* **exposure**: the (epoch, sample id, content hash) sequence after the resume equals the
  reference's: replayed, skipped, unexpected and changed samples are counted. Without
  sample ids it stands on the records' ``rows`` (a hash per batch row,
  :func:`ckptkit.signals.observe.row_hashes`): rows the reference saw at other positions are a
  data-order fault, rows it never saw are content (:func:`row_evidence`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ckptkit.drill.compare import (
    CheckResult,
    Record,
    jsonable,
    samples,
    window,
)

# ----------------------------------------------------------------------------- exposure


def exposure(
    reference: Sequence[Record],
    resumed: Sequence[Record],
    *,
    start: int,
    stop: int,
) -> CheckResult:
    """Check that the resumed run saw exactly the samples the reference saw after the save.

    Returns:
        ``statistic`` = positions where the (epoch, id, hash) sequences differ (plus the
        length difference), ``threshold`` = 0; ``detail`` counts ``replayed`` (seen again
        although the reference saw them before the save), ``skipped`` (the reference saw
        them after the save, the resumed run never did), ``unexpected`` (other extras),
        ``content_changed`` (same epoch and id, another content hash) and ``reordered``.

    Example:
        >>> ref = [{"step": s, "sample_ids": [[0, s, "h"]]} for s in range(1, 5)]
        >>> res = [{"step": 3, "sample_ids": [[0, 1, "h"]]}, {"step": 4, "sample_ids": [[0, 2, "h"]]}]
        >>> r = exposure(ref, res, start=2, stop=4)
        >>> r.ok, r.detail["replayed"], r.detail["skipped"]
        (False, 2, 2)
    """
    pre = samples([r for r in reference if isinstance(r.get("step"), int) and r["step"] <= start])
    want = samples(window(reference, start, stop))
    got = samples(resumed)
    rows = row_evidence(reference, resumed, start=start, stop=stop)
    if not want and not got:
        if rows.recorded:
            return _row_exposure(rows)
        return CheckResult(
            "exposure", True, None, 0, skipped=True,
            detail={"reason": "no sample_ids or rows recorded"},
        )
    pre_seen = Counter((e, i) for e, i, _ in pre)
    want_c = Counter((e, i) for e, i, _ in want)
    got_c = Counter((e, i) for e, i, _ in got)
    extra = got_c - want_c
    replayed = sum(n for k, n in extra.items() if k in pre_seen)
    unexpected = sum(extra.values()) - replayed
    skipped = sum((want_c - got_c).values())
    differ = sum(1 for a, b in zip(want, got, strict=False) if a != b) + abs(len(want) - len(got))
    changed = sum(1 for a, b in zip(want, got, strict=False) if a[:2] == b[:2] and a[2] != b[2])
    first = None
    for j, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            first = {"position": j, "reference": list(a), "resumed": list(b)}
            break
    if first is None and len(want) != len(got):
        first = {"position": min(len(want), len(got)), "reference": len(want), "resumed": len(got)}
    return CheckResult(
        name="exposure",
        ok=differ == 0,
        statistic=differ,
        threshold=0,
        detail={
            "samples": {"reference": len(want), "resumed": len(got)},
            "replayed": replayed,
            "skipped": skipped,
            "unexpected": unexpected,
            "content_changed": changed,
            "reordered": differ > 0 and not extra and skipped == 0 and changed == 0,
            "first_difference": first,
            "basis": "sample_ids",
            **({"rows": rows.to_dict()} if rows.recorded else {}),
        },
    )


def _row_exposure(rows: RowEvidence) -> CheckResult:
    """The exposure check of a run that records rows but no sample ids."""
    differ = rows.moved + rows.unseen
    return CheckResult(
        name="exposure",
        ok=differ == 0,
        statistic=differ,
        threshold=0,
        detail={"basis": "rows", "rows": rows.to_dict(), "summary": rows.summary()},
    )


# --------------------------------------------------------------------------------- rows


RowVerdict = Literal["not recorded", "equal", "order", "content"]


@dataclass(frozen=True)
class RowEvidence:
    """What the resumed run's batch rows say against the reference's (no sample ids needed).

    Rows are the records' ``rows`` (:func:`ckptkit.signals.observe.row_hashes`). The i-th resumed
    record is aligned with the i-th reference record after the save (as in :func:`twin`);
    each of its rows is the reference's row at the same position (``same``), a row the
    reference saw at another position, before or after the save (``moved``: the same data
    in another order), or a row the reference never saw (``unseen``: other content, or a
    sample the reference did not reach in its steps).

    Example:
        >>> ref = [{"step": 1, "rows": ["a", "b"]}, {"step": 2, "rows": ["c", "d"]}]
        >>> row_evidence(ref, [{"step": 2, "rows": ["b", "a"]}], start=1, stop=2).verdict
        'order'
    """

    recorded: bool
    """Both runs' compared records carry rows."""
    steps: int = 0
    """Resumed steps compared."""
    differing_steps: int = 0
    """Resumed steps whose rows are not the reference's at the same position."""
    first_step: Any = None
    """The first of them (the reference's step label)."""
    same: int = 0
    """Resumed rows equal to the reference's at the same step and position."""
    moved: int = 0
    """Resumed rows the reference saw at another step or position."""
    unseen: int = 0
    """Resumed rows the reference never saw."""
    repeats: int = 0
    """Rows the reference saw at two or more steps: there a row is a function of the sample
    (no random augmentation) and the reference passed over samples again (an epoch)."""
    num_workers: int | None = None
    """The largest ``num_workers`` the resumed records carry (None: not recorded)."""
    example: dict[str, Any] | None = None
    """The first differing row: resumed step and position, and where the reference had it."""

    @property
    def verdict(self) -> RowVerdict:
        """``order`` when a differing row is one the reference saw elsewhere, ``content``
        when every differing row is new, ``equal``, or ``not recorded``."""
        if not self.recorded:
            return "not recorded"
        if not self.differing_steps:
            return "equal"
        return "order" if self.moved else "content"

    def summary(self) -> str:
        """One line for the report."""
        if not self.recorded:
            return "no rows recorded"
        return (
            f"rows: {self.differing_steps} of {self.steps} steps differ; "
            f"{self.moved} seen by the reference at other positions, {self.unseen} never "
            f"seen, {self.same} in place ({self.verdict})"
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "verdict": self.verdict,
                "steps": self.steps,
                "differing_steps": self.differing_steps,
                "first_step": self.first_step,
                "same": self.same,
                "moved": self.moved,
                "unseen": self.unseen,
                "reference_repeats": self.repeats,
                "num_workers": self.num_workers,
                "example": self.example,
            }
        )

    @classmethod
    def of(cls, detail: Mapping[str, Any] | None) -> RowEvidence | None:
        """The evidence back from a check's ``detail["rows"]`` (None when absent)."""
        d = (detail or {}).get("rows")
        if not isinstance(d, Mapping) or d.get("verdict") == "not recorded":
            return None
        return cls(
            recorded=True,
            steps=int(d.get("steps") or 0),
            differing_steps=int(d.get("differing_steps") or 0),
            first_step=d.get("first_step"),
            same=int(d.get("same") or 0),
            moved=int(d.get("moved") or 0),
            unseen=int(d.get("unseen") or 0),
            repeats=int(d.get("reference_repeats") or 0),
            num_workers=d.get("num_workers"),
            example=d.get("example"),
        )


def _rows(rec: Record) -> list[str] | None:
    rows = rec.get("rows")
    return [str(r) for r in rows] if isinstance(rows, list) else None


def row_evidence(
    reference: Sequence[Record],
    resumed: Sequence[Record],
    *,
    start: int,
    stop: int,
) -> RowEvidence:
    """Match the resumed run's batch rows against every row the reference saw.

    Args:
        reference: the reference run's records (all of them: rows before the save count,
            so a replayed epoch is found).
        resumed: the resumed run's records.
        start: the save step ``W``.
        stop: the last step ``W + N``.

    Returns:
        The counts (see :class:`RowEvidence`); ``recorded`` is False when either side's
        compared records carry no rows.

    Example:
        >>> ref = [{"step": 1, "rows": ["a", "b"]}, {"step": 2, "rows": ["c", "d"]}]
        >>> ev = row_evidence(ref, [{"step": 2, "rows": ["c", "x"]}], start=1, stop=2)
        >>> ev.verdict, ev.same, ev.unseen
        ('content', 1, 1)
    """
    ref = window(reference, start, stop)
    res = list(resumed)
    if not any(_rows(r) for r in ref) or not any(_rows(r) for r in res):
        return RowEvidence(recorded=False)
    where: dict[str, list[tuple[Any, int]]] = {}
    steps_of: dict[str, set[Any]] = {}
    for r in reference:
        step = r.get("step")
        if not isinstance(step, int) or step > stop:
            continue
        for j, h in enumerate(_rows(r) or []):
            where.setdefault(h, []).append((step, j))
            steps_of.setdefault(h, set()).add(step)
    same = moved = unseen = differing = 0
    first_step: Any = None
    example: dict[str, Any] | None = None
    steps = 0
    for i, b in enumerate(res):
        got = _rows(b)
        if got is None:
            continue
        steps += 1
        want = _rows(ref[i]) if i < len(ref) else None
        want = want or []
        step_diff = got != want
        for j, h in enumerate(got):
            if j < len(want) and want[j] == h:
                same += 1
                continue
            seen = where.get(h)
            if seen:
                moved += 1
            else:
                unseen += 1
            if example is None:
                example = {
                    "resumed": {"step": b.get("step"), "row": j, "hash": h},
                    "reference_at": [{"step": s, "row": k} for s, k in seen[:3]] if seen else [],
                }
        if step_diff:
            differing += 1
            if first_step is None:
                first_step = ref[i].get("step") if i < len(ref) else b.get("step")
    workers = [n for n in (r.get("num_workers") for r in res)
               if isinstance(n, int) and not isinstance(n, bool)]
    return RowEvidence(
        recorded=True,
        steps=steps,
        differing_steps=differing,
        first_step=first_step,
        same=same,
        moved=moved,
        unseen=unseen,
        repeats=sum(1 for s in steps_of.values() if len(s) >= 2),
        num_workers=max(workers) if workers else None,
        example=example,
    )


__all__ = [
    "RowEvidence",
    "RowVerdict",
    "exposure",
    "row_evidence",
]
