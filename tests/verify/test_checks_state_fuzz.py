"""Property test: state checks never traceback on a damaged (but schema-valid) manifest.

Component summaries and the state tree are free-form JSON; the state checks must read
them defensively and skip what they cannot understand.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.format import manifest as mf

_BASE = Path(tempfile.mkdtemp(prefix="ckptkit-state-fuzz-"))


def _source() -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LinearLR(opt)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    sched.step()
    ts = ckptkit.TrainState(
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=torch.amp.GradScaler("cpu"),
        sampler=ResumableSampler(8),
        step=1,
        parallel=ParallelConfig(global_batch_size=0),
        fp8={"x.scale": torch.ones(1), "x.amax_history": torch.ones(4, 1)},
        data={"snapshot": "a"},
    )
    with ckptkit.CheckpointManager(_BASE / "run") as mgr:  # close: joins the background read-back verify
        return mgr.save(ts)


_SRC = _source()
_MANIFEST = json.loads((_SRC / "manifest.json").read_text())


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


# Only the free-form parts: summaries and the state tree (not the RNG's long int lists).
_TARGETS = [
    p
    for p in _paths(_MANIFEST)
    if len(p) > 1 and p[0] in ("components", "tree") and "python" not in p
]
_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
        st.sampled_from(
            [
                {"$t": "float", "v": "nan"},
                {"$t": "dict", "items": [[0]]},
                {"$t": "tensor", "key": "model/weight"},
                {"$t": "tuple"},
            ]
        ),
    ),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=6,
)


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    obj = json.loads(json.dumps(_MANIFEST))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_TARGETS))
        parent: Any = obj
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                # a copy: sampled_from hands out the same dict each time, and one placed
                # inside another copy of itself is a cycle no manifest can hold
                parent[path[-1]] = copy.deepcopy(draw(_values))
        except (KeyError, IndexError, TypeError):
            continue
    obj["manifest_digest"] = mf.content_digest(obj)
    return obj


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_state_checks_never_traceback(obj: dict[str, Any]) -> None:
    d = _BASE / "case"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(_SRC, d)
    (d / "manifest.json").write_text(json.dumps(obj))
    res = ckptkit.verify(d, families=("completeness", "consistency", "compat"), against_env=True)
    for f in res.findings:
        assert f.code.startswith("CK-") and f.message and f.hint
