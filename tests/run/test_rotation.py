"""Retention policies: examples for each rule, hypothesis properties for the guarantees."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptkit.run.rotation import (
    AnyOf,
    CkptInfo,
    KeepEvery,
    KeepHealthy,
    KeepLast,
    Pinned,
    RetentionPlan,
    choose_rollback,
    plan,
)

GB = 10**9


def ck(step: int, *, size: int = GB, verified: bool = True, **kw: object) -> CkptInfo:
    return CkptInfo(step=step, size=size, verified=verified, **kw)  # type: ignore[arg-type]


def reasons(p: RetentionPlan) -> dict[int, str]:
    return {d.ckpt.step: d.reason for d in p.decisions}


# ---------------------------------------------------------------- policies


def test_keep_last_skips_corrupt_and_unverified() -> None:
    cks = [ck(1), ck(2), ck(3, corrupt=True), ck(4, verified=False)]
    assert KeepLast(2).should_preserve(cks) == [True, True, False, False]


def test_keep_every_multiples_only() -> None:
    cks = [ck(0), ck(5), ck(10), ck(20, corrupt=True)]
    assert KeepEvery(10).should_preserve(cks) == [True, False, True, False]


def test_pinned_any_pin_even_corrupt() -> None:
    cks = [ck(1, pinned=frozenset({"best", "emergency"}), corrupt=True), ck(2)]
    assert Pinned().reasons(cks) == ["pinned best,emergency", None]


@pytest.mark.parametrize(
    ("healths", "expected"),
    [
        (["ok", "ok", "warn"], [False, True, False]),
        (["ok", "warn", "ok"], [False, False, False]),  # newest is healthy: nothing to roll back to
        (["ok", None, "critical"], [True, False, False]),
        ([None, "warn"], [False, False]),  # no healthy checkpoint at all
    ],
)
def test_keep_healthy(healths: list[str | None], expected: list[bool]) -> None:
    cks = [ck(i + 1, health=h) for i, h in enumerate(healths)]
    assert KeepHealthy().should_preserve(cks) == expected


def test_any_of_joins_reasons() -> None:
    cks = [ck(10), ck(15), ck(20)]
    assert AnyOf(KeepLast(1), KeepEvery(10)).reasons(cks) == [
        "multiple of 10",
        None,
        "last 1; multiple of 10",
    ]
    assert AnyOf().should_preserve(cks) == [False, False, False]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="k must be"):
        KeepLast(-1)
    with pytest.raises(ValueError, match="n must be"):
        KeepEvery(0)
    with pytest.raises(ValueError, match="duplicate checkpoint steps \\[3\\]"):
        plan([ck(3), ck(3)], keep_last=1)
    with pytest.raises(ValueError, match="max_bytes"):
        plan([ck(3)], keep_last=1, max_bytes=-1)


# ---------------------------------------------------------------- plan examples


def test_plan_reasons() -> None:
    cks = [
        ck(10_000),
        ck(12_000, pinned=frozenset({"emergency"})),
        ck(13_000),
        ck(14_000),
        ck(15_000),
        ck(16_000),
    ]
    r = reasons(plan(cks, keep_last=3, keep_every=10_000))
    assert r == {
        10_000: "keep: multiple of 10000",
        12_000: "keep: pinned emergency",
        13_000: "delete: beyond keep_last=3",
        14_000: "keep: last 3",
        15_000: "keep: last 3",
        16_000: "keep: newest verified; last 3",
    }


def test_corrupt_kept_and_flagged_by_default() -> None:
    cks = [ck(1), ck(2), ck(3, corrupt=True, verified=False)]
    p = plan(cks, keep_last=1)
    assert [c.step for c in p.flagged] == [3]
    assert reasons(p)[3].startswith("keep: corrupt or incomplete, flagged")
    # the corrupt one does not use up keep_last: step 2 is the one good kept
    assert reasons(p)[2] == "keep: newest verified; last 1"
    assert reasons(p)[1] == "delete: beyond keep_last=1"

    p = plan(cks, keep_last=1, delete_corrupt=True)
    assert reasons(p)[3] == "delete: corrupt or incomplete (delete_corrupt=True)"
    assert p.flagged == []


def test_newest_verified_survives_keep_last_zero() -> None:
    p = plan([ck(1), ck(2)], keep_last=0)
    assert reasons(p) == {1: "delete: beyond keep_last=0", 2: "keep: newest verified"}


def test_unverified_newer_than_newest_verified_is_kept() -> None:
    p = plan([ck(1, verified=False), ck(2), ck(3), ck(4, verified=False)], keep_last=1)
    r = reasons(p)
    assert r[4] == "keep: not yet verified, newer than newest verified"
    assert r[1] == "delete: not verified, older than the newest verified step 3"
    assert r[2] == "delete: beyond keep_last=1"


def test_keep_healthy_rollback_target() -> None:
    cks = [ck(1, health="ok"), ck(2, health="ok"), ck(3, health="warn"), ck(4, health="critical")]
    r = reasons(plan(cks, keep_last=2))
    assert r[2] == "keep: newest healthy (step 3 and later not ok)"
    assert r[1] == "delete: beyond keep_last=2"
    assert reasons(plan(cks, keep_last=2, keep_healthy=False))[2] == "delete: beyond keep_last=2"


def test_max_bytes_drops_oldest_unpinned() -> None:
    cks = [ck(s, size=3 * GB) for s in (10, 20, 30, 40)]
    p = plan(cks, keep_last=4, keep_every=10, max_bytes=7 * GB)
    r = reasons(p)
    assert r[10] == "delete: over max_bytes budget (12.0 GB > 7.0 GB); was last 4; multiple of 10"
    assert r[20] == "delete: over max_bytes budget (9.0 GB > 7.0 GB); was last 4; multiple of 10"
    assert p.bytes_kept == 6 * GB and not p.over_budget and p.budget_note is None


def test_max_bytes_impossible_says_why() -> None:
    cks = [ck(1, size=5 * GB, pinned=frozenset({"best"})), ck(2, size=6 * GB), ck(3, size=GB)]
    p = plan(cks, keep_last=2, max_bytes=10 * GB)
    assert not p.over_budget and p.budget_note is None
    assert reasons(p)[3] == "keep: newest verified; last 2"
    assert reasons(p)[2].startswith("delete: over max_bytes budget (12.0 GB > 10.0 GB)")
    p = plan(cks, keep_last=2, max_bytes=5 * GB)
    assert p.over_budget and p.budget_note is not None
    assert p.budget_note.startswith("max_bytes budget cannot be met: 6.0 GB > 5.0 GB")
    assert "step 1 (pinned best, 5.0 GB)" in p.budget_note


def test_empty() -> None:
    p = plan([], keep_last=3, max_bytes=0)
    assert p.decisions == () and p.keep == [] and p.delete == [] and not p.over_budget


# ---------------------------------------------------------------- properties

_HEALTH = st.sampled_from([None, "ok", "warn", "critical"])
_PINS = st.frozensets(st.sampled_from(["best", "emergency"]), max_size=2)


@st.composite
def checkpoint_sets(draw: st.DrawFn) -> list[CkptInfo]:
    steps = draw(st.lists(st.integers(0, 200), unique=True, max_size=12))
    out = []
    for s in steps:
        corrupt = draw(st.integers(0, 3)) == 0  # corrupt is the exception, not the rule
        out.append(
            CkptInfo(
                step=s,
                size=draw(st.integers(0, 10 * GB)),
                verified=draw(st.booleans()),
                corrupt=corrupt,
                pinned=draw(st.one_of(st.just(frozenset()), _PINS)),
                health=draw(_HEALTH),
            )
        )
    return out


plan_args = st.fixed_dictionaries(
    {
        "keep_last": st.integers(0, 5),
        "keep_every": st.one_of(st.none(), st.integers(1, 50)),
        "max_bytes": st.one_of(st.none(), st.integers(0, 40 * GB)),
        "keep_healthy": st.booleans(),
        "delete_corrupt": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(checkpoint_sets(), plan_args)
def test_prop_newest_verified_and_pinned_always_kept(cks: list[CkptInfo], args: dict) -> None:
    p = plan(cks, **args)
    kept = {c.step for c in p.keep}
    good = [c.step for c in cks if c.verified and not c.corrupt]
    if good:
        assert max(good) in kept
    assert {c.step for c in cks if c.pinned} <= kept
    assert len(p.decisions) == len(cks)
    assert all(d.ckpt is c for d, c in zip(p.decisions, cks, strict=True))
    assert all(d.reason.startswith("keep: " if d.keep else "delete: ") for d in p.decisions)


@settings(max_examples=300, deadline=None)
@given(checkpoint_sets(), plan_args)
def test_prop_keep_last_exact(cks: list[CkptInfo], args: dict) -> None:
    args["max_bytes"] = None  # the budget may legitimately drop keep_last ones
    p = plan(cks, **args)
    k = args["keep_last"]
    good = sorted((c.step for c in cks if c.verified and not c.corrupt), reverse=True)
    by_step = p.by_step()
    for s in good[:k]:
        assert by_step[s].keep and f"last {k}" in by_step[s].reason
    # no other checkpoint carries the keep_last reason
    tagged = {s for s, d in by_step.items() if f"last {k}" in d.reason}
    assert tagged == set(good[:k])


@settings(max_examples=300, deadline=None)
@given(checkpoint_sets(), plan_args, st.randoms(use_true_random=False))
def test_prop_order_independent(cks: list[CkptInfo], args: dict, rnd: object) -> None:
    shuffled = list(cks)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    a, b = plan(cks, **args), plan(shuffled, **args)
    assert reasons(a) == reasons(b)
    assert a.budget_note == b.budget_note


@settings(max_examples=300, deadline=None)
@given(checkpoint_sets(), plan_args)
def test_prop_max_bytes_respected_unless_impossible(cks: list[CkptInfo], args: dict) -> None:
    p = plan(cks, **args)
    if args["max_bytes"] is None:
        assert p.budget_note is None
        return
    if p.bytes_kept <= args["max_bytes"]:
        assert p.budget_note is None and not p.over_budget
    else:
        # impossible: every kept checkpoint is protected, and the plan says why
        assert p.budget_note is not None and "cannot be met" in p.budget_note
        good = [c.step for c in cks if c.verified and not c.corrupt]
        for c in p.keep:
            protected = bool(c.pinned) or c.corrupt or (good and c.step == max(good))
            assert protected, c
    # the budget never deletes what is protected
    for d in p.decisions:
        if "max_bytes" in d.reason:
            assert not d.ckpt.pinned and not d.ckpt.corrupt


@settings(max_examples=200, deadline=None)
@given(checkpoint_sets(), plan_args)
def test_prop_corrupt_deleted_only_when_asked(cks: list[CkptInfo], args: dict) -> None:
    p = plan(cks, **args)
    for d in p.decisions:
        if d.ckpt.corrupt and not d.ckpt.pinned:
            assert d.keep is not args["delete_corrupt"]


# --- rollback selection ------------------------------------------------------------------------


def _info(tmp: Path, step: int, status: str, health: str | None, signals: dict | None = None):  # type: ignore[no-untyped-def]
    from ckptkit.checkpoint.catalog import CheckpointInfo

    rec = None if health is None else {"level": health, "signals": signals or {}}
    return CheckpointInfo(
        step, tmp / f"step-{step:08d}", status, 1, 0.0, health=health, health_record=rec  # type: ignore[arg-type]
    )


def test_choose_rollback_skips_unhealthy_and_corrupt(tmp_path: Path) -> None:
    grad = {"grad_norm.zscore": {"detail": "z 7.1 over 5 of 8 steps"}}
    pick = choose_rollback(
        [
            _info(tmp_path, 1, "verified", "ok"),
            _info(tmp_path, 2, "verified", "ok"),
            _info(tmp_path, 3, "corrupt", "ok"),
            _info(tmp_path, 4, "verified", "warn", grad),
            _info(tmp_path, 5, "verified", "critical", {"loss.nonfinite": {"detail": "nan"}}),
        ]
    )
    assert pick.checkpoint is not None and pick.checkpoint.step == 2 and pick.health_data
    assert [r.split(":")[0] for r in pick.reasons] == [
        "step-00000005",
        "step-00000004",
        "step-00000003",
        "step-00000002",
    ]
    assert "picked" in pick.reasons[-1]
    # Hints only for what fired: grad norm and the non-finite loss, not the std-shift one.
    assert any("clipping" in h for h in pick.hints)
    assert any("anomaly detection" in h for h in pick.hints)
    assert not any("noise level rose" in h for h in pick.hints)


def test_choose_rollback_without_any_health_data(tmp_path: Path) -> None:
    # Saved without a StabilityWatch: nothing to judge health by. The newest verified
    # checkpoint is picked, the choice says so, and no hint is invented.
    pick = choose_rollback(
        [
            _info(tmp_path, 1, "verified", None),
            _info(tmp_path, 2, "verified", None),
            _info(tmp_path, 3, "corrupt", None),
        ]
    )
    assert pick.checkpoint is not None and pick.checkpoint.step == 2
    assert not pick.health_data and pick.hints == []
    assert "no checkpoint of this run has health data" in pick.reasons[-1]
    assert pick.reasons[0].startswith("step-00000003: skipped, corrupt")
