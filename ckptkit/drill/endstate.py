"""The drill's *end_state* check: the final checkpoints of both runs, compared tensor by tensor.

* **end_state**: the checkpoints both runs save after the stop step, compared component by
  component and tensor by tensor (:func:`ckptkit.verify.statediff.diff`): state that does not feed
  back into training inside the window (an EMA, a scheduler whose next milestone lies
  beyond it) differs there even when every step record agrees.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptkit.drill.compare import (
    DEFAULT_NOISE_FACTOR,
    FLOOR_ULPS,
    CheckResult,
)
from ckptkit.verify.statediff import StateDiff, TensorDiff
from ckptkit.verify.statediff import diff as state_diff

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
    "EVENT_COUNTERS",
    "RECORDS_NOT_STATE",
    "WALL_CLOCK",
    "end_state",
]
