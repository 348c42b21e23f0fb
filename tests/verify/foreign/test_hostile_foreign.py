"""Odd and damaged foreign files: always findings (never tracebacks), damage never a pass.

Regression tests for: garbage ``.pt`` files crashing ``safe_torch_load`` (``struct.error``)
or passing verify as CK-F103; zip archives whose central directory fails to parse
(``NotImplementedError: zip file version``); DCP ``.metadata`` of an unexpected shape;
non-dict/non-list JSON in ``trainer_state.json``; the fixed temporary name of ``adopt``.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import struct
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from ckptkit.checkpoint import safeload
from ckptkit.cli import main
from ckptkit.errors import IntegrityError
from ckptkit.format import manifest as mf
from ckptkit.verify.foreign import adopt, detect
from ckptkit.verify.foreign.adopt import adopted_path
from ckptkit.verify.foreign.report import describe_foreign, verify_foreign

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


def _codes(rep: Any, severity: str | None = None) -> list[str]:
    return [f.code for f in rep.findings if severity is None or str(f.severity) == severity]


def _assert_damage_everywhere(p: Path, code: str, fmt: str | None = None) -> None:
    """verify exits 1 with ``code`` (an error), inspect answers, adopt refuses without --force."""
    rep = verify_foreign(p, fmt)
    assert not rep.ok and code in _codes(rep, "error"), rep.findings
    assert "CK-F103" not in _codes(rep)
    args = ["--format", fmt] if fmt else []
    runner = CliRunner()
    r = runner.invoke(main, ["verify", str(p), "--json", *args], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    r = runner.invoke(main, ["inspect", str(p), "--json", *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert describe_foreign(p, fmt)["format"] == (fmt or detect(p))
    with pytest.raises(IntegrityError, match="refusing to adopt"):
        adopt.adopt(p, fmt)
    assert not adopted_path(p).exists()
    r = runner.invoke(main, ["adopt", str(p), *args], catch_exceptions=False)
    assert r.exit_code == 2 and not adopted_path(p).exists()
    assert adopt.adopt(p, fmt, force=True) == adopted_path(p)


# --- garbage torch files --------------------------------------------------------------------------


def test_junk_file_is_a_finding_not_a_traceback(tmp_path: Path) -> None:
    p = tmp_path / "j.pt"
    p.write_bytes(b"junk")  # used to crash torch.load's unpickler with struct.error
    _assert_damage_everywhere(p, "CK-F108")
    f = next(f for f in verify_foreign(p).findings if f.code == "CK-F108")
    assert "struct.error" in f.message


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_are_damage_not_code(tmp_path: Path, seed: int) -> None:
    """torch wraps every weights-only failure in "Weights only load failed": not F103."""
    rnd = random.Random(seed)
    head = [b"", b"\x80\x02", b"\x80\x04\x95"][seed % 3]  # some start like a pickle
    p = tmp_path / "r.pt"
    p.write_bytes(head + rnd.randbytes(4096))
    obj, problem = safeload.safe_torch_load(p)
    assert obj is None and problem is not None and problem.code == "CK-F108", problem
    _assert_damage_everywhere(p, "CK-F108")


def test_zip_whose_pickle_is_garbage_is_damage(tmp_path: Path) -> None:
    """CRCs intact (so not CK-F101/F102) but data.pkl is not a pickle: CK-F108."""
    p = tmp_path / "g.pt"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("g/data.pkl", random.Random(0).randbytes(512))
        zf.writestr("g/version", "3\n")
    _assert_damage_everywhere(p, "CK-F108")


@pytest.mark.parametrize(
    "exc",
    [
        struct.error("unpack requires a buffer of 4 bytes"),
        NotImplementedError("zip file version 25.5"),
        OverflowError("too big"),
        MemoryError(),
        RecursionError("maximum recursion depth exceeded"),
        LookupError("anything else"),
    ],
)
def test_safe_torch_load_turns_any_exception_into_f108(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    p = tmp_path / "x.pt"
    torch.save({"a": 1}, p)

    def boom(*_a: object, **_k: object) -> None:
        raise exc

    monkeypatch.setattr(torch, "load", boom)
    obj, problem = safeload.safe_torch_load(p)
    assert obj is None and problem is not None and problem.code == "CK-F108"
    assert type(exc).__name__ in problem.message


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_safe_torch_load_never_swallows_interrupts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: type[BaseException]
) -> None:
    p = tmp_path / "x.pt"
    torch.save({"a": 1}, p)

    def boom(*_a: object, **_k: object) -> None:
        raise exc

    monkeypatch.setattr(torch, "load", boom)
    with pytest.raises(exc):
        safeload.safe_torch_load(p)


# --- pickles that really need code: still CK-F103, named, never executed -----------------------


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("EXECUTED",))


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_pickle_needing_code_names_its_globals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], zipped: bool
) -> None:
    p = tmp_path / "evil.pt"
    torch.save(
        {"model": {"w": torch.ones(1)}, "payload": _Evil()},
        p,
        _use_new_zipfile_serialization=zipped,
    )
    rep = verify_foreign(p)
    f = [f for f in rep.findings if f.code == "CK-F103"]
    # The file as a whole needs code to read: an error (never a good verdict), that names
    # the global and claims nothing about what else the file holds.
    assert f and "builtins.print" in f[0].message and str(f[0].severity) == "error"
    assert not rep.ok and "torch.save(model) pickles" in f[0].message
    assert "CK-F108" not in _codes(rep)
    assert "EXECUTED" not in capsys.readouterr().out


def test_truncated_legacy_pickle_is_damage(tmp_path: Path) -> None:
    p = tmp_path / "legacy.pt"
    torch.save({"model": {"w": torch.ones(4)}}, p, _use_new_zipfile_serialization=False)
    assert safeload.safe_torch_load(p)[1] is None
    p.write_bytes(p.read_bytes()[:60])
    _obj, problem = safeload.safe_torch_load(p)
    assert problem is not None and problem.code == "CK-F108"


def test_pickle_scan_is_bounded() -> None:
    """A hostile length field is not allocated: the walk stops at the stream's bound."""
    evil = b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b"x" * 16  # BINBYTES8 of 2**60
    assert safeload._scan_globals(safeload._Bounded(io.BytesIO(evil), 64)) == ([], False)
    assert safeload.pickle_globals(pickle.dumps(print)) == ["builtins.print"]


# --- damaged zip central directories ----------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".pt", ".ckpt"])
def test_zip_with_unparseable_central_directory(tmp_path: Path, suffix: str) -> None:
    """A flipped "version needed" byte: ZipFile raises NotImplementedError, not BadZipFile."""
    p = tmp_path / f"v{suffix}"
    torch.save({"model": {"w": torch.ones(3)}, "step": 1}, p)
    data = bytearray(p.read_bytes())
    data[data.find(b"PK\x01\x02") + 6] = 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(NotImplementedError):
        zipfile.ZipFile(p)
    assert detect(p) == ("lightning" if suffix == ".ckpt" else "torch-save")
    bad = safeload.check_zip(p)
    assert bad is not None and bad.code == "CK-F102" and "NotImplementedError" in bad.message
    _assert_damage_everywhere(p, "CK-F102")


def test_detect_has_one_zip_sniffer() -> None:
    import importlib

    mod = importlib.import_module("ckptkit.checkpoint.detect")
    assert not hasattr(mod, "_is_zip")
    assert not hasattr(safeload, "load_dcp_item")


# --- DCP .metadata of an unexpected shape -----------------------------------------------------------


def _odd_metadata() -> dict[str, Any]:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    sd = {"model.w": BytesStorageMetadata()}
    return {
        "int-storage-info": Metadata(state_dict_metadata=sd, storage_data={"model.w": 7}),
        "list-storage": Metadata(state_dict_metadata=sd, storage_data=[1, 2, 3]),
        "int-sd-meta": Metadata(state_dict_metadata=5, storage_data={}),
        "non-str-fqn": Metadata(state_dict_metadata={3: BytesStorageMetadata()}),
        "list-relative-path": Metadata(
            state_dict_metadata=sd,
            storage_data={MetadataIndex("model.w"): _StorageInfo(["a"], 0, 1)},  # type: ignore[arg-type]
        ),
        "int-chunks": Metadata(
            state_dict_metadata={
                "model.w": TensorStorageMetadata(
                    TensorProperties(dtype=torch.float32), torch.Size([1]), chunks=5
                )  # type: ignore[arg-type]
            },
            storage_data={},
        ),
        "negative-offset": Metadata(
            state_dict_metadata=sd,
            storage_data={MetadataIndex("model.w"): _StorageInfo("__0_0.distcp", -5, 1)},
        ),
        "str-length": Metadata(
            state_dict_metadata=sd,
            storage_data={MetadataIndex("model.w"): _StorageInfo("__0_0.distcp", 0, "9")},  # type: ignore[arg-type]
        ),
        "no-metadata-object": {"state_dict_metadata": sd},
    }


@pytest.mark.parametrize("case", list(_odd_metadata()))
def test_dcp_metadata_with_unexpected_structure(tmp_path: Path, case: str) -> None:
    d = tmp_path / "dcp"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps(_odd_metadata()[case]))
    (d / "__0_0.distcp").write_bytes(b"\0" * 64)
    assert safeload.read_dcp_metadata(d / ".metadata")[1] is None  # the unpickler accepts it
    rep = verify_foreign(d)
    if case == "negative-offset":  # a range, held by the one coverage rule of every reader
        f = [f for f in rep.findings if f.code == "CK-F106"]
        assert f and f[0].path == "__0_0.distcp"
        _assert_damage_everywhere(d, "CK-F106")
        return
    f = [f for f in rep.findings if f.code == "CK-F108"]
    assert f and "unexpected structure" in f[0].message and f[0].path == ".metadata"
    _assert_damage_everywhere(d, "CK-F108")


def test_dcp_metadata_that_breaks_the_unpickler(tmp_path: Path) -> None:
    d = tmp_path / "dcp"
    d.mkdir()
    # LONG4 of an absurd length, then junk: whatever the unpickler raises is a finding.
    (d / ".metadata").write_bytes(b"\x80\x04\x8b" + struct.pack("<i", 1 << 30) + b"\x01" * 8)
    _assert_damage_everywhere(d, "CK-F108")


# --- trainer_state.json with odd JSON ---------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        {"global_step": 2, "log_history": 5},
        {"global_step": 2, "log_history": "loss"},
        {"global_step": 2, "log_history": {"loss": 1}},
        {"global_step": [2], "epoch": {"x": 1}, "log_history": [{"loss": 1.0}]},
        {"global_step": "2", "epoch": "one", "log_history": None},
    ],
)
def test_trainer_state_with_odd_values(tmp_path: Path, state: dict[str, Any]) -> None:
    d = tmp_path / "checkpoint-2"
    d.mkdir()
    (d / "trainer_state.json").write_text(json.dumps(state))
    rep = verify_foreign(d)
    assert rep.format == "hf-trainer"
    history = state.get("log_history")
    assert rep.components["metrics"].present == (isinstance(history, list) and bool(history))
    if history is not None and not isinstance(history, list):
        assert "CK-F108" in _codes(rep, "warning")
    assert rep.components["progress"].summary["epoch"] is None or isinstance(
        rep.components["progress"].summary["epoch"], int | float
    )
    r = CliRunner().invoke(main, ["inspect", str(d), "--json"], catch_exceptions=False)
    assert r.exit_code == 0
    adopt.adopt(d, force=True)


@pytest.mark.parametrize("text", ["5", "[1, 2]", '"x"', "null", "[" * 100_000 + "]" * 100_000])
def test_trainer_state_not_an_object(tmp_path: Path, text: str) -> None:
    d = tmp_path / "checkpoint-2"
    d.mkdir()
    (d / "trainer_state.json").write_text(text)
    rep = verify_foreign(d)
    f = [f for f in rep.findings if f.code == "CK-F108"]
    assert f and f[0].path == "trainer_state.json" and not rep.ok


# --- adopt's atomic write ---------------------------------------------------------------------------


def test_adopt_uses_unique_temporary_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "ck.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3}, p)
    seen: list[Path] = []
    real_replace = adopt.os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append(Path(src))
        real_replace(src, dst)

    monkeypatch.setattr(adopt.os, "replace", spy)
    out = adopt.adopt(p)
    adopt.adopt(p)
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(s.parent == out.parent and s != out.with_name(out.name + ".tmp") for s in seen)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ck.pt", out.name]


def test_concurrent_adopts_all_succeed(tmp_path: Path) -> None:
    p = tmp_path / "ck.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3}, p)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            barrier.wait()
            adopt.adopt(p)
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    out = adopted_path(p)
    assert mf.Manifest.from_json(out.read_bytes()).step == 3
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ck.pt", out.name]
    codes = _codes(verify_foreign(p))
    assert not {"CK-F001", "CK-F002", "CK-F003", "CK-F006", "CK-F107"} & set(codes)
