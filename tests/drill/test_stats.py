"""The window drift monitor on synthetic series: clean passes, real drifts fail, never raises."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptkit.drill.stats import (
    DEFAULT_THRESHOLDS,
    grad_norm_level,
    length_buckets,
    loss_shift,
    robust_trend,
    skip_rate,
    throughput,
    window_check,
)

W = N = 80
SIGMA = 0.1


def series(
    seed: int,
    steps: range,
    *,
    shift: float = 0.0,
    len_hi: int = 64,
    gn: float = 1.0,
    scale: float = 2.0**16,
    collapse: bool = False,
) -> list[dict[str, Any]]:
    """A decaying loss with Student-t (df 3) noise of robust σ = SIGMA, plus the rest."""
    rng = np.random.default_rng(seed)
    s = np.asarray(steps, dtype=float)
    t = rng.standard_t(3, size=s.size)
    t *= SIGMA / (1.4826 * np.median(np.abs(t - np.median(t))))
    loss = 2.0 + 3.0 / np.sqrt(s) + t + shift * SIGMA
    out = []
    for i, st_ in enumerate(steps):
        if collapse:
            scale /= 2
        lens = rng.integers(8, len_hi + 1, size=16).tolist()
        out.append(
            {
                "step": st_,
                "loss": float(loss[i]),
                "grad_norm": float(gn * np.exp(rng.normal(0, 0.1))),
                "lr": 1e-3,
                "loss_scale": scale,
                "seq_lens": lens,
                "tokens": sum(lens),
                "time": 100.0 * (st_ > W) + 0.05 * st_,
            }
        )
    return out


def pre_post(seed: int = 0, **kw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return series(seed, range(1, W + 1)), series(seed + 1000, range(W + 1, W + N + 1), **kw)


# ---------------------------------------------------------------- pieces


def test_robust_trend_ignores_outliers_and_nan() -> None:
    y = [1.0 + 0.5 * i for i in range(20)]
    y[3], y[11], y[15] = 100.0, math.nan, -50.0
    t = robust_trend(range(20), y)
    assert t.slope == pytest.approx(0.5)
    assert t.intercept == pytest.approx(1.0)
    assert math.isnan(t.residuals[11])
    assert t.predict([40])[0] == pytest.approx(21.0)


def test_robust_trend_degenerate() -> None:
    assert robust_trend([], []).slope == 0.0
    t = robust_trend([5, 5, 5], [1.0, 2.0, 3.0])
    assert (t.slope, t.intercept) == (0.0, 2.0)


@pytest.mark.parametrize("seed", range(5))
def test_clean_continuation_passes(seed: int) -> None:
    pre, post = pre_post(seed)
    r = window_check(pre, post)
    assert r["ok"], r["detail"]
    assert r["name"] == "window" and r["informational"] is True
    assert r["threshold"] == 1.0 and 0 <= r["statistic"] < 1.0
    assert set(r["signals"]) == {"loss_shift", "grad_norm_level", "length_buckets", "skip_rate"}
    for sig in r["signals"].values():
        assert {"statistic", "threshold", "ok", "detail"} <= set(sig)
    json.dumps(r)  # plain JSON types throughout


def test_level_shift_of_3_sigma_fails_loss() -> None:
    pre, post = pre_post(1, shift=3.0)
    r = window_check(pre, post)
    assert not r["ok"]
    assert not r["signals"]["loss_shift"]["ok"]
    assert r["signals"]["loss_shift"]["shift"] >= 3.0
    assert r["signals"]["grad_norm_level"]["ok"]


def test_level_shift_direction_does_not_matter() -> None:
    pre, post = pre_post(2, shift=-5.0)
    sig = loss_shift(pre, post)
    assert not sig["ok"] and sig["shift"] < 0


def test_length_distribution_shift_fails() -> None:
    pre, post = pre_post(3, len_hi=256)
    r = window_check(pre, post)
    sig = r["signals"]["length_buckets"]
    assert not r["ok"] and not sig["ok"]
    assert sig["p_value"] < 1e-3 and sig["statistic"] >= 0.1
    assert "256" in sig["buckets"]


def test_small_length_samples_do_not_fail_on_distance_alone() -> None:
    pre = [{"seq_lens": [10, 100, 100, 100, 100]}] * 4 + [{"seq_lens": [100] * 5}] * 4
    post = [{"seq_lens": [10, 10, 100, 100, 100]}] * 4 + [{"seq_lens": [10, 100, 100]}] * 4
    sig = length_buckets(pre, post)
    assert sig["statistic"] > 0.1 and sig["p_value"] > 1e-3 and sig["ok"]


def test_loss_scale_collapse_fails_skip_rate() -> None:
    pre, post = pre_post(4, collapse=True)
    r = window_check(pre, post)
    sig = r["signals"]["skip_rate"]
    assert not r["ok"] and not sig["ok"]
    assert sig["rate_post"] == 1.0 and sig["rate_pre"] == 0.0


def test_rare_skips_pass() -> None:
    pre = [{"loss_scale": 2.0 ** (16 - (i >= 40))} for i in range(80)]
    post = [{"loss_scale": 2.0 ** (15 - (i >= 50))} for i in range(80)]
    assert skip_rate(pre, post)["ok"]


def test_no_loss_scale_skips_signal() -> None:
    pre = [{"loss_scale": None} for _ in range(20)]
    sig = skip_rate(pre, pre)
    assert sig["ok"] and sig["statistic"] is None and "not fp16" in sig["detail"]


def test_grad_norm_level_shift_fails() -> None:
    pre, post = pre_post(5, gn=3.0)
    sig = grad_norm_level(pre, post)
    assert not sig["ok"] and sig["log_ratio"] == pytest.approx(math.log(3.0), abs=0.1)


@pytest.mark.parametrize("bad", [math.nan, "nan", math.inf, "-inf"])
def test_nonfinite_loss_after_resume_fails(bad: Any) -> None:
    pre, post = pre_post(6)
    post[30]["loss"] = bad
    r = window_check(pre, post)
    sig = r["signals"]["loss_shift"]
    assert not r["ok"] and not sig["ok"]
    assert sig["statistic"] == math.inf and "non-finite" in sig["detail"]


def test_nonfinite_loss_in_window_too_is_not_automatic_failure() -> None:
    pre, post = pre_post(7)
    pre[10]["loss"] = "nan"
    post[10]["loss"] = "nan"
    assert loss_shift(pre, post)["ok"]


def test_too_few_points_is_ok_with_detail() -> None:
    pre, post = pre_post(8)
    r = window_check(pre[-5:], post[:5])
    assert r["ok"]
    assert r["statistic"] == 0.0
    assert "too few points" in r["detail"]
    assert all(
        "too few points" in s["detail"] or "not fp16" in s["detail"] for s in r["signals"].values()
    )


def test_throughput_reported_not_judged() -> None:
    pre, post = pre_post(9)
    for r in post:
        r["time"] = 1000 + 0.5 * r["step"]  # 10x slower
    res = window_check(pre, post)
    assert res["ok"]
    assert res["throughput"]["ratio"] == pytest.approx(0.1)
    assert res["throughput"]["judged"] is False


def test_throughput_judged_against_same_time_reference() -> None:
    pre, post = pre_post(10)
    ref = [dict(r, time=r["step"] * 0.05) for r in post]
    slow = [dict(r, time=r["step"] * 0.5) for r in post]
    th = {"throughput_min_ratio": 0.5}
    r = window_check(pre, slow, reference_records=ref, thresholds=th)
    assert not r["ok"] and r["throughput"]["judged"]
    assert r["throughput"]["ratio_vs_reference"] == pytest.approx(0.1)
    assert "throughput" in r["detail"]
    assert throughput(pre, slow, reference=ref)["judged"] is False


def test_thresholds_override() -> None:
    pre, post = pre_post(11, shift=4.0)
    assert not window_check(pre, post)["ok"]
    r = window_check(pre, post, thresholds={"loss_shift": 100.0, "bogus": 1.0})
    assert r["ok"] and r["signals"]["loss_shift"]["threshold"] == 100.0
    assert DEFAULT_THRESHOLDS["loss_shift"] == 3.0


# ---------------------------------------------------------------- never raises

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["nan", "inf", "-inf", "x", ""]),
    st.lists(st.integers(min_value=-5, max_value=10**6), max_size=5),
)
_record = st.dictionaries(
    st.sampled_from(
        ["step", "loss", "grad_norm", "lr", "loss_scale", "seq_lens", "tokens", "time"]
    ),
    _values,
)
_records = st.lists(st.one_of(_record, st.integers(), st.none()), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pre=_records, post=_records, ref=st.one_of(st.none(), _records))
def test_window_check_never_raises(pre: list[Any], post: list[Any], ref: list[Any] | None) -> None:
    r = window_check(pre, post, reference_records=ref, thresholds={"throughput_min_ratio": 0.5})
    assert isinstance(r["ok"], bool) and r["informational"] is True
    assert r["statistic"] >= 0


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=60),
    m=st.integers(min_value=0, max_value=60),
    data=st.data(),
)
def test_window_check_numeric_series_never_raise(n: int, m: int, data: st.DataObject) -> None:
    fl = st.floats(allow_nan=True, allow_infinity=True, width=64)
    pre = [
        {"step": i, "loss": data.draw(fl), "grad_norm": data.draw(fl), "loss_scale": data.draw(fl)}
        for i in range(n)
    ]
    post = [
        {"step": n + i, "loss": data.draw(fl), "grad_norm": data.draw(fl), "seq_lens": [i + 1]}
        for i in range(m)
    ]
    r = window_check(pre, post)
    assert isinstance(r["ok"], bool)
