"""The drill's checks and diagnosis on synthetic step records (no processes, fast)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ckptkit.drill.compare import CheckResult, same, samples, twin
from ckptkit.drill.continuity import continuity
from ckptkit.drill.diagnose import diagnose
from ckptkit.drill.exposure import exposure
from ckptkit.drill.hints import HINTS
from ckptkit.drill.noisefloor import noise_floor

W, N = 5, 5
ROOT = Path(__file__).resolve().parents[2]


def lr_at(step: int, scale: float = 1.0) -> float:
    return scale * 0.1 / (1 + 0.1 * (step - 1))


def run(
    first: int = 1,
    last: int = W + N,
    *,
    lr_scale: float = 1.0,
    lr_shift: int = 0,
    label_offset: int = 0,
    opt_base: int = 0,
    sample_shift: int = 0,
    loss_from: int | None = None,
    rng_from: int | None = None,
    hash_tag: str = "h",
    loss_scale: float | None = None,
) -> list[dict[str, Any]]:
    """Records of a deterministic fake run; keyword arguments inject one difference."""
    out = []
    for s in range(first, last + 1):
        k = s - first  # position within this run
        rec: dict[str, Any] = {
            "step": s - label_offset,
            "loss": 3.0 - 0.01 * s + (0.5 if loss_from is not None and s >= loss_from else 0),
            "grad_norm": 1.0 + 0.001 * s,
            "lr": lr_at(s - lr_shift, lr_scale),
            "opt_step": (opt_base + k + 1) if opt_base else s,
            "rng": f"r{s}" if rng_from is None or s < rng_from else f"x{s}",
            "batch_hash": f"b{s + sample_shift}",
            "sample_ids": [
                [0, 2 * (s + sample_shift), hash_tag],
                [0, 2 * (s + sample_shift) + 1, hash_tag],
            ],
        }
        if loss_scale is not None:
            rec["loss_scale"] = loss_scale
        out.append(rec)
    return out


REF = run()
GOOD = run(W + 1)


def checks(ref: list[dict[str, Any]], res: list[dict[str, Any]], **kw: Any) -> list[CheckResult]:
    facts = {
        "step": W,
        "lookahead": {
            "next_step": W + 1,
            "lr": ref[W]["lr"],
            "opt_step": ref[W - 1]["opt_step"],
            "rng": ref[W]["rng"],
            "sample_ids": [s[1] for s in ref[W]["sample_ids"]],
        },
    }
    return [
        twin(ref, res, start=W, stop=W + N, **kw),
        exposure(ref, res, start=W, stop=W + N),
        continuity(facts, res, reference=ref, save_step=W),
    ]


def test_identical_runs_pass_every_check() -> None:
    cs = checks(REF, GOOD)
    assert all(c.ok for c in cs), [c.detail for c in cs]
    tw, ex, _ = cs
    assert tw.statistic == 0 and tw.detail["first_divergence"] is None
    assert "param_hash" in tw.detail["not_recorded"]
    assert ex.detail["replayed"] == ex.detail["skipped"] == 0
    assert diagnose(REF, GOOD, cs, start=W, stop=W + N).component == "none"


def test_continuity_passes_on_a_clean_resume() -> None:
    facts = {
        "step": W,
        "lookahead": {"next_step": W + 1, "lr": REF[W]["lr"], "opt_step": W, "rng": REF[W]["rng"]},
    }
    r = continuity(facts, GOOD, reference=REF, save_step=W)
    assert r.ok, r.detail
    assert {i["what"] for i in r.detail["items"]} >= {"step", "lr", "opt_step", "rng", "no_replay"}


@pytest.mark.parametrize(
    ("resumed", "component", "first_step", "fields"),
    [
        (run(W + 1, label_offset=W), "progress", W + 1, ["step"]),
        (run(W + 1, lr_scale=1.1), "hyperparameters", W + 1, ["lr"]),
        (run(W + 1, lr_shift=1), "scheduler", W + 1, ["lr"]),
        (run(W + 1, sample_shift=-W), "sampler", W + 1, ["batch_hash"]),
        (run(W + 1, rng_from=W + 1, loss_from=W + 1), "rng", W + 1, ["loss", "rng"]),
        (run(W + 1, opt_base=1, loss_from=W + 2), "optimizer", W + 1, ["opt_step"]),
        (run(W + 1, loss_from=W + 2), "optimizer", W + 2, ["loss"]),
        (run(W + 1, loss_from=W + 1), "model", W + 1, ["loss"]),
    ],
    ids=[
        "step-reset",
        "lr-changed",
        "sched-off-by-one",
        "no-sampler",
        "no-rng",
        "no-moments",
        "moments-unrecorded",
        "weights",
    ],
)
def test_diagnosis_names_the_broken_component(
    resumed: list[dict[str, Any]], component: str, first_step: int, fields: list[str]
) -> None:
    cs = checks(REF, resumed)
    assert not cs[0].ok
    d = diagnose(REF, resumed, cs, start=W, stop=W + N)
    assert d.component == component, d.evidence
    assert d.step == first_step
    assert set(fields) <= set(d.fields)
    assert d.evidence and d.to_dict()["hint"] == HINTS[component]


def test_scheduler_restart_is_scheduler_not_hyperparameters() -> None:
    res = copy.deepcopy(GOOD)
    for k, r in enumerate(res[1:], start=1):
        r["lr"] = lr_at(k + 1)  # the schedule restarted at 1 after the first step
    d = diagnose(REF, res, checks(REF, res), start=W, stop=W + N)
    assert d.component == "scheduler" and d.step == W + 2


def test_data_version_when_same_ids_have_other_content() -> None:
    res = run(W + 1, hash_tag="changed")
    for r in res:
        r["batch_hash"] += "x"
    cs = checks(REF, res)
    assert cs[1].detail["content_changed"] == 2 * N and cs[1].detail["replayed"] == 0
    assert diagnose(REF, res, cs, start=W, stop=W + N).component == "data-version"


def test_exposure_counts_replayed_and_skipped() -> None:
    res = run(W + 1, sample_shift=-W)  # the epoch restarted: the first W batches again
    r = exposure(REF, res, start=W, stop=W + N)
    assert not r.ok
    assert r.detail["replayed"] == 2 * W
    assert r.detail["skipped"] == 2 * W
    assert r.detail["first_difference"]["position"] == 0


def test_exposure_is_skipped_without_sample_ids() -> None:
    strip = [{k: v for k, v in r.items() if k != "sample_ids"} for r in REF]
    r = exposure(strip, strip[W:], start=W, stop=W + N)
    assert r.ok and r.skipped and r.statistic is None


def test_samples_accepts_bare_ids_with_epoch_and_hashes() -> None:
    recs = [
        {"epoch": 2, "sample_ids": [7, 9], "sample_hashes": ["a", "b"]},
        {"sample_ids": [[1, 3]]},
    ]
    assert samples(recs) == [(2, 7, "a"), (2, 9, "b"), (1, 3, None)]


def test_twin_tolerates_measured_noise_but_not_exact_fields() -> None:
    noisy = copy.deepcopy(REF)
    for r in noisy:
        r["loss"] += 1e-7
    nf = noise_floor([REF, noisy], start=W, stop=W + N)
    assert nf.measured and not nf.deterministic and nf.numeric["loss"] == pytest.approx(1e-7)
    res = copy.deepcopy(GOOD)
    for r in res:
        r["loss"] += 2e-7  # within 4x the noise
    assert twin(REF, res, start=W, stop=W + N, noise=nf).ok
    res[2]["loss"] += 1e-3
    bad = twin(REF, res, start=W, stop=W + N, noise=nf)
    assert not bad.ok and bad.detail["first_divergence"]["step"] == W + 3
    res = copy.deepcopy(GOOD)
    res[0]["lr"] += 1e-15  # LR is always bitwise
    assert not twin(REF, res, start=W, stop=W + N, noise=nf).ok


def test_twin_explicit_tolerance_and_run_length() -> None:
    res = copy.deepcopy(GOOD)
    res[0]["loss"] += 1e-4
    assert twin(REF, res, start=W, stop=W + N, thresholds={"loss": 1e-3}).ok
    short = twin(REF, GOOD[:-2], start=W, stop=W + N)
    assert not short.ok and "length" in short.detail["fields"]


def test_twin_final_parameter_hash() -> None:
    r = twin(REF, GOOD, start=W, stop=W + N, final=("aa", "bb"))
    assert not r.ok and r.detail["first_divergence"]["fields"] == ["param_hash"]
    assert twin(REF, GOOD, start=W, stop=W + N, final=("aa", "aa")).ok


def test_same_treats_nan_as_equal_and_tolerance_as_absolute() -> None:
    nan = float("nan")
    assert same(nan, nan) and not same(nan, 1.0) and same(1.0, 1.05, 0.1)
    assert same("abc", "abc") and not same(1, "1")


def test_continuity_flags_each_wrong_fact() -> None:
    facts = {
        "step": W,
        "lookahead": {
            "next_step": W + 1,
            "lr": 0.5,
            "opt_step": W,
            "rng": "r6",
            "loss_scale": 1024.0,
        },
    }
    res = [{"step": W + 1, "lr": 0.5, "opt_step": 1, "rng": "zz", "loss_scale": 2048.0}]
    r = continuity(facts, res)
    assert r.detail["failed"] == ["opt_step", "rng"]  # a grown loss scale is consistent
    assert r.statistic == 2


def test_continuity_skips_facts_recorded_in_other_units() -> None:
    facts = {"step": W, "lookahead": {"rng": "full-state-fingerprint"}}
    r = continuity(facts, GOOD, reference=REF, save_step=W)
    rng = next(i for i in r.detail["items"] if i["what"] == "rng")
    assert rng["ok"] and rng["skipped"]


def test_continuity_without_facts_is_skipped() -> None:
    r = continuity({}, [{"step": 1}])
    assert r.skipped and r.ok


def test_report_schema_is_valid_and_strict() -> None:
    schema = json.loads((ROOT / "schemas" / "drill-report.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    check = schema["$defs"]["check"]
    assert set(check["required"]) == {
        "name",
        "ok",
        "statistic",
        "threshold",
        "informational",
        "detail",
    }
    validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/check"})
    for c in checks(REF, run(W + 1, lr_scale=2.0)):
        validator.validate(c.to_dict())


# --- regressions -----------------------------------------------------------------------


def test_nan_in_one_reference_does_not_make_the_tolerance_infinite() -> None:
    other = copy.deepcopy(REF)
    other[W]["loss"] = float("nan")  # one reference run blew up at one step
    nf = noise_floor([REF, other], start=W, stop=W + N)
    assert "loss" in nf.noisy and nf.numeric["loss"] == 0.0  # the inf diff is not a noise level
    res = copy.deepcopy(GOOD)
    res[1]["loss"] = 1e9
    r = twin(REF, res, start=W, stop=W + N, noise=nf)
    assert not r.ok and "loss" in r.detail["fields"]


@pytest.mark.parametrize(
    "noise, thresholds",
    [
        (None, {"loss": float("inf")}),
        (None, {"noise_factor": float("nan")}),
    ],
)
def test_non_finite_tolerance_is_not_judgeable(noise: Any, thresholds: dict[str, float]) -> None:
    nf = noise_floor([REF, REF], start=W, stop=W + N)
    r = twin(REF, GOOD, start=W, stop=W + N, noise=noise or nf, thresholds=thresholds)
    assert not r.ok and r.statistic >= 1
    assert "loss" in r.detail["not_judgeable"]
    assert "cannot be judged" in r.detail["not_judgeable"]["loss"]
    json.dumps(r.to_dict(), allow_nan=False)  # still strict JSON


@pytest.mark.parametrize("field", ["lr", "loss_scale", "opt_step", "rng", "batch_hash"])
def test_references_disagreeing_on_a_step_input_fail_twin(field: str) -> None:
    ref = run(loss_scale=1024.0)
    other = copy.deepcopy(ref)
    other[W + 1][field] = 0.25 if field != "rng" and field != "batch_hash" else "other"
    nf = noise_floor([ref, other], start=W, stop=W + N)
    assert field in nf.noisy
    res = copy.deepcopy(run(W + 1, loss_scale=1024.0))
    res[1][field] = 0.5 if field != "rng" and field != "batch_hash" else "wrong"
    r = twin(ref, res, start=W, stop=W + N, noise=nf)
    assert not r.ok
    assert r.detail["not_judgeable"][field] == f"reference runs are not deterministic in {field}"
    assert r.detail["modes"][field].startswith("not judgeable")
    cs = [r, exposure(ref, res, start=W, stop=W + N)]
    d = diagnose(ref, res, cs, start=W, stop=W + N)
    assert field in d.fields and "not deterministic" in d.evidence[0]


def test_continuity_forgives_only_when_resumed_equals_the_reference() -> None:
    facts = {"step": W, "lookahead": {"rng": "full-state-fingerprint", "lr": 123.0}}
    res = copy.deepcopy(GOOD)
    res[0]["rng"] = "something-else"  # neither the checkpoint's nor the reference's value
    res[0]["lr"] = 7.0
    r = continuity(facts, res, reference=REF, save_step=W)
    assert not r.ok and r.detail["failed"] == ["lr", "rng"]
    assert not any(i.get("skipped") for i in r.detail["items"])


def test_continuity_uses_the_resume_guard_and_says_so() -> None:
    guard = {
        "k": 8,
        "next_step": W + 1,
        "lr": [REF[W]["lr"], 0.0],
        "sched_epoch": W,
        "opt_step": W,
        "loss_scale": 1024.0,
        "rng": "guard-fingerprint",
        "world_size": 1,
    }
    facts = {"step": W, "lookahead": {"guard": guard}, "lr": 999.0, "opt_step": 999}
    res = [{"step": W + 1, "lr": REF[W]["lr"], "opt_step": W + 1, "loss_scale": 1024.0}]
    r = continuity(facts, res)
    assert r.ok, r.detail
    assert r.detail["source"] == "resume guard"
    items = {i["what"]: i for i in r.detail["items"]}
    assert items["lr"]["checkpoint"] == REF[W]["lr"] and items["opt_step"]["checkpoint"] == W
    # a wrong LR against the guard fails
    bad = continuity(facts, [{**res[0], "lr": 0.5}])
    assert bad.detail["failed"] == ["lr"]
    # the user's look-ahead wins over the guard where it has the key
    mixed = continuity({**facts, "lookahead": {"guard": guard, "lr": 0.5}}, [{**res[0], "lr": 0.5}])
    assert mixed.ok and mixed.detail["source"] == "resume guard + lookahead"
    # no look-ahead at all: the component summaries
    plain = continuity({"step": W, "lr": 0.5}, [{"step": W + 1, "lr": 0.5}])
    assert plain.detail["source"] == "component summaries"
