"""The drill's twin check, and what every check shares: step-record fields and windows,
tolerant equality, :class:`CheckResult` and :class:`NoiseFloor`.

Records are the Recorder's JSONL dicts (``step``, ``loss``, ``grad_norm``, ``lr``,
``loss_scale``, ``opt_step``, ``rng``, ``batch_hash``, ``sample_ids`` ...). Each check returns
a :class:`CheckResult`: a verdict, a statistic, the threshold it was held to, and a detail
dict saying what differed first and where.

* **twin**: resumed vs reference step by step over ``W+1..W+N``: bitwise equal where the run
  is deterministic; numeric fields within ``noise_factor`` x the measured run-to-run noise
  where it is not (``--repeat``). The inputs of a step (:data:`EXACT_FIELDS`) are always
  bitwise: reference runs that disagree on one fail the check ("not deterministic").

The other checks have a module each: :mod:`ckptkit.drill.exposure`,
:mod:`ckptkit.drill.continuity` and :mod:`ckptkit.drill.endstate`; the noise a twin check
is held to is measured by :mod:`ckptkit.drill.noisefloor`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckptkit._jsonval import encode_float

Record = Mapping[str, Any]

NUMERIC_FIELDS = ("loss", "grad_norm")
"""Fields compared within a tolerance when the run is not deterministic."""
EXACT_FIELDS = ("lr", "loss_scale", "scale_growth", "opt_step", "rng", "batch_hash", "cursor")
"""Fields compared bitwise (inputs to a step, and the data cursor: a difference is a
resume bug, not noise)."""
TWIN_FIELDS = NUMERIC_FIELDS + EXACT_FIELDS
DEFAULT_NOISE_FACTOR = 4.0
"""Tolerance = this x the noise measured (per step, from ``W``, by control runs)."""
LOOKAHEAD = 3
"""The noise envelope at a step is the largest difference the control runs show up to this
many steps later: one difference of a single pair is one draw of a heavy-tailed ratio, the
largest of several (still growing as the runs do) is a stable scale."""
FLOOR_ULPS = 4
"""Under noise, values that differ by at most this many float32 ulps (relative ``2**-23``)
are equal: a value two runs happen to agree on bitwise has no measured noise, yet a last-bit
difference there is noise too (an EMA one ulp apart)."""
F32_EPS = 2.0**-23
"""float32's unit roundoff spacing at 1.0, the precision of step records and most state."""
FIRST_STEP_REL = 1e-3
"""Two restores of the same checkpoint compute their first step from the same state and
batch: a loss more than this far apart (relative) there is not hardware noise but a restore
that is itself random (a re-initialised layer), and the drill says it cannot judge it."""


@dataclass
class CheckResult:
    """One named check and its verdict.

    Example:
        >>> CheckResult("twin", True, 0, 0).to_dict()["name"]
        'twin'
    """

    name: str
    ok: bool
    statistic: float | int | None
    threshold: float | int | None
    informational: bool = False
    """Reported, never fails the drill."""
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    """Nothing to compare (the script records none of the fields this check needs)."""

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "name": self.name,
                "ok": self.ok,
                "statistic": self.statistic,
                "threshold": self.threshold,
                "informational": self.informational,
                "skipped": self.skipped,
                "detail": self.detail,
            }
        )


@dataclass
class NoiseFloor:
    """How much runs of the same command differ where the resumed run is judged.

    Two sources, kept apart:

    * **control** runs (``source == "control"``): more restores of the same step-``W``
      checkpoint, compared with the resumed run over ``W+1..W+N``. They start from the state
      the resumed run starts from, so their differences are the hardware's noise from ``W``
      on, and nothing the runs did before ``W``; a restore bug that is deterministic is
      shared by them and the resumed run, so it does not widen the tolerance. ``per_step``
      holds, per numeric field, the tolerance's base at each compared step.
    * fresh **references** (``--repeat``): they say whether the script reproduces itself
      from scratch (``reference_noisy``, and ``generators`` that differ at the save); with
      control runs they inform and never widen a tolerance.

    Example:
        >>> NoiseFloor(runs=1).deterministic
        True
    """

    runs: int
    numeric: dict[str, float] = field(default_factory=dict)
    """Largest finite absolute difference per numeric field (0.0: bitwise equal)."""
    noisy: list[str] = field(default_factory=list)
    """Fields that differ between the runs the tolerance is measured on."""
    source: Literal["references", "control"] = "references"
    """What the noise was measured on: fresh reference runs, or control runs from ``W``."""
    controls: int = 0
    """Control runs from the step-``W`` checkpoint compared with the resumed run."""
    control_steps: int = 0
    """Steps after ``W`` the control runs recorded (fewer than ``N``: a short detection
    segment that found the runs bitwise)."""
    per_step: dict[str, list[float]] = field(default_factory=dict)
    """Per numeric field and compared step: the noise envelope the tolerance multiplies."""
    reference_noisy: list[str] = field(default_factory=list)
    """Fields that differ between fresh reference runs (``--repeat``), when controls judge."""
    generators: list[dict[str, str]] = field(default_factory=list)
    """Generators whose state differs between fresh reference runs at the save: ``name``,
    ``why`` and ``fix`` (the script does not seed it)."""
    unreproducible: dict[str, str] = field(default_factory=dict)
    """Fields two restores of the same checkpoint disagree on beyond any hardware noise at
    their first step (the restore itself is random): the drill cannot judge them."""
    action: str = ""
    """What the drill did to measure the noise, in one sentence (the report prints it)."""

    @property
    def measured(self) -> bool:
        return self.runs >= 2 or self.controls >= 1

    @property
    def deterministic(self) -> bool:
        return not self.noisy

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runs": self.runs,
            "measured": self.measured,
            "deterministic": self.deterministic,
            "max_abs_diff": self.numeric,
            "noisy_fields": self.noisy,
            "source": self.source,
            "controls": self.controls,
            "control_steps": self.control_steps,
            "reference_noisy_fields": self.reference_noisy,
            "generators": self.generators,
            "unreproducible": self.unreproducible,
            "action": self.action,
        }
        if self.per_step:
            out["per_step"] = self.per_step
        return jsonable(out)


# ------------------------------------------------------------------------------ helpers


def jsonable(obj: Any) -> Any:
    """Return ``obj`` as strict JSON values: non-finite floats become ``"nan"``/``"inf"``.

    Example:
        >>> jsonable({"a": float("inf"), "b": (1, Path("x"))})
        {'a': 'inf', 'b': [1, 'x']}
    """
    if isinstance(obj, float):
        return encode_float(obj)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):
        return jsonable(obj.item())
    return obj


def num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return float(v)
    return None


def same(a: Any, b: Any, tol: float = 0.0) -> bool:
    """Whether two record values agree: bitwise (``tol == 0``) or within ``tol``; NaN == NaN.

    Example:
        >>> same(float("nan"), float("nan")), same(1.0, 1.0 + 1e-12), same(1.0, 1.1, 0.2)
        (True, False, True)
    """
    fa, fb = num(a), num(b)
    if fa is not None and fb is not None:
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        if fa == fb:
            return True
        return tol > 0 and abs(fa - fb) <= tol
    return a == b


def absdiff(a: Any, b: Any) -> float | None:
    fa, fb = num(a), num(b)
    if fa is None or fb is None:
        return None
    if math.isnan(fa) and math.isnan(fb):
        return 0.0
    d = abs(fa - fb)
    return math.inf if math.isnan(d) else d


def window(records: Sequence[Record], lo: int, hi: int) -> list[Record]:
    """Records with ``lo < step <= hi``, in file order.

    Example:
        >>> [r["step"] for r in window([{"step": s} for s in range(6)], 2, 4)]
        [3, 4]
    """
    return [r for r in records if isinstance(r.get("step"), int) and lo < r["step"] <= hi]


def samples(records: Sequence[Record]) -> list[tuple[Any, Any, Any]]:
    """The (epoch, sample id, content hash) sequence the records saw, in order.

    ``sample_ids`` entries may be ``[epoch, id, hash]`` triples, ``[epoch, id]`` pairs or
    bare ids; a bare id takes the record's ``epoch`` and its ``sample_hashes`` entry.

    Example:
        >>> samples([{"epoch": 1, "sample_ids": [4, 5], "sample_hashes": ["a", "b"]}])
        [(1, 4, 'a'), (1, 5, 'b')]
    """
    out: list[tuple[Any, Any, Any]] = []
    for rec in records:
        ids = rec.get("sample_ids")
        if not isinstance(ids, list):
            continue
        epoch = rec.get("epoch")
        hashes = rec.get("sample_hashes")
        for j, s in enumerate(ids):
            h = hashes[j] if isinstance(hashes, list) and j < len(hashes) else None
            if isinstance(s, list | tuple):
                if len(s) >= 3:
                    out.append((key(s[0]), key(s[1]), key(s[2])))
                elif len(s) == 2:
                    out.append((key(s[0]), key(s[1]), h))
                elif len(s) == 1:
                    out.append((epoch, key(s[0]), h))
            else:
                out.append((epoch, key(s), h))
    return out


def key(v: Any) -> Any:
    return tuple(key(x) for x in v) if isinstance(v, list | tuple) else v


def bare_id(x: Any) -> Any:
    """The sample id of a record entry: a bare id, or the id of an [epoch, id, hash] entry."""
    if isinstance(x, list | tuple):
        return x[1] if len(x) >= 2 else (x[0] if x else None)
    return x


def ulp_floor(a: Any, b: Any) -> float:
    """The few-ulp floor of a tolerance: :data:`FLOOR_ULPS` float32 ulps of the larger value.

    Example:
        >>> ulp_floor(1.0, 2.0) == 4 * 2.0 * 2.0**-23
        True
    """
    fa, fb = num(a), num(b)
    m = max(abs(x) for x in (fa, fb) if x is not None and math.isfinite(x)) \
        if any(x is not None and math.isfinite(x) for x in (fa, fb)) else 0.0
    return FLOOR_ULPS * F32_EPS * m


# -------------------------------------------------------------------------------- twin


def twin(
    reference: Sequence[Record],
    resumed: Sequence[Record],
    *,
    start: int,
    stop: int,
    noise: NoiseFloor | None = None,
    thresholds: Mapping[str, float] | None = None,
    final: tuple[str | None, str | None] = (None, None),
) -> CheckResult:
    """Compare the resumed run with the reference step by step over ``start < step <= stop``.

    Steps are aligned by position (the i-th resumed record with the i-th reference record
    after the save), so a wrong step label is itself a difference, not a misalignment.

    Args:
        reference: the reference run's records (all of them).
        resumed: the resumed run's records.
        start: the save step ``W``.
        stop: the last step ``W + N``.
        noise: the measured noise floor (None: assume a deterministic run).
        thresholds: ``noise_factor`` and per-field absolute tolerances (``loss``,
            ``grad_norm``) overriding the measured ones.
        final: the final parameter hashes (reference, resumed), when the script reports one.

    Returns:
        ``statistic`` = number of (field, step) mismatches, ``threshold`` = 0; ``detail``
        holds ``first_divergence`` (step, fields, values), per-field ``fields`` facts, the
        tolerances and which fields were compared. ``not_judgeable`` maps each field the
        check could not judge to why (a step input the reference runs disagree on, or a
        non-finite tolerance); each counts as a failure.

    Example:
        >>> ref = [{"step": s, "loss": 1.0 / s} for s in range(1, 5)]
        >>> res = [{"step": 3, "loss": 1 / 3}, {"step": 4, "loss": 0.3}]
        >>> r = twin(ref, res, start=2, stop=4)
        >>> r.ok, r.detail["first_divergence"]["step"], r.detail["first_divergence"]["fields"]
        (False, 4, ['loss'])
    """
    noise = noise or NoiseFloor(runs=1)
    th = dict(thresholds or {})
    factor = float(th.get("noise_factor", DEFAULT_NOISE_FACTOR))
    ref = window(reference, start, stop)
    res = list(resumed)
    n = max(len(ref), len(res))
    labels_ref = [r.get("step") for r in ref]
    labels_res = [r.get("step") for r in res]

    tolerances: dict[str, float] = {}
    modes: dict[str, str] = {}
    # Measured from W by control runs (and the run is not bitwise): per step, never below
    # a few ulps. Otherwise one number per field (measured on fresh references, or given).
    stepwise = noise.source == "control" and not noise.deterministic
    per_step: dict[str, list[float]] = {}
    for f in TWIN_FIELDS:
        if f in th and f in NUMERIC_FIELDS:
            tolerances[f] = float(th[f])
        elif f in NUMERIC_FIELDS and stepwise:
            env = noise.per_step.get(f) or [0.0]
            per_step[f] = [factor * x for x in env]
            tolerances[f] = max(per_step[f])
        elif f in NUMERIC_FIELDS:
            tolerances[f] = factor * noise.numeric.get(f, 0.0)
        else:
            tolerances[f] = 0.0
        if not math.isfinite(tolerances[f]):
            modes[f] = "not judgeable (non-finite tolerance)"
        elif f in noise.noisy and f in EXACT_FIELDS and noise.source == "references":
            modes[f] = "not judgeable (differs between reference runs)"
        elif f in per_step:
            modes[f] = (f"within {factor:g} x the noise of control runs from step {start}, per "
                        f"step ({min(per_step[f]):.3g} .. {tolerances[f]:.3g}; at least "
                        f"{FLOOR_ULPS} float32 ulps)")
        else:
            modes[f] = "bitwise" if tolerances[f] == 0 else f"within {tolerances[f]:.3g}"

    def tol_at(f: str, i: int, a: Any, b: Any) -> float:
        steps = per_step.get(f)
        if steps is None:
            return tolerances[f]
        return max(steps[min(i, len(steps) - 1)], ulp_floor(a, b))

    facts: dict[str, dict[str, Any]] = {}

    def note(f: str, i: int, a: Any, b: Any, diff: float | None = None) -> None:
        fact = facts.setdefault(
            f,
            {
                "mismatches": 0,
                "first_index": i,
                "first_step": _label(labels_ref, labels_res, i),
                "reference": a,
                "resumed": b,
                "max_abs_diff": None,
            },
        )
        fact["mismatches"] += 1
        if diff is not None:
            fact["max_abs_diff"] = max(fact["max_abs_diff"] or 0.0, diff)

    for i in range(n):
        a = labels_ref[i] if i < len(ref) else None
        b = labels_res[i] if i < len(res) else None
        if a != b:
            note("step", i, a, b)
    if len(ref) != len(res):
        facts.setdefault(
            "length",
            {
                "mismatches": 1,
                "first_index": min(len(ref), len(res)),
                "first_step": _label(labels_ref, labels_res, min(len(ref), len(res))),
                "reference": len(ref),
                "resumed": len(res),
                "max_abs_diff": None,
            },
        )

    compared: list[str] = []
    missing: list[str] = []
    unjudgeable: dict[str, str] = {}
    for f in TWIN_FIELDS:
        in_ref = any(f in r for r in ref)
        in_res = any(f in r for r in res)
        if not in_ref and not in_res:
            missing.append(f)
            continue
        compared.append(f)
        if f in noise.unreproducible:
            unjudgeable[f] = noise.unreproducible[f]
            continue
        if f in EXACT_FIELDS and f in noise.noisy and noise.source == "references":
            # An input of a step is never noise: reference runs that disagree on it
            # cannot serve as a reference for it, and the drill cannot vouch for it.
            unjudgeable[f] = f"reference runs are not deterministic in {f}" + "".join(
                f"; {g['why']} (fix: {g['fix']})" for g in noise.generators if f == "rng")
            continue
        if not math.isfinite(tolerances[f]):
            unjudgeable[f] = (
                f"the {f} tolerance is {tolerances[f]} (a non-finite threshold or noise "
                f"floor): {f} cannot be judged; set a finite thresholds.{f}"
            )
            continue
        for i in range(min(len(ref), len(res))):
            a, b = ref[i].get(f), res[i].get(f)
            if f not in ref[i] and f not in res[i]:
                continue
            if not same(a, b, tol_at(f, i, a, b)):
                note(f, i, a, b, absdiff(a, b))
            elif (d := absdiff(a, b)) is not None and d > 0:
                m = facts.setdefault(f"{f}_within_tolerance", {"max_abs_diff": 0.0})
                m["max_abs_diff"] = max(m["max_abs_diff"], d)
    fa, fb = final
    if fa is not None or fb is not None:
        compared.append("param_hash")
        if "param_hash" in noise.noisy:
            who = ("restores of the same checkpoint" if noise.source == "control"
                   else "reference runs")
            modes["param_hash"] = f"not judged (differs between {who}; end_state judges the tensors)"
        elif fa != fb:
            last = max(0, min(len(ref), len(res)) - 1)
            note("param_hash", last, fa, fb)
    else:
        missing.append("param_hash")

    within = {
        k[: -len("_within_tolerance")]: v["max_abs_diff"]
        for k, v in facts.items()
        if k.endswith("_within_tolerance")
    }
    fields = {k: v for k, v in facts.items() if not k.endswith("_within_tolerance")}
    mismatches = sum(v["mismatches"] for v in fields.values())
    first: dict[str, Any] | None = None
    if fields:
        i0 = min(v["first_index"] for v in fields.values())
        names = sorted(k for k, v in fields.items() if v["first_index"] == i0)
        first = {
            "index": i0,
            "step": _label(labels_ref, labels_res, i0),
            "fields": names,
            "values": {
                k: {"reference": fields[k]["reference"], "resumed": fields[k]["resumed"]}
                for k in names
            },
        }
    return CheckResult(
        name="twin",
        ok=mismatches == 0 and not unjudgeable,
        statistic=mismatches + len(unjudgeable),
        threshold=0,
        detail={
            "first_divergence": first,
            "not_judgeable": unjudgeable,
            "fields": fields,
            "compared": compared,
            "not_recorded": missing,
            "modes": {k: v for k, v in modes.items() if k in compared},
            "tolerances": {k: v for k, v in tolerances.items() if k in compared and not v <= 0},
            "per_step_tolerances": {k: v for k, v in per_step.items() if k in compared},
            "noise": noise.action or None,
            "within_tolerance_max_abs_diff": within,
            "steps": {"reference": _span(labels_ref), "resumed": _span(labels_res)},
        },
    )


def _label(ref: Sequence[Any], res: Sequence[Any], i: int) -> Any:
    """The step a position stands for: the reference's label (it is the expected one)."""
    if i < len(ref):
        return ref[i]
    if i < len(res):
        return res[i]
    return None


def _span(labels: Sequence[Any]) -> dict[str, Any]:
    return {
        "first": labels[0] if labels else None,
        "last": labels[-1] if labels else None,
        "count": len(labels),
    }


__all__ = [
    "DEFAULT_NOISE_FACTOR",
    "EXACT_FIELDS",
    "F32_EPS",
    "FIRST_STEP_REL",
    "FLOOR_ULPS",
    "LOOKAHEAD",
    "NUMERIC_FIELDS",
    "TWIN_FIELDS",
    "CheckResult",
    "NoiseFloor",
    "Record",
    "absdiff",
    "bare_id",
    "jsonable",
    "key",
    "num",
    "same",
    "samples",
    "twin",
    "ulp_floor",
    "window",
]
