"""A stability watch saved with a checkpoint goes on judging after a resume (state_dict).

Without its state a resumed watch warms up again: every checkpoint of the next ``warmup``
steps records ``not judged``, and a run pre-empted more often than that never gets a
healthy checkpoint. The state goes through ckptkit's tree and JSON, as in a checkpoint, and
the resumed watch's verdicts and health equal the uninterrupted watch's, step by step.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format import tree
from ckptkit.signals.stability import StabilityWatch

PARAMS: dict[str, Any] = {"window": 16, "recent": 8, "warmup": 12, "clear_after": 10,
                          "ref_horizon": 32, "backoff_window": 20}


def _through_a_checkpoint(state: dict[str, Any]) -> Any:
    enc = tree.encode(state)
    assert not enc.tensors
    return tree.decode(json.loads(json.dumps(enc.tree)), {})


def _health(w: StabilityWatch) -> dict[str, Any]:
    h = w.snapshot()
    h.pop("time")  # when the snapshot was taken
    return h


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (a signal's threshold may be NaN)."""
    return json.dumps(a, default=repr) == json.dumps(b, default=repr)


step_metrics = st.fixed_dictionaries(
    {"loss": st.one_of(st.floats(0.5, 3.0), st.sampled_from([50.0, math.nan])),
     "grad_norm": st.floats(0.1, 20.0),
     "loss_scale": st.sampled_from([2.0**16, 2.0**15, 2.0**14, 2.0**16])},
)


@settings(max_examples=40, deadline=None)
@given(before=st.lists(step_metrics, min_size=1, max_size=60),
       after=st.lists(step_metrics, min_size=1, max_size=40))
def test_a_resumed_watch_judges_every_later_step_as_the_uninterrupted_one(
    before: list[dict[str, float]], after: list[dict[str, float]]
) -> None:
    whole, first = StabilityWatch(**PARAMS), StabilityWatch(**PARAMS)
    for i, m in enumerate(before):
        whole.update(i, **m)
        first.update(i, **m)
    resumed = StabilityWatch(**PARAMS)
    assert resumed.load_state_dict(_through_a_checkpoint(first.state_dict()))
    assert _same(resumed.state_dict(), first.state_dict())  # every field came back
    assert _same(_health(resumed), _health(whole))
    for i, m in enumerate(after, len(before)):
        a, b = whole.update(i, **m), resumed.update(i, **m)
        assert _same(a, b), (i, a, b)
    assert _same(_health(resumed), _health(whole))
    assert _same(resumed.state_dict(), whole.state_dict())


def test_a_long_run_resumed_in_an_episode_matches_step_by_step() -> None:
    # Past warm-up, with baselines, drift references and an open episode at the cut: the
    # fields a short run never fills.
    steps = [{"loss": 2.0 + 0.05 * (i % 7), "grad_norm": 1.0 + 0.1 * (i % 5),
              "loss_scale": 2.0**16 if i % 9 else 2.0**15} for i in range(120)]
    for i in (60, 61, 62, 63):
        steps[i]["loss"] = 30.0
    whole, first = StabilityWatch(**PARAMS), StabilityWatch(**PARAMS)
    for i, m in enumerate(steps[:64]):
        whole.update(i, **m)
        first.update(i, **m)
    assert first.episode_level != "ok" and first.tracks["grad_norm"].ref_level
    resumed = StabilityWatch(**PARAMS)
    assert resumed.load_state_dict(_through_a_checkpoint(first.state_dict()))
    assert _same(resumed.state_dict(), first.state_dict())
    for i, m in enumerate(steps[64:], 64):
        assert _same(whole.update(i, **m), resumed.update(i, **m)), i
    assert _same(_health(resumed), _health(whole))


def test_past_its_warm_up_a_resumed_watch_judges_at_once() -> None:
    w = StabilityWatch(**PARAMS)
    for i in range(40):
        w.update(i, loss=2.0 + 0.01 * (i % 5), grad_norm=1.0 + 0.02 * (i % 3))
    assert w.snapshot()["level"] == "ok"
    fresh, resumed = StabilityWatch(**PARAMS), StabilityWatch(**PARAMS)
    resumed.load_state_dict(_through_a_checkpoint(w.state_dict()))
    assert resumed.snapshot()["level"] == "ok"
    assert fresh.snapshot()["level"] == "not judged"
    # A spike of three steps is judged at once, as the uninterrupted watch judges it; a
    # watch warming up again would let it pass.
    for i in (40, 41, 42):
        got, want, blind = (x.update(i, loss=40.0) for x in (resumed, w, fresh))
    assert got.level == want.level != "ok"
    assert blind.level == "ok"


def test_a_state_saved_under_other_parameters_starts_the_watch_afresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = StabilityWatch(**PARAMS)
    for i in range(30):
        w.update(i, loss=2.0)
    other = StabilityWatch(**{**PARAMS, "window": 32})
    _ = other.update(0, loss=1.0)
    with caplog.at_level(logging.WARNING, logger="ckptkit.signals.stability"):
        assert not other.load_state_dict(w.state_dict(), where="ckpt/step-00000030")
    assert "ckpt/step-00000030" in caplog.text and "other parameters" in caplog.text
    assert other.updates == 0 and other.snapshot()["level"] == "not judged"


def _saved() -> dict[str, Any]:
    w = StabilityWatch(**PARAMS)
    for i in range(30):
        w.update(i, loss=2.0 + 0.1 * (i % 2), loss_scale=2.0**16)
    return w.state_dict()


def _set(state: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split("/")
    node = state
    for p in parents:
        node = node[p]
    node[last] = value
    return state


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("version", 2),
        ("updates", "30"),
        ("updates", True),
        ("level", "fine"),
        ("tracks/loss/values", [1.0] * 25),  # longer than window + recent
        ("tracks/loss/values", ["x"]),
        ("tracks/loss/trig", [3]),
        ("tracks/loss/ref_level", [[1, 2.0, 3.0]]),
        ("tracks/loss/count", None),
        ("tracks/bogus", {}),
        ("episode_signals", [["a", "warn", 1.0]]),
        ("last", {"level": "ok", "step": 3}),
        ("nonfinite", {"loss": "many"}),
        ("tracks", None),
    ],
)
def test_a_malformed_state_is_refused_with_a_warning_and_the_watch_starts_afresh(
    path: str, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    w = StabilityWatch(**PARAMS)
    _ = w.update(0, loss=1.0)
    with caplog.at_level(logging.WARNING, logger="ckptkit.signals.stability"):
        assert not w.load_state_dict(_set(_saved(), path, value), where="x.ckpt")
    assert "x.ckpt" in caplog.text and "malformed" in caplog.text
    assert w.updates == 0 and not w.tracks


def test_not_a_mapping_is_refused() -> None:
    assert not StabilityWatch(**PARAMS).load_state_dict(["not", "a", "state"])


# --- every state load_state_dict takes is one the watch can go on from (issue 39) -------------

def _bases() -> list[dict[str, Any]]:
    """Real states: warming up, judging with drift references, and inside an episode."""
    out = []
    for n, spike in ((6, None), (60, None), (70, 60)):
        w = StabilityWatch(**PARAMS, extra=["acc"])
        for i in range(n):
            loss = 30.0 if spike is not None and i >= spike else 2.0 + 0.05 * (i % 7)
            w.update(i, loss=loss, grad_norm=1.0 + 0.1 * (i % 5), max_logit=5.0 + (i % 3),
                     attn_entropy=3.0 - 0.01 * (i % 4), acc=0.5 + 0.01 * (i % 9),
                     loss_scale=2.0**16 if i % 9 else 2.0**15)
        out.append(_through_a_checkpoint(w.state_dict()))
    return out


_BASES = _bases()


def _leaf_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _leaf_paths(v, (*prefix, i))
    return out


hostile = st.one_of(
    st.sampled_from([0.0, -0.0, -1.0, 5e-324, 1e-300, 1e6, 1e300, 1.7e308, -1.7e308,
                     math.nan, math.inf, -math.inf, 0, -1, 3, 10**400, 2**63, True, None,
                     "x", "nan", [], {}, [1, 2.0], [[0, 1e6]]]),
    st.floats(), st.integers(-(2**70), 2**70),
)


@st.composite
def malformed_states(draw: st.DrawFn) -> dict[str, Any]:
    state = json.loads(json.dumps(draw(st.sampled_from(_BASES))))  # deep copy, NaN kept
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_leaf_paths(state) or [("version",)]))
        parent: Any = state
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) or not isinstance(parent, dict):
                parent[path[-1]] = draw(hostile)
            else:
                del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
    return state


metrics = st.fixed_dictionaries(
    {"loss": st.one_of(st.floats(1e-40, 1e300), st.sampled_from([math.nan, math.inf, 0.0])),
     "grad_norm": st.floats(0.0, 1e300),
     "max_logit": st.floats(1e-40, 1e300),
     "attn_entropy": st.floats(-1e300, 1e300),
     "acc": st.floats(-1e6, 1e6),
     "loss_scale": st.sampled_from([2.0**16, 2.0**15, 1.0, 0.5])},
)


@settings(max_examples=400, deadline=None)
@given(state=malformed_states(), steps=st.lists(metrics, min_size=1, max_size=12))
def test_every_state_the_watch_takes_it_can_go_on_from(
    state: dict[str, Any], steps: list[dict[str, float]]
) -> None:
    w = StabilityWatch(**PARAMS, extra=["acc"])
    try:
        w.load_state_dict(state, where="x.ckpt", strict=True)
    except CkptkitError as e:
        assert e.code == codes.S030 and "x.ckpt" in str(e) and "malformed" in str(e)
        event("refused")
        return
    event("taken")
    start = w.updates + 100
    for i, m in enumerate(steps, start):  # the repro: ZeroDivisionError, OverflowError
        w.update(i, **m)
        w.health()
    again = StabilityWatch(**PARAMS, extra=["acc"])
    assert again.load_state_dict(w.state_dict(), strict=True)  # its own state: always taken


@pytest.mark.parametrize(
    ("track", "key", "value"),
    [("loss", "sig", 0.0), ("grad_norm", "dsig_base", 0.0), ("loss", "med_recent", 1e6),
     ("grad_norm", "spread_ref", 0.0), ("grad_norm", "spreads", [0.0])],
)
def test_the_states_that_raised_in_update_are_refused_naming_the_value(
    track: str, key: str, value: Any
) -> None:
    # Outside trial of issue 39: each was taken, and the next update() raised
    # ZeroDivisionError (a zero spread) or OverflowError (a median past exp's range).
    state = _BASES[1]
    state = json.loads(json.dumps(state))
    state["tracks"][track][key] = value
    with pytest.raises(CkptkitError) as e:
        StabilityWatch(**PARAMS, extra=["acc"]).load_state_dict(state, where="x.ckpt", strict=True)
    assert e.value.code == codes.S030 and repr(track) in e.value.what and repr(key) in e.value.what
