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
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ckptkit import codes
from ckptkit._repr import short
from ckptkit.errors import ManifestError, StateError
from ckptkit.format.dtypes import DTYPES

TAG = "$t"

_NP_KINDS = "biufc"  # numpy array kinds we store as tensors: bool, int, uint, float, complex


@dataclass
class Encoded:
    """Result of :func:`encode`: the JSON tree and the tensors it references, by key."""

    tree: Any
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Unique tensors by key, in first-seen order (aliases are not repeated)."""


def key_segment(k: Any) -> str:
    """The path segment a container key becomes in tensor keys and shard file names.

    Keys become tensor names and file names: kept printable and unambiguous.

    Example:
        >>> key_segment("model"), key_segment(3), key_segment("a b/c")
        ('model', '3', 'a_b_c')
    """
    s = str(k)
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
        if len(path) > MAX_NESTING:
            raise StateError(
                f"state nested deeper than {MAX_NESTING} levels at '{'/'.join(path[:8])}/…'",
                hint="flatten the state; checkpoints hold state_dicts and plain records",
            )
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
                return {k: enc(v, [*path, key_segment(k)]) for k, v in x.items()}
            return {
                TAG: "dict",
                "items": [[enc_key(k, path), enc(v, [*path, key_segment(k)])] for k, v in x.items()],
            }
        if isinstance(x, torch.dtype):
            return {TAG: "dtype", "v": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {TAG: "device", "v": str(x)}
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in _NP_KINDS or x.dtype.byteorder == ">":
                raise _unsupported(x, path, f"numpy array of dtype {x.dtype}")
            return tensor_ref(torch.from_numpy(np.ascontiguousarray(x)), path, tag="ndarray")
        if isinstance(x, np.generic) and x.dtype.str.lstrip("<=|") in _NP_SCALARS:
            return {TAG: "npscalar", "dtype": x.dtype.str.lstrip("<=|"), "v": enc(x.item(), path)}
        if type(x) is bytes:
            return {TAG: "bytes", "b64": base64.b64encode(x).decode("ascii")}
        raise _unsupported(x, path)

    def enc_key(k: Any, path: list[str]) -> Any:
        if k is None or type(k) in (bool, int, str, float):
            return enc(k, path)
        if type(k) is tuple and _key_ok(k):
            return enc(k, path)
        raise _unsupported(k, path, f"dict key of type {type(k).__name__}")

    out.tree = enc(obj, [])
    if nesting_exceeds(out.tree, MAX_NESTING):
        raise StateError(
            f"state nested deeper than {MAX_NESTING} JSON levels once encoded",
            hint="flatten the state; checkpoints hold state_dicts and plain records",
        )
    return out


def nesting_exceeds(obj: Any, limit: int) -> bool:
    """Return whether JSON value ``obj`` nests containers deeper than ``limit`` (no recursion).

    Example:
        >>> nesting_exceeds([[1]], 2), nesting_exceeds([[[1]]], 2)
        (False, True)
    """
    level = [obj] if type(obj) is dict or type(obj) is list else []
    depth = 0
    while level:  # one pass per level: no per-node tuples, no recursion
        depth += 1
        if depth > limit:
            return True
        nxt: list[Any] = []
        for x in level:
            vals = x.values() if type(x) is dict else x
            nxt += [v for v in vals if type(v) is dict or type(v) is list]
        level = nxt
    return False


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


MAX_NESTING = 100
"""Deepest JSON nesting of an encoded tree. Real training state nests a few levels (a
tagged dict takes three); the bound keeps every recursive walk of a hostile tree far
from Python's recursion limit. :func:`encode` refuses deeper state, so whatever saves
also loads."""

Leaf = Callable[[str, str, Mapping[str, Any]], Any]
"""``(tag, key, reference) -> value`` for a ``tensor`` / ``ndarray`` reference."""

_TAG_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # tag: (required fields besides "$t", optional fields)
    "tensor": (frozenset({"key"}), frozenset({"requires_grad"})),
    "ndarray": (frozenset({"key"}), frozenset()),
    "tuple": (frozenset({"items"}), frozenset()),
    "dict": (frozenset({"items"}), frozenset()),
    "float": (frozenset({"v"}), frozenset()),
    "size": (frozenset({"items"}), frozenset()),
    "dtype": (frozenset({"v"}), frozenset()),
    "device": (frozenset({"v"}), frozenset()),
    "npscalar": (frozenset({"dtype", "v"}), frozenset()),
    "bytes": (frozenset({"b64"}), frozenset()),
}
_REF_FIELDS = frozenset({TAG, "key"})
_TORCH_DTYPES: dict[str, torch.dtype] = {
    name: v for name, v in vars(torch).items() if isinstance(v, torch.dtype)
}
"""``torch.<name>`` dtypes, looked up without ``getattr`` (which imports lazy submodules)."""
_NP_SCALARS: dict[str, np.dtype[Any]] = {
    np.dtype(c).str.lstrip("<=|"): np.dtype(c)
    for c in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")
}
"""numpy scalar dtypes :func:`encode` writes (``x.dtype.str`` without byte order)."""
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_SIZE_MAX = 1 << 63
_DECODE_ERRORS = (TypeError, ValueError, OverflowError, RuntimeError)
"""What converting a hostile JSON value can raise (a huge int to a float, an unhashable
value looked up, a string torch or numpy cannot parse). The decoder checks each value
before converting it; these are turned into ``CK-M009`` at the one conversion boundary
(:func:`rebuild`'s tagged values) as a safety net for a check it lacks, with the path to
the value. Not ``KeyError``/``IndexError``/``AttributeError``: fields are checked before
they are read, so those would be bugs here, and a bug must not pass as damaged input."""


class _Malformed(Exception):
    """A tree value :func:`decode` cannot rebuild; carries the path to it."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        self.where: list[str] = []


def tree_error(why: str, where: str = "") -> ManifestError:
    """Return the ``CK-M009`` error for a state tree that cannot be rebuilt."""
    at = f"tree/{where}" if where else "tree"
    return ManifestError(
        f"the state tree cannot be rebuilt at '{at}': {why}",
        code=codes.M009,
        hint="the manifest was damaged, edited or written by a newer ckptkit; roll back to "
        "the previous verified checkpoint ('ckptkit ls RUN'), or upgrade ckptkit",
    )


def _converts_to_numpy(dt: torch.dtype) -> bool:
    try:
        torch.empty(0, dtype=dt).numpy()
    except (TypeError, RuntimeError):
        return False
    return True


_NUMPY_DTYPES = frozenset(dt for dt in DTYPES.values() if _converts_to_numpy(dt))
"""Tensor dtypes that ``Tensor.numpy()`` converts (not bf16, not fp8): what an ndarray holds."""


def rebuild(tree: Any, *, known: Container[str], leaf: Leaf) -> Any:
    """Rebuild the object an encoded tree describes; ``leaf`` supplies each tensor.

    This is the one decoder: :func:`decode` (load) and :func:`check` (every manifest
    read, so verify) both run it, so a tree that verifies also loads.

    Args:
        tree: the encoded tree (JSON).
        known: tensor keys the manifest lists.
        leaf: returns the value of a tensor or ndarray reference whose key is known.

    Raises:
        ManifestError: ``CK-M009``, naming the place in the tree and what is wrong.
    """
    tag_of: dict[str, str] = {}

    def dec(x: Any, depth: int) -> Any:
        if depth > MAX_NESTING:
            raise _Malformed(f"nested deeper than {MAX_NESTING} levels")
        if isinstance(x, list):
            out = []
            for i, v in enumerate(x):
                try:
                    out.append(dec(v, depth + 1))
                except _Malformed as e:
                    e.where.append(str(i))
                    raise
            return out
        if not isinstance(x, dict):
            return x  # a JSON scalar (the parser admits finite numbers only)
        if TAG not in x:
            res = {}
            for k, v in x.items():
                try:
                    res[k] = dec(v, depth + 1)
                except _Malformed as e:
                    e.where.append(key_segment(k))
                    raise
            return res
        tag = x[TAG]
        try:
            return dec_tagged(x, tag, depth)
        except _DECODE_ERRORS as e:
            # The decode boundary: a conversion below met a value no check above foresaw.
            why = str(e) if len(str(e)) <= 120 else str(e)[:119] + "…"
            raise _Malformed(f"a {short(tag)} value cannot be rebuilt ({type(e).__name__}: {why})") from None

    def fields(x: dict[str, Any], tag: str) -> None:
        need, opt = _TAG_FIELDS[tag]
        have = set(x) - {TAG}
        if not need <= have or not have <= need | opt:
            raise _Malformed(
                f"a {short(tag)} value has fields {short(sorted(have))}; it needs {sorted(need)}"
                + (f" and may have {sorted(opt)}" if opt else "")
            )

    def items_of(x: dict[str, Any], tag: str) -> list[Any]:
        v = x["items"]
        if not isinstance(v, list):
            raise _Malformed(f"the items of a {short(tag)} value are {type(v).__name__}, not a list")
        return v

    def dec_tagged(x: dict[str, Any], tag: Any, depth: int) -> Any:
        if not isinstance(tag, str) or tag not in _TAG_FIELDS:
            raise _Malformed(f"unknown tag {short(tag)} (written by a newer ckptkit?)")
        if not (tag == "tensor" and x.keys() == _REF_FIELDS):  # the common case, checked fast
            fields(x, tag)
        if tag in ("tensor", "ndarray"):
            key = x["key"]
            if not isinstance(key, str):
                raise _Malformed(f"a {tag} reference has a key of type {type(key).__name__}")
            if key not in known:
                raise _Malformed(f"references tensor {short(key)}, which the manifest does not list")
            if tag_of.setdefault(key, tag) != tag:
                raise _Malformed(f"tensor {short(key)} is referenced both as a tensor and an ndarray")
            if not isinstance(x.get("requires_grad", False), bool):
                raise _Malformed("requires_grad is not a boolean")
            return leaf(tag, key, x)
        if tag == "tuple":
            vals = []
            for i, v in enumerate(items_of(x, tag)):
                try:
                    vals.append(dec(v, depth + 2))
                except _Malformed as e:
                    e.where.append(str(i))
                    raise
            return tuple(vals)
        if tag == "dict":
            out: dict[Any, Any] = {}
            for i, kv in enumerate(items_of(x, tag)):
                try:
                    if not isinstance(kv, list) or len(kv) != 2:
                        raise _Malformed("a dict item is not a [key, value] pair")
                    k = _hashable(dec(kv[0], depth + 3))
                    if not _key_ok(k):
                        raise _Malformed(f"a dict key of type {type(k).__name__} (unhashable "
                                         "or not a plain value)")
                    out[k] = dec(kv[1], depth + 3)
                except _Malformed as e:
                    e.where.append(str(i))
                    raise
            return out
        v = x.get("v")
        if tag == "float":
            if not isinstance(v, str) or v not in _NONFINITE:
                raise _Malformed(f"a float tag holds {short(v)}, not 'nan', 'inf' or '-inf'")
            return _NONFINITE[v]
        if tag == "size":
            dims = items_of(x, tag)
            if not all(type(d) is int and 0 <= d < _SIZE_MAX for d in dims):
                raise _Malformed("a torch.Size holds something other than non-negative ints")
            return torch.Size(dims)
        if tag == "dtype":
            dt = _TORCH_DTYPES.get(v) if isinstance(v, str) else None
            if dt is None:
                raise _Malformed(f"unknown torch dtype {short(v)}")
            return dt
        if tag == "device":
            if not isinstance(v, str) or len(v) > 64:
                raise _Malformed(f"a device is {type(v).__name__}, not a short string")
            try:
                return torch.device(v)
            except RuntimeError:
                raise _Malformed(f"torch cannot parse the device {short(v)}") from None
        if tag == "npscalar":
            return _npscalar(x["dtype"], dec(v, depth + 1))
        # bytes
        b64 = x["b64"]
        if not isinstance(b64, str):
            raise _Malformed("a bytes value is not a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except ValueError:
            raise _Malformed("a bytes value is not valid base64") from None

    try:
        return dec(tree, 1)
    except _Malformed as e:
        raise tree_error(e.why, "/".join(reversed(e.where))) from None
    except RecursionError:
        raise tree_error("nested too deeply") from None


def _npscalar(name: Any, v: Any) -> Any:
    dt = _NP_SCALARS.get(name) if isinstance(name, str) else None
    if dt is None:
        raise _Malformed(f"unsupported numpy scalar dtype {short(name)}")
    if dt.kind == "b":
        ok = type(v) is bool
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        ok = type(v) is int and info.min <= v <= info.max
    else:
        # encode writes a float scalar's .item(): always a Python float (non-finite ones
        # tagged), so an int here was not written by encode; a finite value past the
        # dtype's range would silently become inf.
        ok = type(v) is float and not (math.isfinite(v) and abs(v) > float(np.finfo(dt).max))
    if not ok:
        raise _Malformed(f"{short(v)} is not a value of numpy {dt.name}")
    return dt.type(v)


def _key_ok(k: Any) -> bool:
    if k is None or type(k) in (bool, int, float, str):
        return True
    return type(k) is tuple and all(_key_ok(v) for v in k)


def decode(tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild the object :func:`encode` split, sharing tensors referenced twice.

    Raises:
        ManifestError: ``CK-M009`` for anything :func:`encode` would not have written (an
            unknown tag, a reference to a tensor that does not exist, a malformed value).

    Example:
        >>> e = encode({"a": (1, 2), 3: float("inf")})
        >>> decode(e.tree, e.tensors)
        {'a': (1, 2), 3: inf}
    """

    def leaf(tag: str, key: str, ref: Mapping[str, Any]) -> Any:
        t = tensors[key]
        if tag == "ndarray":
            if t.dtype not in _NUMPY_DTYPES:
                raise _Malformed(f"tensor {key!r} of dtype {t.dtype} cannot be a numpy array")
            return t.detach().cpu().numpy()
        if ref.get("requires_grad") and t.is_floating_point():
            t.requires_grad_(True)
        return t

    return rebuild(tree, known=tensors, leaf=leaf)


def check(
    tree: Any, dtypes: Mapping[str, str], *, elsewhere: Callable[[str], bool] | None = None
) -> None:
    """Run :func:`decode` on a tree without tensor bytes: raise what ``load`` would raise.

    Args:
        tree: the encoded tree.
        dtypes: tensor key -> safetensors dtype name, as the manifest lists them.
        elsewhere: for a manifest read in part (the root alone, as a run's listing reads
            it): True for a key a rank manifest not read may hold; such a reference is
            not refused here. Every other key must be listed.

    Raises:
        ManifestError: ``CK-M009``, as :func:`decode`.

    Example:
        >>> check({"$t": "tensor", "key": "w"}, {"w": "F32"})
        >>> check({"$t": "bytes", "b64": "!"}, {})
        Traceback (most recent call last):
        ...
        ckptkit.errors.ManifestError: CK-M009 the state tree cannot be rebuilt at 'tree': ...
    """
    def leaf(tag: str, key: str, ref: Mapping[str, Any]) -> Any:
        if key not in dtypes:  # listed by a manifest not read here (``elsewhere``)
            return _StandIn()
        dt = DTYPES.get(dtypes[key])
        if tag == "ndarray" and (dt is None or dt not in _NUMPY_DTYPES):
            raise _Malformed(f"tensor {key!r} of dtype {dt} cannot be a numpy array")
        return _StandIn()  # not a plain value either: refused as a dict key, as a tensor is

    rebuild(tree, known=dtypes if elsewhere is None else _Either(dtypes, elsewhere), leaf=leaf)


class _Either:
    """The keys :func:`check` accepts from a manifest read in part: listed, or ``elsewhere``."""

    def __init__(self, listed: Container[str], elsewhere: Callable[[str], bool]) -> None:
        self.listed, self.elsewhere = listed, elsewhere

    def __contains__(self, key: object) -> bool:
        return key in self.listed or (isinstance(key, str) and self.elsewhere(key))


class _StandIn:
    """What :func:`check` puts where ``load`` puts a tensor or an array (no bytes read)."""


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
    except ManifestError:
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
                    yield from iter_tensor_refs(item[1], (*path, key_segment(item[0])))
        elif tag is None:
            for k, v in tree.items():
                yield from iter_tensor_refs(v, (*path, key_segment(k)))


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
