"""What the checks and the resumed records say about a failed resume, gathered once for the
diagnosis (:func:`ckptkit.drill.diagnose.diagnose`).

The resume guard's findings, where the records' RNG fingerprint was taken, whether the
saving run's data fetch always drew the same, whether a GradScaler is part of the run,
and what the exposure and continuity checks saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptkit import codes
from ckptkit.drill.compare import (
    CheckResult,
    Record,
    same,
)
from ckptkit.drill.exposure import RowEvidence
from ckptkit.format.records import LookAhead

Component = Literal[
    "none",
    "progress",
    "hyperparameters",
    "scheduler",
    "scaler",
    "data-version",
    "sampler",
    "rng",
    "optimizer",
    "model",
    "unknown",
]


GUARD_COMPONENT: dict[str, Component] = {
    "progress": "progress",
    "sampler": "sampler",
    "scheduler": "scheduler",
    "scaler": "scaler",
    "optimizer": "optimizer",
    "rng": "rng",
    "model": "model",
    "data": "data-version",
    "fp8": "scaler",
}
"""Resume-guard finding components (and refusal components) as drill components."""


@dataclass
class Evidence:
    """What the checks and the resumed records say, gathered once."""

    fields: dict[str, dict[str, Any]]
    at: list[str]
    i0: int | None
    step: Any
    exposure: CheckResult | None
    continuity: CheckResult | None
    guard: dict[Component, list[str]]
    """Resume-guard findings of the resumed run: drill component -> messages."""
    rng_at: str | None
    """Where the resumed records' RNG fingerprint was taken (``data``/``forward``), or None."""
    data_declared: bool
    compared: list[str]
    saved: Record | None = None
    """The reference's record of the save step (what both runs stood on at the save)."""
    draws_fixed: bool = False
    """The saving run drew the same from the global generators between every two steps
    (one distinct ``rng_gaps`` pattern in the checkpoint's look-ahead): what a step's data
    fetch draws does not depend on which batch it fetches."""
    sampler_saved: bool | None = None
    """Whether the checkpoint holds sampler / data-loader state (None: no facts)."""
    content_hashed: bool = False
    """The resumed records' sample ids carry content hashes (exposure can see content)."""
    rows: RowEvidence | None = None
    """The batch rows' evidence (the exposure check's ``detail["rows"]``), if recorded."""
    scaler_in_run: bool = False
    """A GradScaler (or a loss scale) is part of the run: records or checkpoint carry a scale."""
    before: list[Record] = field(default_factory=list)
    """The reference's records up to the save step, oldest first (the schedule's start)."""
    ev: list[str] = field(default_factory=list)

    def first(self, f: str) -> int | None:
        return self.fields[f]["first_index"] if f in self.fields else None

    @property
    def ordinal(self) -> str:
        return _ordinal((self.i0 or 0) + 1)

    def rng_independent_of_data(self) -> bool:
        """Whether an RNG difference at the first diverging step cannot come from the data.

        The fingerprint is taken at a step's start: before the batch is fetched (``rng_at``
        ``data``), or at the first forward, after the fetch (``forward``; also assumed when
        the loop logs ``rng`` itself). After the fetch, a collate or ``__getitem__`` whose
        draws depend on the batch (random masking over the padded length, a crop of a
        variable-length sample) turns a data-order fault into an RNG difference: then the
        RNG is independent of the data only when the saving run drew the same between every
        two steps, or when the batch is recorded and equal where the RNG first differs.
        """
        if self.rng_at == "data" or self.draws_fixed:
            return True
        batch_first = self.first("batch_hash")
        if "batch_hash" not in self.compared:
            return False
        return batch_first is None or batch_first > (self.i0 or 0)

    def guard_decisive(self, comp: Component) -> bool:
        """Whether the resume guard's finding on ``comp`` is evidence of its own.

        The guard counts the draws between the restore and the first resumed step at the
        same point as the records' RNG fingerprint, so a count that differs is no more
        conclusive than the fingerprint (:meth:`rng_independent_of_data`); a generator
        re-seeded after the restore is, whatever the data did, and so are restored streams
        nothing drew from where the saving run's fetch always drew (the first batch came
        from other streams: no data difference makes a fetch draw nothing).
        """
        if comp != "rng" or "rng" not in self.fields:
            return True
        if self.rng_independent_of_data():
            return True
        return any(_reseeded(m) or _fetched_elsewhere(m) for m in self.guard.get("rng", []))

    def order_observed_same(self) -> str | None:
        """What directly shows the resumed run got the same samples in the same order.

        The sample ids of a clean exposure, or a data cursor equal at every step: observed,
        not inferred. Rows (hashes of the augmented batch) only infer order, so a row the
        reference saw elsewhere does not outweigh either. None: nothing observed it.
        """
        ran, moved, _ = self.exposure_counts()
        if ran and not moved:
            return "the same sample ids in the same order (exposure)"
        if "cursor" in self.compared and "cursor" not in self.fields:
            return "the data cursor is equal at every step"
        return None

    def guard_named(self) -> list[Component]:
        """The components the resume guard names with evidence of its own: ``model`` only
        for weights it saw change after the restore (a rebuilt model or a probe loss comes
        with other components' faults too)."""
        return [c for c in self.guard
                if (c != "model" or self.weights_changed()) and self.guard_decisive(c)]

    def weights_changed(self) -> bool:
        """The resume guard saw model parameters change between the restore and the first
        optimizer step (CK-D092): observed, not inferred from outputs."""
        return any(m.startswith(codes.D092) for m in self.guard.get("model", []))

    def exposure_counts(self) -> tuple[bool, int, int]:
        """(exposure ran, samples moved, samples with changed content)."""
        ex = self.exposure
        if ex is None or ex.skipped or ex.detail.get("basis") == "rows":
            return False, 0, 0  # no sample ids: the rows speak for themselves (_rows)
        d = ex.detail
        moved = int(d.get("replayed", 0)) + int(d.get("skipped", 0)) + int(d.get("unexpected", 0))
        changed = int(d.get("content_changed", 0))
        if not ex.ok and not moved and not changed:
            moved = 1  # reordered
        return True, moved, changed


def has_scaler(
    reference: Sequence[Record], resumed: Sequence[Record], facts: Mapping[str, Any] | None
) -> bool:
    """Whether a GradScaler is part of the run: a loss scale in the records or the checkpoint."""
    if any(r.get("loss_scale") is not None for r in (*reference, *resumed)):
        return True
    f = facts or {}
    guard = LookAhead.of(f.get("lookahead")).guard or {}
    return f.get("loss_scale") is not None or guard.get("loss_scale") is not None


def guard_findings(resumed: Sequence[Record]) -> dict[Component, list[str]]:
    out: dict[Component, list[str]] = {}
    for r in resumed:
        for g in r.get("guard") or []:
            if not isinstance(g, Mapping):
                continue
            comp = GUARD_COMPONENT.get(str(g.get("component")))
            if comp is not None:
                out.setdefault(comp, []).append(f"{g.get('code')} {g.get('message')}")
    return out


def _reseeded(message: str) -> bool:
    """Whether a guard RNG finding says a generator was re-seeded (not merely drew more).

    The guard's finding carries its explanation only as text (``rngtrace.explain``): "torch
    was re-seeded (torch.manual_seed(3))", "... re-seeded or its state replaced"; a CUDA
    generator "re-seeded or drew" cannot be told from a draw, so it does not count.
    """
    return "re-seeded" in message and "re-seeded or drew" not in message


def _fetched_elsewhere(message: str) -> bool:
    """Whether a guard RNG finding says the restored streams drew nothing where the saving
    run's data fetch always drew (the first batch came from other streams)."""
    return "nothing drew from the restored" in message


def draws_fixed(facts: Mapping[str, Any] | None) -> bool:
    """Whether the saving run drew the same between every two steps it observed.

    The resume guard's look-ahead keeps the distinct draw patterns between a step's record
    and the next step's start (``rng_gaps``, over the last few steps); one pattern means
    the data fetch draws the same whatever the batch (none at all included).
    """
    guard = LookAhead.of((facts or {}).get("lookahead")).guard or {}
    gaps = guard.get("rng_gaps")
    return isinstance(gaps, list) and len(gaps) == 1


def continuity_rng_failed(e: Evidence) -> bool:
    co = e.continuity
    if co is None:
        return False
    return any(i.get("what") == "rng" and not i.get("ok") for i in co.detail.get("items", []))


def exposure_first_step(e: Evidence) -> bool:
    """Whether the exposure's first difference lies in the first diverging step's batch."""
    ex = e.exposure
    if ex is None or ex.ok or ex.skipped:
        return False
    first = ex.detail.get("first_difference") or {}
    return isinstance(first.get("position"), int)


def schedule_restart(
    before: Sequence[Record], lr_res: Sequence[Any], differ: Sequence[int]
) -> str | None:
    """Evidence that the schedule restarted at the resume, or None.

    The resumed LRs that differ, from the first one on, are the LRs the reference used at
    the first steps of the run (its warm-up): the scheduler stepping the resumed run stands
    where a new one stands (built after the restore, or its state never loaded), whatever
    it does once the warm-up is over (a constant LR after it rejoins the reference's).
    """
    if len(differ) < 2 or differ[0] != 0:
        return None
    head = [r.get("lr") for r in sorted(before, key=lambda r: r["step"])]
    seg = list(lr_res[: differ[-1] + 1])
    if len(head) < len(seg) or not all(isinstance(x, int | float) for x in seg):
        return None
    if not all(same(a, b) for a, b in zip(seg, head, strict=False)):
        return None
    return (f"the resumed LRs of its first {len(seg)} steps are the reference's LRs at the "
            f"first {len(seg)} steps of the run ({', '.join(f'{x:.6g}' for x in seg[:4])}"
            f"{', ...' if len(seg) > 4 else ''}): the schedule restarted at the resume (a "
            "scheduler built after the restore, or its state not loaded)")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


__all__ = [
    "GUARD_COMPONENT",
    "Component",
    "Evidence",
    "continuity_rng_failed",
    "draws_fixed",
    "exposure_first_step",
    "guard_findings",
    "has_scaler",
    "schedule_restart",
]
