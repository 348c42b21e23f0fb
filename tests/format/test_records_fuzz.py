"""Property test: a malformed record read from a file is refused with a code or works, never
another exception (issue 39, item 5).

The records a run carries besides its tensors: the run's recoveries log
(``.ckptkit-recoveries.json``, read by ``ckptkit ls``, ``rollback`` and automatic recovery)
and a manifest's ``recoveries``, ``replicas``, ``health`` and ``lookahead`` (read by verify,
the catalog and restore). Each is mutated at random and fed to every reader; the reader
either raises a :class:`~ckptkit.CkptkitError` with a code or returns, and verify and the
reader agree (one validator per record). The stability watch's state has its own property
in ``test_watch_state.py``.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit import codes
from ckptkit.cli import main
from ckptkit.cli.render.text import render_recoveries
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format.records import (
    Health,
    LookAhead,
    Recoveries,
    recoveries_problems,
    replica_problem,
)
from ckptkit.signals.recovery import RecoveryPolicy
from ckptkit.signals.recovery_log import LOG, describe, iter_records, read_log
from ckptkit.signals.stability import StabilityWatch

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 10**400, 1e308, 0.0, -0.5, "nan", "", "step-00000001"]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)

RECOVERED: dict[str, Any] = {
    "n": 1, "time": 1700000000.5, "detected_at": 90,
    "trigger": {"level": "critical", "signals": {"loss.nonfinite": {"level": "critical"}},
                "first_warning_step": 88},
    "restored": {"checkpoint": "step-00000050", "step": 50},
    "actions": {"lr": {"factor": 0.5, "scale": 0.5, "applied": True},
                "clip": {"factor": None, "scale": 1.0, "read_by_loop": False},
                "skip": {"mode": "window", "status": "pending", "at_step": 87,
                         "from_step": 88, "to_step": 90},
                "callback": None},
    "abandoned": [{"step": 60}],
    "timing": {"detect_to_resume_s": 0.25, "restore_s": 0.1, "set_aside_s": 0.01},
}
REFUSED: dict[str, Any] = {"n": 2, "time": 1700000100.0, "detected_at": 95,
                           "trigger": {"level": "warn", "signals": {}}, "refused": "limit"}
RECOVERIES: dict[str, Any] = {
    "count": 1, "lr_scale": 0.5, "clip_scale": 1.0, "history": [RECOVERED],
    "pending_skip": {"n": 1, "at_step": 87, "to": {"0": {"position": 3}}},
}
REPLICAS: dict[str, Any] = {
    "ranks": 2, "groups": 1, "tensors": 2, "policy": "warn",
    "divergent": [{"key": "model/w", "copies": {"aa": [0], "bb": [1]}, "minority": None}],
}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(draw: st.DrawFn, obj: Any) -> Any:
    """``obj`` with 1-3 values replaced by any JSON value or deleted (the root included)."""
    obj = copy.deepcopy(obj)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(obj)))
        if not path:
            obj = draw(json_values)
            continue
        parent: Any = obj
        try:
            for k in path[:-1]:
                parent = parent[k]
            if isinstance(parent, dict) and draw(st.booleans()):
                del parent[path[-1]]
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    return obj


@st.composite
def logs(draw: st.DrawFn) -> Any:
    return _mutate(draw, {"version": 1, "recoveries": [RECOVERED], "refusals": [REFUSED]})


# --- the run's recoveries log -----------------------------------------------------------------

_RUN = Path(tempfile.mkdtemp(prefix="ckptkit-fuzz-records-")) / "run"
with ckptkit.CheckpointManager(_RUN, keep_last=5) as _mgr:
    _mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 1), step=1))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=logs())
def test_a_malformed_recoveries_log_is_refused_or_read_never_raised_from(data: Any) -> None:
    (_RUN / LOG).write_text(json.dumps(data))
    try:
        read_log(_RUN, strict=True)
        event("log: read")
    except CkptkitError as e:
        assert e.code == codes.D011 and LOG in str(e)
        event("log: refused")
    loose = read_log(_RUN)  # never raises: what it returns, every reader can act on
    recs = list(iter_records(_RUN))
    assert len(recs) == len(loose["recoveries"]) + len(loose["refusals"])
    for r in recs:
        assert "malformed" not in describe(r)
    render_recoveries(recs, io.StringIO())
    res = CliRunner().invoke(main, ["ls", str(_RUN)], catch_exceptions=False)
    assert res.exit_code in (0, 1), res.output


def test_a_log_entry_with_a_string_step_no_longer_breaks_ls() -> None:
    # Before: describe() raised ValueError formatting a string LR scale, and sorting
    # raised TypeError on a string time.
    bad = {**RECOVERED, "time": "yesterday",
           "actions": {"lr": {"factor": 0.5, "scale": "half"}}}
    (_RUN / LOG).write_text(json.dumps({"version": 1, "recoveries": [bad, RECOVERED],
                                        "refusals": ["x"]}))
    with pytest.raises(CkptkitError) as e:
        read_log(_RUN, strict=True)
    assert "recoveries[0]" in str(e.value) and "'time'" in str(e.value)
    assert [r["n"] for r in iter_records(_RUN)] == [1]
    res = CliRunner().invoke(main, ["ls", str(_RUN)], catch_exceptions=False)
    assert res.exit_code == 0 and "recovery #1 at step 90" in res.output


# --- a manifest's records: verify and every reader agree ----------------------------------------

_CKPT = Path(tempfile.mkdtemp(prefix="ckptkit-fuzz-manifest-records-"))
_SRC = _CKPT / "src"
ckptkit.save(ckptkit.TrainState(model=torch.nn.Linear(2, 1), step=3), _SRC, step=3)
_MANIFEST = json.loads((_SRC / "manifest.json").read_text())
_FIELDS = {"recoveries": RECOVERIES, "replicas": REPLICAS,
           "health": {"level": "ok", "step": 3, "signals": {}},
           "lookahead": {"guard": {"next_step": 4, "k": 2}, "lr": 0.1}}


@st.composite
def manifests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(_FIELDS)))
    obj = copy.deepcopy(_MANIFEST)
    obj[name] = _mutate(draw, _FIELDS[name])
    obj["manifest_digest"] = mf.content_digest(obj)
    return name, obj


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=manifests())
def test_a_malformed_manifest_record_is_refused_or_read_never_raised_from(
    case: tuple[str, dict[str, Any]],
) -> None:
    name, obj = case
    d = _CKPT / "case"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(_SRC, d)
    (d / "manifest.json").write_text(json.dumps(obj))
    report = ckptkit.verify(d)
    found = {f.code for f in report.findings if f.severity == "error"}
    try:
        man = mf.Manifest.from_json((d / "manifest.json").read_bytes())
    except CkptkitError as e:  # the schema refused it: verify says so with the same code
        assert e.code in found
        event(f"{name}: refused by the manifest schema")
        return
    # Readers: restore (Recoveries.read), the catalog (replica_problem), ls (Health), the guard.
    try:
        Recoveries.read(man.recoveries)
    except CkptkitError as e:
        assert e.code == codes.S031 and codes.S031 in found
        event(f"{name}: refused, CK-S031")
    else:
        assert codes.S031 not in found
        event(f"{name}: read")
    problem = replica_problem(man.replicas)
    assert (problem is not None) == (codes.F120 in found)
    Health.of(man.health)
    LookAhead.of(man.lookahead)


def test_restore_skips_a_checkpoint_whose_data_skip_is_malformed(tmp_path: Path) -> None:
    # Before: on_restore armed the skip from the manifest and raised KeyError ('at_step')
    # after the state was restored; now verify's CK-S031 skips it and restore falls back.
    model = torch.nn.Linear(2, 1)
    ts = ckptkit.TrainState(model=model, step=1)
    with ckptkit.CheckpointManager(tmp_path / "run", watch=StabilityWatch(),
                                   recovery=RecoveryPolicy(), background_verify=False) as mgr:
        mgr.save(ts)
        ts.step = 2
        newest = Path(str(mgr.save(ts)))
    m = json.loads((newest / "manifest.json").read_text())
    m["recoveries"] = {**RECOVERIES, "pending_skip": {"n": 1, "to": {"0": {}}}}
    assert recoveries_problems(m["recoveries"]) == ["pending_skip: 'at_step' is missing"]
    m["manifest_digest"] = mf.content_digest(m)
    (newest / "manifest.json").write_text(json.dumps(m))
    assert codes.S031 in {f.code for f in ckptkit.verify(newest).findings}
    with ckptkit.CheckpointManager(tmp_path / "run", watch=StabilityWatch(),
                                   recovery=RecoveryPolicy(), background_verify=False) as mgr:
        res = mgr.restore(ckptkit.TrainState(model=model, step=0))
    assert res is not None and res.step == 1


def test_a_recovery_whose_scale_is_not_a_number_is_described_not_raised_from() -> None:
    """What hypothesis found: ``actions.lr.scale`` null in a hand-edited log raised a
    TypeError from the text (``f"{None:g}"``)."""
    from ckptkit.signals.recovery_log import describe

    text = describe({"n": 1, "detected_at": 5, "level": "warn", "signals": [],
                     "restored": {"checkpoint": "step-00000004"},
                     "actions": {"lr": {"factor": 0.5, "scale": None},
                                 "clip": {"factor": 0.5, "scale": None}}})
    assert "LR x?" in text and "clip norm x?" in text
