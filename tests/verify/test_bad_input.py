"""Spec §8: every bad input gets a clear error naming the file, and nothing is lost."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import zstandard

import ckptkit
from ckptkit.format import manifest as mf


def _snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _codes(path: Path) -> list[str]:
    return [f.code for f in ckptkit.verify(path).findings]


def _rewrite_manifest(d: Path, edit: Callable[[dict], None], *, redigest: bool = True) -> None:
    obj = json.loads((d / "manifest.json").read_text())
    edit(obj)
    if redigest:
        obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))


def _load_error(d: Path) -> ckptkit.CkptkitError:
    with pytest.raises(ckptkit.CkptkitError) as ei:
        ckptkit.load(d)
    return ei.value


def test_truncated_file(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    f = d / "model.safetensors"
    os.truncate(f, f.stat().st_size - 10)
    before = _snapshot(d)
    err = _load_error(d)
    assert isinstance(err, ckptkit.IntegrityError) and err.code == "CK-F002"
    assert "model.safetensors" in str(err) and "truncated" in str(err) and "Fix:" in str(err)
    assert _codes(d) == ["CK-F002", "CK-C010"]  # and the model it held is unproven
    assert _snapshot(d) == before  # nothing written or deleted


@pytest.mark.parametrize("where", ["header", "data"])
def test_flipped_byte(saved_ckpt, where: str) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    f = d / "optimizer.safetensors"
    raw = bytearray(f.read_bytes())
    pos = 20 if where == "header" else len(raw) - 3
    raw[pos] ^= 0x01
    f.write_bytes(bytes(raw))
    err = _load_error(d)
    assert err.code in {"CK-F003", "CK-F004", "CK-F005"}
    assert "optimizer.safetensors" in str(err)
    assert "CK-F003" in _codes(d)


def test_missing_file(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "model.safetensors").unlink()
    err = _load_error(d)
    assert isinstance(err, ckptkit.IncompleteCheckpointError) and isinstance(err, FileNotFoundError)
    assert err.code == "CK-F001" and "model.safetensors" in str(err)
    assert _codes(d) == ["CK-F001", "CK-C010"]  # and the model it held is unproven


def test_extra_file_is_a_warning(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "notes.txt").write_text("hi")
    res = ckptkit.verify(d)
    assert res.ok and [f.code for f in res.findings] == ["CK-F006"]
    assert res.findings[0].path == "notes.txt"
    assert not ckptkit.verify(d, strict=True).ok
    ckptkit.load(d)  # loads fine: the extra file is ignored, never read


def test_no_manifest_is_incomplete(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "manifest.json").unlink()
    err = _load_error(d)
    assert err.code == "CK-M001" and isinstance(err, ckptkit.IncompleteCheckpointError)
    assert _codes(d) == ["CK-M001"]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (b"{not json", "CK-M002"),
        (b"\xff\xfe", "CK-M002"),
        (b"[1, 2]", "CK-M003"),
        (b'{"schema_version": 99}', "CK-M004"),
        (b'{"schema_version": 1}', "CK-M003"),
        (b'{"schema_version": 1, "x": NaN}', "CK-M002"),
        (b"[" * 100_000, "CK-M002"),
    ],
)
def test_corrupt_manifest(saved_ckpt, text: bytes, code: str) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "manifest.json").write_bytes(text)
    err = _load_error(d)
    assert err.code == code and "manifest.json" in str(err)
    assert _codes(d) == [code]


def test_manifest_edit_without_redigest(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    _rewrite_manifest(d, lambda o: o.update(step=999), redigest=False)
    assert _load_error(d).code == "CK-M007"


@pytest.mark.parametrize(
    "bad_path", ["../outside.safetensors", "/etc/passwd", "a/../../x", ".hidden", "..", "a//b"]
)
def test_hostile_path_escape(saved_ckpt, bad_path: str) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    _rewrite_manifest(d, lambda o: o["files"][0].update(path=bad_path))
    err = _load_error(d)
    assert isinstance(err, ckptkit.UnsafeInputError)
    assert err.code in {"CK-M005", "CK-M003"}
    assert _codes(d)[0] in {"CK-M005", "CK-M003"}


def test_symlink_outside_is_never_read(saved_ckpt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    target = d / "model.safetensors"
    outside = tmp_path / "outside.safetensors"
    target.rename(outside)
    target.symlink_to(outside)
    err = _load_error(d)
    assert err.code == "CK-F009"
    assert "CK-F009" in _codes(d)


@pytest.mark.parametrize(
    "edit",
    [
        lambda o: o["files"][0].update(size=2**60),
        lambda o: o["tensors"][0].update(shape=[2**40, 2**40]),
        lambda o: o["tensors"][0].update(shape=[1] * 40),
        lambda o: o["tensors"][0].update(offsets=[0, 10**12]),
    ],
    ids=["file-size", "shape", "ndim", "offsets"],
)
def test_absurd_sizes(saved_ckpt, edit) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    _rewrite_manifest(d, edit)
    err = _load_error(d)
    assert isinstance(err, ckptkit.UnsafeInputError) and err.code == "CK-M006"


def test_absurd_total_refused_before_allocating(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    with pytest.raises(ckptkit.UnsafeInputError, match="max_bytes"):
        ckptkit.load(d, max_bytes=100)


def test_decompression_bomb(tmp_path: Path) -> None:
    d = tmp_path / "c"
    ckptkit.save({"model": {"w": torch.zeros(1000)}}, d, compress="zstd")
    # Replace the file with a stream that expands far beyond the declared raw size,
    # and fix the manifest's digest/size so only the bomb guard can catch it.
    from ckptkit.format import digest

    f = d / "model.safetensors.zst"
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    f.write_bytes(bomb)

    def edit(o: dict) -> None:
        o["files"][0].update(size=len(bomb), xxh3_128=digest.hexdigest_bytes(bomb))

    _rewrite_manifest(d, edit)
    err = _load_error(d)
    assert isinstance(err, ckptkit.UnsafeInputError) or err.code in {"CK-F004", "CK-F008"}
    assert "model.safetensors.zst" in str(err)
    assert set(_codes(d)) & {"CK-F004", "CK-F008"}


def test_bomb_guard_stops_at_limit() -> None:
    import io

    from ckptkit.storage.codec import LimitedReader

    data = zstandard.ZstdCompressor().compress(b"\0" * (8 << 20))
    r = LimitedReader(io.BytesIO(data), limit=1 << 20, path="x.zst")
    buf = bytearray(1 << 20)
    assert r.readinto(buf) > 0
    with pytest.raises(ckptkit.UnsafeInputError, match="decompression bomb"):
        while r.readinto(buf):
            pass


def test_tensor_header_mismatch(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    # Swap two same-size tensors' names in the manifest only: header disagrees.
    def edit(o: dict) -> None:
        ts = [t for t in o["tensors"] if t["file"] == "model.safetensors"]
        ts[0]["key"], ts[1]["key"] = ts[1]["key"], ts[0]["key"]

    _rewrite_manifest(d, edit)
    err = _load_error(d)
    assert err.code == "CK-F005" and "model.safetensors" in str(err)
    assert set(_codes(d)) == {"CK-F005"}


def test_leftover_tmp_dir_reported(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d.parent / f"{d.name}.ckptkit-tmp.deadbeef").mkdir()
    res = ckptkit.verify(d)
    assert [f.code for f in res.findings] == ["CK-F007"] and res.ok


@pytest.mark.parametrize(
    "tree",
    [
        {"$t": "dict", "items": [[]]},
        {"$t": "dict", "items": None},
        {"$t": "tuple"},
        {"$t": "tensor", "key": "nope"},
        {"$t": "dtype", "v": "not_a_dtype"},
        {"$t": "npscalar", "dtype": "zzz", "v": 1},
        {"$t": "from-the-future"},
    ],
)
def test_malformed_tree_tags(saved_ckpt, tree: dict) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    _rewrite_manifest(d, lambda o: o.update(tree={"model": o["tree"]["model"], "x": tree}))
    err = _load_error(d)
    assert isinstance(err, ckptkit.ManifestError) and err.code == "CK-M009"
    assert "manifest.json" in str(err) and "tree/x" in str(err)
    assert _codes(d) == ["CK-M009"]  # verify refuses what load refuses
