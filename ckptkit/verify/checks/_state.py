"""Read a checkpoint's state for the state checks, defensively, through its view.

The checks read a :class:`~ckptkit.verify.view.StateView`: a foreign reader's
(:class:`~ckptkit.verify.reader.ReaderContext`), or, for a native checkpoint, the
:class:`ManifestView` defined here. The manifest passed its schema, but component summaries
and the state tree are free-form JSON: a damaged or hostile manifest can put any value
anywhere. Every accessor here returns None (or an empty container) for a value of the wrong
type instead of raising, so a check skips what it cannot read and never tracebacks; the
integrity family reports the damage.

Tensor *values* are read only for the NaN/Inf scan, one file at a time, through the same
verifying reader ``load`` uses, and only files whose tensors belong to the model or the
optimizer.
"""

from __future__ import annotations

import math
import mmap
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ckptkit import codes
from ckptkit.checkpoint.read import COMPONENT_ALIASES
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format import tree as tree_mod
from ckptkit.format.dtypes import DTYPES, HeaderEntry
from ckptkit.storage import dcp_meta, fs, remote, shards, transfer
from ckptkit.storage import tensors as tensors_mod
from ckptkit.storage.fs import Location
from ckptkit.verify.context import CheckContext
from ckptkit.verify.reader import ReaderContext
from ckptkit.verify.view import (
    EXPECTS,
    Expect,
    Found,
    NonFinite,
    OptimizerView,
    OptParam,
    StateView,
    apply_expect,
    count_nonfinite,
)

TAG = tree_mod.TAG


# --- plain values ----------------------------------------------------------------------------


def num(x: Any) -> float | None:
    """A number (tagged non-finite floats and 0-d tensors' JSON forms included), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, float):
        return x
    if isinstance(x, int):
        try:
            return float(x)
        except OverflowError:  # a JSON int has any magnitude; past a float's, not a number
            return None
    if isinstance(x, Mapping) and x.get(TAG) == "float":
        v = x.get("v")
        if v in ("nan", "inf", "-inf"):
            return float(v)
    return None


def integer(x: Any) -> int | None:
    """A non-negative integer (an integral float counts), else None."""
    v = num(x)
    if v is None or not math.isfinite(v) or not v.is_integer() or v < 0:
        return None
    return int(v)


def decimal(s: str) -> int | None:
    """A non-negative int spelled in ASCII digits (a rank or parameter index), else None.

    ``str.isdigit`` alone admits ``'²'`` (``int`` refuses it) and digit strings longer
    than ``int`` converts; both are refused here, not raised.

    Example:
        >>> decimal("12"), decimal("²"), decimal("1" * 5000), decimal("-1")
        (12, None, None, None)
    """
    if s.isascii() and s.isdigit() and len(s) <= 18:
        return int(s)
    return None


def mapping(x: Any) -> Mapping[str, Any]:
    """``x`` when it is a plain (untagged) JSON object, else an empty mapping."""
    if isinstance(x, Mapping) and TAG not in x:
        return x
    return {}


def items(x: Any) -> list[tuple[Any, Any]]:
    """Key/value pairs of a JSON object or of a tagged dict (``{"$t": "dict", "items": ...}``)."""
    if isinstance(x, Mapping):
        if x.get(TAG) == "dict":
            raw = x.get("items")
            if not isinstance(raw, list):
                return []
            return [(kv[0], kv[1]) for kv in raw if isinstance(kv, list) and len(kv) == 2]
        if TAG not in x:
            return list(x.items())
    return []


def seq(x: Any) -> list[Any]:
    """Items of a JSON array or of a tagged tuple, else an empty list."""
    if isinstance(x, list):
        return x
    if isinstance(x, Mapping) and x.get(TAG) in ("tuple", "size"):
        raw = x.get("items")
        return raw if isinstance(raw, list) else []
    return []


def tensor_key(x: Any) -> str | None:
    """The tensor key of a tensor reference in the tree, else None."""
    if isinstance(x, Mapping) and x.get(TAG) == "tensor" and isinstance(x.get("key"), str):
        return str(x["key"])
    return None


# --- the view ------------------------------------------------------------------------------

_VIEWS: dict[int, StateView] = {}


def view(ctx: CheckContext) -> StateView:
    """The state view the checks read: a reader's (foreign), or the manifest's (native).

    The manifest's view is built once per context.
    """
    if isinstance(ctx, ReaderContext) and ctx.state is not None:
        return ctx.state
    v = _VIEWS.get(id(ctx))
    if v is None:
        v = ManifestView(ctx)
        _VIEWS[id(ctx)] = v
        weakref.finalize(ctx, _VIEWS.pop, id(ctx), None)
    return v


def manifest(ctx: CheckContext) -> mf.Manifest:
    assert ctx.manifest is not None  # checks needing ("manifest",) only run with one
    return ctx.manifest


def dcp_metadata(ctx: CheckContext) -> Any:
    """The native checkpoint's DCP ``.metadata`` as :func:`ckptkit.storage.dcp_meta.read_metadata`
    returns it (listed, digest-checked, unpickled with the allow-list), or the error that
    refused it: read once per verify, for every check that needs it (at thousands of ranks
    it holds W x T chunks, and each parse costs seconds)."""

    def read() -> Any:
        try:
            return dcp_meta.read_metadata(ctx.root, manifest(ctx))
        except CkptkitError as e:
            return e
        except OSError as e:  # unreadable now: the file scan reports it with its code
            return codes.read_error(e, path=dcp_meta.METADATA_REL)

    return ctx.memo("dcp.metadata", read)


def component(ctx: CheckContext, name: str) -> mf.Component | None:
    c = view(ctx).components().get(name)
    return c if isinstance(c, mf.Component) else None


def present(ctx: CheckContext, name: str) -> bool:
    c = component(ctx, name)
    return c is not None and c.present is True


def summary(ctx: CheckContext, name: str) -> Mapping[str, Any]:
    """The component's summary when it is present and has one, else {}."""
    c = component(ctx, name)
    if c is None or c.present is not True:
        return {}
    return mapping(c.summary)


def tree_part(ctx: CheckContext, name: str) -> Any:
    """The component's raw state in tree form (native TrainState trees), else None."""
    return view(ctx).part(name)


def optimizers(ctx: CheckContext) -> list[OptimizerView]:
    """Every optimizer whose per-parameter state the checkpoint lets the checks read."""
    return view(ctx).optimizers()


def model_names_by_key(ctx: CheckContext) -> Mapping[str, list[str]]:
    """Tensor key -> state-dict names holding it (tied weights share one key)."""
    return view(ctx).model_names()


def nonfinite(ctx: CheckContext) -> Mapping[str, list[NonFinite]]:
    """Non-finite tensors of the model and the optimizer, by component."""
    return view(ctx).nonfinite()


# --- the native view: what manifest.json records -----------------------------------------------


class ManifestView:
    """The :class:`~ckptkit.verify.view.StateView` of a native checkpoint (its manifest).

    The expectation (``ctx.options["expect"]``, from ``verify --expect``) overrides what the
    run recorded as required; without one the recorded table stands. Tensor values are
    read only for the NaN/Inf scan, once per context.
    """

    def __init__(self, ctx: CheckContext) -> None:
        self._ctx = ctx
        self._nonfinite: dict[str, list[NonFinite]] | None = None

    @property
    def _m(self) -> mf.Manifest:
        return manifest(self._ctx)

    def components(self) -> Mapping[str, mf.Component]:
        comps = {n: c for n, c in self._m.components.items() if isinstance(c, mf.Component)}
        expect, _ = self.expectation()
        return apply_expect(comps, expect)

    def found(self) -> Mapping[str, Found]:
        return {
            n: Found("recorded", tuple(w for w in c.where if isinstance(w, str)))
            for n, c in self.components().items()
            if c.present is True
        }

    def expectation(self) -> tuple[Expect | None, str]:
        expect = self._ctx.options.get("expect")
        return (expect if expect in EXPECTS else None), ""

    def part(self, name: str) -> Any:
        """``tree[name]`` of a TrainState-shaped tree (a plain JSON object at the top)."""
        return mapping(self._m.tree).get(name)

    def optimizers(self) -> list[OptimizerView]:
        """The TrainState optimizer snapshot, when it was recorded with its summary."""
        summ = summary(self._ctx, "optimizer")
        if not summ:
            return []
        opt = mapping(self.part("optimizer"))
        sd = mapping(opt.get("state_dict"))
        params = _optimizer_params(opt, sd, self._shapes())
        if params is None:
            return []
        par = summary(self._ctx, "parallel")
        kind = summ.get("type")
        return [
            OptimizerView(
                kind=kind if isinstance(kind, str) else None,
                params=params,
                groups=[mapping(g) for g in seq(sd.get("param_groups"))],
                flat=par.get("fsdp") is True or bool(integer(par.get("zero_stage"))),
            )
        ]

    def model_shapes(self) -> Mapping[str, tuple[int, ...]]:
        shapes = self._shapes()
        out: dict[str, tuple[int, ...]] = {}
        for key, names in self.model_names().items():
            if key in shapes:
                for n in names:
                    out[n] = shapes[key]
        return out

    def model_names(self) -> Mapping[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, ref in items(self.part("model")):
            key = tensor_key(ref)
            if key is not None and isinstance(name, str):
                out.setdefault(key, []).append(name)
        return out

    def trainable(self) -> frozenset[str]:
        return frozenset(
            n for n in seq(summary(self._ctx, "model").get("trainable")) if isinstance(n, str)
        )

    def nonfinite(self) -> Mapping[str, list[NonFinite]]:
        if self._nonfinite is None:
            self._nonfinite = _scan_nonfinite(self._ctx)
        return self._nonfinite

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.key: tuple(t.shape) for t in self._m.tensors}


def _optimizer_params(
    opt: Mapping[str, Any], sd: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]
) -> list[OptParam] | None:
    """Every optimized parameter of a TrainState optimizer snapshot, or None if unreadable."""
    groups = sd.get("param_groups")
    if not isinstance(groups, list) or "state" not in sd:
        return None
    state: dict[int, Mapping[str, Any]] = {}
    for k, v in items(sd.get("state")):
        idx = integer(k) if not isinstance(k, str) else decimal(k)
        if idx is not None and isinstance(v, Mapping):
            state[idx] = v
    names = opt.get("param_names")
    all_shapes = opt.get("param_shapes")
    out: list[OptParam] = []
    for gi, g in enumerate(groups):
        for pi, raw in enumerate(seq(mapping(g).get("params"))):
            idx = integer(raw)
            if idx is None:
                return None
            name = _nested(names, gi, pi)
            per = state.get(idx) or None
            moments: dict[str, tuple[int, ...]] | None = None
            if per is not None:
                moments = {}
                for key, ref in items(per):
                    tk = tensor_key(ref)
                    if isinstance(key, str) and tk is not None and tk in shapes:
                        moments[key] = shapes[tk]
            out.append(
                OptParam(
                    index=idx,
                    name=name if isinstance(name, str) else f"#{pi} of group {gi}",
                    shape=_shape(_nested(all_shapes, gi, pi)),
                    moments=moments,
                )
            )
    return out


def _nested(x: Any, i: int, j: int) -> Any:
    if isinstance(x, list) and i < len(x) and isinstance(x[i], list) and j < len(x[i]):
        return x[i][j]
    return None


def _shape(x: Any) -> tuple[int, ...] | None:
    dims = seq(x)
    if not isinstance(x, list | Mapping):
        return None
    out = [integer(d) for d in dims]
    return None if any(d is None for d in out) else tuple(d for d in out if d is not None)


# --- tensor values: the NaN/Inf scan of safetensors shards ------------------------------------


SCANNED = ("model", "optimizer")
"""Components whose tensors the NaN/Inf scan reads."""


def tensor_component(key: str) -> str | None:
    """Component of a tensor key: its top-level segment, through the plain-save aliases."""
    head = key.split("/", 1)[0]
    return COMPONENT_ALIASES.get(head.lower())


def _scan_nonfinite(ctx: CheckContext) -> dict[str, list[NonFinite]]:
    """Non-finite tensors of the model and the optimizer of a native checkpoint.

    Files are read one at a time with full verification (size, header, digest); a file
    that fails is skipped (the integrity family reports it), as is one that is a symlink or
    resolves outside the checkpoint. ``ctx.options["scan_values"] = False`` skips the scan
    (a caller that has just scanned the same bytes, or wants a manifest-only verify).
    """
    out: dict[str, list[NonFinite]] = {c: [] for c in SCANNED}
    if ctx.options.get("scan_values", True) is False:
        return out
    m = manifest(ctx)
    wanted: dict[str, dict[str, HeaderEntry]] = {}
    for te in m.tensors:
        if tensor_component(te.key) in SCANNED and _floating(te.dtype):
            wanted.setdefault(te.file, {})
    # The reader checks the header against *every* tensor of the file, so pass them all.
    for te in m.tensors:
        if te.file in wanted:
            wanted[te.file][te.key] = te.header_entry()
    scans = ctx.scan_all()
    for fe in m.files:
        if fe.path not in wanted:
            continue
        scan = scans.get(fe.path)
        if scan is None or scan.digest != fe.xxh3_128:
            continue  # missing or damaged: the integrity family reports it; never scan it
        want = wanted[fe.path]
        if scan.finite is not None:
            # The digest pass already checked every aligned floating tensor: only those
            # it flagged (for the counts) or could not check are looked at again.
            look = scan.finite.nonfinite | scan.finite.unchecked
            want = {k: v for k, v in want.items() if k in look}
            if not want:
                continue
        local = fs.local_path(ctx.root)
        if local is None:  # an object store: fetch the flagged tensors' byte ranges
            found: Iterator[tuple[str, NonFinite | None]] = _remote(ctx.root, fe, want)
        elif fe.compression is None:
            found = _mapped(local, fe, want)
        else:
            found = _read(local, fe, want)
        for key, nf in found:
            comp = tensor_component(key)
            if comp in out and nf is not None:
                out[comp].append(nf)
    return out


def tensor_values(ctx: CheckContext, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors whose key starts with ``prefix``, read whole through the verifying reader.

    Only files whose digest the scan matched are read (damage is the integrity family's to
    report), never one that is a symlink or resolves outside the checkpoint; a file that
    fails is skipped. ``ctx.options["scan_values"] = False`` reads nothing (a manifest-only
    verify: restore's pre-check, which has the values itself moments later).
    """
    if ctx.options.get("scan_values", True) is False:
        return {}
    m = manifest(ctx)
    wanted: dict[str, dict[str, HeaderEntry]] = {}
    for te in m.tensors:
        if te.key.startswith(prefix):
            wanted.setdefault(te.file, {})
    # The reader checks the header against *every* tensor of the file, so pass them all.
    for te in m.tensors:
        if te.file in wanted:
            wanted[te.file][te.key] = te.header_entry()
    if not wanted:
        return {}
    scans = ctx.scan_all()
    out: dict[str, torch.Tensor] = {}
    for fe in m.files:
        scan = scans.get(fe.path)
        if fe.path not in wanted or scan is None or scan.digest != fe.xxh3_128:
            continue
        exp = tensors_mod.Expected.of(fe)
        if fs.escapes(ctx.root, fe.path):
            continue
        try:
            got = shards.read_file(ctx.root / fe.path, exp, wanted[fe.path])
        except (CkptkitError, OSError, ValueError):
            continue
        out.update({k: t for k, t in got.items() if k.startswith(prefix)})
    return out


def _remote(
    root: Location, fe: mf.FileEntry, wanted: dict[str, HeaderEntry]
) -> Iterator[tuple[str, NonFinite | None]]:
    """The second look on an object store: the flagged tensors' byte ranges, fetched."""
    p = root / fe.path
    try:
        if fe.compression is not None:
            obj = remote.read_file(
                p,
                tensors_mod.Expected.of(fe),
                wanted,
            )
            for key, t in obj.items():
                if key in wanted and _floating(wanted[key].dtype):
                    yield key, count_nonfinite(key, t)
            return
        n = int.from_bytes(transfer.read_ranges(p, [(0, 8)])[0], "little")
        base = 8 + n
        keys = [k for k, e in wanted.items() if _floating(e.dtype) and e.offsets[1] > e.offsets[0]]
        spans = [(base + wanted[k].offsets[0], base + wanted[k].offsets[1]) for k in keys]
        for key, data in zip(keys, transfer.read_ranges(p, spans), strict=True):
            dt = DTYPES[wanted[key].dtype]
            yield key, count_nonfinite(key, torch.frombuffer(bytearray(data), dtype=dt))
    except (CkptkitError, OSError, ValueError):
        return


def _floating(dtype: str) -> bool:
    return dtype.startswith(("F", "BF", "C"))


def _mapped(
    root: Path, fe: mf.FileEntry, wanted: dict[str, HeaderEntry]
) -> Iterator[tuple[str, NonFinite | None]]:
    """Scan an uncompressed file whose digest just matched, tensor by tensor, via mmap.

    The integrity pass has just read (and page-cached) these bytes; mapping them costs
    no second copy in RAM, and one fused ``aminmax`` per tensor runs at memory speed.
    """
    p = root / fe.path
    if p.is_symlink() or not p.resolve().is_relative_to(root.resolve()):
        return
    try:
        with open(p, "rb") as f:
            n, _ = tensors_mod.read_header_from(f, path=fe.path, file_size=fe.size)
            if fe.size <= 8 + n:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                base = 8 + n
                for key, e in wanted.items():
                    if not _floating(e.dtype) or e.offsets[1] == e.offsets[0]:
                        continue
                    dt = DTYPES[e.dtype]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # read-only buffer: we never write
                        t = torch.frombuffer(
                            mm,
                            dtype=dt,
                            count=(e.offsets[1] - e.offsets[0]) // t_itemsize(dt),
                            offset=base + e.offsets[0],
                        )
                    try:
                        yield key, count_nonfinite(key, t)
                    finally:
                        del t  # release the view before the map closes
    except (CkptkitError, OSError, ValueError, BufferError):
        return


def t_itemsize(dt: torch.dtype) -> int:
    """Bytes per element of ``dt``."""
    return torch.empty((), dtype=dt).element_size()


def _read(
    root: Path, fe: mf.FileEntry, wanted: dict[str, HeaderEntry]
) -> Iterator[tuple[str, NonFinite | None]]:
    """Scan a compressed file: decompress it once, fully verified, then count per tensor."""
    p = root / fe.path
    try:
        if p.is_symlink() or not p.resolve().is_relative_to(root.resolve()):
            return
        exp = tensors_mod.Expected.of(fe)
        got = tensors_mod.read_file(p, exp, wanted)
    except (CkptkitError, OSError, ValueError):
        return  # damaged or unreadable: integrity checks say so
    for key, t in got.items():
        yield key, (count_nonfinite(key, t) if (t.is_floating_point() or t.is_complex()) else None)
