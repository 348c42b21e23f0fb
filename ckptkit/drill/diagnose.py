"""Name the component a failed resume most likely broke, weighing every signal the drill has.

The twin check says *which* fields first differ and at *which* resumed step; the inputs of a
step (step label, LR, loss scale, batch, RNG, data cursor, optimizer step count) are judged
before its outputs (loss, grad norm, parameters), because a wrong input explains every
output after it. Other evidence then confirms, rules out or breaks a tie:

* **exposure** -- samples replayed or skipped point to the sampler; the same ids with other
  content to the data version; "0 replayed, 0 skipped, 0 changed" *rules out* both;
* **where the RNG fingerprint was taken** (``rng_at`` in records that fill themselves):
  before the batch was fetched (``data``), an RNG difference cannot come from the data, so
  it is the RNG even when the batch differs too; after it (``forward``, or a fingerprint the
  loop logs itself), augmentation or masking whose draws depend on the batch carries a data
  difference into the RNG, so it is conclusive only when the saving run's fetch always drew
  the same (one ``rng_gaps`` pattern in the look-ahead);
* **continuity** -- the first resumed step's RNG against the look-ahead saved with the
  checkpoint;
* **the resume guard's findings** the resumed run wrote into its records (``guard``):
  e.g. CK-D008 "the torch RNG was re-seeded after the restore" or CK-D004 "the GradScaler
  stepping the optimizer has growth tracker 0";
* **a refusal at restore** (the ``restore`` check): ckptkit refused the resume and said why.

Confidence is ``high`` only with evidence that excludes every other candidate: a signal
that only one component controls diverged first, or the guard named the component with
evidence of its own and the records agree (the guard's RNG draw count, taken where the
records' fingerprint is, is no more conclusive than the fingerprint). ``medium`` when one
component remains by elimination; when more remain, the component is ``unknown`` and
``candidates`` names each one nothing excluded. Measured over the fault × script × logging
table in docs/drills.md (``tools/diagnosis_table.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, Literal

from ckptkit.drill.compare import (
    CheckResult,
    Record,
    jsonable,
    same,
    samples,
    window,
)
from ckptkit.drill.evidence import (
    GUARD_COMPONENT,
    Component,
    Evidence,
    continuity_rng_failed,
    draws_fixed,
    exposure_first_step,
    guard_findings,
    has_scaler,
    schedule_restart,
)
from ckptkit.drill.exposure import RowEvidence
from ckptkit.drill.hints import ACCUM_HINT, HINTS, WEIGHTS_CHANGED_HINT, WORKERS_HINT, extra_hint

Confidence = Literal["high", "medium", "low"]


@dataclass
class Diagnosis:
    """The most likely broken component and why.

    Example:
        >>> Diagnosis("none", "high").to_dict()["component"]
        'none'
    """

    component: Component | str
    """A :data:`~ckptkit.drill.evidence.Component`, or the name of other state the end-state
    check found different (an extra of the ``TrainState`` such as ``ema``, a foreign checkpoint's part)."""
    confidence: Confidence
    evidence: list[str] = field(default_factory=list)
    hint: str = ""
    step: int | None = None
    """The first resumed step that diverged (None when none did)."""
    fields: list[str] = field(default_factory=list)
    """The fields that diverged first."""
    candidates: list[str] = field(default_factory=list)
    """With ``unknown`` (or a medium guess): the components the evidence leaves."""

    def to_dict(self) -> dict[str, Any]:
        hint = self.hint or _hint(self.component, self.candidates)
        return jsonable(
            {
                "component": self.component,
                "confidence": self.confidence,
                "candidates": self.candidates,
                "evidence": self.evidence,
                "hint": hint,
                "first_divergence_step": self.step,
                "fields": self.fields,
            }
        )


def _hint(component: str, candidates: Sequence[str]) -> str:
    """The fix for ``component``; for ``unknown``, one fix per candidate."""
    if component == "unknown" and candidates:
        return " | ".join(f"{c}: {HINTS[c]}" for c in candidates if c in HINTS)
    return HINTS.get(component, "")


def diagnose(
    reference: Sequence[Record],
    resumed: Sequence[Record],
    checks: Sequence[CheckResult],
    *,
    start: int,
    stop: int,
    facts: Mapping[str, Any] | None = None,
) -> Diagnosis:
    """Name the most likely broken component from the checks and the resumed records.

    Args:
        reference: the reference run's records (all of them).
        resumed: the resumed run's records.
        checks: the drill's checks (``restore``, ``twin``, ``exposure``, ``continuity``;
            informational ones are ignored).
        start: the save step ``W``.
        stop: the last step ``W + N``.
        facts: the checkpoint's facts (:func:`~ckptkit.drill.continuity.checkpoint_facts`),
            for whether the run declared its data identity.

    Example:
        >>> from ckptkit.drill.compare import twin
        >>> ref = [{"step": s, "lr": 0.1 * s} for s in range(1, 5)]
        >>> res = [{"step": s, "lr": 0.2 * s} for s in range(3, 5)]
        >>> d = diagnose(ref, res, [twin(ref, res, start=2, stop=4)], start=2, stop=4)
        >>> d.component, d.confidence
        ('hyperparameters', 'high')
    """
    by_name = {c.name: c for c in checks}
    failed = [c.name for c in checks if not c.ok and not c.informational]
    if not failed:
        return Diagnosis(
            "none",
            "high",
            ["every check passed: the resumed run matches the reference"],
            HINTS["none"],
        )
    refusal = by_name.get("restore")
    if refusal is not None and not refusal.ok:
        return _refused(refusal)
    tw = by_name.get("twin")
    fields: dict[str, dict[str, Any]] = (tw.detail.get("fields") or {}) if tw else {}
    e = Evidence(
        fields=fields,
        at=[],
        i0=None,
        step=None,
        exposure=by_name.get("exposure"),
        continuity=by_name.get("continuity"),
        guard=guard_findings(resumed),
        rng_at=next((str(r["rng_at"]) for r in resumed if r.get("rng_at")), None),
        data_declared=bool((facts or {}).get("data_declared")),
        compared=list((tw.detail.get("compared") or []) if tw else []),
        saved=next((r for r in reference if r.get("step") == start), None),
        draws_fixed=draws_fixed(facts),
        sampler_saved=bool((facts or {}).get("sampler")) if facts is not None else None,
        content_hashed=any(h is not None for _, _, h in samples(resumed)),
        scaler_in_run=has_scaler(reference, resumed, facts),
        before=[r for r in reference if isinstance(r.get("step"), int) and r["step"] <= start],
    )
    ex = by_name.get("exposure")
    e.rows = RowEvidence.of(ex.detail) if ex is not None else None
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
        for name in ("end_state", "artefacts"):  # the final states, then the other files
            es = by_name.get(name)
            if es is not None and not es.ok and not set(failed) & {"exposure", "continuity"}:
                return _confirm(e, _from_end_state(es))
        return _without_twin(e)
    e.i0 = min(v["first_index"] for v in fields.values())
    e.at = sorted(k for k, v in fields.items() if v["first_index"] == e.i0)
    e.step = fields[e.at[0]]["first_step"]
    ref = window(reference, start, stop)
    res = list(resumed)
    return _cite_moved(_decide(e, ref, res), by_name.get("end_state"))


def _decide(e: Evidence, ref: Sequence[Record], res: Sequence[Record]) -> Diagnosis:
    f, at = e.fields, e.at

    def d(comp: Component, conf: Confidence, candidates: Sequence[str] = ()) -> Diagnosis:
        return _confirm(e, Diagnosis(comp, conf, e.ev, _hint(comp, candidates), step=e.step,
                                     fields=at, candidates=list(candidates)))

    if "step" in at or ("length" in at and "step" in f):
        s = f["step"]
        e.ev.append(
            f"step labels differ from the {e.ordinal} resumed step: reference "
            f"{s['reference']}, resumed {s['resumed']}"
        )
        return d("progress", "high")
    if "lr" in f and all(e.first("lr") <= v["first_index"] for v in f.values()):  # type: ignore[operator]
        return _confirm(e, _lr(ref, res, f, e.ev, e.step, at, before=e.before, guard=e.guard))
    scale_fields = [k for k in ("loss_scale", "scale_growth") if k in at]
    if scale_fields:
        parts = ", ".join(f"{k} {f[k]['reference']} → {f[k]['resumed']}" for k in scale_fields)
        e.ev.append(f"GradScaler state differs at step {e.step} ({parts}) while the LR is equal")
        return d("scaler", "high")
    data_or_rng = {"batch_hash", "cursor", "rng"} & set(at)
    ran, moved, changed = e.exposure_counts()
    ex_first_step = exposure_first_step(e)
    rows_first = e.rows is not None and e.rows.differing_steps > 0 and e.rows.first_step == e.step
    if data_or_rng or rows_first or (ran and (moved or changed) and ex_first_step):
        return _data_or_rng(e, ran, moved, changed)
    if "opt_step" in at:
        return _opt_step(e, ref, res)
    outputs = {"loss", "grad_norm", "param_hash"} & set(at)
    if outputs and e.weights_changed():
        e.ev.append(f"{', '.join(sorted(outputs))} differ from step {e.step} while every "
                    "recorded input is equal, and the resume guard saw the weights change "
                    "after the restore")
        return replace(d("model", "high"), hint=WEIGHTS_CHANGED_HINT)
    if outputs and (e.i0 or 0) >= 1:
        e.ev.append(
            f"LR, data and RNG equal, but {', '.join(sorted(outputs))} differ from the "
            f"{e.ordinal} resumed step (step {e.step}): the first update differed"
        )
        if "scaler" in e.guard:
            return d("scaler", "medium", ["scaler", "optimizer"])
        return d("optimizer", "medium")
    if outputs:
        e.ev.append(
            f"{', '.join(sorted(outputs))} differ at the first resumed step (step {e.step}) "
            "while every recorded input is equal"
        )
        if "rng" not in e.compared:
            e.ev.append("the records carry no rng fingerprint, so RNG cannot be ruled out")
            return d("unknown", "low", ["model", "rng"])
        return d("model", "low")
    e.ev.append(f"fields {', '.join(at)} differ first at step {e.step}")
    return d("unknown", "low")


def _data_or_rng(e: Evidence, ran: bool, moved: int, changed: int) -> Diagnosis:
    """The batch, the data cursor or the RNG differs first: sampler, data version or RNG."""
    at = set(e.at)
    rng_diff, batch_diff, cursor_diff = "rng" in at, "batch_hash" in at, "cursor" in at
    rng_known = "rng" in e.compared

    def d(comp: Component, conf: Confidence, candidates: Sequence[str] = ()) -> Diagnosis:
        return _confirm(e, Diagnosis(comp, conf, e.ev, _hint(comp, candidates), step=e.step,
                                     fields=e.at, candidates=list(candidates)))

    if batch_diff:
        e.ev.append(f"batch hash differs from step {e.step} (LR equal)")
    if ran:
        det = e.exposure.detail if e.exposure is not None else {}
        e.ev.append(
            f"exposure: {det.get('replayed', 0)} replayed, {det.get('skipped', 0)} skipped, "
            f"{det.get('unexpected', 0)} unexpected, {det.get('content_changed', 0)} with "
            "changed content"
        )
    if ran and moved:
        return d("sampler", "high")
    if cursor_diff:
        e.ev.append(f"the data cursor (sampler/loader state_dict) differs after step {e.step}")
        return d("sampler", "high")
    if ran and changed:
        return d("data-version", "high")
    if "data-version" in e.guard:
        return d("data-version", "high")
    by_rows = _rows(e)
    if by_rows is not None:
        return by_rows
    if rng_diff:
        return _rng_or_data(e, ran, moved, changed, d)
    # The batch differs while the RNG (where recorded) and the cursor are equal.
    if ran:
        e.ev.append("same sample ids in the same order (exposure 0/0/0): the sampler is ruled "
                    "out")
        if rng_known:
            return d("data-version", "medium", ["data-version"])
        return d("unknown", "low", ["data-version", "rng"])
    cursor_known = "cursor" in e.compared
    if cursor_known and e.data_declared:
        # The cursor can be a bare batch count (a StatefulDataLoader over a plain sampler):
        # equal counts over an epoch order drawn again give other batches.
        e.ev.append("the data cursor is equal, but the run declares its data identity and the "
                    "resume guard found it unchanged: the data version is ruled out, so the "
                    "cursor does not pin the order (a batch count over a re-drawn epoch order)")
        return d("sampler", "medium", ["sampler"])
    if cursor_known:
        e.ev.append("the data cursor is equal at every step: the sampler is in the same state")
        return d("data-version", "medium", ["data-version", "sampler"])
    if e.data_declared:
        e.ev.append("the run declares its data identity and the resume guard found it "
                    "unchanged: the data version is ruled out")
        return d("sampler", "medium", ["sampler"])
    if rng_known:
        return d("unknown", "low", ["sampler", "data-version"])
    e.ev.append("the records carry no RNG fingerprint, so the RNG cannot be ruled out")
    return d("unknown", "low", ["sampler", "data-version", "rng"])


def _rng_or_data(
    e: Evidence, ran: bool, moved: int, changed: int, d: Callable[..., Diagnosis]
) -> Diagnosis:
    """The RNG fingerprint differs first (the sample ids and the cursor did not settle it).

    ``rng`` at ``high`` needs an RNG difference the data cannot have caused
    (:meth:`Evidence.rng_independent_of_data`) or a re-seed the guard saw. Otherwise each
    other candidate has to be excluded by evidence of its own: the sampler by the sample
    ids in the same order (exposure) or an equal data cursor, the data version by equal
    content hashes or a declared data identity the guard found unchanged. What is not
    excluded stays a candidate, and with more than one the component is ``unknown``.
    """
    where = {"data": "before the batch was fetched", "forward": "at the first forward "
             "(after the batch was fetched)"}.get(e.rng_at or "", "at the start of the step")
    e.ev.append(f"RNG fingerprint differs at the {e.ordinal} resumed step (step {e.step}), "
                f"taken {where}")
    if continuity_rng_failed(e):
        e.ev.append("the first resumed step's RNG differs from the look-ahead saved with "
                    "the checkpoint, while the reference's matches it")
    if e.rng_independent_of_data():
        if e.rng_at != "data" and e.draws_fixed:
            e.ev.append("the saving run drew the same between every two steps, so what the "
                        "data fetch draws does not depend on the batch")
        return d("rng", "high")
    if e.guard_decisive("rng") and "rng" in e.guard:
        return d("rng", "high")  # the guard saw a generator re-seeded after the restore
    e.ev.append("the RNG was fingerprinted after the batch was fetched and the batch differs "
                "too: draws that depend on the batch (augmentation, random masking) carry a "
                "data difference into the RNG, so the RNG difference may be a consequence")
    if "rng" in e.guard:
        e.ev.append("the resume guard's extra draws were counted at that same point: not "
                    "evidence of their own")
    remaining: list[str] = []
    sampler_out = ran and not moved
    if not sampler_out and "cursor" in e.compared and "cursor" not in e.fields:
        e.ev.append("the data cursor is equal at every step")
        sampler_out = True
    if not sampler_out:
        remaining.append("sampler")
        if e.sampler_saved is False:
            e.ev.append("the checkpoint holds no sampler or data-loader state: the data "
                        "order can only resume if the loop rebuilds it")
    remaining.append("rng")
    if ran and e.content_hashed and not changed:
        e.ev.append("the same samples have the same content hashes: the data version is "
                    "ruled out")
    elif e.data_declared:
        e.ev.append("the run declares its data identity and the resume guard found it "
                    "unchanged: the data version is ruled out")
    else:
        remaining.append("data-version")
    if remaining == ["rng"]:
        e.ev.append("same samples in the same order: the RNG difference changed the batch")
        return d("rng", "medium", ["rng"])
    return d("unknown", "low", remaining)


WORKERS_RNG = "DataLoader workers' RNG (base seed)"
"""What a content fault of a loader with workers is named after (component ``rng``)."""


def _rows(e: Evidence) -> Diagnosis | None:
    """Name order or content from the batch rows when the first diverging step's rows differ.

    Rows the reference saw at other positions are the same data in another order: the
    sampler. Rows it never saw are content: the data version, or random augmentation that
    did not repeat; with ``num_workers > 0`` and the main process's RNG equal, the workers'
    RNG. New rows say "content" only when something shows the order is the same (a clean
    exposure of ids, an equal cursor, or a reference whose rows repeat: it passed over the
    samples again and they gave the same rows); otherwise they may be samples the reference
    never reached, and both stay candidates. None: the rows do not decide (an RNG
    difference at the same step explains new content better; the RNG rules take it).
    """
    rows = e.rows
    if rows is None or rows.verdict not in ("order", "content") or rows.first_step != e.step:
        return None
    at = set(e.at)
    rng_diff, rng_known = "rng" in at, "rng" in e.compared

    def d(comp: Component, conf: Confidence, candidates: Sequence[str] = (),
          hint: str = "") -> Diagnosis:
        return _confirm(e, Diagnosis(comp, conf, e.ev, hint or _hint(comp, candidates),
                                     step=e.step, fields=e.at, candidates=list(candidates)))

    observed = e.order_observed_same()
    ran, moved, _ = e.exposure_counts()
    if observed is not None and not (ran and not moved) and rows.verdict == "order" and (
        rng_known and not rng_diff
    ):
        # A data cursor is a position, not a permutation (a sampler that is not seeded
        # keeps its position and shuffles anew); with the RNG equal at every step no
        # augmentation drew differently, so rows at other positions are a reordering.
        e.ev.append(f"{observed}, but a cursor is a position, not an order, and the RNG is "
                    "equal at every step: augmentation cannot explain rows the reference had "
                    "elsewhere")
        observed = None
    if rows.verdict == "order" and observed is None:
        e.ev.append(f"{rows.summary()}: the resumed run got data the reference also trained on, "
                    "in another order")
        if rng_diff or not rng_known:
            e.ev.append("the RNG differs at the same step (or is not recorded): a loader that "
                        "shuffles from the global RNG moves both")
            return d("sampler", "medium", ["sampler", "rng"])
        return d("sampler", "high")
    if rows.verdict == "order":
        # Observed beats inferred: ids or the cursor say the order is the same, so the rows
        # the reference had elsewhere are augmented rows that happen to repeat.
        e.ev.append(f"{rows.summary()}, but {observed}: rows only infer the order, so the "
                    f"{rows.moved} row(s) the reference had elsewhere are randomly augmented "
                    "rows that happen to repeat, not a reordering")
    if rng_diff:
        return None
    if rows.verdict == "content":
        e.ev.append(f"{rows.summary()}: the resumed run got rows the reference never saw")
    ran, _, changed = e.exposure_counts()
    cursor_same = "cursor" in e.compared and "cursor" not in e.fields
    if rows.repeats and rows.verdict == "content":
        e.ev.append(f"the reference saw {rows.repeats} rows again at later steps: its rows are a "
                    "function of the sample (no random augmentation) and it passed over the "
                    "data again, so new rows are new data")
        if ran or cursor_same:
            return d("data-version", "high")
        return d("data-version", "medium", ["data-version"])
    if not (ran or cursor_same):
        e.ev.append("nothing shows the order is the same (no sample ids, no data cursor) and "
                    "no row of the reference repeats: the new rows may be samples the "
                    "reference did not reach")
        workers = ["rng"] if (rows.num_workers or 0) > 0 else []
        return d("unknown", "low", ["data-version", "sampler", *workers])
    e.ev.append("the same sample ids in the same order" if ran
                else "the data cursor is equal at every step: the order is the same")
    if (rows.num_workers or 0) > 0:
        e.ev.append(f"{WORKERS_RNG}: the loader runs {rows.num_workers} workers and the main "
                    "process's RNG is equal, so random augmentation in the workers is the "
                    "likely source of the new rows")
        return d("rng", "medium", ["rng", "data-version"], hint=f"{WORKERS_RNG}: {WORKERS_HINT}")
    if rows.num_workers == 0 and rng_known:
        e.ev.append("the loader runs no workers and the RNG is equal at every step: random "
                    "augmentation drew the same, so the data changed")
        return d("data-version", "medium", ["data-version"])
    data_same = (ran and e.content_hashed and not changed) or e.data_declared
    if data_same and rng_known:
        e.ev.append("the same samples have the same content hashes (or a declared data identity "
                    "the resume guard found unchanged): the data version is ruled out; the main "
                    "process's RNG is equal, so randomness it does not hold changed the rows: "
                    "augmentation in DataLoader workers, or a generator of the script's own")
        return d("rng", "medium", ["rng"], hint=f"{WORKERS_RNG}: {WORKERS_HINT}")
    e.ev.append("the main process's RNG is equal and ckptkit does not see whether the loader "
                "runs workers: new content (data version) and augmentation in workers that "
                "restarted from a new base seed (rng) both fit")
    return d("unknown", "low", ["data-version", "rng"])


def _opt_step(e: Evidence, ref: Sequence[Record], res: Sequence[Record]) -> Diagnosis:
    f = e.fields["opt_step"]
    a, b = f["reference"], f["resumed"]
    e.ev.append(
        f"optimizer step count at step {e.step}: reference {a}, resumed {b} "
        "(LR, batch and RNG equal)"
    )
    i = e.i0 or 0
    if isinstance(a, int) and isinstance(b, int) and abs(a - b) == 1 and i < len(res):
        before = e.saved.get("opt_step") if e.saved is not None else None
        prev_ref = ref[i - 1].get("opt_step") if i >= 1 else before
        prev_res = res[i - 1].get("opt_step") if i >= 1 else before
        skipped = (prev_ref is not None and prev_ref == a) or (prev_res is not None
                                                               and prev_res == b)
        if skipped and e.scaler_in_run:
            e.ev.append("one run skipped the optimizer step (an fp16 overflow) where the other "
                        "did not: the loss scales differ")
            return _confirm(e, Diagnosis("scaler", "medium", e.ev, HINTS["scaler"], step=e.step,
                                         fields=e.at, candidates=["scaler", "optimizer"]))
        if skipped:
            # No GradScaler in the run, so no fp16 skip: a component absent is never named.
            accumulates = _accumulates(e.before, ref)
            if accumulates:
                e.ev.append("the run has no GradScaler, and the reference steps the optimizer "
                            "only every few steps (gradient accumulation): the resumed run "
                            "steps it at other steps, so its place in the accumulation window "
                            "(the micro-step counter) was not restored")
                return _confirm(e, Diagnosis("progress", "medium", e.ev, ACCUM_HINT,
                                             step=e.step, fields=e.at,
                                             candidates=["progress", "optimizer"]))
            e.ev.append("the run has no GradScaler (no fp16 skip): one run stepped the "
                        "optimizer where the other did not")
            return _confirm(e, Diagnosis("unknown", "low", e.ev,
                                         _hint("unknown", ["optimizer", "progress"]), step=e.step,
                                         fields=e.at, candidates=["optimizer", "progress"]))
    return _confirm(e, Diagnosis("optimizer", "high", e.ev, HINTS["optimizer"], step=e.step,
                                 fields=e.at))


def _accumulates(before: Sequence[Record], ref: Sequence[Record]) -> bool:
    """Whether the reference's optimizer step count stays put on some steps and moves on
    others with no loss scale to explain it (gradient accumulation)."""
    counts = [r.get("opt_step") for r in [*before, *ref]]
    steps = [b - a for a, b in pairwise(counts)
             if isinstance(a, int) and isinstance(b, int)]
    return 0 in steps and 1 in steps


def _cite_moved(dg: Diagnosis, es: CheckResult | None) -> Diagnosis:
    """A ``model`` named from the step records cites the model tensors the end-state check
    found beyond the noise (``detail.moved``, farthest first): under noise they show which
    weights the resume did not restore as saved."""
    if dg.component != "model" or es is None:
        return dg
    moved = [str(m["tensor"]).split("/", 1)[1] for m in es.detail.get("moved") or []
             if str(m.get("tensor", "")).startswith("model/")]
    if moved:
        dg.evidence.append("end state: model tensors beyond the noise, farthest first: "
                           + ", ".join(moved[:5]) + (" ..." if len(moved) > 5 else ""))
    return dg


def _confirm(e: Evidence, dg: Diagnosis) -> Diagnosis:
    """Weigh the resume guard's findings against the records' verdict; an RNG named with
    the guard's own finding carries, in its fix, the generator and the call the guard saw."""
    dg = _weigh_guard(e, dg)
    seen = e.guard.get("rng") or []
    if dg.component == "rng" and seen and "rng" in e.guard_named():
        dg.hint = f"the resume guard saw {seen[0]} -- {dg.hint or HINTS['rng']}"
    return dg


def _weigh_guard(e: Evidence, dg: Diagnosis) -> Diagnosis:
    named = e.guard_named()
    for comp, msgs in e.guard.items():
        for m in msgs[:1]:
            dg.evidence.append(f"resume guard ({comp}): {m}")
    if not named:
        return dg
    if dg.component in named:
        if dg.confidence != "high":
            dg.evidence.append(f"the resume guard names {dg.component} too")
            dg.confidence = "high"
            dg.candidates = []
        return dg
    if dg.component == "unknown" and len(named) == 1 and (
        not dg.candidates or named[0] in dg.candidates
    ):
        tie = named[0]
        dg.evidence.append(f"the resume guard breaks the tie: {tie}")
        return Diagnosis(tie, "medium", dg.evidence, HINTS[tie], step=dg.step,
                         fields=dg.fields, candidates=dg.candidates)
    if dg.component == "unknown":
        dg.hint = _hint("unknown", dg.candidates)
    if dg.confidence == "high" and dg.component not in ("progress", "hyperparameters"):
        # The records point one way, the guard another: say both.
        dg.confidence = "medium"
        dg.candidates = [str(c) for c in (dg.component, *named) if c][:2]
    return dg


def _without_twin(e: Evidence) -> Diagnosis:
    ran, moved, changed = e.exposure_counts()
    if ran and (moved or changed):
        comp: Component = "sampler" if moved else "data-version"
        det = e.exposure.detail if e.exposure is not None else {}
        e.ev.append(
            f"exposure: {det.get('replayed', 0)} replayed, {det.get('skipped', 0)} skipped, "
            f"{det.get('unexpected', 0)} unexpected, {det.get('content_changed', 0)} with "
            "changed content"
        )
        return _confirm(e, Diagnosis(comp, "medium", e.ev, HINTS[comp]))
    co = e.continuity
    if co is not None and not co.ok:
        return _confirm(e, _from_continuity(co))
    return _confirm(e, Diagnosis("unknown", "low", ["a check failed without a twin divergence"]))


def _refused(check: CheckResult) -> Diagnosis:
    det = check.detail
    comp: Component = GUARD_COMPONENT.get(str(det.get("component")), "unknown")
    ev = [f"ckptkit refused the resume at restore: {det.get('error')}: {det.get('message')}"]
    conf: Confidence = "high" if comp != "unknown" else "low"
    hint = (f"{det.get('message')} -- {HINTS[comp]}" if comp != "unknown"
            else str(det.get("message")))
    return Diagnosis(comp, conf, ev, hint, fields=["restore"])


def _lr(
    ref: Sequence[Record],
    res: Sequence[Record],
    fields: Mapping[str, Any],
    ev: list[str],
    step: Any,
    at: list[str],
    *,
    before: Sequence[Record] = (),
    guard: Mapping[Component, list[str]] | None = None,
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
    o = fields.get("opt_step")
    if (o is not None and o["first_index"] == f["first_index"]
            and isinstance(o["resumed"], int) and isinstance(o["reference"], int)
            and o["resumed"] <= 1 < o["reference"]):
        # Step count and schedule restarted together: no optimizer state came back, and
        # the scheduler with it (a Trainer without optimizer.pt skips scheduler.pt too).
        ev.append(
            f"LR differs from step {step} (reference {f['reference']}, resumed "
            f"{f['resumed']}) and the optimizer step count restarted with it (reference "
            f"{o['reference']}, resumed {o['resumed']}): the optimizer state was not "
            "restored, and the scheduler with it"
        )
        return Diagnosis("optimizer", "medium", ev, _hint("unknown", ["optimizer", "scheduler"]),
                         step=step, fields=sorted({*at, "opt_step"}),
                         candidates=["optimizer", "scheduler"])
    differ = [i for i, (a, b) in enumerate(pairs) if not same(a, b)]
    restart = schedule_restart(before, lr_res, differ)
    if restart is not None:
        ev.append(restart)
        return Diagnosis("scheduler", "high", ev, HINTS["scheduler"], step=step, fields=at)
    moved = [m for m in (guard or {}).get("scheduler", []) if "scheduler position" in m]
    if differ and differ[-1] < len(pairs) - 1 and moved:
        ev.append(f"LR differs from step {step} (reference {f['reference']}, resumed "
                  f"{f['resumed']}), and the resume guard saw the scheduler's position differ "
                  "from the checkpoint's: the schedule, not a hand-set LR")
        return Diagnosis("scheduler", "high", ev, HINTS["scheduler"], step=step, fields=at)
    if differ and differ[-1] < len(pairs) - 1:
        # The LR is back on the reference's schedule for the last steps: the scheduler's
        # state was right (a restarted or shifted schedule stays off), so the LR was set by
        # hand after the restore and the scheduler's next step overwrote it.
        back = ref[differ[-1] + 1].get("step") if differ[-1] + 1 < len(ref) else None
        ev.append(
            f"LR differs from step {step} (reference {f['reference']}, resumed "
            f"{f['resumed']}) but equals the reference again from step {back}: the "
            "schedule is intact, the LR was overridden after the restore"
        )
        return Diagnosis("hyperparameters", "medium", ev,
                         _hint("unknown", ["hyperparameters", "scheduler"]), step=step,
                         fields=at, candidates=["hyperparameters", "scheduler"])
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


_END_STATE_ORDER: tuple[str, ...] = (
    "progress", "scheduler", "scaler", "fp8", "sampler", "data", "rng", "optimizer", "model",
)
"""Built-in components in the order a difference in one explains a difference in the next."""


def _from_end_state(es: CheckResult) -> Diagnosis:
    """Every step record agreed, but the final states differ: name what differs there.

    One component alone differing, with every other component of the state compared
    tensor by tensor, is evidence that excludes the others: ``high``. When some state
    could not be compared (``detail.not_compared_state``: the run's own records and files
    no resume loads aside), it may differ too and be the cause: ``medium``, with it among
    the candidates. Several differing: ``unknown`` with them as candidates, upstream first
    (a scheduler before the optimizer, the optimizer before the model).
    """
    different: Mapping[str, Any] = es.detail.get("different") or {}
    unseen = list(es.detail.get("not_compared_state") or [])
    names = sorted(different, key=lambda n: (
        _END_STATE_ORDER.index(n) if n in _END_STATE_ORDER else len(_END_STATE_ORDER), n))
    comps = [GUARD_COMPONENT.get(n, n) for n in names]
    if not different:
        why = str(es.detail.get("reason") or "the final states could not be compared")
        return Diagnosis("unknown", "low", ["every step record agrees", why],
                         "run the resumed command by hand from the checkpoint and read why its "
                         "final save failed (ckptkit verify names what the state holds)",
                         fields=["end_state"])
    what = ("the checkpoints both runs saved after the stop step" if es.name == "end_state"
            else "the files both runs wrote in their checkpoint directories")
    ev = [f"every step record agrees, yet {what} differ (compared {es.detail.get('mode')})"]
    ev += [f"{es.name.replace('_', ' ')}: {n}: {different[n].get('summary')}" for n in names]
    fields = [f"{es.name}:{n}" for n in names]
    candidates = list(dict.fromkeys([*comps, *(GUARD_COMPONENT.get(n, n) for n in unseen)]))
    if unseen:
        ev.append(f"not compared, so not ruled out: {', '.join(unseen)}")
    if len(comps) == 1:
        comp = comps[0]
        hint = HINTS.get(comp) or extra_hint(comp)
        if not unseen:
            return Diagnosis(comp, "high", ev, hint, fields=fields)
        return Diagnosis(comp, "medium", ev, hint, fields=fields, candidates=candidates)
    hint = " | ".join(f"{c}: {HINTS.get(c) or extra_hint(c)}" for c in comps)
    return Diagnosis("unknown", "low", ev, hint, fields=fields, candidates=candidates)


__all__ = ["Diagnosis", "diagnose"]
