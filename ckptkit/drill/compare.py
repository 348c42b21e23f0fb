"""The drill's checks: twin, exposure and continuity, as pure functions over step records.

Records are the Recorder's JSONL dicts (``step``, ``loss``, ``grad_norm``, ``lr``,
``loss_scale``, ``opt_step``, ``rng``, ``batch_hash``, ``sample_ids`` ...). Each check returns
a :class:`CheckResult`: a verdict, a statistic, the threshold it was held to, and a detail
dict saying what differed first and where.

* **twin**: resumed vs reference step by step over ``W+1..W+N``: bitwise equal where the run
  is deterministic; numeric fields within ``noise_factor`` x the measured run-to-run noise
  where it is not (``--repeat``). The inputs of a step (:data:`EXACT_FIELDS`) are always
  bitwise: reference runs that disagree on one fail the check ("not deterministic").
* **exposure**: the (epoch, sample id, content hash) sequence after the resume equals the
  reference's: replayed, skipped, unexpected and changed samples are counted. Without
  sample ids it stands on the records' ``rows`` (a hash per batch row,
  :func:`ckptkit.signals.observe.row_hashes`): rows the reference saw at other positions are a
  data-order fault, rows it never saw are content (:func:`row_evidence`).
* **continuity**: what the checkpoint recorded for the next step (its manifest's
  ``lookahead``, else the component summaries) is what the resumed run's first step does;
  no (epoch, id) of the pre-save window is seen again. Needs no reference.
* **end_state**: the checkpoints both runs save after the stop step, compared component by
  component and tensor by tensor (:func:`ckptkit.verify.statediff.diff`): state that does not feed
  back into training inside the window (an EMA, a scheduler whose next milestone lies
  beyond it) differs there even when every step record agrees.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckptkit._jsonval import encode_float
from ckptkit.checkpoint import manifest_io
from ckptkit.format import manifest as mf
from ckptkit.format.records import LookAhead
from ckptkit.verify.foreign.adopted import adopted_path
from ckptkit.verify.statediff import StateDiff, TensorDiff
from ckptkit.verify.statediff import diff as state_diff

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


def _num(v: Any) -> float | None:
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
    fa, fb = _num(a), _num(b)
    if fa is not None and fb is not None:
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        if fa == fb:
            return True
        return tol > 0 and abs(fa - fb) <= tol
    return a == b


def _absdiff(a: Any, b: Any) -> float | None:
    fa, fb = _num(a), _num(b)
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
                    out.append((_key(s[0]), _key(s[1]), _key(s[2])))
                elif len(s) == 2:
                    out.append((_key(s[0]), _key(s[1]), h))
                elif len(s) == 1:
                    out.append((epoch, _key(s[0]), h))
            else:
                out.append((epoch, _key(s), h))
    return out


def _key(v: Any) -> Any:
    return tuple(_key(x) for x in v) if isinstance(v, list | tuple) else v


def _bare_id(x: Any) -> Any:
    """The sample id of a record entry: a bare id, or the id of an [epoch, id, hash] entry."""
    if isinstance(x, list | tuple):
        return x[1] if len(x) >= 2 else (x[0] if x else None)
    return x


_GUARD_KEYS = ("next_step", "lr", "loss_scale", "opt_step", "rng")
"""Look-ahead facts the automatic resume guard records (``lookahead["guard"]``)."""
_RNG_V = 2
"""The fingerprint version step records carry (:data:`ckptkit.signals.rngtrace.FINGERPRINT_VERSION`)."""


# -------------------------------------------------------------------------- noise floor


def noise_floor(
    references: Sequence[Sequence[Record]],
    *,
    start: int,
    stop: int,
    finals: Sequence[str | None] = (),
) -> NoiseFloor:
    """Measure how much reference runs of the same command differ over ``start < step <= stop``.

    Args:
        references: the records of each reference run (run 0 is the one compared with).
        start: the save step ``W``.
        stop: the last step ``W + N``.
        finals: each run's final parameter hash, if known.

    Example:
        >>> a = [{"step": 1, "loss": 1.0, "lr": 0.1}]
        >>> b = [{"step": 1, "loss": 1.5, "lr": 0.1}]
        >>> nf = noise_floor([a, b], start=0, stop=1)
        >>> nf.numeric["loss"], nf.noisy
        (0.5, ['loss'])
    """
    nf = NoiseFloor(runs=len(references))
    if len(references) < 2:
        return nf
    base = window(references[0], start, stop)
    noisy: set[str] = set()
    for other in references[1:]:
        rows = window(other, start, stop)
        if [r.get("step") for r in rows] != [r.get("step") for r in base]:
            noisy.add("step")
        for a, b in zip(base, rows, strict=False):
            for f in TWIN_FIELDS:
                if f not in a and f not in b:
                    continue
                if not same(a.get(f), b.get(f)):
                    noisy.add(f)
                d = _absdiff(a.get(f), b.get(f))
                # A NaN/inf in one run only gives an infinite difference: that says the
                # field is noisy (marked above), not that any value is within the noise.
                if f in NUMERIC_FIELDS and d is not None and math.isfinite(d):
                    nf.numeric[f] = max(nf.numeric.get(f, 0.0), d)
    known = [h for h in finals if h is not None]
    if len(set(known)) > 1:
        noisy.add("param_hash")
    for f in NUMERIC_FIELDS:
        if any(f in r for r in base):
            nf.numeric.setdefault(f, 0.0)
    nf.noisy = sorted(noisy)
    return nf


def control_noise(
    base: NoiseFloor,
    resumed: Sequence[Record],
    controls: Sequence[Sequence[Record]],
    *,
    start: int,
    stop: int,
    finals: tuple[str | None, Sequence[str | None]] = (None, ()),
    states: Sequence[bool] = (),
) -> NoiseFloor:
    """Measure the noise where the resumed run lives: control runs restored from the same
    step-``W`` checkpoint, compared with the resumed run step by step.

    Args:
        base: the fresh references' noise floor (:func:`noise_floor`); its noisy fields
            become ``reference_noisy`` (they inform, never widen a tolerance).
        resumed: the resumed run's records.
        controls: each control run's records.
        start: the save step ``W``.
        stop: the last step ``W + N``.
        finals: the resumed run's final parameter hash and each control's.
        states: per control, whether its final checkpoint differs from the resumed run's
            (:func:`states_differ`): noise that no step record shows (float32 records
            round a 1e-7 relative noise away) still makes the run not bitwise.

    Returns:
        A :class:`NoiseFloor` with ``source="control"``: ``noisy`` lists the fields a control
        and the resumed run disagree on, ``per_step`` the envelope (:data:`LOOKAHEAD`) of
        their largest difference per numeric field.

    Example:
        >>> res = [{"step": s, "loss": 1.0 + 1e-4 * (s - 2)} for s in (3, 4)]
        >>> ctl = [{"step": s, "loss": 1.0} for s in (3, 4)]
        >>> nf = control_noise(NoiseFloor(runs=1), res, [ctl], start=2, stop=4)
        >>> nf.noisy, [round(x, 6) for x in nf.per_step["loss"]]
        (['loss'], [0.0002, 0.0002])
    """
    nf = NoiseFloor(runs=base.runs, source="control", controls=len(controls),
                    reference_noisy=list(base.noisy), generators=list(base.generators))
    runs = [window(resumed, start, stop), *(window(c, start, stop) for c in controls)]
    noisy: set[str] = set()
    diffs: dict[str, list[float]] = {}
    steps = max((len(rows) for rows in runs[1:]), default=0)
    # Every pair of restores (the resumed run and each control, and the controls with each
    # other): with two controls, three differences per step instead of two.
    for one, other in itertools.combinations(runs, 2):
        for i, (a, b) in enumerate(zip(one, other, strict=False)):
            for f in TWIN_FIELDS:
                if f not in a and f not in b:
                    continue
                if not same(a.get(f), b.get(f)):
                    noisy.add(f)
                if f not in NUMERIC_FIELDS:
                    continue
                d = _absdiff(a.get(f), b.get(f))
                col = diffs.setdefault(f, [])
                col.extend([0.0] * (i + 1 - len(col)))
                col[i] = max(col[i], d if d is not None else 0.0)
                scale = max(1.0, abs(_num(a.get(f)) or 0.0))
                if i == 0 and f == "loss" and d is not None and d > FIRST_STEP_REL * scale:
                    nf.unreproducible[f] = (
                        f"two restores of the step-{start} checkpoint differ by {d:.3g} in "
                        f"{f} at their first step, computed from the same state and batch: "
                        "the restore itself is random (a layer or buffer re-initialised after "
                        "the restore?), so the drill cannot tell noise from a fault")
    resumed_hash, control_hashes = finals
    if any(h is not None and h != resumed_hash for h in control_hashes):
        noisy.add("param_hash")
    if any(states):
        noisy.add("state")
    nf.control_steps = steps
    nf.noisy = sorted(noisy)
    for f, col in diffs.items():
        finite = [x for x in col if math.isfinite(x)]
        nf.numeric[f] = max(finite, default=0.0)
        nf.per_step[f] = _envelope(col, LOOKAHEAD)
    if not noisy:
        nf.per_step = {}
        nf.action = (f"{len(controls)} control run(s) restored from step {start} matched the "
                     f"resumed run bitwise over {steps} step(s)"
                     + (" and in their final state" if states else "")
                     + ": the run is deterministic, so the checks are bitwise")
    else:
        nf.action = (f"the run is not bitwise reproducible ({', '.join(nf.noisy)} differ between "
                     f"two restores of the step-{start} checkpoint): measured the noise with "
                     f"{len(controls)} control run(s) from step {start} over {steps} step(s); "
                     f"numeric fields are held to {DEFAULT_NOISE_FACTOR:g} x that noise per "
                     f"step (at least {FLOOR_ULPS} float32 ulps), inputs of a step stay bitwise")
    inputs = [f for f in base.noisy if f in EXACT_FIELDS]
    if inputs or base.generators:
        gens = "; ".join(f"{g['why']} (fix: {g['fix']})" for g in base.generators)
        nf.action += (f". Fresh reference runs differ in {', '.join(inputs or base.noisy)}"
                      + (f": {gens}" if gens else "")
                      + ". The script does not reproduce itself from scratch; the resume does "
                      "not need it to (it restores every generator), so this only informs")
    return nf


_GENERATOR_FIXES: dict[str, tuple[str, str]] = {
    "python": ("Python's `random` is not seeded by the script",
               "call random.seed(SEED) at the start of the script"),
    "numpy": ("NumPy's global RNG (np.random) is not seeded by the script",
              "call np.random.seed(SEED) at the start of the script"),
    "torch_cpu": ("torch's CPU generator is not seeded by the script",
                  "call torch.manual_seed(SEED) at the start of the script"),
    "cuda": ("the CUDA generators are not seeded by the script",
             "call torch.manual_seed(SEED) (it seeds every CUDA device too)"),
}
"""What a generator that differs between fresh starts says about the script, and the fix."""


def differing_generators(a: Path, b: Path) -> list[dict[str, str]]:
    """The generators whose state differs between two checkpoints of the same step written
    by two fresh runs of one script: each one the script does not seed.

    Returns:
        ``[{"name", "why", "fix"}]`` in a fixed order (Python, NumPy, torch, CUDA, named
        NumPy generators); empty when the RNG states agree or cannot be read.

    Example:
        >>> differing_generators(Path("/nonexistent/a"), Path("/nonexistent/b"))
        []
    """
    try:
        sd = state_diff(a, b)
    except Exception:
        return []
    found: list[str] = []
    for c in sd.components:
        if c.name != "rng":
            continue
        paths = [v.path for v in c.values if not v.equal]
        for path in [*paths, *(t.path for t in c.tensors if not t.equal)]:
            parts = path.split("/")
            gen = parts[1] if len(parts) > 1 and parts[0].startswith("rank") else parts[0]
            if gen == "numpy_generators" and len(parts) > 2:
                gen = f"numpy_generators/{parts[2]}"
            if gen not in found and gen not in ("rank", "world_size"):
                found.append(gen)
    order = list(_GENERATOR_FIXES)
    out = []
    for gen in sorted(found, key=lambda g: order.index(g) if g in order else len(order)):
        why, fix = _GENERATOR_FIXES.get(gen, (
            f"the NumPy generator {gen.split('/', 1)[-1]!r} is not seeded by the script",
            "create it with np.random.default_rng(SEED)"))
        out.append({"name": gen, "why": why, "fix": fix})
    return out


def states_differ(a: Path | None, b: Path | None, *, roots: tuple[str, str] | None = None
                  ) -> bool:
    """Whether two final checkpoints hold different state (any tensor or value not bitwise,
    the run's own records and clock readings aside); False when one is missing.

    Example:
        >>> states_differ(None, None)
        False
    """
    if a is None or b is None:
        return False
    for c in state_diff(a, b, roots=roots).components:
        if c.name in RECORDS_NOT_STATE:
            continue
        if any(not t.bitwise for t in c.tensors):
            return True
        if any(not v.equal and not EVENT_COUNTERS.match(f"{c.name}/{v.path}")
               and not WALL_CLOCK.search(f"{c.name}/{v.path}") for v in c.values):
            return True
    return False


def _envelope(d: Sequence[float], lookahead: int) -> list[float]:
    """Per position, the largest value up to ``lookahead`` positions later: non-decreasing.

    Example:
        >>> _envelope([0.0, 1.0, 0.5, 3.0, 2.0], 1)
        [1.0, 1.0, 3.0, 3.0, 3.0]
    """
    prefix: list[float] = []
    for x in d:
        prefix.append(max(prefix[-1], x) if prefix else x)
    n = len(prefix)
    return [prefix[min(n - 1, i + lookahead)] for i in range(n)]


def ulp_floor(a: Any, b: Any) -> float:
    """The few-ulp floor of a tolerance: :data:`FLOOR_ULPS` float32 ulps of the larger value.

    Example:
        >>> ulp_floor(1.0, 2.0) == 4 * 2.0 * 2.0**-23
        True
    """
    fa, fb = _num(a), _num(b)
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
                note(f, i, a, b, _absdiff(a, b))
            elif (d := _absdiff(a, b)) is not None and d > 0:
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


# --------------------------------------------------------------------------- continuity


def checkpoint_facts(ckpt: str | Path) -> dict[str, Any]:
    """Read what a checkpoint recorded about the next step, from its manifest only.

    Returns:
        ``step``, ``lookahead`` (the manifest's, or None), ``lr`` (optimizer LR of group 0,
        the LR of the next step), ``loss_scale``, ``growth_factor``, ``backoff_factor``,
        ``opt_step``, ``rng`` (rank 0 fingerprint), ``sampler`` (summary) and
        ``window_records`` (the Recorder's pre-save window, if attached).

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = Path(tempfile.mkdtemp()) / "c"
        >>> _ = ckptkit.CheckpointManager(d).save(ckptkit.TrainState(model=torch.nn.Linear(1, 1), step=3))
        >>> checkpoint_facts(d / "step-00000003")["step"]
        3
    """
    m = _manifest(Path(ckpt))
    comps = m.components

    def summ(name: str) -> Mapping[str, Any]:
        c = comps.get(name)
        return c.summary if c is not None and c.present else {}

    opt, sched, scaler, rng = summ("optimizer"), summ("scheduler"), summ("scaler"), summ("rng")
    lrs = opt.get("lrs") or sched.get("last_lr") or []
    fps = rng.get("fingerprints") or {}
    window_records: list[dict[str, Any]] = []
    tree = m.tree if isinstance(m.tree, Mapping) else {}
    metrics = tree.get("metrics")
    if isinstance(metrics, Mapping) and isinstance(metrics.get("records"), list):
        window_records = [r for r in metrics["records"] if isinstance(r, dict)]
    step = m.step if m.step is not None else summ("progress").get("step")
    return {
        "step": step,
        "lookahead": dict(m.lookahead) if m.lookahead else None,
        "lr": lrs[0] if lrs else None,
        "loss_scale": scaler.get("scale") if scaler.get("enabled") else None,
        "growth_factor": scaler.get("growth_factor") or 2.0,
        "backoff_factor": scaler.get("backoff_factor") or 0.5,
        "opt_step": opt.get("step_max"),
        "rng": fps.get("rank00000") or (next(iter(fps.values())) if fps else None),
        "sampler": dict(summ("sampler")),
        "data_declared": bool(summ("data")) or ("data" in comps and comps["data"].present),
        "window_records": window_records,
    }


def _manifest(ckpt: Path) -> mf.Manifest:
    """The native manifest of ``ckpt``, else the one ``ckptkit adopt`` (or a framework
    integration) wrote beside a framework's checkpoint; an empty one for a single-file
    checkpoint nobody adopted (a plain Lightning ``.ckpt``: nothing is known)."""
    if not (ckpt / mf.MANIFEST_NAME).is_file() and adopted_path(ckpt).is_file():
        return manifest_io.read_path(adopted_path(ckpt))
    if ckpt.is_file():
        return mf.Manifest(files=(), tensors=(), tree=None, components={}, env={})
    return manifest_io.read(ckpt)


def continuity(
    facts: Mapping[str, Any],
    resumed: Sequence[Record],
    *,
    reference: Sequence[Record] | None = None,
    save_step: int | None = None,
) -> CheckResult:
    """Check the resumed run's first step against what the checkpoint recorded.

    Each fact comes from the manifest's ``lookahead`` (what the saving run was about to
    do, as the script recorded it) when it holds that key, else from the automatic resume
    guard under ``lookahead["guard"]`` (next step, LR of group 0, loss scale, optimizer
    step), else from the component summaries; ``detail.source`` names the ones used. With
    a ``reference``, a mismatch is skipped ("not comparable": the script records the fact
    in other units) only when the reference's own next step misses the checkpoint too
    *and* the resumed run shows exactly the reference's value.

    Returns:
        ``statistic`` = failed items, ``threshold`` = 0; ``detail.items`` lists each
        ``{what, checkpoint, resumed, ok}``.

    Example:
        >>> facts = {"step": 4, "lookahead": {"next_step": 5, "lr": 0.1}}
        >>> r = continuity(facts, [{"step": 5, "lr": 0.2}])
        >>> r.ok, [i["what"] for i in r.detail["items"] if not i["ok"]]
        (False, ['lr'])
    """
    if not resumed:
        return CheckResult("continuity", False, 1, 0, detail={"reason": "no resumed records"})
    first = resumed[0]
    look = LookAhead.of(facts.get("lookahead"))
    guard: Mapping[str, Any] = look.guard or {}
    # The user's own look-ahead (``mgr.save(ts, lookahead={...})``), without the automatic
    # resume-guard part the manager always adds.
    la = look.user
    step = facts.get("step") if save_step is None else save_step
    ref_next: Record | None = None
    if reference is not None and step is not None:
        nxt = [r for r in reference if r.get("step") == step + 1]
        ref_next = nxt[0] if nxt else None
    items: list[dict[str, Any]] = []
    sources: list[str] = []

    def recorded(key: str) -> Any:
        """What the checkpoint says about ``key``: user look-ahead, guard, summaries."""
        if la.get(key) is not None:
            src, value = "lookahead", la[key]
        elif key in _GUARD_KEYS and guard.get(key) is not None and (
            key != "rng" or guard.get("rng_v") == _RNG_V
        ):
            # The guard's RNG fingerprint is the one step records carry (rng_v 2) since
            # records fill themselves; an older one is in other units.
            src, value = "resume guard", guard[key]
            if key == "lr":
                value = value[0] if isinstance(value, list) and value else None
        elif key != "next_step" and facts.get(key) is not None:
            src, value = "component summaries", facts[key]
        else:
            return None
        if value is not None and src not in sources:
            sources.append(src)
        return value

    def item(
        what: str,
        expected: Any,
        got: Any,
        ok: bool | None,
        *,
        unit_check: bool = True,
        ref_ok: bool | None = None,
        ref_got: Any = None,
    ) -> None:
        if expected is None or got is None:
            return
        entry: dict[str, Any] = {"what": what, "checkpoint": expected, "resumed": got}
        # Forgiven only when the reference's own next step disagrees with the checkpoint
        # the same way: it also misses the recorded value *and* the resumed run does
        # exactly what the reference did (else the resumed run is wrong either way).
        if (
            not ok
            and unit_check
            and ref_next is not None
            and ref_ok is False
            and ref_got is not None
            and same(got, ref_got)
        ):
            entry |= {
                "ok": True,
                "skipped": True,
                "reason": "not comparable: the reference's next step does not match "
                "the checkpoint either (the script records it in other units)",
            }
        else:
            entry["ok"] = bool(ok)
        items.append(entry)

    def ref_val(key: str) -> Any:
        return ref_next.get(key) if ref_next is not None else None

    # step label
    nxt_step = recorded("next_step")
    if nxt_step is None and isinstance(step, int):
        nxt_step = step + 1
    item("step", nxt_step, first.get("step"), first.get("step") == nxt_step, unit_check=False)
    # learning rate of the next step
    lr = recorded("lr")
    item(
        "lr",
        lr,
        first.get("lr"),
        same(lr, first.get("lr")),
        ref_ok=same(lr, ref_val("lr")) if "lr" in (ref_next or {}) else None,
        ref_got=ref_val("lr"),
    )
    # loss scale: the first record's scale is after its own update (may grow or back off once)
    scale = recorded("loss_scale")
    g, bo = float(facts.get("growth_factor") or 2.0), float(facts.get("backoff_factor") or 0.5)

    def scale_ok(v: Any) -> bool:
        s = _num(scale)
        return s is not None and any(same(v, s * k) for k in (1.0, g, bo))

    item(
        "loss_scale",
        scale,
        first.get("loss_scale"),
        scale_ok(first.get("loss_scale")),
        ref_ok=scale_ok(ref_val("loss_scale")) if "loss_scale" in (ref_next or {}) else None,
        ref_got=ref_val("loss_scale"),
    )
    # optimizer step count: one more (or the same, when fp16 skipped the step)
    opt_step = recorded("opt_step")

    def opt_ok(v: Any, rec: Record | None) -> bool:
        o = _num(opt_step)
        if o is None or _num(v) is None:
            return False
        # One more after a step that stepped the optimizer; the same after one that did not
        # (a micro-batch of gradient accumulation, an fp16 overflow skipped): equal counts are
        # never a failure, the twin check sees a step taken at the wrong place.
        return _num(v) in (o, o + 1)

    item(
        "opt_step",
        opt_step,
        first.get("opt_step"),
        opt_ok(first.get("opt_step"), first),
        ref_ok=opt_ok(ref_val("opt_step"), ref_next) if "opt_step" in (ref_next or {}) else None,
        ref_got=ref_val("opt_step"),
    )
    # RNG state at the start of the next step
    rng = recorded("rng")
    item(
        "rng",
        rng,
        first.get("rng"),
        rng == first.get("rng"),
        ref_ok=(rng == ref_val("rng")) if "rng" in (ref_next or {}) else None,
        ref_got=ref_val("rng"),
    )
    # the next samples
    if (
        la.get("sample_ids") is None
        and isinstance(guard.get("sample_ids"), list)
        and isinstance(first.get("sample_ids"), list)
    ):
        # The guard's next K ids (bare) against the ids the first records show.
        want_g = [int(x) for x in guard["sample_ids"]]
        shown = [_bare_id(x) for r in resumed for x in (r.get("sample_ids") or [])]
        ref_shown = (
            [_bare_id(x) for r in reference if isinstance(r.get("step"), int)
             and isinstance(step, int) and r["step"] > step for x in (r.get("sample_ids") or [])]
            if reference is not None else []
        )
        n = min(len(want_g), len(shown))
        if n:
            if "resume guard" not in sources:
                sources.append("resume guard")
            item(
                "next_sample_ids",
                want_g[:n],
                shown[:n],
                want_g[:n] == shown[:n],
                ref_ok=(ref_shown[:n] == want_g[:n]) if len(ref_shown) >= n else None,
                ref_got=ref_shown[:n] if len(ref_shown) >= n else None,
            )
    if la.get("sample_ids") is not None and first.get("sample_ids") is not None:
        want = [_key(x) for x in la["sample_ids"]]
        got = [_key(x) for x in first["sample_ids"]]
        ref_ids = ref_val("sample_ids")
        if "lookahead" not in sources:
            sources.append("lookahead")
        item(
            "next_sample_ids",
            want,
            got,
            want == got,
            ref_ok=([_key(x) for x in ref_ids] == want) if isinstance(ref_ids, list) else None,
            ref_got=[_key(x) for x in ref_ids] if isinstance(ref_ids, list) else None,
        )
    if la.get("epoch") is not None and first.get("epoch") is not None:
        if "lookahead" not in sources:
            sources.append("lookahead")
        item(
            "epoch",
            la["epoch"],
            first["epoch"],
            la["epoch"] == first["epoch"],
            ref_ok=(la["epoch"] == ref_val("epoch")) if "epoch" in (ref_next or {}) else None,
            ref_got=ref_val("epoch"),
        )
    # no (epoch, id) of the pre-save window seen again
    pre = facts.get("window_records") or []
    if not pre and reference is not None and isinstance(step, int):
        pre = [r for r in reference if isinstance(r.get("step"), int) and r["step"] <= step]
    seen = {(e, i) for e, i, _ in samples(pre)}
    got_samples = samples(resumed)
    if seen and got_samples:
        again = [(e, i) for e, i, _ in got_samples if (e, i) in seen]
        items.append(
            {
                "what": "no_replay",
                "checkpoint": f"{len(seen)} samples before the save",
                "resumed": f"{len(again)} of them seen again",
                "ok": not again,
                **({"first_replayed": list(again[0])} if again else {}),
            }
        )
    failed = [i for i in items if not i["ok"]]
    if not items:
        return CheckResult(
            "continuity",
            True,
            None,
            0,
            skipped=True,
            detail={"reason": "the checkpoint records nothing comparable"},
        )
    return CheckResult(
        name="continuity",
        ok=not failed,
        statistic=len(failed),
        threshold=0,
        detail={
            "source": " + ".join(sources) if sources else "manifest step",
            "items": items,
            "failed": [i["what"] for i in failed],
        },
    )


# ---------------------------------------------------------------------------- end state


RECORDS_NOT_STATE = frozenset({"metrics"})
"""Components that are the run's own records (the Recorder's pre-save window, a Trainer's
``log_history``), not training state: their timestamps and windows differ between any two
runs, and the step records they hold are what the twin check compares."""

EVENT_COUNTERS = re.compile(r"\Aloops/.*_progress/(?:total|current)/(?:ready|started)\Z")
"""Lightning's loop progress counters of events a loop *began* (``ready``, ``started``):
Lightning counts them again, or not, when a process restarts inside its loops (a resume
from an end-of-epoch checkpoint leaves ``fit_loop.epoch_progress.total.ready`` one behind
the uninterrupted run's). They steer nothing; the ``processed``/``completed`` counters,
which say where training stands, are still compared."""

WALL_CLOCK = re.compile(r"(?:\A|/)health/time\Z")
"""When a stability watch's health record was taken (``StabilityWatch.health``): a clock
reading, different in any two runs; the record's level, windows and signals are compared."""


def end_state(
    references: Sequence[Path | None],
    resumed: Path | None,
    *,
    roots: Sequence[str] = (),
    thresholds: Mapping[str, float] | None = None,
    resumed_failed: str | None = None,
    controls: Sequence[Path | None] = (),
) -> CheckResult:
    """Compare the final checkpoint of the resumed run with reference 0's, every component.

    Exact (bitwise) when the reference runs' final states agree bitwise (always with one
    reference run); otherwise a tensor may differ by ``noise_factor`` x the largest
    difference the reference runs show on that same tensor, and a value the reference runs
    disagree on is not judged. A tensor or value that differs beyond that, or a component
    one final state lacks, fails the check and is named.

    Args:
        references: each reference run's final checkpoint (None: it saved none).
        resumed: the resumed run's final checkpoint (None: it saved none).
        roots: the runs' own directories, references first then the resumed one: paths
            under them compare as equal (see :func:`ckptkit.verify.statediff.diff`).
        thresholds: ``noise_factor`` (default :data:`DEFAULT_NOISE_FACTOR`).
        resumed_failed: why the resumed run failed after its last step, before its final
            checkpoint was saved (the references saved theirs): the check fails with it.
        controls: the final checkpoints of control runs restored from the same step-``W``
            checkpoint (:func:`control_noise`), passed when the run is not bitwise. The
            noise of each tensor is then how far it lies from the resumed run's (the same
            start), not how far fresh references drifted apart from step 1, and a tensor
            within :data:`FLOOR_ULPS` ulps of its dtype (relative L2) is equal. Their roots
            follow the resumed run's in ``roots``.

    Returns:
        A failed result when the resumed run failed to save its final state; a skipped,
        informational result when a final checkpoint is missing (never a pass); else ``statistic`` = components that differ, ``threshold`` = 0, and
        ``detail.different``: per component the tensors and values that differ.

    Example:
        >>> end_state([None], None).skipped
        True
    """
    ref0 = references[0] if references else None
    if resumed_failed is not None and ref0 is not None:
        return CheckResult("end_state", False, None, 0,
                           detail={"reason": resumed_failed, "different": {}})
    if ref0 is None or resumed is None:
        who = "the reference run" if ref0 is None else "the resumed run"
        return CheckResult(
            "end_state", True, None, 0, informational=True, skipped=True,
            detail={"reason": f"{who} saved no checkpoint after the stop step, so the final "
                    "states cannot be compared: save when DrillEnv.should_save(step) is True "
                    "(CKPTKIT_DRILL_SAVE_FINAL, docs/drills.md)"},
        )
    factor = float((thresholds or {}).get("noise_factor", DEFAULT_NOISE_FACTOR))
    root = list(roots)

    def pair(i: int, j: int) -> tuple[str, str] | None:
        return (root[i], root[j]) if len(root) > max(i, j) else None

    noise_t: dict[str, float] = {}
    noisy_v: set[str] = set()
    n_ref = len(references)
    ctl = [(n_ref + 1 + j, c) for j, c in enumerate(controls) if c is not None]
    # Control runs start where the resumed run starts: their distance to it is the noise.
    # Without them, fresh references (which differ from step 1: far looser).
    pairs = ([(n_ref, resumed, j, c) for j, c in ctl] if ctl
             else [(0, ref0, i, o) for i, o in enumerate(references[1:], 1) if o is not None])
    noise_rel: dict[str, float] = {}
    for i0, a, i, other in pairs:
        nd = state_diff(a, other, roots=pair(i0, i))
        for c in nd.components:
            if c.name in RECORDS_NOT_STATE:
                continue
            for t in c.tensors:
                if not t.equal:
                    noise_t[f"{c.name}/{t.path}"] = max(
                        noise_t.get(f"{c.name}/{t.path}", 0.0), _noise(t)
                    )
                    if ctl and t.rel_l2 is not None and math.isfinite(t.rel_l2):
                        noise_rel[c.name] = max(noise_rel.get(c.name, 0.0), t.rel_l2)
            noisy_v |= {f"{c.name}/{v.path}" for v in c.values if not v.equal}
    sd = state_diff(ref0, resumed, roots=pair(0, len(references)))
    # Controls are passed for a run that is not bitwise: a tensor they happen to agree on
    # bitwise may still differ by a few ulps.
    noisy = bool(noise_t or noisy_v or ctl)
    different, not_compared = _judge(sd, noise_t, noisy_v, factor,
                                     ulps=FLOOR_ULPS if ctl else 0, noise_rel=noise_rel)
    names = list(different)
    compared = [c.name for c in sd.components if c.name not in not_compared]
    mode = ("bitwise" if not noisy
            else f"within {factor:g} x the final-state differences of {len(ctl)} control "
            f"run(s) restored from the same checkpoint (at least {FLOOR_ULPS} ulps)" if ctl
            else f"within {factor:g} x the reference runs' own final-state differences")
    # State a resume restores that could not be read: it may differ, unseen.
    unseen = [c.name for c in sd.components if c.name in not_compared
              and c.name not in RECORDS_NOT_STATE and c.restored]
    blind = [n for n in ("model", "optimizer") if n in unseen]
    tail = f"; {' and '.join(blind)} not compared ({not_compared[blind[0]]})" if blind else ""
    if names:
        first = different[names[0]]
        summary = (f"final states differ in {', '.join(names)} ({names[0]}: "
                   f"{first['summary']}) while compared {mode}{tail}")
    else:
        summary = f"{len(compared)} components equal ({mode}){tail}"
    detail = {
        "reference": str(ref0),
        "resumed": str(resumed),
        "mode": mode,
        "compared": compared,
        "different": different,
        "not_compared": not_compared,
        "not_compared_state": unseen,
        "noise": {"tensors": len(noise_t), "values": sorted(noisy_v),
                  "unbounded": sorted(k for k, v in noise_t.items() if v == math.inf),
                  "source": "control" if ctl else "references"},
        "moved": _moved(different, noise_t),
        "summary": summary,
    }
    if not names and not compared:
        # Nothing of the state was read (a format diff cannot read): no evidence either way.
        why = "; ".join(f"{n}: {v}" for n, v in not_compared.items()
                        if n not in RECORDS_NOT_STATE) or "both hold no state"
        detail["reason"] = f"no component of the final states could be compared ({why})"
        return CheckResult("end_state", True, None, 0, informational=True, skipped=True,
                           detail=detail)
    return CheckResult(
        name="end_state",
        ok=not names,
        statistic=len(names),
        threshold=0,
        detail=detail,
    )


def _within_ulps(t: TensorDiff, ulps: int) -> bool:
    """Whether ``t`` differs by at most ``ulps`` units of roundoff of its dtype (relative L2).

    Example:
        >>> _within_ulps(TensorDiff("w", "changed", False, False, 1e-7, 1e-7, (2,), (2,),
        ...                         "float32", "float32"), 4)
        True
    """
    eps = _EPS.get((t.dtype_a or "").removeprefix("torch.").lower())
    if ulps <= 0 or eps is None or t.rel_l2 is None or not math.isfinite(t.rel_l2):
        return False
    return t.rel_l2 <= ulps * eps


_EPS = {"float64": 2.0**-52, "f64": 2.0**-52, "float32": 2.0**-23, "f32": 2.0**-23,
        "float16": 2.0**-10, "f16": 2.0**-10, "bfloat16": 2.0**-7, "bf16": 2.0**-7}
"""Unit roundoff spacing at 1.0 of each floating dtype (as ``torch.finfo(...).eps``)."""


def _moved(different: Mapping[str, Mapping[str, Any]], noise_t: Mapping[str, float]
           ) -> list[dict[str, Any]]:
    """The tensors that moved beyond the noise, the farthest (relative L2) first:
    ``tensor`` (``component/path``), ``max_abs``, ``rel_l2`` and ``ratio`` (``max_abs`` over
    the measured noise; None where none was measured). A weight-only fault shows here: the
    tensors it touched lie farthest from the reference."""
    out: list[dict[str, Any]] = []
    for comp, d in different.items():
        for t in d.get("tensors") or []:
            key = f"{comp}/{t['path']}"
            n = noise_t.get(key, 0.0)
            m = t.get("max_abs")
            ratio = m / n if isinstance(m, int | float) and n and math.isfinite(n) else None
            rel = t.get("rel_l2")
            out.append({"tensor": key, "max_abs": m, "rel_l2": rel, "ratio": ratio})
    return sorted(out, key=lambda x: -(x["rel_l2"] if isinstance(x["rel_l2"], int | float)
                                       else math.inf))


def _noise(t: TensorDiff) -> float:
    """How far the reference runs' copies of one tensor lie apart: its largest absolute
    difference. ``0.0`` when they differ only in bits that compare equal (``-0.0`` against
    ``0.0``, two NaN payloads): then the resumed run may differ in such bits too, and in
    nothing else. Unbounded only when no number could be computed (a dtype without CPU
    arithmetic, a shape that differs between the reference runs themselves): that
    tensor is not judged, and ``detail.noise.unbounded`` lists it.
    """
    return math.inf if t.max_abs is None else t.max_abs


def _judge(
    sd: StateDiff, noise_t: Mapping[str, float], noisy_v: set[str], factor: float,
    *, ulps: int = 0, noise_rel: Mapping[str, float] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The components of ``sd`` that differ beyond the measured noise (and beyond ``ulps``
    units of roundoff of their dtype, relative L2), and those that could not be compared
    (with why).

    ``noise_rel`` (control runs) pools the noise of a component: a tensor is also within it
    when its relative L2 difference is at most ``factor`` x the largest relative difference
    the controls show on any tensor of that component. One pair's difference on one small
    tensor is a single heavy-tailed draw; noise from ``W`` spreads over every tensor of a
    component alike, so their largest is a stable scale, and a fault confined to some
    tensors (a stale layer) still stands out by orders of magnitude."""
    rel = noise_rel or {}
    different: dict[str, dict[str, Any]] = {}
    not_compared: dict[str, str] = {}
    for c in sd.components:
        if c.name in RECORDS_NOT_STATE:
            not_compared[c.name] = "the run's step records, not state (the twin check compares them)"
            continue
        if c.status == "not-read":
            not_compared[c.name] = c.note
            continue
        if c.status != "compared":
            side = "reference" if c.status == "only-a" else "resumed run"
            different[c.name] = {"summary": f"only in the {side}'s final state",
                                 "tensors": [], "values": []}
            continue
        tensors = [
            t for t in c.changed_tensors
            if not (t.status == "changed" and t.max_abs is not None
                    and (t.max_abs <= factor * noise_t.get(f"{c.name}/{t.path}", 0.0)
                         or _within_ulps(t, ulps)
                         or (t.rel_l2 is not None and t.rel_l2 <= factor * rel.get(c.name, 0.0))))
        ]
        values = [v for v in c.changed_values if f"{c.name}/{v.path}" not in noisy_v
                  and not EVENT_COUNTERS.match(f"{c.name}/{v.path}")
                  and not WALL_CLOCK.search(f"{c.name}/{v.path}")]
        if tensors or values:
            parts = []
            if tensors:
                worst = max((t.max_abs for t in tensors if t.max_abs is not None), default=None)
                parts.append(f"{len(tensors)}/{len(c.tensors)} tensors differ"
                             + (f" (max abs {worst:.3g})" if worst is not None else ""))
            if values:
                v = values[0]
                parts.append(f"{len(values)}/{len(c.values)} values differ ({v.path}: "
                             f"{v.a!r} → {v.b!r})")
            different[c.name] = {
                "summary": ", ".join(parts),
                "tensors": [t.to_dict() for t in tensors[:20]],
                "values": [v.to_dict() for v in values[:20]],
            }
    return different, not_compared


__all__ = [
    "DEFAULT_NOISE_FACTOR",
    "EXACT_FIELDS",
    "NUMERIC_FIELDS",
    "TWIN_FIELDS",
    "CheckResult",
    "NoiseFloor",
    "RowEvidence",
    "checkpoint_facts",
    "continuity",
    "control_noise",
    "differing_generators",
    "end_state",
    "exposure",
    "jsonable",
    "noise_floor",
    "row_evidence",
    "same",
    "samples",
    "states_differ",
    "twin",
]
