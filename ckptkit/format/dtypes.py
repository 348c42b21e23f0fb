"""The tensor dtypes a checkpoint can hold, by their safetensors names.

The manifest records a tensor's dtype by the name safetensors gives it (``BF16``,
``F8_E4M3`` ...), and the schema's dtype enum lists the same names: this table is the
one place those names meet torch's dtypes, for the manifest's size checks, the state
tree codec and the shard files alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ckptkit.errors import StateError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
    "C64": torch.complex64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
NOT_YET: dict[torch.dtype, str] = {
    torch.float4_e2m1fn_x2: "safetensors records it as F4 with the last dimension counted in "
    "4-bit halves, and ckptkit's manifests record torch shapes",
}
"""Dtypes safetensors writes that ckptkit refuses on purpose, and why (a test holds this
table, :data:`DTYPES` and the installed safetensors together)."""


@dataclass(frozen=True)
class HeaderEntry:
    """One tensor as a safetensors header describes it."""

    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


def dtype_name(dt: torch.dtype, *, key: str) -> str:
    """Return the safetensors name of a torch dtype, or raise naming the tensor."""
    try:
        return DTYPE_NAMES[dt]
    except KeyError:
        if dt in NOT_YET:
            raise StateError(
                f"tensor '{key}' has dtype {dt}, which ckptkit cannot store yet: "
                + NOT_YET[dt],
                hint=f"save its bytes (t.view(torch.uint8)) and view them back as {dt} after load",
            ) from None
        raise StateError(
            f"tensor '{key}' has dtype {dt}, which safetensors cannot hold",
            hint="convert it (e.g. complex128 -> two float64 tensors) before saving",
        ) from None
