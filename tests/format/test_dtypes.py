"""The dtype table against the installed safetensors: what it writes, ckptkit stores.

Every torch dtype is tried. When the library writes it and reads it back unchanged
(``safe_open``, framework ``pt``), ckptkit must save and load it unchanged too, name it
as the library does, and write a shard the library reads back; or refuse it on purpose,
listed in ``dtypes.NOT_YET`` with the reason. When the library cannot write it, ckptkit
refuses it with an error naming the tensor. A new safetensors or torch release that adds
a dtype fails here until the table says what ckptkit does with it.
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

import ckptkit
from ckptkit.errors import StateError
from ckptkit.format import dtypes


def _all_dtypes() -> list[torch.dtype]:
    seen: dict[torch.dtype, None] = {}
    for name in sorted(dir(torch)):
        dt = getattr(torch, name)
        if isinstance(dt, torch.dtype):
            seen.setdefault(dt)
    return list(seen)


def _sample(dt: torch.dtype) -> torch.Tensor | None:
    """A 2x3 tensor of ``dt`` built from bytes 0..n (no NaN/Inf pattern), or None."""
    raw = torch.arange(6 * dt.itemsize, dtype=torch.uint8) % 100
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
        try:
            return raw.view(dt).reshape(2, 3)
        except (RuntimeError, TypeError, NotImplementedError):
            return None


def _library_round_trips(t: torch.Tensor, tmp: Path) -> str | None:
    """The header dtype name when safetensors writes ``t`` and reads it back unchanged."""
    f = tmp / "lib.safetensors"
    try:
        safetensors.torch.save_file({"x": t}, str(f))
    except (KeyError, ValueError, TypeError, RuntimeError):
        return None
    try:
        with safetensors.safe_open(str(f), framework="pt") as r:
            back = r.get_tensor("x")
    except Exception:  # the library writes what it cannot read: not a dtype it holds
        return None
    if back.dtype != t.dtype or back.shape != t.shape:
        return None
    if not torch.equal(back.view(torch.uint8), t.view(torch.uint8)):
        return None
    n = struct.unpack("<Q", f.read_bytes()[:8])[0]
    return str(json.loads(f.read_bytes()[8 : 8 + n])["x"]["dtype"])


CASES = [dt for dt in _all_dtypes() if _sample(dt) is not None]


@pytest.mark.parametrize("dt", CASES, ids=str)
def test_dtype_table_matches_safetensors(dt: torch.dtype, tmp_path: Path) -> None:
    t = _sample(dt)
    assert t is not None
    lib_name = _library_round_trips(t, tmp_path)
    d = tmp_path / "ck"
    if lib_name is None or dt in dtypes.NOT_YET:
        with pytest.raises(StateError, match="'model/x'") as ei:
            ckptkit.save({"model": {"x": t}}, d)
        if dt in dtypes.NOT_YET:
            assert lib_name is not None, f"{dt} is listed as refused on purpose, but the "
            "installed safetensors cannot write it anyway: drop it from NOT_YET"
            assert "cannot store yet" in str(ei.value)
        assert not d.exists()
        return
    assert dtypes.DTYPE_NAMES.get(dt) == lib_name, (
        f"safetensors writes {dt} as {lib_name}; add it to ckptkit.format.dtypes.DTYPES "
        "(and the dtype enum of schemas/manifest.schema.json), or to NOT_YET with the reason"
    )
    ckptkit.save({"model": {"x": t}}, d)
    back = ckptkit.load(d)["model"]["x"]
    assert back.dtype == dt and back.shape == t.shape
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))
    # The shard ckptkit wrote is one the library reads, as the same tensor.
    with safetensors.safe_open(str(d / "model.safetensors"), framework="pt") as r:
        lib = r.get_tensor("model/x")
    assert lib.dtype == dt and torch.equal(lib.view(torch.uint8), t.view(torch.uint8))
    assert ckptkit.verify(d).ok


def test_float8_e8m0fnu_is_stored() -> None:
    """The case the newcomer hit: 'safetensors cannot hold it' although it can."""
    assert dtypes.DTYPE_NAMES[torch.float8_e8m0fnu] == "F8_E8M0"
