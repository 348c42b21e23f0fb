"""How much runs of the same command differ: the noise floor a drill's twin check is held to.

The floor comes from reference repeats (:func:`noise_floor`) or, in statistical mode, from
control restores of the step-``W`` checkpoint (:func:`control_noise`); two fresh runs whose
checkpoints differ name the generators the script does not seed
(:func:`differing_generators`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

from ckptkit.drill.compare import (
    DEFAULT_NOISE_FACTOR,
    EXACT_FIELDS,
    FIRST_STEP_REL,
    FLOOR_ULPS,
    LOOKAHEAD,
    NUMERIC_FIELDS,
    TWIN_FIELDS,
    NoiseFloor,
    Record,
    absdiff,
    num,
    same,
    window,
)
from ckptkit.drill.endstate import EVENT_COUNTERS, RECORDS_NOT_STATE, WALL_CLOCK
from ckptkit.verify.statediff import diff as state_diff

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
                d = absdiff(a.get(f), b.get(f))
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
                d = absdiff(a.get(f), b.get(f))
                col = diffs.setdefault(f, [])
                col.extend([0.0] * (i + 1 - len(col)))
                col[i] = max(col[i], d if d is not None else 0.0)
                scale = max(1.0, abs(num(a.get(f)) or 0.0))
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


__all__ = [
    "control_noise",
    "differing_generators",
    "noise_floor",
    "states_differ",
]
