"""Issue 17 item 4: fuzz the newest checkpoint of a run (tree, tags, devices, dtypes, shapes,
tensor table, components, file kinds) and assert that no non-ckptkit exception escapes
``ckptkit.load``, ``ckptkit.verify``, ``describe`` (inspect) and ``CheckpointManager.restore``,
that nothing blocks, and that restore falls back to the good older checkpoint.

Issue 23 item 2: the decoder alone, every tag it knows with hostile payloads (numbers at
every magnitude, wrong container types, missing and extra fields), returns a value or raises
``CK-M009``, and ``check`` (verify) refuses exactly what ``decode`` (load) refuses; on disk,
verify calls such a checkpoint corrupt exactly when restore refuses it and falls back.

``CKPTKIT_FUZZ_EXAMPLES=N`` runs more examples; ``CKPTKIT_FUZZ_COUNTS=FILE`` writes the
tried / refused cleanly / escaped counts as JSON (also printed with ``pytest -s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit.checkpoint.catalog import Catalog
from ckptkit.format import manifest as mf
from ckptkit.format import tree as tree_mod
from ckptkit.verify.describe import describe
from ckptkit.verify.findings import CODES
from ckptkit.verify.runner import VerifyResult

EXAMPLES = int(os.environ.get("CKPTKIT_FUZZ_EXAMPLES", "120"))
NEW, OLD = "step-00000002", "step-00000001"
COUNTS: Counter[str] = Counter()


def _state(step: int) -> ckptkit.TrainState:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return ckptkit.TrainState(model=model, optimizer=opt, step=step)


_BASE = Path(tempfile.mkdtemp(prefix="ckptkit-fuzz-tree-"))
_TEMPLATE = _BASE / "template"
with ckptkit.CheckpointManager(_TEMPLATE, keep_last=5) as _mgr:
    _mgr.save(_state(1))
    _mgr.save(_state(2))
_MANIFEST: dict[str, Any] = json.loads((_TEMPLATE / NEW / "manifest.json").read_text())
_KEYS = [t["key"] for t in _MANIFEST["tensors"]]
_FILES = [f["path"] for f in _MANIFEST["files"]]
(_BASE / "outside.safetensors").write_bytes((_TEMPLATE / NEW / _FILES[0]).read_bytes())


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Iterator[None]:
    yield
    shutil.rmtree(_BASE, ignore_errors=True)
    print("\nfuzz counts:", dict(sorted(COUNTS.items())))
    out = os.environ.get("CKPTKIT_FUZZ_COUNTS")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(COUNTS.items())), indent=1))


# --- what a mutation can put in ----------------------------------------------------------

HUGE = [10**400, -(10**400), 2**63, -(2**63) - 1, 2**64, 2**1024, 1e308, -1e308, 5e-324, -0.0]
"""Numbers past every width a decoder converts to (int64, uint64, float64, float16)."""
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from(HUGE),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    st.sampled_from([*_KEYS, "nope", "", "$t"]),
)
devices = st.sampled_from(["cpu", "cuda", "cuda:0", "meta", "cuda:x:y", "", "mps:0", "xla:1",
                           "cpu:-1", "a" * 100, 7, None])
torch_dtypes = st.sampled_from(["float32", "bfloat16", "float8_e4m3fn", "_dynamo", "nn", "int8",
                                "Tensor", 3, None])
np_dtypes = st.sampled_from(["f8", "f2", "i1", "u8", "b1", "V9999999999", "(100000,100000)f8",
                             "U999999999", "O", "zz", "<f8", None, 4])
st_dtypes = st.sampled_from(["F64", "F32", "F16", "BF16", "I64", "I8", "U8", "BOOL", "F8_E4M3",
                             "C64", "X99"])
shapes = st.lists(st.integers(-2, 2**41), max_size=4) | st.just([]) | scalars


@st.composite
def tagged(draw: st.DrawFn, inner: st.SearchStrategy[Any]) -> dict[str, Any]:
    tag = draw(st.sampled_from(["tensor", "ndarray", "tuple", "dict", "float", "size", "dtype",
                                "device", "npscalar", "bytes", "pickle", 5]))
    fields: dict[str, Any] = {
        "tensor": {"key": draw(st.sampled_from([*_KEYS, "nope", 3]) | scalars)},
        "ndarray": {"key": draw(st.sampled_from(_KEYS) | scalars)},
        "tuple": {"items": draw(st.lists(inner, max_size=3) | scalars)},
        "dict": {"items": draw(st.lists(st.lists(inner, min_size=0, max_size=3), max_size=3))},
        "float": {"v": draw(st.sampled_from(["nan", "inf", "-inf", "1e5", 1.0, None])
                            | scalars | st.lists(scalars, max_size=2)
                            | st.dictionaries(st.text(max_size=3), scalars, max_size=2))},
        "size": {"items": draw(st.lists(st.integers(-3, 2**70), max_size=3) | scalars)},
        "dtype": {"v": draw(torch_dtypes)},
        "device": {"v": draw(devices)},
        "npscalar": {"dtype": draw(np_dtypes), "v": draw(scalars | st.lists(scalars, max_size=2))},
        "bytes": {"b64": draw(st.sampled_from(["AAAA", "abc", "!!!!", "", "QQ==", 5]))},
    }.get(tag, {"v": draw(scalars)})
    if tag == "tensor" and draw(st.booleans()):
        fields["requires_grad"] = draw(st.booleans() | scalars)
    if draw(st.integers(0, 9)) == 0:
        fields["extra"] = 1
    if fields and draw(st.integers(0, 9)) == 0:
        fields.pop(next(iter(fields)))
    return {"$t": tag, **fields}


values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    | tagged(inner),
    max_leaves=6,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


_TREE_PATHS = [p for p in _paths(_MANIFEST["tree"]) if p]
_KINDS = ["directory", "fifo", "symlink-inside", "symlink-outside", "garbage", "missing"]


@st.composite
def mutations(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["tree", "tree", "tree", "tensor", "file", "component",
                                     "kind", "drop"]))
        if what == "tree":
            ops.append(("tree", draw(st.sampled_from(_TREE_PATHS)), draw(values)))
        elif what == "drop":
            ops.append(("drop", draw(st.sampled_from(_TREE_PATHS))))
        elif what == "tensor":
            i = draw(st.integers(0, len(_KEYS) - 1))
            field = draw(st.sampled_from(["dtype", "shape", "offsets", "key", "file"]))
            v = {"dtype": st_dtypes, "shape": shapes, "offsets": shapes,
                 "key": st.sampled_from([*_KEYS, "x"]), "file": st.sampled_from([*_FILES, "x"])}
            ops.append(("tensor", i, field, draw(v[field])))
        elif what == "file":
            i = draw(st.integers(0, len(_FILES) - 1))
            field = draw(st.sampled_from(["size", "compression", "raw_size", "path"]))
            v = {"size": st.integers(0, 2**40), "compression": st.sampled_from([None, "zstd"]),
                 "raw_size": st.integers(0, 2**40), "path": st.sampled_from(_FILES)}
            ops.append(("file", i, field, draw(v[field])))
        elif what == "component":
            name = draw(st.sampled_from(list(_MANIFEST["components"])))
            field = draw(st.sampled_from(["present", "required", "summary", "where"]))
            ops.append(("component", name, field, draw(values)))
        else:
            target = draw(st.sampled_from([*_FILES, "manifest.json"]))
            ops.append(("kind", target, draw(st.sampled_from(_KINDS))))
    ops.append(("redigest", draw(st.integers(0, 9)) > 0))
    return ops


def _apply(d: Path, ops: list[tuple[Any, ...]]) -> list[Path]:
    """Mutate checkpoint ``d``; return the FIFOs made (to unblock a reader on timeout)."""
    obj: dict[str, Any] = json.loads(json.dumps(_MANIFEST))
    kinds = []
    for op in ops:
        with contextlib.suppress(KeyError, IndexError, TypeError):
            if op[0] in ("tree", "drop"):
                parent: Any = obj["tree"]
                for k in op[1][:-1]:
                    parent = parent[k]
                if op[0] == "drop":
                    parent.pop(op[1][-1])
                else:
                    parent[op[1][-1]] = op[2]
            elif op[0] == "tensor":
                obj["tensors"][op[1]][op[2]] = op[3]
            elif op[0] == "file":
                obj["files"][op[1]][op[2]] = op[3]
            elif op[0] == "component":
                obj["components"][op[1]][op[2]] = op[3]
            elif op[0] == "kind":
                kinds.append(op)
            elif op[0] == "redigest" and op[1]:
                with contextlib.suppress(ValueError, TypeError, RecursionError):
                    obj["manifest_digest"] = mf.content_digest(obj)
    with contextlib.suppress(ValueError, TypeError):
        (d / "manifest.json").write_text(json.dumps(obj))
    fifos = []
    for _, target, kind in kinds:
        p = d / target
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif os.path.lexists(p):
            p.unlink()
        if kind == "directory":
            p.mkdir()
        elif kind == "fifo":
            os.mkfifo(p)
            fifos.append(p)
        elif kind == "symlink-inside":
            os.symlink(_FILES[-1] if target != _FILES[-1] else _FILES[0], p)
        elif kind == "symlink-outside":
            os.symlink(_BASE / "outside.safetensors", p)
        elif kind == "garbage":
            p.write_bytes(b"\x00garbage" * 7)
    return fifos


def _call(
    api: str, fn: Callable[[], Any], fifos: list[Path], seconds: float = 60, survey: bool = False
) -> Any:
    """Run ``fn``: ckptkit errors are 'refused', anything else escapes; never wait forever."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except ckptkit.CkptkitError as e:
            out["refused"] = e
        except BaseException as e:  # the failure this test exists to find
            out["escaped"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for f in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        COUNTS[f"{api}: blocked"] += 1
        pytest.fail(f"{api} blocked for {seconds}s")
    if "escaped" in out:
        COUNTS[f"{api}: escaped"] += 1
        if survey:
            e = out["escaped"]
            tb = [f for f in traceback.extract_tb(e.__traceback__) if "/ckptkit/" in f.filename]
            where = f"{Path(tb[-1].filename).name}:{tb[-1].name}" if tb else "?"
            COUNTS[f"{api}: escaped {type(e).__name__} in {where}"] += 1
            return e
        raise AssertionError(f"{api} let a non-ckptkit exception escape") from out["escaped"]
    if "refused" in out:
        e = out["refused"]
        assert e.code is None or e.code in CODES, e
        assert str(e)
        COUNTS[f"{api}: refused cleanly"] += 1
        return e
    COUNTS[f"{api}: ok"] += 1
    return out["value"]


def _case(ops: list[tuple[Any, ...]]) -> tuple[Path, list[Path]]:
    run = _BASE / "case"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(_TEMPLATE, run, symlinks=True)
    return run, _apply(run / NEW, ops)


_FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_FUZZ
@given(ops=mutations())
def test_newest_checkpoint_mutated(ops: list[tuple[Any, ...]]) -> None:
    """load, verify and inspect refuse cleanly, never block, and agree."""
    COUNTS["tried"] += 1
    run, fifos = _case(ops)
    ck = run / NEW
    loaded = _call("load", lambda: ckptkit.load(ck), fifos)
    res = _call("verify", lambda: ckptkit.verify(ck), fifos)
    _call("inspect", lambda: describe(ck), fifos)
    if isinstance(res, VerifyResult):
        for f in res.findings:
            assert f.code in CODES and f.message and f.hint
        if res.ok:
            assert not isinstance(loaded, ckptkit.CkptkitError), (
                f"verify passed what load refuses: {loaded}"
            )


@_FUZZ
@example(ops=[("drop", ("model", "0.weight")), ("redigest", True)])
@example(ops=[("drop", ("model",)), ("redigest", True)])
@example(ops=[("drop", ("optimizer", "state_dict", "param_groups")), ("redigest", True)])
@given(ops=mutations())
def test_restore_falls_back_from_mutated_newest(ops: list[tuple[Any, ...]]) -> None:
    """With a good older checkpoint, restore never raises and skips a damaged newest one."""
    COUNTS["restore tried"] += 1
    run, fifos = _case(ops)
    ck = run / NEW
    bad = isinstance(_call("load", lambda: ckptkit.load(ck), fifos), ckptkit.CkptkitError)
    survey = bool(os.environ.get("CKPTKIT_FUZZ_SURVEY"))  # count outcomes, assert nothing
    with ckptkit.CheckpointManager(run, keep_last=5) as mgr:
        r = _call("restore", lambda: mgr.restore(_state(0)), fifos, survey=survey)
    if survey:
        if isinstance(r, ckptkit.CkptkitError):
            COUNTS[f"restore: did not fall back, raised {r.code}: {r.what[:60]}"] += 1
        COUNTS["restore: did not fall back" if isinstance(r, ckptkit.CkptkitError)
               else "restore: (escaped)" if isinstance(r, BaseException)
               else "restore: fell back" if bad and r is not None and r.step == 1
               else "restore: took the damaged newest" if bad
               else "restore: took the newest (loads)"] += 1
        return
    assert not isinstance(r, ckptkit.CkptkitError), f"restore did not fall back: {r}"
    assert r is not None
    if bad:
        assert r.step == 1, f"restored the damaged newest checkpoint (step {r.step})"


# --- the decoder alone: every tag it knows x hostile payloads (issue 23 item 2) ------------

hostile_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(HUGE), st.floats(),
    st.text(max_size=6),
    st.sampled_from(["nan", "inf", "-inf", "f8", "f2", "i1", "u8", "?", "float32", "bfloat16",
                     "cpu", "cuda:0", "AAAA", "w", "b", "$t"]),
)
hostile_values = st.recursive(
    hostile_leaves,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=5,
)
_DECODER_TAGS = sorted(tree_mod._TAG_FIELDS)  # every tag the decoder knows: a new one is fuzzed too


@st.composite
def hostile_tagged(draw: st.DrawFn, inner: st.SearchStrategy[Any]) -> dict[str, Any]:
    """A tagged value of a known tag (now and then an unknown one) with hostile fields."""
    tag = draw(st.sampled_from(_DECODER_TAGS) | hostile_leaves)
    need, opt = tree_mod._TAG_FIELDS.get(tag, (frozenset({"v"}), frozenset()))
    out: dict[str, Any] = {"$t": tag}
    for name in sorted(need | opt):
        if draw(st.integers(0, 9)) == 0:
            continue  # a missing field (or an absent optional one)
        out[name] = draw(inner | hostile_values)
    if draw(st.integers(0, 9)) == 0:
        out["extra"] = draw(hostile_leaves)
    return out


hostile_trees = st.recursive(
    hostile_values,
    lambda inner: hostile_tagged(inner)
    | st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _decode_outcome(fn: Callable[[], Any]) -> str | None:
    """None when ``fn`` decoded; the code when it refused. Anything else fails the test."""
    try:
        fn()
    except ckptkit.ManifestError as e:
        assert e.code == "CK-M009" and "'tree" in e.what, e
        return e.code
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(value={"$t": "npscalar", "dtype": "f8", "v": 10**400})
@example(value={"$t": "float", "v": []})
@example(value={"$t": "npscalar", "dtype": "f2", "v": 1e300})
@example(value={"$t": "npscalar", "dtype": "u8", "v": -(10**400)})
@example(value={"$t": None})
@given(value=hostile_trees)
def test_decoding_a_hostile_value_returns_or_raises_m009(value: Any) -> None:
    """``check`` (every manifest read, so verify) and ``decode`` (load) never raise anything
    but CK-M009 (warnings are errors here: a numpy overflow would fail too), and agree."""
    tensors = {"w": torch.zeros(2), "b": torch.zeros(2, dtype=torch.bfloat16)}
    tree = {"x": value}
    checked = _decode_outcome(lambda: tree_mod.check(tree, {"w": "F32", "b": "BF16"}))
    loaded = _decode_outcome(lambda: tree_mod.decode(tree, tensors))
    assert checked == loaded, f"verify {'refuses' if checked else 'passes'} what load does not"


def _extra_state(step: int) -> ckptkit.TrainState:
    """:func:`_state` with an ``extra`` dict: restore puts the tree's ``extra`` back into it."""
    ts = _state(step)
    return ckptkit.TrainState(model=ts.model, optimizer=ts.optimizer, step=step, extra={})


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(value={"$t": "npscalar", "dtype": "f8", "v": 10**400})
@example(value={"$t": "float", "v": []})
@example(value={"$t": "float", "v": "inf"})
@given(value=hostile_trees)
def test_verify_and_restore_agree_on_a_hostile_value(value: Any) -> None:
    """The newest checkpoint carries the value (digest recomputed): verify calls it corrupt
    exactly when restore refuses it and falls back to the older one; the catalog lists it
    (corrupt only if verify fails) and never raises."""
    run = _BASE / "agree"
    if run.exists():
        shutil.rmtree(run)
    shutil.copytree(_TEMPLATE, run)
    obj = json.loads(json.dumps(_MANIFEST))
    obj["tree"]["extra"] = {"x": value}
    try:
        obj["manifest_digest"] = mf.content_digest(obj)
    except ValueError:
        # A bare inf/NaN is not JSON: no manifest can hold it (strict parsing refuses
        # such text as CK-M002, tests/verify/test_hostile_manifest.py), so there is no
        # checkpoint to judge here.
        assume(False)
    (run / NEW / "manifest.json").write_text(json.dumps(obj))
    res = ckptkit.verify(run / NEW)
    listed = {c.path.name: c for c in Catalog(run).list()}
    assert set(listed) == {OLD, NEW}
    if listed[NEW].status == "corrupt":
        assert not res.ok and "CK-M009" in (listed[NEW].problem or "")
    with ckptkit.CheckpointManager(run, keep_last=5) as mgr:
        r = mgr.restore(_extra_state(0))
    assert r is not None
    assert r.step == (2 if res.ok else 1), (
        f"verify {'passed' if res.ok else 'failed'} step 2 but restore took step {r.step}: "
        f"{[f.code for f in res.findings if f.severity == 'error']}"
    )
