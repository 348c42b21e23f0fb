"""Issue 17 items 4-6: hostile manifests, trees and file kinds are refused cleanly, never hang,
and verify refuses exactly what load refuses (same code)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from deadline import within
from hostile import HOSTILE_TREES

import ckptkit
from ckptkit.checkpoint import manifest_io
from ckptkit.format import manifest as mf
from ckptkit.verify.describe import describe


def _verify_codes(d: Path) -> list[str]:
    return [f.code for f in ckptkit.verify(d).findings if f.severity != "info"]


def _file_codes(d: Path) -> list[str]:
    """Verify's codes about files, without CK-C010 (the component those bytes held is
    then not proven present, which is right and reported too)."""
    return [c for c in _verify_codes(d) if c != "CK-C010"]


def _load_code(d: Path) -> str | None:
    try:
        ckptkit.load(d)
    except ckptkit.CkptkitError as e:
        return e.code
    return None


def _describe_code(d: Path) -> str | None:
    try:
        describe(d)
    except ckptkit.CkptkitError as e:
        return e.code
    return None


def _rewrite(d: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    obj = json.loads((d / "manifest.json").read_text())
    edit(obj)
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "c"
    ckptkit.save(
        {"model": {"w": torch.randn(3, 2), "b": torch.zeros(2, dtype=torch.bfloat16)},
         "opt": {"state": {0: {"step": torch.tensor(1.0)}}, "eps": 1e-08}, "step": 4},
        d,
        step=4,
    )
    return d


# --- the manifest's bytes ------------------------------------------------------------------


def _dup_top(text: str) -> str:
    return text.replace('"step": 4,', '"step": 4, "step": 5,', 1)


def _dup_in_file_entry(text: str) -> str:
    # Two "path" keys in one entry: one reader takes the first, another the last.
    return text.replace('"path": "model.safetensors"',
                        '"path": "model.safetensors", "path": "../../etc/passwd"', 1)


@pytest.mark.parametrize(
    ("mutate", "code", "words"),
    [
        (lambda t: _dup_top(t).encode(), "CK-M002", "duplicate key 'step'"),
        (lambda t: _dup_in_file_entry(t).encode(), "CK-M002", "duplicate key 'path'"),
        (lambda t: t.encode("utf-16"), "CK-M002", "not UTF-8"),
        (lambda t: t.encode("utf-16-le"), "CK-M002", "not UTF-8"),
        (lambda t: b"\xef\xbb\xbf" + t.encode(), "CK-M002", "byte-order mark"),
        (lambda t: t.replace("1e-08", "1e908").encode(), "CK-M002", "out of range"),
        (lambda t: t.replace("1e-08", "-1e999").encode(), "CK-M002", "out of range"),
        (lambda t: t.replace('"step": 4,', '"step": 4, "x": Infinity,', 1).encode(),
         "CK-M002", "Infinity"),
        (lambda t: t.encode().replace(b"ckptkit", b"ckpt\xffkit", 1), "CK-M002", "not UTF-8"),
    ],
    ids=["dup-top", "dup-file-path", "utf16-bom", "utf16-no-bom", "utf8-bom", "1e908",
         "-1e999", "Infinity", "bad-utf8"],
)
def test_not_strict_json_is_m002_everywhere(ckpt: Path, mutate, code: str, words: str) -> None:  # type: ignore[no-untyped-def]
    p = ckpt / "manifest.json"
    p.write_bytes(mutate(p.read_text()))
    assert _load_code(ckpt) == code
    assert _verify_codes(ckpt) == [code]
    assert _describe_code(ckpt) == code
    with pytest.raises(ckptkit.ManifestError, match=words):
        ckptkit.load(ckpt)


def test_nonfinite_number_with_recomputed_digest_never_reaches_digest_code(ckpt: Path) -> None:
    """The issue's reproduction: `eps` 1e-08 -> 1e908 reads as inf; was a ValueError traceback."""
    text = (ckpt / "manifest.json").read_text().replace("1e-08", "1e908")
    (ckpt / "manifest.json").write_text(text)
    for fn in (ckptkit.load, ckptkit.verify, describe):
        try:
            res = fn(ckpt)
        except ckptkit.CkptkitError as e:
            assert e.code == "CK-M002"
        else:
            assert [f.code for f in res.findings] == ["CK-M002"]


@pytest.mark.parametrize("depth", [150, 600, 950, 5000])
@pytest.mark.parametrize("where", ["tree", "user", "summary"])
def test_deep_nesting_is_refused_cleanly(ckpt: Path, depth: int, where: str) -> None:
    deep = ("[" * depth + "1" + "]" * depth) if depth % 2 else ('{"a":' * depth + "1" + "}" * depth)
    obj = json.loads((ckpt / "manifest.json").read_text())
    if where == "tree":
        obj["tree"]["x"] = "@DEEP@"
    elif where == "user":
        obj["user"] = {"x": "@DEEP@"}
    else:
        obj["components"]["model"]["summary"] = {"x": "@DEEP@"}
    # No digest to recompute: the nesting is found before the digest runs.
    (ckpt / "manifest.json").write_text(json.dumps(obj).replace('"@DEEP@"', deep))
    code = _load_code(ckpt)
    assert code in ("CK-M006", "CK-M002")  # M002: deeper than the JSON parser follows
    assert _verify_codes(ckpt) == [code]
    assert _describe_code(ckpt) == code


def test_nesting_limit_is_symmetric_with_save(tmp_path: Path) -> None:
    """Whatever save writes, load reads: save refuses state nested past the read limit."""
    deep: Any = torch.ones(1)
    for _ in range(120):
        deep = {"a": deep}
    with pytest.raises(ckptkit.StateError, match="nested deeper"):
        ckptkit.save({"x": deep}, tmp_path / "c")
    assert not (tmp_path / "c").exists()
    ok: Any = torch.ones(1)
    for _ in range(15):
        ok = {0: (ok,)}  # a tagged dict and a tuple: five JSON levels per turn
    ckptkit.save({"x": ok}, tmp_path / "d")
    back = ckptkit.load(tmp_path / "d")["x"]
    for _ in range(15):
        back = back[0][0]
    assert torch.equal(back, torch.ones(1))
    with pytest.raises(ckptkit.StateError, match="user"):
        ckptkit.save({"w": torch.ones(1)}, tmp_path / "e", user={"x": json.loads("[" * 150 + "]" * 150)})


# --- what manifest.json is -----------------------------------------------------------------


def _manifest_kinds(ckpt: Path, tmp_path: Path) -> dict[str, Callable[[], Path | None]]:
    m = ckpt / "manifest.json"

    def symlink_inside() -> None:
        os.rename(m, ckpt / "real.json")
        os.symlink("real.json", m)

    def symlink_outside() -> None:
        shutil.copy(m, tmp_path / "elsewhere.json")
        m.unlink()
        os.symlink(tmp_path / "elsewhere.json", m)

    def fifo() -> Path:
        m.unlink()
        os.mkfifo(m)
        return m

    def directory() -> None:
        m.unlink()
        m.mkdir()

    def dangling() -> None:
        m.unlink()
        os.symlink(tmp_path / "nowhere.json", m)

    return {"symlink-inside": symlink_inside, "symlink-outside": symlink_outside,  # type: ignore[dict-item]
            "fifo": fifo, "directory": directory, "dangling-symlink": dangling}


@pytest.mark.parametrize("kind", ["symlink-inside", "symlink-outside", "fifo", "directory",
                                  "dangling-symlink"])
def test_manifest_must_be_a_regular_file(ckpt: Path, tmp_path: Path, kind: str) -> None:
    fifo = _manifest_kinds(ckpt, tmp_path)[kind]()
    fifos = [fifo] if fifo else []
    assert within(20, lambda: _load_code(ckpt), *fifos) == "CK-M008"
    assert within(20, lambda: _verify_codes(ckpt), *fifos) == ["CK-M008"]
    assert within(20, lambda: _describe_code(ckpt), *fifos) == "CK-M008"
    with pytest.raises(ckptkit.UnsafeInputError, match=r"manifest\.json: is a"):
        ckptkit.load(ckpt)


def test_manifest_char_device_is_never_opened(ckpt: Path) -> None:
    m = ckpt / "manifest.json"
    m.unlink()
    try:
        os.mknod(m, 0o600 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    assert _load_code(ckpt) == "CK-M008"
    assert _verify_codes(ckpt) == ["CK-M008"]


def test_cli_verify_and_inspect_fifo_manifest(ckpt: Path) -> None:
    from click.testing import CliRunner

    from ckptkit.cli import main

    m = ckpt / "manifest.json"
    m.unlink()
    os.mkfifo(m)
    r = within(20, lambda: CliRunner().invoke(main, ["verify", str(ckpt)]), m)
    assert r.exit_code == 1 and "CK-M008" in r.output
    r = within(20, lambda: CliRunner().invoke(main, ["inspect", str(ckpt)]), m)
    assert r.exit_code == 2 and "CK-M008" in r.output


# --- what a shard is -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_shard_must_be_a_regular_file(ckpt: Path, kind: str) -> None:
    f = ckpt / "model.safetensors"
    f.unlink()
    if kind == "fifo":
        os.mkfifo(f)
    else:
        f.mkdir()
    fifos = [f] if kind == "fifo" else []
    with pytest.raises(ckptkit.UnsafeInputError) as ei:
        within(20, lambda: ckptkit.load(ckpt), *fifos)
    assert ei.value.code == "CK-F022" and "model.safetensors" in str(ei.value)
    assert within(20, lambda: _file_codes(ckpt), *fifos) == ["CK-F022"]


def test_shard_fifo_with_size_zero_in_manifest_does_not_hang(ckpt: Path) -> None:
    """A hostile manifest can claim size 0 so that the size check passes: still not opened."""
    f = ckpt / "model.safetensors"
    f.unlink()
    os.mkfifo(f)
    _rewrite(ckpt, lambda o: o["files"][0].update(size=0))
    assert within(20, lambda: _load_code(ckpt), f) in ("CK-F022", "CK-M006")
    assert "CK-F022" in within(20, lambda: _file_codes(ckpt), f) or _load_code(ckpt) == "CK-M006"


def test_shard_symlink_is_f009_on_both_paths(ckpt: Path, tmp_path: Path) -> None:
    f = ckpt / "model.safetensors"
    shutil.move(f, tmp_path / "m.safetensors")
    os.symlink(tmp_path / "m.safetensors", f)
    assert _load_code(ckpt) == "CK-F009"
    assert _file_codes(ckpt) == ["CK-F009"]


# --- verify and load agree -----------------------------------------------------------------

_TREES = HOSTILE_TREES


@pytest.mark.parametrize("name", sorted(_TREES))
def test_verify_refuses_what_load_refuses(ckpt: Path, name: str) -> None:
    bad = _TREES[name]

    def edit(o: dict[str, Any]) -> None:
        if name == "tensor-and-ndarray":
            o["tree"]["y"] = {"$t": "tensor", "key": "model/w"}
        o["tree"]["x"] = bad

    _rewrite(ckpt, edit)
    err = None
    try:
        ckptkit.load(ckpt)
    except ckptkit.CkptkitError as e:
        err = e
    assert err is not None and err.code == "CK-M009", err
    assert isinstance(err, ckptkit.ManifestError) and "tree/x" in str(err)
    assert _verify_codes(ckpt) == ["CK-M009"]
    assert _describe_code(ckpt) == "CK-M009"


def test_every_encodable_value_passes_both(tmp_path: Path) -> None:
    """The other direction: what save writes, verify passes and load rebuilds."""
    import numpy as np

    w = torch.randn(2, 2, requires_grad=True)
    state = {
        "t": (1, 2.5, None, "s"), "d": {0: 1, (1, "a"): 2, None: 3, 1.5: 4, float("nan"): 5},
        "f": [float("inf"), float("-inf")], "size": torch.Size([2, 3]), "dtype": torch.bfloat16,
        "dev": torch.device("cpu"), "np": np.arange(3, dtype=np.int16), "b": b"\x00\xff",
        "npf": np.float32(1.5), "npi": np.int8(-3), "npb": np.bool_(True), "npu": np.uint64(2**63),
        "w": w, "w2": w, "big": 2**80,
    }
    ckptkit.save(state, tmp_path / "c")
    assert ckptkit.verify(tmp_path / "c").ok
    back = ckptkit.load(tmp_path / "c")
    assert back["t"] == (1, 2.5, None, "s") and back["size"] == torch.Size([2, 3])
    assert back["w"] is back["w2"] and back["w"].requires_grad
    assert back["np"].dtype == np.int16 and back["npu"] == np.uint64(2**63)
    assert back["b"] == b"\x00\xff" and back["big"] == 2**80


def test_tuple_key_holding_a_tensor_is_refused_at_save(tmp_path: Path) -> None:
    with pytest.raises(ckptkit.StateError, match="dict key"):
        ckptkit.save({"d": {(torch.ones(1),): 1}}, tmp_path / "c")


# --- issue 23, reproduction 3: one hostile value, the run goes on ---------------------------

_ISSUE23_VALUES = {
    name: HOSTILE_TREES[name]
    for name in (
        "npscalar-overflow", "float-list", "npscalar-f2-past-range", "npscalar-int-for-float",
        "null-tag",
    )
}


def _train_state(step: int) -> ckptkit.TrainState:
    torch.manual_seed(step)
    model = torch.nn.Linear(3, 2)
    return ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              step=step)


@pytest.mark.parametrize("name", sorted(_ISSUE23_VALUES))
def test_hostile_value_is_one_corrupt_checkpoint_not_a_broken_run(tmp_path: Path, name: str) -> None:
    """The checkpoint lists as corrupt naming the key path; restore falls back; the next save
    commits, verifies and rotates with no raw error (its background listing reads the bad
    manifest too)."""
    from ckptkit.checkpoint.catalog import Catalog

    run = tmp_path / "run"
    with ckptkit.CheckpointManager(run) as mgr:
        mgr.save(_train_state(1))
        mgr.save(_train_state(2))
    _rewrite(run / "step-00000002", lambda o: o["tree"].__setitem__("x", _ISSUE23_VALUES[name]))
    with pytest.raises(ckptkit.ManifestError) as ei:
        manifest_io.read(run / "step-00000002")
    assert ei.value.code == "CK-M009" and "manifest.json" in str(ei.value)
    assert "tree/x" in str(ei.value)
    status = {c.step: c for c in Catalog(run).list()}
    assert status[2].status == "corrupt" and "CK-M009" in (status[2].problem or "")
    assert status[1].status == "verified"
    with ckptkit.CheckpointManager(run, keep_last=2) as mgr:
        r = mgr.restore(_train_state(0))
        assert r is not None and r.step == 1
        mgr.save(_train_state(3))
        mgr.wait()  # raises what the background verify and rotation raised
    status = {c.step: c for c in Catalog(run).list()}
    assert status[3].status == "verified" and 2 not in status
    # the save after restoring step 1 branched the run: step 2 is set aside, kept whole
    assert list((run / ".ckptkit-abandoned").glob("branch-*/step-00000002/manifest.json"))


def _set_opt_state_key(o: dict[str, Any], key: Any) -> None:
    o["tree"]["optimizer"]["state_dict"]["state"] = {"$t": "dict", "items": [[key, {}]]}


_VIEW_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    # Values the tree decoder accepts (a huge int is a valid dict key) but verify's state
    # view once converted with float() or int() and raised.
    "optimizer-state-key-10**400": lambda o: _set_opt_state_key(o, 10**400),
    "optimizer-state-key-superscript": lambda o: _set_opt_state_key(o, "²"),
    "rng-rank-superscript": lambda o: o["tree"]["rng"].__setitem__(
        "rank²", o["tree"]["rng"]["rank00000"]
    ),
    "param-group-lr-10**400": lambda o: o["tree"]["optimizer"]["state_dict"]["param_groups"][0]
    .__setitem__("lr", 10**400),
}


@pytest.mark.parametrize("name", sorted(_VIEW_EDITS))
def test_verify_state_view_reads_hostile_numbers_without_raising(tmp_path: Path, name: str) -> None:
    run = tmp_path / "run"
    with ckptkit.CheckpointManager(run) as mgr:
        mgr.save(_train_state(1))
    _rewrite(run / "step-00000001", _VIEW_EDITS[name])
    res = ckptkit.verify(run / "step-00000001")  # a finding or a pass, never a traceback
    assert all(f.code.startswith("CK-") for f in res.findings)
