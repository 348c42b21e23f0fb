"""Encode nested training state as JSON plus a list of tensors, and back, without pickle.

The JSON tree keeps every container type: plain JSON objects for ``str``-keyed
dicts, arrays for lists, and tagged objects (``{"$t": ...}``) for what JSON lacks:
tuples, dicts with non-string keys (optimizer ``state`` is keyed by int), non-finite
floats, ``torch.Size``/``dtype``/``device``, numpy arrays and scalars, bytes, and
tensor references. A tensor reachable from two places (tied embeddings) is stored
once and comes back shared.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ckptkit.errors import ManifestError, StateError

TAG = "$t"

_NP_KINDS = "biufc"  # numpy array kinds we store as tensors: bool, int, uint, float, complex


@dataclass
class Encoded:
    """Result of :func:`encode`: the JSON tree and the tensors it references, by key."""

    tree: Any
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Unique tensors by key, in first-seen order (aliases are not repeated)."""


def _seg(k: Any) -> str:
    s = str(k)
    # Keys become tensor names and file names: keep them printable and unambiguous.
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", s) or "_"


def _alias_id(t: torch.Tensor) -> tuple[Any, ...] | None:
    if t.numel() == 0:
        return None  # empty tensors may share a null pointer without being the same tensor
    return (
        t.device.type,
        t.device.index,
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        tuple(t.stride()),
        t.dtype,
    )


def encode(obj: Any) -> Encoded:
    """Split ``obj`` into a JSON-able tree and its tensors.

    Raises:
        StateError: for an object that cannot be stored without pickle, naming its key path.

    Example:
        >>> import torch
        >>> w = torch.ones(2)
        >>> e = encode({"a": w, "b": w, "n": (1, None)})
        >>> list(e.tensors), e.tree["b"]
        (['a'], {'$t': 'tensor', 'key': 'a'})
    """
    out = Encoded(tree=None)
    seen: dict[tuple[Any, ...], str] = {}
    used: set[str] = set()

    def tensor_ref(t: torch.Tensor, path: list[str], tag: str = "tensor") -> dict[str, Any]:
        aid = _alias_id(t)
        if aid is not None and aid in seen and tag == "tensor":
            return {TAG: tag, "key": seen[aid]}
        key = "/".join(path) or "tensor"
        base, n = key, 1
        while key in used:
            n += 1
            key = f"{base}~{n}"
        used.add(key)
        out.tensors[key] = t
        if aid is not None and tag == "tensor":
            seen[aid] = key
        ref: dict[str, Any] = {TAG: tag, "key": key}
        if t.requires_grad:
            ref["requires_grad"] = True
        return ref

    def enc(x: Any, path: list[str]) -> Any:
        if x is None or type(x) in (bool, int, str):
            return x
        if type(x) is float:
            if math.isfinite(x):
                return x
            return {TAG: "float", "v": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if isinstance(x, torch.Tensor):
            if type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter):
                raise StateError(
                    f"tensor subclass {type(x).__name__} at '{'/'.join(path)}' cannot be stored "
                    "as a plain tensor",
                    hint="convert it to a plain tensor (e.g. DTensor.full_tensor() or "
                    ".to_local()) before saving, or save through the distributed path",
                )
            return tensor_ref(x, path)
        if type(x) is list:
            return [enc(v, [*path, str(i)]) for i, v in enumerate(x)]
        if type(x) is tuple:
            return {TAG: "tuple", "items": [enc(v, [*path, str(i)]) for i, v in enumerate(x)]}
        if isinstance(x, torch.Size):
            return {TAG: "size", "items": list(x)}
        if isinstance(x, dict):
            if type(x) not in (dict,) and not _is_plain_mapping(x):
                raise _unsupported(x, path)
            if all(type(k) is str for k in x) and TAG not in x:
                return {k: enc(v, [*path, _seg(k)]) for k, v in x.items()}
            return {
                TAG: "dict",
                "items": [[enc_key(k, path), enc(v, [*path, _seg(k)])] for k, v in x.items()],
            }
        if isinstance(x, torch.dtype):
            return {TAG: "dtype", "v": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {TAG: "device", "v": str(x)}
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in _NP_KINDS or x.dtype.byteorder == ">":
                raise _unsupported(x, path, f"numpy array of dtype {x.dtype}")
            return tensor_ref(torch.from_numpy(np.ascontiguousarray(x)), path, tag="ndarray")
        if isinstance(x, np.generic) and x.dtype.kind in _NP_KINDS:
            return {TAG: "npscalar", "dtype": x.dtype.str.lstrip("<=|"), "v": enc(x.item(), path)}
        if type(x) is bytes:
            return {TAG: "bytes", "b64": base64.b64encode(x).decode("ascii")}
        raise _unsupported(x, path)

    def enc_key(k: Any, path: list[str]) -> Any:
        if k is None or type(k) in (bool, int, str, float):
            return enc(k, path)
        if type(k) is tuple:
            return enc(k, path)
        raise _unsupported(k, path, f"dict key of type {type(k).__name__}")

    out.tree = enc(obj, [])
    return out


def _is_plain_mapping(x: Any) -> bool:
    # OrderedDict (every state_dict) and other dict subclasses with no extra state.
    return isinstance(x, dict) and not getattr(x, "__slots__", None)


def _unsupported(x: Any, path: list[str], what: str | None = None) -> StateError:
    where = "/".join(path) or "<root>"
    return StateError(
        f"cannot store {what or 'object of type ' + type(x).__qualname__} at '{where}' "
        "without pickle",
        hint="store plain values (dict/list/tuple/int/float/str/bool/None), tensors or "
        "numpy arrays; convert objects to their state_dict() or to a dict of fields",
    )


def decode(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Rebuild the object :func:`encode` split, sharing tensors referenced twice.

    Raises:
        ManifestError: on an unknown tag or a reference to a tensor that does not exist.

    Example:
        >>> e = encode({"a": (1, 2), 3: float("inf")})
        >>> decode(e.tree, e.tensors)
        {'a': (1, 2), 3: inf}
    """

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        tag = x.get(TAG)
        if tag is None:
            return {k: dec(v) for k, v in x.items()}
        if tag == "tensor" or tag == "ndarray":
            key = x.get("key")
            if key not in tensors:
                raise ManifestError(
                    f"tree references tensor {key!r} that the manifest does not list",
                    code="CK-M003",
                    hint="the manifest is inconsistent; roll back to the previous checkpoint",
                )
            t = tensors[key]
            if tag == "ndarray":
                return t.numpy()
            if x.get("requires_grad") and t.is_floating_point():
                t.requires_grad_(True)
            return t
        if tag == "tuple":
            return tuple(dec(v) for v in x["items"])
        if tag == "dict":
            return {_hashable(dec(k)): dec(v) for k, v in x["items"]}
        if tag == "float":
            return float(x["v"])
        if tag == "size":
            return torch.Size(x["items"])
        if tag == "dtype":
            dt = getattr(torch, str(x["v"]), None)
            if not isinstance(dt, torch.dtype):
                raise ManifestError(f"unknown dtype {x['v']!r} in tree", code="CK-M003")
            return dt
        if tag == "device":
            return torch.device(str(x["v"]))
        if tag == "npscalar":
            return np.dtype(str(x["dtype"])).type(dec(x["v"]))
        if tag == "bytes":
            return base64.b64decode(str(x["b64"]))
        raise ManifestError(
            f"unknown tag {tag!r} in the state tree",
            code="CK-M003",
            hint="written by a newer ckptkit? upgrade ckptkit to read it",
        )

    try:
        return dec(tree)
    except ManifestError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        # A schema-valid manifest can still carry a malformed tagged value (hand-edited or
        # hostile): report it as a manifest problem, never a traceback.
        raise ManifestError(
            f"the state tree is malformed ({type(e).__name__}: {e})",
            code="CK-M003",
            hint="the manifest was damaged or edited; roll back to the previous verified "
            "checkpoint",
        ) from None


def _hashable(k: Any) -> Any:
    if isinstance(k, list):
        return tuple(_hashable(v) for v in k)
    return k


def decode_key(k: Any) -> Any:
    """Decode one tagged dict key of a tree (an undecodable key comes back as its repr).

    Example:
        >>> decode_key(3), decode_key({"$t": "tuple", "items": [1, 2]})
        (3, (1, 2))
    """
    try:
        return _hashable(decode(k, {}))
    except (ManifestError, TypeError):
        return repr(k)


def iter_tensor_refs(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Yield ``(container path, tensor key)`` for every tensor reference in an encoded tree."""
    if isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from iter_tensor_refs(v, (*path, str(i)))
    elif isinstance(tree, dict):
        tag = tree.get(TAG)
        if tag in ("tensor", "ndarray"):
            yield path, str(tree.get("key"))
        elif tag in ("tuple",):
            for i, v in enumerate(tree.get("items", [])):
                yield from iter_tensor_refs(v, (*path, str(i)))
        elif tag == "dict":
            for item in tree.get("items", []):
                if isinstance(item, list) and len(item) == 2:
                    yield from iter_tensor_refs(item[1], (*path, _seg(item[0])))
        elif tag is None:
            for k, v in tree.items():
                yield from iter_tensor_refs(v, (*path, _seg(k)))


def collect_targets(obj: Any, encoded_tree: Any) -> dict[str, torch.Tensor]:
    """Map tensor keys of ``encoded_tree`` to the tensors at the same places in ``obj``.

    Used to restore into existing tensors: the loader reads bytes straight into
    these when dtype and shape match, so no second copy of the state is made.
    """
    targets: dict[str, torch.Tensor] = {}

    def walk(x: Any, t: Any) -> None:
        if isinstance(t, dict) and t.get(TAG) == "tensor":
            if isinstance(x, torch.Tensor):
                targets.setdefault(str(t["key"]), x)
            return
        if isinstance(t, list) and isinstance(x, (list, tuple)):
            for xv, tv in zip(x, t, strict=False):
                walk(xv, tv)
        elif isinstance(t, dict):
            tag = t.get(TAG)
            if tag is None and isinstance(x, dict):
                for k, tv in t.items():
                    if k in x:
                        walk(x[k], tv)
            elif tag == "tuple" and isinstance(x, (list, tuple)):
                for xv, tv in zip(x, t["items"], strict=False):
                    walk(xv, tv)
            elif tag == "dict" and isinstance(x, dict):
                for item in t["items"]:
                    k = _hashable(decode(item[0], {}))
                    if k in x:
                        walk(x[k], item[1])

    walk(obj, encoded_tree)
    return targets


Grouper = Callable[[str], str]


def default_group(key: str) -> str:
    """File group of a tensor key: its top-level key (``model/...`` -> ``model``)."""
    head = key.split("/", 1)[0]
    return head if "/" in key and head else "tensors"
