"""The single-host read path (issue 27 item 5): the value scan's bit rule, the load
pipeline's bytes and refusals, and the verify pass, each against an independent oracle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.errors import CkptkitError
from ckptkit.storage import digest, tensors, tensors_direct, tensors_scan

BIT_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float8_e5m2,
    torch.float8_e4m3fn,
]


def _raw(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


@pytest.mark.parametrize("dt", BIT_DTYPES, ids=str)
def test_bit_rule_agrees_with_torch_on_every_pattern(dt: torch.dtype) -> None:
    """Every 8- and 16-bit pattern, one value at a time: the rule says NaN/Inf exactly
    where ``torch.isfinite`` does (on the widened value; exact for these dtypes)."""
    width = torch.empty((), dtype=dt).element_size()
    n = 1 << (8 * width)
    # every pattern once (int16 wraps past 0x7FFF into the negative half)
    patterns = torch.arange(n, dtype=torch.int32).to(torch.uint8 if width == 1 else torch.int16)
    expect = ~torch.isfinite(patterns.view(dt).float())
    got = [tensors_scan.nonfinite_bits(_raw(patterns[i : i + 1].view(dt)), dt) for i in range(n)]
    assert got == expect.tolist()


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.complex64], ids=str)
def test_bit_rule_on_wide_floats(dt: torch.dtype) -> None:
    """The values at the edges: the largest finite numbers, both infinities, a NaN with
    the sign bit set and one quiet NaN, each alone in a tensor of finite values."""
    real = torch.float32 if dt == torch.complex64 else dt
    info = torch.finfo(real)
    finite = torch.tensor([0.0, -0.0, info.max, -info.max, info.tiny, -info.tiny], dtype=real)
    assert tensors_scan.nonfinite_bits(_raw(finite.to(dt)), dt) is False
    bad_values = [float("inf"), float("-inf"), float("nan")]
    neg_nan = torch.tensor([float("nan")], dtype=real).neg()
    for bad in [torch.tensor([v], dtype=real) for v in bad_values] + [neg_nan]:
        t = torch.cat([finite, bad]).to(dt)
        assert tensors_scan.nonfinite_bits(_raw(t), dt) is True, (dt, bad)
    # a NaN in the imaginary part only
    if dt == torch.complex64:
        z = torch.complex(torch.ones(3), torch.tensor([0.0, float("nan"), 0.0]))
        assert tensors_scan.nonfinite_bits(_raw(z), dt) is True


def test_bit_rule_leaves_fnuz_to_torch() -> None:
    """The fnuz float8s keep NaN at the -0 pattern: no bit rule, the scan asks torch."""
    assert tensors_scan.nonfinite_bits(memoryview(b"\x80"), torch.float8_e4m3fnuz) is None
    scan = tensors_scan.FiniteScan({"x": tensors.HeaderEntry("F8_E4M3FNUZ", (2,), (0, 2))}, 0)
    scan.feed(0, memoryview(b"\x00\x80"))
    assert scan.nonfinite == {"x"}


def test_scan_across_chunks_flags_only_the_bad_tensor() -> None:
    """A tensor spanning a chunk edge with its NaN in the second chunk is flagged; its
    finite neighbour is not (the scan is fed chunk by chunk, as the digest pass does)."""
    good = torch.ones(digest.CHUNK // 4)
    bad = torch.ones(digest.CHUNK // 4)
    bad[-1] = float("nan")
    data = torch.cat([good, bad])
    hdr = {
        "good": tensors.HeaderEntry("F32", (good.numel(),), (0, good.numel() * 4)),
        "bad": tensors.HeaderEntry("F32", (bad.numel(),), (good.numel() * 4, data.numel() * 4)),
    }
    scan = tensors_scan.FiniteScan(hdr, 0)
    raw = _raw(data)
    for off in range(0, len(raw), digest.CHUNK):
        scan.feed(off, raw[off : off + digest.CHUNK])
    assert scan.nonfinite == {"bad"} and not scan.unchecked


def test_verify_counts_nan_found_by_the_bit_rule(tmp_path: Path) -> None:
    """End to end: a bf16 NaN and an fp32 -Inf in a saved model are both reported."""
    w = torch.ones(64, dtype=torch.bfloat16)
    w[3] = float("nan")
    m = torch.ones(64)
    m[5] = float("-inf")
    ckptkit.save({"model": {"w": w, "m": m, "ok": torch.ones(8)}}, tmp_path / "c")
    res = ckptkit.verify(tmp_path / "c")
    msg = " ".join(f.message for f in res.findings if f.code == "CK-S010")
    assert "'model/w' (1 NaN)" in msg and "'model/m' (1 -Inf)" in msg and "model/ok" not in msg


def test_damaged_byte_still_refuses(tmp_path: Path) -> None:
    """A flipped byte in the data section: load refuses with CK-F003 naming the file."""
    ckptkit.save({"model": {"w": torch.arange(4096, dtype=torch.float32)}}, tmp_path / "c")
    [f] = (tmp_path / "c").glob("*.safetensors")
    raw = bytearray(f.read_bytes())
    raw[-100] ^= 0x01
    f.write_bytes(bytes(raw))
    with pytest.raises(CkptkitError) as ei:
        ckptkit.load(tmp_path / "c")
    assert ei.value.code == "CK-F003" and f.name in str(ei.value)


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _mixed_state() -> dict[str, torch.Tensor]:
    """Tensors that cross chunk edges, span several MiB, are empty, 0-d or odd-sized."""
    g = torch.Generator().manual_seed(7)
    return {
        "big": torch.randn((digest.CHUNK * 2 + 4100) // 4, generator=g),
        "bf": torch.randn(3 << 20, generator=g).bfloat16(),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "odd": torch.randint(0, 255, (777,), dtype=torch.uint8, generator=g),
    }


@pytest.mark.parametrize(
    ("compress", "direct"), [(None, "1"), (None, "0"), ("zstd", "auto")], ids=["direct", "cached", "zstd"]
)
def test_load_and_restore_return_the_saved_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compress: str | None, direct: str
) -> None:
    """New tensors and restore into existing ones both give back every byte, read with
    O_DIRECT or through the page cache (the file's size is no multiple of a block, so the
    last direct read ends inside one); an independent reader (safetensors) agrees on the
    uncompressed file, and verify finds it clean."""
    from safetensors.torch import load_file

    monkeypatch.setenv("CKPTKIT_DIRECT_IO", direct)
    state = {"model": _mixed_state()}
    ckptkit.save(state, tmp_path / "c", compress=compress)
    out = ckptkit.load(tmp_path / "c")["model"]
    for k, t in state["model"].items():
        assert _bitwise(out[k], t), k
    into = {"model": {k: torch.zeros_like(t) for k, t in state["model"].items()}}
    ckptkit.load(tmp_path / "c", into=into)
    for k, t in state["model"].items():
        assert _bitwise(into["model"][k], t), k
    if compress is None:
        [f] = (tmp_path / "c").glob("*.safetensors")
        ref = load_file(str(f))
        for k, t in state["model"].items():
            assert _bitwise(ref[f"model/{k}"], t), k
        assert f.stat().st_size % 512
    assert ckptkit.verify(tmp_path / "c").ok


def test_header_changed_between_parse_and_digest_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header load parses must be the bytes the digest pass hashed: a header byte
    changed on disk right after the parse is refused with CK-F003 by that comparison
    (before any digest is compared), never trusted."""
    ckptkit.save({"model": _mixed_state()}, tmp_path / "c")
    [f] = (tmp_path / "c").glob("*.safetensors")
    real = tensors.read_header_from

    def other_bytes(*a, **k):  # type: ignore[no-untyped-def]
        got = real(*a, **k)
        with f.open("r+b") as fh:  # another writer, between the parse and the digest pass
            fh.seek(9)
            b = fh.read(1)
            fh.seek(9)
            fh.write(bytes([b[0] ^ 0x20]))
        return got

    monkeypatch.setattr(tensors, "read_header_from", other_bytes)
    into = {"model": {k: torch.zeros_like(t) for k, t in _mixed_state().items()}}
    with pytest.raises(CkptkitError) as ei:
        ckptkit.load(tmp_path / "c", into=into)  # in place: the whole-file chunk pass
    assert ei.value.code == "CK-F003" and "changed while being read" in str(ei.value)


def test_truncated_shard_refuses_before_reading(tmp_path: Path) -> None:
    """One byte short: CK-F002 from the size check, and no tensor comes back."""
    ckptkit.save({"model": _mixed_state()}, tmp_path / "c")
    [f] = (tmp_path / "c").glob("*.safetensors")
    with f.open("r+b") as fh:
        fh.truncate(f.stat().st_size - 1)
    with pytest.raises(CkptkitError) as ei:
        ckptkit.load(tmp_path / "c")
    assert ei.value.code == "CK-F002" and "truncated" in str(ei.value)


@pytest.mark.parametrize("writers", [1, 3])
def test_direct_writes_in_flight_give_the_same_file(tmp_path: Path, monkeypatch, writers: int) -> None:  # type: ignore[no-untyped-def]
    """Several O_DIRECT writes in flight at their own offsets (small buffers, so many of
    them) give the file a buffered write gives, byte for byte, digest included."""
    items = sorted(_mixed_state().items())
    monkeypatch.setenv("CKPTKIT_DIRECT_IO", "0")
    a = tensors.write_file(tmp_path / "a.safetensors", items)
    monkeypatch.setenv("CKPTKIT_DIRECT_IO", "1")
    monkeypatch.setattr(tensors_direct, "DIRECT_BUF", 64 << 10)
    monkeypatch.setattr(tensors_direct, "DIRECT_WRITERS", writers)
    b = tensors.write_file(tmp_path / "b.safetensors", items)
    assert (a.size, a.digest) == (b.size, b.digest)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_a_short_direct_read_mid_file_goes_on_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system may return fewer bytes than asked in the middle of a file (NFS can):
    the next request would start off a block boundary, which O_DIRECT refuses (EINVAL).
    The pass clears O_DIRECT and reads on; every byte comes back, and verify is clean."""
    monkeypatch.setenv("CKPTKIT_DIRECT_IO", "1")
    state = {"model": _mixed_state()}
    ckptkit.save(state, tmp_path / "c")
    real = os.preadv
    short = {"done": False}

    def preadv(fd: int, bufs: list[Any], off: int) -> int:
        k = real(fd, bufs, off)
        if not short["done"] and off == 0 and k > 8192:
            short["done"] = True
            return k - 100  # claims less than it read: the rest is read again
        return k

    monkeypatch.setattr(digest.os, "preadv", preadv)
    into = {"model": {k: torch.zeros_like(t) for k, t in state["model"].items()}}
    ckptkit.load(tmp_path / "c", into=into)
    assert short["done"]
    for k, t in state["model"].items():
        assert _bitwise(into["model"][k], t), k
