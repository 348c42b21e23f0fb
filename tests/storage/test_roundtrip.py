"""ckptkit.save / load: exact round trips of every dtype, container and tensor layout."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ckptkit
from ckptkit.format.dtypes import DTYPES

ALL_DTYPES = sorted(DTYPES.values(), key=str)


def _sample(dt: torch.dtype, shape: tuple[int, ...] = (5, 3)) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty((), dtype=dt).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dt == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dt).reshape(shape)


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                            b.contiguous().reshape(-1).view(torch.uint8)))


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("compress", [None, "zstd"])
def test_every_dtype_bitwise(tmp_path: Path, dt: torch.dtype, compress: str | None) -> None:
    t = _sample(dt)
    ckptkit.save({"x": t, "scalar": _sample(dt, ())}, tmp_path / "c", compress=compress)
    out = ckptkit.load(tmp_path / "c")
    assert _bitwise_equal(out["x"], t)  # NaN payloads included: compare bytes
    assert out["scalar"].shape == ()


def test_layouts_and_containers(tmp_path: Path) -> None:
    base = torch.randn(6, 8)
    state = {
        "noncontig": base.t(),
        "sliced": base[1:4, ::2],
        "empty": torch.empty(0, 7, dtype=torch.bfloat16),
        "zero_d": torch.tensor(3.5),
        "param": torch.nn.Parameter(torch.randn(2)),
        "tuple": (1, 2.5, "x", None, True),
        "list": [torch.ones(1), {"nested": (torch.zeros(2),)}],
        "int_keys": {0: "a", 1: {"b": 2}, (1, 2): 3, None: 4},
        "floats": [float("nan"), float("inf"), -float("inf"), -0.0, 1e300],
        "big_int": 2**70,
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
        "np": np.arange(6, dtype=np.int32).reshape(2, 3),
        "np_scalar": np.float32(1.5),
        "bytes": b"\x00\xff",
        "$t": "a user key that looks like our tag",
    }
    ckptkit.save(state, tmp_path / "c")
    out = ckptkit.load(tmp_path / "c")
    assert torch.equal(out["noncontig"], base.t())
    assert torch.equal(out["sliced"], base[1:4, ::2])
    assert out["empty"].shape == (0, 7) and out["empty"].dtype == torch.bfloat16
    assert out["zero_d"].shape == () and out["zero_d"].item() == 3.5
    assert out["param"].requires_grad
    assert out["tuple"] == (1, 2.5, "x", None, True) and type(out["tuple"]) is tuple
    assert isinstance(out["list"][1]["nested"], tuple)
    assert out["int_keys"] == {0: "a", 1: {"b": 2}, (1, 2): 3, None: 4}
    assert np.isnan(out["floats"][0]) and out["floats"][1:3] == [float("inf"), -float("inf")]
    assert str(out["floats"][3]) == "-0.0" and out["floats"][4] == 1e300
    assert out["big_int"] == 2**70
    assert out["dtype"] is torch.bfloat16 and out["size"] == torch.Size([2, 3])
    assert isinstance(out["np"], np.ndarray) and out["np"].dtype == np.int32
    assert (out["np"] == np.arange(6).reshape(2, 3)).all()
    assert type(out["np_scalar"]) is np.float32 and out["np_scalar"] == 1.5
    assert out["bytes"] == b"\x00\xff"
    assert out["$t"] == "a user key that looks like our tag"


def test_tied_tensors_stay_shared(tmp_path: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model()
    sd = model.state_dict()
    assert sd["emb.weight"].data_ptr() == sd["head.weight"].data_ptr()
    m = ckptkit.save({"model": sd}, tmp_path / "c")
    assert len([t for t in m.tensors if t.key.startswith("model/")]) == len(sd) - 1  # stored once
    out = ckptkit.load(tmp_path / "c")["model"]
    assert out["emb.weight"] is out["head.weight"]
    fresh = tiny_model(seed=5)
    fresh.load_state_dict(out)
    assert fresh.head.weight.data_ptr() == fresh.emb.weight.data_ptr()


def test_overlapping_views_are_copied_not_confused(tmp_path: Path) -> None:
    base = torch.arange(10.0)
    ckptkit.save({"a": base[:6], "b": base[4:]}, tmp_path / "c")
    out = ckptkit.load(tmp_path / "c")
    assert out["a"].tolist() == base[:6].tolist() and out["b"].tolist() == base[4:].tolist()


def test_sharding_splits_groups(tmp_path: Path) -> None:
    state = {"model": {f"w{i}": torch.randn(256, 256) for i in range(6)}}  # 256 KiB each
    m = ckptkit.save(state, tmp_path / "c", shard_bytes=600_000)
    names = sorted(f.path for f in m.files)
    assert names == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]
    out = ckptkit.load(tmp_path / "c")
    assert all(torch.equal(out["model"][k], v) for k, v in state["model"].items())


def test_files_are_standard_safetensors(tmp_path: Path) -> None:
    state = {"model": {"a": torch.randn(3, 4).bfloat16(), "b": torch.arange(5)}}
    ckptkit.save(state, tmp_path / "c")
    theirs = load_file(tmp_path / "c" / "model.safetensors")
    assert torch.equal(theirs["model/a"], state["model"]["a"])
    # and our reader accepts their writer's header layout (offsets, padding)
    from ckptkit.storage import tensors as st

    save_file({"x": torch.ones(3), "y": torch.zeros(2, dtype=torch.int8)}, tmp_path / "their.st")
    with open(tmp_path / "their.st", "rb") as f:
        n, raw = st.read_header_from(f, path="their.st", file_size=os.path.getsize(tmp_path / "their.st"))
    hdr = st.parse_header(raw, path="their.st", data_len=os.path.getsize(tmp_path / "their.st") - 8 - n)
    assert set(hdr) == {"x", "y"}


def test_restore_into_existing_tensors_in_place(tmp_path: Path, tiny_model) -> None:  # type: ignore[no-untyped-def]
    src = tiny_model(seed=1)
    ckptkit.save({"model": src.state_dict()}, tmp_path / "c")
    dst = tiny_model(seed=2)
    ptrs = {k: v.data_ptr() for k, v in dst.state_dict().items()}
    out = ckptkit.load(tmp_path / "c", into={"model": dst.state_dict()})
    for k, v in dst.state_dict().items():
        assert v.data_ptr() == ptrs[k]  # no reallocation: bytes landed in place
        assert torch.equal(v, src.state_dict()[k])
        assert out["model"][k].data_ptr() == ptrs[k]


def test_digest_recorded_matches_file(tmp_path: Path) -> None:
    from ckptkit.storage.digest import hash_file

    m = ckptkit.save({"model": {"w": torch.randn(100, 100)}}, tmp_path / "c", compress="zstd")
    for f in m.files:
        assert hash_file(tmp_path / "c" / f.path) == (f.xxh3_128, f.size)
        assert f.raw_size is not None and f.compression == "zstd"


def test_zstd_compresses_redundant_state(tmp_path: Path) -> None:
    state = {"model": {"w": torch.zeros(512, 512)}}
    plain = ckptkit.save(state, tmp_path / "a")
    packed = ckptkit.save(state, tmp_path / "b", compress="zstd")
    assert packed.total_bytes * 50 < plain.total_bytes


def test_save_overwrites_previous_checkpoint_only(tmp_path: Path) -> None:
    d = tmp_path / "c"
    ckptkit.save({"v": 1}, d)
    ckptkit.save({"v": 2}, d)
    assert ckptkit.load(d) == {"v": 2}
    other = tmp_path / "notckpt"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(ckptkit.CheckpointExistsError, match="not a ckptkit checkpoint"):
        ckptkit.save({"v": 3}, other)
    assert (other / "precious.txt").read_text() == "keep me"
    assert not list(tmp_path.glob("*.ckptkit-*"))


def test_unsupported_object_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ckptkit.StateError, match="at 'opt/fn'") as ei:
        ckptkit.save({"opt": {"fn": lambda x: x}}, tmp_path / "c")
    assert "Fix:" in str(ei.value)
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())


def test_map_location_meta_device(tmp_path: Path) -> None:
    ckptkit.save({"w": torch.ones(2)}, tmp_path / "c")
    out = ckptkit.load(tmp_path / "c", map_location="meta")
    assert out["w"].device.type == "meta"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_roundtrip(tmp_path: Path) -> None:
    t = torch.randn(64, 64, device="cuda")
    ckptkit.save({"w": t}, tmp_path / "c")
    out = ckptkit.load(tmp_path / "c", map_location="cuda")
    assert out["w"].is_cuda and torch.equal(out["w"], t)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 8 << 20, (8 << 20) + 7, (17 << 20) + 3])
def test_direct_io_writes_the_same_bytes(tmp_path: Path, monkeypatch, size: int) -> None:  # type: ignore[no-untyped-def]
    from ckptkit.storage import tensors as st

    t = torch.randint(0, 255, (size,), dtype=torch.uint8)
    monkeypatch.setenv("CKPTKIT_DIRECT_IO", "0")
    a = st.write_file(tmp_path / "a.safetensors", [("x", t)])
    monkeypatch.setenv("CKPTKIT_DIRECT_IO", "1")
    b = st.write_file(tmp_path / "b.safetensors", [("x", t)])
    assert (a.size, a.digest) == (b.size, b.digest)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_direct_io_falls_back_when_unsupported(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import errno

    from ckptkit.storage import tensors_direct

    real_open = os.open

    def no_direct(path, flags, *a):  # type: ignore[no-untyped-def]
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    monkeypatch.setenv("CKPTKIT_DIRECT_IO", "1")
    m = ckptkit.save({"w": torch.arange(1000)}, tmp_path / "c")
    assert ckptkit.load(tmp_path / "c")["w"].tolist() == list(range(1000))
    assert m.files[0].size == (tmp_path / "c" / m.files[0].path).stat().st_size
    assert tensors_direct.use_direct_io(1)


def test_second_writer_never_replaces_a_checkpoint_without_overwrite(tmp_path: Path) -> None:
    from ckptkit.storage import atomic

    final = tmp_path / "step-1"
    a = atomic.PendingCheckpoint.create(final)
    b = atomic.PendingCheckpoint.create(final)
    (a.tmp / "manifest.json").write_text("a")
    (b.tmp / "manifest.json").write_text("b")
    a.finalize()
    with pytest.raises(ckptkit.CheckpointExistsError, match="appeared here"):
        b.finalize()
    assert (final / "manifest.json").read_text() == "a"
    assert not b.tmp.exists()
