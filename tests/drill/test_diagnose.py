"""The diagnosis weighs every signal and says "unknown" with the candidates when unsure."""

from __future__ import annotations

from typing import Any

from ckptkit.drill.compare import CheckResult, twin
from ckptkit.drill.diagnose import diagnose
from ckptkit.drill.exposure import exposure

W, N = 4, 4


def recs(first: int = 1, last: int = W + N, **over: Any) -> list[dict[str, Any]]:
    """Records with every auto field; ``over`` maps a field to {step: value} overrides."""
    out = []
    for s in range(first, last + 1):
        r = {"step": s, "loss": 1.0 / s, "lr": 0.1, "opt_step": s, "rng": f"r{s}",
             "rng_at": "data", "batch_hash": f"b{s}", "cursor": f"c{s}"}
        for k, vals in over.items():
            if s in vals:
                if vals[s] is None:
                    r.pop(k, None)
                else:
                    r[k] = vals[s]
        out.append(r)
    return out


def checks(ref: list[dict[str, Any]], res: list[dict[str, Any]]) -> list[CheckResult]:
    return [twin(ref, res, start=W, stop=W + N), exposure(ref, res, start=W, stop=W + N)]


def dg(ref: list[dict[str, Any]], res: list[dict[str, Any]], **kw: Any) -> Any:
    return diagnose(ref, res, checks(ref, res), start=W, stop=W + N, **kw)


def test_rng_fingerprinted_before_the_batch_is_rng_even_when_the_batch_differs() -> None:
    ref = recs()
    res = recs(W + 1, rng={5: "x"}, batch_hash={5: "y"}, loss={5: 9.0})
    d = dg(ref, res)
    assert (d.component, d.confidence) == ("rng", "high")


def test_after_the_batch_rng_and_batch_alone_are_not_conclusive() -> None:
    ref = recs(rng_at={s: "forward" for s in range(1, 9)}, cursor={s: None for s in range(9)})
    res = recs(W + 1, rng_at={s: "forward" for s in range(5, 9)}, rng={5: "x"},
               batch_hash={5: "y"}, cursor={s: None for s in range(9)})
    d = dg(ref, res)
    # No sample ids, no cursor, no declared data identity: nothing excludes any of the three.
    assert d.component == "unknown" and d.candidates == ["sampler", "rng", "data-version"]
    guarded = recs(W + 1, rng_at={s: "forward" for s in range(5, 9)}, rng={5: "x"},
                   batch_hash={5: "y"}, cursor={s: None for s in range(9)},
                   guard={5: [{"code": "CK-D008", "component": "rng", "message": "re-seeded"}]})
    d = dg(ref, guarded)
    assert (d.component, d.confidence) == ("rng", "high")  # the guard saw the re-seed


def test_exposure_zero_rules_out_the_sampler() -> None:
    ids = {s: [[0, s, "h"]] for s in range(1, 9)}
    ref = recs(sample_ids=ids, rng_at={s: "forward" for s in range(1, 9)})
    res = recs(W + 1, sample_ids=ids, rng_at={s: "forward" for s in range(5, 9)},
               rng={5: "x"}, batch_hash={5: "y"})
    d = dg(ref, res)
    assert d.component == "rng" and d.confidence == "medium"  # augmentation randomness
    moved = recs(W + 1, sample_ids={**ids, 5: [[0, 1, "h"]]}, batch_hash={5: "y"})
    assert dg(ref, moved).component == "sampler"


def test_a_cursor_that_differs_is_the_sampler_and_an_equal_one_points_to_the_data() -> None:
    ref = recs()
    assert dg(ref, recs(W + 1, cursor={5: "z"}, batch_hash={5: "y"})).component == "sampler"
    d = dg(ref, recs(W + 1, batch_hash={5: "y"}))
    assert (d.component, d.confidence) == ("data-version", "medium")


def test_without_ids_or_cursor_the_batch_leaves_two_candidates() -> None:
    nocur = {s: None for s in range(9)}
    ref = recs(cursor=nocur)
    res = recs(W + 1, cursor=nocur, batch_hash={5: "y"})
    d = dg(ref, res)
    assert d.component == "unknown" and set(d.candidates) == {"sampler", "data-version"}
    assert " | " in d.to_dict()["hint"]  # a fix for each candidate
    d = dg(ref, res, facts={"data_declared": True})  # data pinned and not changed: sampler
    assert (d.component, d.confidence) == ("sampler", "medium")


def test_growth_tracker_alone_names_the_scaler() -> None:
    ref = recs(scale_growth={s: s for s in range(1, 9)})
    res = recs(W + 1, scale_growth={s: s - W for s in range(5, 9)})
    d = dg(ref, res)
    assert (d.component, d.confidence) == ("scaler", "high")


def test_a_skipped_fp16_step_is_the_scaler_a_reset_count_the_optimizer() -> None:
    scale = {s: 256.0 for s in range(1, W + N + 1)}
    ref = recs(loss_scale=scale)
    skip = recs(W + 1, opt_step={5: 4, 6: 5, 7: 6, 8: 7}, loss_scale=scale)
    d = dg(ref, skip)
    assert d.component == "scaler" and d.candidates == ["scaler", "optimizer"]
    reset = recs(W + 1, opt_step={5: 1, 6: 2, 7: 3, 8: 4}, loss_scale=scale)
    assert (dg(ref, reset).component, dg(ref, reset).confidence) == ("optimizer", "high")


def test_a_guard_that_disagrees_with_the_records_lowers_the_confidence() -> None:
    ref = recs()
    res = recs(W + 1, cursor={5: "z"}, batch_hash={5: "y"},
               guard={5: [{"code": "CK-D006", "component": "rng", "message": "m"}]})
    d = dg(ref, res)
    assert (d.component, d.confidence) == ("sampler", "medium")
    assert d.candidates == ["sampler", "rng"]


def test_a_refusal_at_restore_is_the_diagnosis() -> None:
    refusal = CheckResult("restore", False, 1, 0, detail={
        "error": "StateError", "message": "the checkpoint has no scaler state but this run "
        "passes one", "component": "scaler"})
    d = diagnose(recs(), [], [refusal], start=W, stop=W + N)
    assert (d.component, d.confidence) == ("scaler", "high")
    assert "refused the resume" in d.evidence[0]


def test_the_guard_breaks_a_tie_between_two_candidates() -> None:
    nocur = {s: None for s in range(9)}
    ref = recs(cursor=nocur)
    res = recs(W + 1, cursor=nocur, batch_hash={5: "y"},
               guard={6: [{"code": "CK-R003", "component": "data", "message": "changed"}]})
    d = dg(ref, res)
    assert (d.component, d.confidence) == ("data-version", "high")


FWD = {s: "forward" for s in range(1, 9)}
NOCUR = {s: None for s in range(9)}
DRAWS = {"code": "CK-D008", "component": "rng",
         "message": "torch advanced 66 words more than the saved run drew there; seen at the "
         "start of the first resumed step (forward)"}


def test_extra_draws_counted_after_a_differing_batch_do_not_name_the_rng() -> None:
    # A sampler fault whose batches make a batch-dependent augmentation draw differently:
    # the RNG at the first forward, the look-ahead and the guard's count all differ as a
    # consequence. Named "rng (high)" before; now unknown with sampler and rng.
    ref = recs(rng_at=FWD, cursor=NOCUR)
    res = recs(W + 1, rng_at=FWD, cursor=NOCUR, rng={5: "x"}, batch_hash={5: "y"},
               guard={5: [DRAWS]})
    d = dg(ref, res, facts={"data_declared": True,
                            "lookahead": {"guard": {"rng_gaps": [{"torch": 72}, {"torch": 42}]}}})
    assert (d.component, d.confidence) == ("unknown", "low")
    assert d.candidates == ["sampler", "rng"]  # the data identity is pinned and unchanged
    assert "sampler:" in d.to_dict()["hint"] and "rng:" in d.to_dict()["hint"]


def test_a_fetch_that_always_draws_the_same_makes_the_rng_difference_conclusive() -> None:
    ref = recs(rng_at=FWD, cursor=NOCUR)
    res = recs(W + 1, rng_at=FWD, cursor=NOCUR, rng={5: "x"}, batch_hash={5: "y"},
               guard={5: [DRAWS]})
    d = dg(ref, res, facts={"lookahead": {"guard": {"rng_gaps": [{"torch": 64}]}}})
    assert (d.component, d.confidence) == ("rng", "high")


def test_sample_ids_that_moved_stay_the_sampler_despite_the_guards_draw_count() -> None:
    ids = {s: [[0, s, "h"]] for s in range(1, 9)}
    ref = recs(rng_at=FWD, cursor=NOCUR, sample_ids=ids)
    res = recs(W + 1, rng_at=FWD, cursor=NOCUR, rng={5: "x"}, batch_hash={5: "y"},
               sample_ids={**ids, 5: [[0, 1, "h"]]}, guard={5: [DRAWS]})
    d = dg(ref, res)
    assert (d.component, d.confidence) == ("sampler", "high")
    assert d.candidates == []


def test_an_lr_that_rejoins_the_schedule_was_set_by_hand_not_a_broken_scheduler() -> None:
    # A relaunch sets the LR from its flag after the restore; the restored LambdaLR's next
    # step puts the schedule back. Named "scheduler (high)" before.
    ref = recs(lr={s: 0.01 * s for s in range(1, 9)})
    res = recs(W + 1, lr={5: 0.03, 6: 0.06, 7: 0.07, 8: 0.08})
    d = dg(ref, res)
    assert (d.component, d.confidence) == ("hyperparameters", "medium")
    assert d.candidates == ["hyperparameters", "scheduler"]
    restarted = recs(W + 1, lr={5: 0.05, 6: 0.01, 7: 0.02, 8: 0.03})  # stays off: scheduler
    assert (dg(ref, restarted).component, dg(ref, restarted).confidence) == ("scheduler", "high")
