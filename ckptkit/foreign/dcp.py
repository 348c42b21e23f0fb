"""PyTorch Distributed Checkpoint directories: ``.metadata`` plus ``*.distcp`` shards.

``.metadata`` (a pickle, written last by the coordinator) lists every item of the state
dict, its chunks and, in ``storage_data``, the shard file and byte range of each. ckptkit
reads it with a restricted unpickler, then checks that every item is covered by a present
shard long enough for its byte range, naming missing shards (``dcp.load`` would raise
``CheckpointException``, which does not derive from ``Exception``). Each item of the
default ``torch.save`` serialisation is a small zip archive: its CRCs are checked too, and
model/optimizer tensors scanned for NaN/Inf.

Components are recognised in the state dict's own nesting (``planner_data`` keeps it): a
DCP-tutorial ``Stateful`` wrapper (``app/model``, ``app/optim``), torchtitan's layout (the
model's parameters flattened to the top level beside ``optimizer``, ``lr_scheduler``,
``dataloader`` and ``train_state``), or anything else, by name or by the shape of the
content (:mod:`ckptkit.foreign.structure`). Small non-tensor items are read only when a
rule needs their value (a step, a ``last_epoch``). DCP saves only what it is given: RNG,
sampler and progress are present only when the caller put them in the state dict.
"""

from __future__ import annotations

import io
import pickle
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.foreign import _load
from ckptkit.foreign._scan import Scan
from ckptkit.foreign.structure import Lazy, TensorMeta
from ckptkit.foreign.torch_save import scan_tree
from ckptkit.format import digest
from ckptkit.storage import dcp

META = ".metadata"


def scan(s: Scan) -> None:
    """Fill ``s`` for a DCP directory."""
    if not s.readable(META):
        shards = s.glob("*.distcp")
        if s.has(META):
            s.absent("model", ".metadata is a symlink or resolves outside the checkpoint: not read")
            return
        s.add(
            codes.F105,
            ".metadata missing: DCP writes it last, so the save did not finish "
            f"(or it was not copied); {len(shards)} shard(s) are unusable without it",
            path=META,
        )
        s.absent("model", ".metadata is missing: no item of the checkpoint can be located")
        return
    md: Any = None
    problem: _load.Problem | None
    try:
        data = s.path(META).read_bytes()
    except OSError as e:
        problem = _load.failed_read(e, codes.F108, "cannot be read")
    else:
        s.digests[META] = (digest.hexdigest_bytes(data), len(data))  # read once
        md, problem = _load.loads_dcp_metadata(data)
    if problem is not None and problem.code == codes.F103:
        s.refused_pickle(META, f".metadata {problem.message}")
        s.absent("model", f".metadata could not be read ({problem.code})")
        return
    if problem is not None:
        s.add(problem.code, f".metadata {problem.message}", path=META)
        s.absent("model", f".metadata could not be read ({problem.code})")
        return
    try:
        walked = _walk(md)
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        s.add(
            codes.F108,
            f".metadata has an unexpected structure: {_load._errname(e)}: {_load._first_line(e)}",
            path=META,
        )
        s.absent("model", ".metadata has an unexpected structure")
        return
    sd_meta, entries, planner = walked

    # Every item covered by a storage entry.
    covered: dict[str, int] = defaultdict(int)
    for ent in entries:
        covered[ent.fqn] += 1
    uncovered = [fqn for fqn, (need, _m) in sd_meta.items() if covered.get(fqn, 0) < need]
    if uncovered:
        s.add(
            codes.F105,
            f"{len(uncovered)} item(s) have no storage entry in .metadata: "
            + ", ".join(uncovered[:5]),
            path=META,
        )

    # Every storage entry inside a present shard of sufficient size.
    by_file: dict[str, list[_Entry]] = defaultdict(list)
    for ent in entries:
        by_file[ent.rel].append(ent)
    bad_files: set[str] = set()
    for rel, items in sorted(by_file.items()):
        if not s.readable(rel):
            bad_files.add(rel)
            if rel in s.outside:
                continue  # CK-F009 says it; never read
            s.add(
                codes.F105,
                f"shard {rel} is missing: it holds {len(items)} item(s), e.g. "
                + ", ".join(sorted({i.fqn for i in items})[:4]),
                path=rel,
            )
            continue
        size = s.path(rel).stat().st_size
        end = max(i.offset + i.length for i in items)
        if size < end:
            bad_files.add(rel)
            short = sorted({i.fqn for i in items if i.offset + i.length > size})
            s.add(
                codes.F106,
                f"shard {rel} is {size} bytes but .metadata needs {end}: "
                f"{len(short)} item(s) cut off, e.g. " + ", ".join(short[:4]),
                path=rel,
            )
    extra = [f for f in s.glob("*.distcp") if f not in by_file]
    s.unrecognised("shards (not referenced by .metadata)", extra)

    # The state dict's tree, with tensors known by metadata and small items read lazily.
    first: dict[str, _Entry] = {}
    for ent in entries:
        first.setdefault(ent.fqn, ent)
    reader = _Reader(s, bad_files)
    tree: dict[Any, Any] = {}
    for fqn, (_need, meta) in sd_meta.items():
        where = first.get(fqn)
        leaf: Any
        if isinstance(meta, tuple):  # a tensor: (shape, dtype)
            shape, dtype = meta
            leaf = TensorMeta(shape, dtype, read=reader.reader(where) if where is not None else None)
        else:
            leaf = Lazy(reader.reader(where)) if where is not None else None
        _insert(tree, item_path(fqn, planner), leaf)
    tree = _listify(tree)
    scan_tree(s, tree, file=META, what="the DCP state dict")

    # Values: per-item CRCs and NaN/Inf in model/optimizer tensors, each shard read once
    # and hashed in the same pass (the digest an adopted manifest is checked against).
    if not s.scan_values:
        return
    model_keys = _keys_of(s, "model")
    opt_keys = _keys_of(s, "optimizer")
    wanted: dict[str, list[tuple[_Entry, str, tuple[Any, ...]]]] = {}
    for ent in entries:
        if ent.rel in bad_files:
            continue
        todo = wanted.setdefault(ent.rel, [])  # every good shard is hashed, values or not
        if ent.transformed:
            continue
        path = item_path(ent.fqn, planner)
        comp = (
            "model" if _under(path, model_keys)
            else "optimizer" if _under(path, opt_keys) else None
        )
        if comp is None or not isinstance(sd_meta.get(ent.fqn, (0, None))[1], tuple):
            continue
        todo.append((ent, comp, path))
    for rel, todo in wanted.items():
        reader.scan_shard(rel, todo)


@dataclass(frozen=True)
class _Entry:
    """One ``storage_data`` entry of ``.metadata``: where an item's bytes are."""

    fqn: str
    rel: str
    offset: int
    length: int
    transformed: bool


class _Reader:
    """Reads single DCP items safely (CRC-checked, weights-only), recording findings."""

    def __init__(self, s: Scan, bad_files: set[str]) -> None:
        self._s = s
        self._bad = bad_files

    def reader(self, ent: _Entry) -> Any:
        return lambda: self.read(ent, component="checkpoint", critical=False)

    def read(self, ent: _Entry, *, component: str, critical: bool = True) -> Any:
        s, rel, fqn = self._s, ent.rel, ent.fqn
        if rel in self._bad or ent.transformed:
            raise ValueError("item not readable")
        try:
            with open(s.path(rel), "rb") as f:
                f.seek(ent.offset)
                blob = f.read(ent.length)
        except OSError as e:
            s.add(codes.F108, f"item {fqn} cannot be read: {e}", path=rel, component=component)
            return None
        return self.parse(ent, blob, component=component, critical=critical)

    def scan_shard(self, rel: str, todo: list[tuple[_Entry, str, tuple[Any, ...]]]) -> None:
        """Read shard ``rel`` once, in file order (:class:`ckptkit.storage.dcp.Shard`, the
        reader ``ckptkit.dcp`` loads and checks with): scan the values of ``todo``'s items
        for NaN/Inf as their bytes go by, and keep the file's digest (:attr:`Scan.digests`)
        for the adopted manifest's check, so no byte is read twice.

        A file that cannot be read here gets no digest (the file check reads it and says
        why), and its remaining items are read one by one, each failure a finding.
        """
        s = self._s
        todo = sorted(todo, key=lambda t: (t[0].offset, t[0].length))
        done = 0
        try:
            with dcp.open_shard(s.path(rel), rel=rel, expected_size=None) as shard:
                for ent, comp, path in todo:
                    blob = bytearray(ent.length)
                    shard.read_into(ent.offset, memoryview(blob))
                    done += 1
                    self._scan(comp, path, self.parse(ent, bytes(blob), component=comp))
                s.digests[rel] = (shard.hexdigest(), shard.size)
        except CkptkitError:
            for ent, comp, path in todo[done:]:
                self._scan(comp, path, self.read(ent, component=comp))

    def _scan(self, comp: str, path: tuple[Any, ...], obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            self._s.scan_tensor(comp, "/".join(str(p) for p in path), obj)

    def parse(self, ent: _Entry, blob: bytes, *, component: str, critical: bool = True) -> Any:
        """One item's bytes: zip CRCs checked, then ``torch.load(weights_only=True)``."""
        s, rel, fqn = self._s, ent.rel, ent.fqn
        if blob[:4] == b"PK\x03\x04":
            zf, why = _load._open_zip(io.BytesIO(blob))
            if zf is None:
                s.add(codes.F102, f"item {fqn} is damaged ({why})", path=rel, component=component)
                return None
            big = _load.check_zip_sizes(zf, archive_size=len(blob))
            if big is not None:
                zf.close()
                s.add(big.code, f"item {fqn}: {big.message}", path=rel, component=component)
                return None
            try:
                with zf:
                    bad = zf.testzip()
            except _load.ZIP_READ_ERRORS as e:
                s.add(codes.F102, f"item {fqn} is damaged ({e})", path=rel, component=component)
                return None
            if bad is not None:
                s.add(
                    codes.F101,
                    f"item {fqn}: member {bad!r} fails its CRC-32",
                    path=rel,
                    component=component,
                )
                return None
        try:
            with torch.serialization.safe_globals(_load.SAFE_GLOBALS):
                return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            if critical:
                s.add(
                    codes.F108,
                    f"item {fqn} cannot be read: {_load._errname(e)}",
                    path=rel,
                    component=component,
                )
            else:  # a pickled object: dcp.load would unpickle it with weights_only=False
                s.refused_pickle(
                    rel,
                    f"item {fqn} needs code to unpickle (not on the allow-list); not executed",
                    component=component,
                )
            return None
        except Exception as e:  # not a torch.save blob (another serialisation)
            s.add(
                codes.F108, f"item {fqn} cannot be read: {_load._errname(e)}", path=rel,
                component=component,
            )
            return None


def _walk(md: Any) -> tuple[dict[str, tuple[int, Any]], list[_Entry], dict[str, Any]]:
    """Read what the scan needs from unpickled ``.metadata``, checking its shape.

    The restricted unpickler only builds allowed classes, but their fields can hold
    anything: every value used later is type-checked here.

    Returns:
        ``({fqn: (chunks needed, (shape, dtype) for a tensor else None)}, storage
        entries, planner_data)``.

    Raises:
        AttributeError, TypeError, ValueError, KeyError: an unexpected structure.
    """
    sd_meta: dict[str, tuple[int, Any]] = {}
    for fqn, m in dict(md.state_dict_metadata or {}).items():
        if not isinstance(fqn, str):
            raise TypeError(f"state_dict_metadata key {fqn!r} is not a string")
        chunks = getattr(m, "chunks", None)
        need = (len(chunks) if chunks is not None else 0) or 1
        size = getattr(m, "size", None)
        tensor: Any = None
        if size is not None:
            shape = tuple(int(d) for d in size)
            props = getattr(m, "properties", None)
            dtype = getattr(props, "dtype", None)
            tensor = (shape, dtype if isinstance(dtype, torch.dtype) else None)
        sd_meta[fqn] = (need, tensor)
    entries = []
    for idx, info in dict(getattr(md, "storage_data", None) or {}).items():
        fqn = getattr(idx, "fqn", idx)
        rel = info.relative_path
        if not isinstance(fqn, str) or not isinstance(rel, str):
            raise TypeError(f"storage_data entry {idx!r}: {info!r}"[:200])
        offset, length = _nonneg(info.offset), _nonneg(info.length)
        transformed = bool(getattr(info, "transform_descriptors", None))
        entries.append(_Entry(fqn, rel, offset, length, transformed))
    planner = dict(getattr(md, "planner_data", None) or {})
    return sd_meta, entries, planner


def _nonneg(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"byte offset/length {v!r} is not a non-negative integer")
    return v


def item_path(fqn: str, planner: dict[str, Any]) -> tuple[Any, ...]:
    """The item's place in the saved state dict (``planner_data``), else its dotted name."""
    p = planner.get(fqn)
    if isinstance(p, tuple | list) and p and all(isinstance(x, str | int) for x in p):
        return tuple(p)
    return tuple(fqn.split("."))


def _insert(tree: dict[Any, Any], path: tuple[Any, ...], leaf: Any) -> None:
    node = tree
    for k in path[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = node[k] = {}
        node = nxt
    node[path[-1]] = leaf


def _listify(node: Any) -> Any:
    """Dicts keyed 0..n-1 (DCP flattens lists that way) back into lists."""
    if not isinstance(node, dict):
        return node
    out = {k: _listify(v) for k, v in node.items()}
    keys = list(out)
    if keys and all(isinstance(k, int) for k in keys) and sorted(keys) == list(range(len(keys))):
        return [out[i] for i in range(len(keys))]
    return out


def _keys_of(s: Scan, component: str) -> list[tuple[str, ...]]:
    """Paths (inside the state dict) where ``component`` was found."""
    out: list[tuple[str, ...]] = []
    row = s.rows.get(component)
    for w in row.where if row is not None else []:
        if w == META:
            out.append(())  # the state dict's top level (a flattened model)
        elif w.startswith(META + ":"):
            out.append(tuple(w[len(META) + 1 :].split("/")))
    return out


def _under(path: tuple[Any, ...], prefixes: list[tuple[str, ...]]) -> bool:
    sp = tuple(str(p) for p in path)
    for pre in prefixes:
        if not pre:
            # The top-level flattened model: a one-segment path not under another component.
            if len(sp) == 1:
                return True
        elif sp[: len(pre)] == pre:
            return True
    return False
