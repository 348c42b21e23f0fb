"""Property test: no mutation of a manifest gives a traceback or a read outside the checkpoint."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit.format import manifest as mf

_OPENED: list[str] = []
_RECORD = [False]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _RECORD[0] and event == "open" and isinstance(args[0], (str, bytes, Path)):
        _OPENED.append(str(args[0] if not isinstance(args[0], bytes) else args[0].decode()))


sys.addaudithook(_audit)

_BASE_DIR = Path(tempfile.mkdtemp(prefix="ckptkit-fuzz-"))
_SRC = _BASE_DIR / "src"
ckptkit.save(
    {"model": {"w": torch.randn(4, 4), "b": torch.zeros(3, dtype=torch.bfloat16)},
     "optimizer": {"state": {0: {"step": torch.tensor(2.0)}}}, "step": 2},
    _SRC,
    step=2,
)
(_BASE_DIR / "secret.safetensors").write_bytes(b"top secret" * 10)
_MANIFEST = json.loads((_SRC / "manifest.json").read_text())

hostile_strings = st.sampled_from(
    ["../secret.safetensors", "/etc/passwd", "..", "", "a" * 300, "model.safetensors",
     "optimizer.safetensors", "x/../../secret.safetensors", "\x00", "manifest.json"]
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -(10**400), 2**63, 2**64, 1e308, -1e308]),  # past every width
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20), hostile_strings,
)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


_ALL_PATHS = [p for p in _paths(_MANIFEST) if p]


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    obj = json.loads(json.dumps(_MANIFEST))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_ALL_PATHS))
        parent: Any = obj
        try:
            for k in path[:-1]:
                parent = parent[k]
            action = draw(st.sampled_from(["set", "delete"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "delete" and isinstance(parent, list) and path[-1] < len(parent):
                parent.pop(path[-1])
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    if draw(st.booleans()):
        obj["manifest_digest"] = mf.content_digest(obj) if isinstance(obj, dict) else ""
    return obj


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_manifest_mutations_never_traceback_nor_escape(obj: dict[str, Any]) -> None:
    d = _BASE_DIR / "case"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(_SRC, d)
    try:
        text = json.dumps(obj)
    except (TypeError, ValueError):
        return
    (d / "manifest.json").write_text(text)
    _OPENED.clear()
    _RECORD[0] = True
    try:
        try:
            ckptkit.load(d)
        except ckptkit.CkptkitError as e:
            assert e.code and str(e)
        res = ckptkit.verify(d)
        for f in res.findings:
            assert f.code.startswith("CK-") and f.message and f.hint
    finally:
        _RECORD[0] = False
    for p in _OPENED:
        rp = Path(p).resolve() if p else Path()
        assert not str(rp).startswith(str(_BASE_DIR)) or rp.is_relative_to(d.resolve()), p
