"""The drill's *continuity* check: what the checkpoint recorded for the next step, against
what the resumed run's first step does.

* **continuity**: what the checkpoint recorded for the next step (its manifest's
  ``lookahead``, else the component summaries) is what the resumed run's first step does;
  no (epoch, id) of the pre-save window is seen again. Needs no reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptkit.checkpoint import manifest_io
from ckptkit.drill.compare import (
    CheckResult,
    Record,
    bare_id,
    key,
    num,
    same,
    samples,
)
from ckptkit.format import manifest as mf
from ckptkit.format.records import LookAhead
from ckptkit.verify.foreign.adopted import adopted_path

_GUARD_KEYS = ("next_step", "lr", "loss_scale", "opt_step", "rng")
"""Look-ahead facts the automatic resume guard records (``lookahead["guard"]``)."""
_RNG_V = 2
"""The fingerprint version step records carry (:data:`ckptkit.signals.rngtrace.FINGERPRINT_VERSION`)."""


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
        s = num(scale)
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
        o = num(opt_step)
        if o is None or num(v) is None:
            return False
        # One more after a step that stepped the optimizer; the same after one that did not
        # (a micro-batch of gradient accumulation, an fp16 overflow skipped): equal counts are
        # never a failure, the twin check sees a step taken at the wrong place.
        return num(v) in (o, o + 1)

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
        shown = [bare_id(x) for r in resumed for x in (r.get("sample_ids") or [])]
        ref_shown = (
            [bare_id(x) for r in reference if isinstance(r.get("step"), int)
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
        want = [key(x) for x in la["sample_ids"]]
        got = [key(x) for x in first["sample_ids"]]
        ref_ids = ref_val("sample_ids")
        if "lookahead" not in sources:
            sources.append("lookahead")
        item(
            "next_sample_ids",
            want,
            got,
            want == got,
            ref_ok=([key(x) for x in ref_ids] == want) if isinstance(ref_ids, list) else None,
            ref_got=[key(x) for x in ref_ids] if isinstance(ref_ids, list) else None,
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


__all__ = [
    "checkpoint_facts",
    "continuity",
]
