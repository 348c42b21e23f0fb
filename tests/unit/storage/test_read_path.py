"""The single-host read path (issue 27 item 5): the value scan's bit rule, the load
pipeline's bytes and refusals, and the verify pass, each against an independent oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.errors import CkptkitError
from ckptkit.storage import digest, tensors

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
    got = [tensors.nonfinite_bits(_raw(patterns[i : i + 1].view(dt)), dt) for i in range(n)]
    assert got == expect.tolist()


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.complex64], ids=str)
def test_bit_rule_on_wide_floats(dt: torch.dtype) -> None:
    """The values at the edges: the largest finite numbers, both infinities, a NaN with
    the sign bit set and one quiet NaN, each alone in a tensor of finite values."""
    real = torch.float32 if dt == torch.complex64 else dt
    info = torch.finfo(real)
    finite = torch.tensor([0.0, -0.0, info.max, -info.max, info.tiny, -info.tiny], dtype=real)
    assert tensors.nonfinite_bits(_raw(finite.to(dt)), dt) is False
    bad_values = [float("inf"), float("-inf"), float("nan")]
    neg_nan = torch.tensor([float("nan")], dtype=real).neg()
    for bad in [torch.tensor([v], dtype=real) for v in bad_values] + [neg_nan]:
        t = torch.cat([finite, bad]).to(dt)
        assert tensors.nonfinite_bits(_raw(t), dt) is True, (dt, bad)
    # a NaN in the imaginary part only
    if dt == torch.complex64:
        z = torch.complex(torch.ones(3), torch.tensor([0.0, float("nan"), 0.0]))
        assert tensors.nonfinite_bits(_raw(z), dt) is True


def test_bit_rule_leaves_fnuz_to_torch() -> None:
    """The fnuz float8s keep NaN at the -0 pattern: no bit rule, the scan asks torch."""
    assert tensors.nonfinite_bits(memoryview(b"\x80"), torch.float8_e4m3fnuz) is None
    scan = tensors.FiniteScan({"x": tensors.HeaderEntry("F8_E4M3FNUZ", (2,), (0, 2))}, 0)
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
    scan = tensors.FiniteScan(hdr, 0)
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
