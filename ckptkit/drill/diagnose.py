"""Name the component a failed resume most likely broke, from which signals diverged and when.

The twin check says *which* fields first differ and at *which* resumed step; the inputs of a
step (step label, LR, loss scale, batch, RNG, optimizer step count) are judged before its
outputs (loss, grad norm, parameters), because a wrong input explains every output after it:

==============================================  ===================================
first divergence                                most likely component
==============================================  ===================================
step labels                                     progress (step counter)
LR, constant ratio to the reference             hyper-parameters (LR changed)
LR, equal to the reference shifted k steps      scheduler (off by k)
LR, otherwise                                   scheduler (not restored)
loss scale                                      scaler
batch / sample ids, same ids other content      data version
batch / sample ids                              sampler
batch equal, RNG fingerprint differs            RNG
optimizer step count                            optimizer moments
loss from the 2nd resumed step (inputs equal)   optimizer moments
loss at the 1st resumed step (inputs equal)     model (or unrecorded randomness)
==============================================  ===================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptkit.drill.compare import CheckResult, Record, jsonable, same, window

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

HINTS: dict[str, str] = {
    "none": "nothing to fix: the resume is exact",
    "progress": "the step counter is not restored: pass step=/Progress to TrainState and "
    "restore it (ckptkit.TrainState(..., step=...)); check 'ckptkit inspect CKPT' shows "
    "the progress component",
    "hyperparameters": "the resumed run uses other hyper-parameters (LR scaled by a constant): "
    "compare the launch flags/config of both runs; restore the optimizer's param_groups "
    "and the scheduler's base_lrs from the checkpoint instead of overriding them",
    "scheduler": "the LR scheduler is not saved/restored (or is stepped a different number "
    "of times): pass scheduler= to TrainState, restore it after the optimizer, and do not "
    "step it during restore",
    "scaler": "the AMP GradScaler is not saved/restored: pass scaler= to TrainState",
    "data-version": "the same sample ids now have other content: the dataset or tokenizer "
    "changed between save and resume; pin the data snapshot (TrainState(data={...}))",
    "sampler": "the data order is not resumed: use a stateful sampler "
    "(ckptkit.ResumableSampler or torchdata's StatefulDataLoader), pass it as sampler= "
    "to TrainState, and do not call set_epoch()/re-seed it after the restore",
    "rng": "the RNG state is not restored, or is re-seeded after the restore (a seed_all() "
    "call after loading): restore the RNG last and draw nothing before the first step",
    "optimizer": "the optimizer state (Adam moments, step counts) is not restored: pass "
    "optimizer= to TrainState and do not rebuild or clear the optimizer after restoring",
    "model": "the loss differs while all step inputs are equal: model weights/buffers are "
    "not fully restored, or randomness the records do not fingerprint (another generator, "
    "a CUDA RNG) differs; log rng= for every generator the step uses",
    "unknown": "compare the differing fields in the report; docs/drills.md#triage lists "
    "what each signal points to",
}
"""The triage playbook: what to look at for each component (docs/drills.md#triage)."""


@dataclass
class Diagnosis:
    """The most likely broken component and why.

    Example:
        >>> Diagnosis("none", "high").to_dict()["component"]
        'none'
    """

    component: Component
    confidence: Literal["high", "medium", "low"]
    evidence: list[str] = field(default_factory=list)
    hint: str = ""
    step: int | None = None
    """The first resumed step that diverged (None when none did)."""
    fields: list[str] = field(default_factory=list)
    """The fields that diverged first."""

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "component": self.component,
                "confidence": self.confidence,
                "evidence": self.evidence,
                "hint": self.hint or HINTS.get(self.component, ""),
                "first_divergence_step": self.step,
                "fields": self.fields,
            }
        )


def diagnose(
    reference: Sequence[Record],
    resumed: Sequence[Record],
    checks: Sequence[CheckResult],
    *,
    start: int,
    stop: int,
) -> Diagnosis:
    """Name the most likely broken component from the checks' findings.

    Args:
        reference: the reference run's records (all of them).
        resumed: the resumed run's records.
        checks: the drill's checks (``twin``, ``exposure``, ``continuity``; others ignored).
        start: the save step ``W``.
        stop: the last step ``W + N``.

    Example:
        >>> from ckptkit.drill.compare import twin
        >>> ref = [{"step": s, "lr": 0.1 * s} for s in range(1, 5)]
        >>> res = [{"step": s, "lr": 0.2 * s} for s in range(3, 5)]
        >>> d = diagnose(ref, res, [twin(ref, res, start=2, stop=4)], start=2, stop=4)
        >>> d.component, d.confidence
        ('hyperparameters', 'high')
    """
    by_name = {c.name: c for c in checks}
    tw, ex, co = by_name.get("twin"), by_name.get("exposure"), by_name.get("continuity")
    failed = [c.name for c in checks if not c.ok and not c.informational]
    if not failed:
        return Diagnosis(
            "none",
            "high",
            ["every check passed: the resumed run matches the reference"],
            HINTS["none"],
        )
    fields: dict[str, dict[str, Any]] = (tw.detail.get("fields") or {}) if tw else {}
    ref = window(reference, start, stop)
    res = list(resumed)
    ev: list[str] = []

    if not fields:
        unjudged = (tw.detail.get("not_judgeable") or {}) if tw is not None else {}
        if unjudged:
            return Diagnosis(
                "unknown",
                "low",
                [str(why) for why in unjudged.values()],
                "the reference runs disagree on an input of a step (or a tolerance is not "
                "finite), so the drill cannot judge the resume: make the script deterministic "
                "in those fields (same seeds, threads, data order) or set finite thresholds",
                fields=sorted(unjudged),
            )
        # Twin passed (or was skipped): judge from exposure / continuity alone.
        if ex is not None and not ex.ok:
            return _data(ex, None, [], ev, "medium")
        if co is not None and not co.ok:
            return _from_continuity(co)
        return Diagnosis("unknown", "low", ["a check failed without a twin divergence"])

    i0 = min(v["first_index"] for v in fields.values())
    at = sorted(k for k, v in fields.items() if v["first_index"] == i0)
    step = fields[at[0]]["first_step"]
    ordinal = _ordinal(i0 + 1)

    def first(f: str) -> int | None:
        return fields[f]["first_index"] if f in fields else None

    def d(comp: Component, conf: Literal["high", "medium", "low"]) -> Diagnosis:
        return Diagnosis(comp, conf, ev, HINTS[comp], step=step, fields=at)

    if "step" in at or ("length" in at and "step" in fields):
        f = fields["step"]
        ev.append(
            f"step labels differ from the {ordinal} resumed step: reference "
            f"{f['reference']}, resumed {f['resumed']}"
        )
        return d("progress", "high")
    if "lr" in fields and all(first("lr") <= v["first_index"] for v in fields.values()):  # type: ignore[operator]
        return _lr(ref, res, fields, ev, step, at)
    if "loss_scale" in at:
        f = fields["loss_scale"]
        ev.append(
            f"loss scale differs at step {step}: reference {f['reference']}, resumed "
            f"{f['resumed']} (LR equal)"
        )
        return d("scaler", "high")
    data_fields = {"batch_hash"} & set(at)
    ex_first = (ex.detail.get("first_difference") or {}) if ex is not None and not ex.ok else {}
    batch_known = tw is not None and "batch_hash" in (tw.detail.get("compared") or [])
    if data_fields or (ex_first and not batch_known):
        return _data(ex, step, at, ev, "high")
    if "rng" in at:
        ev.append(
            f"RNG fingerprint differs at the {ordinal} resumed step (step {step}) "
            "while LR and batch are equal"
        )
        return d("rng", "high")
    if "opt_step" in at:
        f = fields["opt_step"]
        ev.append(
            f"optimizer step count at step {step}: reference {f['reference']}, "
            f"resumed {f['resumed']} (LR, batch and RNG equal)"
        )
        return d("optimizer", "high")
    outputs = {"loss", "grad_norm", "param_hash"} & set(at)
    if outputs and i0 >= 1:
        ev.append(
            f"LR, data and RNG equal, but {', '.join(sorted(outputs))} differ from the "
            f"{ordinal} resumed step (step {step}): the first update differed"
        )
        return d("optimizer", "medium")
    if outputs:
        ev.append(
            f"{', '.join(sorted(outputs))} differ at the first resumed step (step {step}) "
            "while every recorded input is equal"
        )
        if not any("rng" in r for r in res):
            ev.append("the records carry no rng fingerprint, so RNG cannot be ruled out")
        return d("model", "low")
    ev.append(f"fields {', '.join(at)} differ first at step {step}")
    return d("unknown", "low")


def _lr(
    ref: Sequence[Record],
    res: Sequence[Record],
    fields: Mapping[str, Any],
    ev: list[str],
    step: Any,
    at: list[str],
) -> Diagnosis:
    f = fields["lr"]
    pairs = [(a.get("lr"), b.get("lr")) for a, b in zip(ref, res, strict=False)]
    nums = [
        (float(a), float(b))
        for a, b in pairs
        if isinstance(a, int | float) and isinstance(b, int | float) and a != 0
    ]
    ratios = [b / a for a, b in nums]
    at = sorted({*at, "lr"})
    if (
        ratios
        and all(math.isclose(r, ratios[0], rel_tol=1e-9) for r in ratios)
        and not math.isclose(ratios[0], 1.0, rel_tol=1e-12)
    ):
        ev.append(
            f"LR is {ratios[0]:.6g}x the reference at every resumed step "
            f"(from step {step}): a changed learning rate, not a schedule offset"
        )
        return Diagnosis(
            "hyperparameters", "high", ev, HINTS["hyperparameters"], step=step, fields=at
        )
    lr_ref = [a for a, _ in pairs]
    lr_res = [b for _, b in pairs]
    for k in (1, -1, 2, -2, 3, -3):
        shifted = [
            (lr_res[i], lr_ref[i - k]) for i in range(len(lr_res)) if 0 <= i - k < len(lr_ref)
        ]
        if len(shifted) >= 2 and all(same(x, y) for x, y in shifted):
            ev.append(
                f"resumed LR equals the reference LR {abs(k)} step(s) "
                f"{'earlier' if k > 0 else 'later'}: the scheduler is off by {k}"
            )
            return Diagnosis("scheduler", "high", ev, HINTS["scheduler"], step=step, fields=at)
    ev.append(
        f"LR differs from step {step} (reference {f['reference']}, resumed "
        f"{f['resumed']}) with no constant ratio or shift: the schedule restarted or "
        "was not restored"
    )
    return Diagnosis(
        "scheduler",
        "high" if "lr" in at else "medium",
        ev,
        HINTS["scheduler"],
        step=step,
        fields=at,
    )


def _data(
    ex: CheckResult | None,
    step: Any,
    at: list[str],
    ev: list[str],
    conf: Literal["high", "medium", "low"],
) -> Diagnosis:
    det = ex.detail if ex is not None else {}
    if ex is not None and not ex.skipped:
        ev.append(
            f"exposure: {det.get('replayed', 0)} replayed, {det.get('skipped', 0)} "
            f"skipped, {det.get('unexpected', 0)} unexpected, "
            f"{det.get('content_changed', 0)} with changed content"
        )
    if "batch_hash" in at:
        ev.insert(0, f"batch hash differs from step {step} (LR equal)")
    changed = det.get("content_changed", 0)
    moved = det.get("replayed", 0) + det.get("skipped", 0) + det.get("unexpected", 0)
    if changed and not moved:
        return Diagnosis("data-version", conf, ev, HINTS["data-version"], step=step, fields=at)
    return Diagnosis("sampler", conf, ev, HINTS["sampler"], step=step, fields=at)


_CONTINUITY_COMPONENT: dict[str, Component] = {
    "step": "progress",
    "lr": "scheduler",
    "loss_scale": "scaler",
    "opt_step": "optimizer",
    "rng": "rng",
    "next_sample_ids": "sampler",
    "epoch": "sampler",
    "no_replay": "sampler",
}


def _from_continuity(co: CheckResult) -> Diagnosis:
    failed = co.detail.get("failed") or []
    comp = _CONTINUITY_COMPONENT.get(failed[0], "unknown") if failed else "unknown"
    items = {i["what"]: i for i in co.detail.get("items", [])}
    ev = [
        f"continuity: {w} recorded {items[w]['checkpoint']!r}, resumed run shows "
        f"{items[w]['resumed']!r}"
        for w in failed
        if w in items
    ]
    return Diagnosis(comp, "medium", ev, HINTS[comp])


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


__all__ = ["HINTS", "Component", "Diagnosis", "diagnose"]
