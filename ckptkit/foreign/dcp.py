"""PyTorch Distributed Checkpoint directories: ``.metadata`` plus ``*.distcp`` shards.

``.metadata`` (a pickle, written last by the coordinator) lists every item of the state
dict, its chunks and, in ``storage_data``, the shard file and byte range of each. ckptkit
reads it with a restricted unpickler, then checks that every item is covered by a present
shard long enough for its byte range, naming missing shards (``dcp.load`` would raise
``CheckpointException``, which does not derive from ``Exception``). Each item of the
default ``torch.save`` serialisation is a small zip archive: its CRCs are checked too, and
model/optimizer tensors scanned for NaN/Inf. Components come from the top-level keys, with
the same conventions as plain ``torch.save`` dicts. DCP saves only what it is given: RNG,
sampler and progress are present only when the caller put them in the state dict.
"""

from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from ckptkit.foreign import _load
from ckptkit.foreign._scan import Scan, as_int
from ckptkit.foreign.torch_save import PROGRESS_KEYS, classify, require_training_state

META = ".metadata"


def scan(s: Scan) -> None:
    """Fill ``s`` for a DCP directory."""
    if not s.has(META):
        shards = s.glob("*.distcp")
        s.add(
            "CK-F105",
            ".metadata missing: DCP writes it last, so the save did not finish "
            f"(or it was not copied); {len(shards)} shard(s) are unusable without it",
            path=META,
        )
        return
    md, problem = _load.read_dcp_metadata(s.path(META))
    if problem is not None:
        s.add(problem.code, f".metadata {problem.message}", path=META)
        return
    try:
        walked = _walk(md)
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        s.add(
            "CK-F108",
            f".metadata has an unexpected structure: {_load._errname(e)}: {_load._first_line(e)}",
            path=META,
        )
        return
    sd_meta, entries, planner = walked

    # Every item covered by a storage entry.
    covered: dict[str, int] = defaultdict(int)
    for ent in entries:
        covered[ent.fqn] += 1
    uncovered = []
    for fqn, need in sd_meta.items():
        if covered.get(fqn, 0) < need:
            uncovered.append(fqn)
    if uncovered:
        s.add(
            "CK-F105",
            f"{len(uncovered)} item(s) have no storage entry in .metadata: "
            + ", ".join(uncovered[:5]),
            path=META,
        )

    # Every storage entry inside a present shard of sufficient size.
    by_file: dict[str, list[tuple[str, _Entry]]] = defaultdict(list)
    for ent in entries:
        by_file[ent.rel].append((ent.fqn, ent))
    bad_files: set[str] = set()
    for rel, items in sorted(by_file.items()):
        p = s.path(rel)
        if not s.has(rel):
            bad_files.add(rel)
            s.add(
                "CK-F105",
                f"shard {rel} is missing: it holds {len(items)} item(s), e.g. "
                + ", ".join(sorted({f for f, _ in items})[:4]),
                path=rel,
                component=_component_of(items[0][0], planner),
            )
            continue
        size = p.stat().st_size
        end = max(i.offset + i.length for _, i in items)
        if size < end:
            bad_files.add(rel)
            short = sorted({f for f, i in items if i.offset + i.length > size})
            s.add(
                "CK-F106",
                f"shard {rel} is {size} bytes but .metadata needs {end}: "
                f"{len(short)} item(s) cut off, e.g. " + ", ".join(short[:4]),
                path=rel,
            )
    extra = [f for f in s.glob("*.distcp") if f not in by_file]
    s.unrecognised("shards (not referenced by .metadata)", extra)

    # Components from the top-level keys.
    tops: dict[str, list[str]] = defaultdict(list)
    for fqn in sd_meta:
        tops[_top(fqn, planner)].append(fqn)
    comps, rest = classify(list(tops))
    for comp, keys in comps.items():
        fqns = [f for k in keys for f in tops[k]]
        wanted = set(fqns)
        files = sorted({ent.rel for ent in entries if ent.fqn in wanted})
        s.comp(
            comp,
            present=True,
            required=comp != "env" and comp != "metrics",
            where=[f"{META}:{k}.*" for k in keys] + files,
            summary={"items": len(fqns)},
        )
    require_training_state(s, comps, what="the DCP state dict")
    s.unrecognised("top-level keys", rest, path=META)

    # Values: per-item CRCs, NaN/Inf in model/optimizer tensors, the step counter.
    if not s.scan_values:
        return
    for rel, items in sorted(by_file.items()):
        if rel in bad_files:
            continue
        for fqn, info in items:
            comp = _component_of(fqn, planner)
            top = _top(fqn, planner)
            want_step = comp == "progress" and top in PROGRESS_KEYS and s.step is None
            if info.transformed or not (comp in ("model", "optimizer") or want_step):
                continue
            obj = _item(s, rel, fqn, info, comp)
            if isinstance(obj, torch.Tensor):
                s.nonfinite(comp, [(fqn, obj)], path=rel)
            elif want_step:
                s.step = as_int(obj)


@dataclass(frozen=True)
class _Entry:
    """One ``storage_data`` entry of ``.metadata``: where an item's bytes are."""

    fqn: str
    rel: str
    offset: int
    length: int
    transformed: bool


def _walk(md: Any) -> tuple[dict[str, int], list[_Entry], dict[str, Any]]:
    """Read what the scan needs from unpickled ``.metadata``, checking its shape.

    The restricted unpickler only builds allowed classes, but their fields can hold
    anything: every value used later is type-checked here.

    Returns:
        ``({fqn: chunks needed}, storage entries, planner_data)``.

    Raises:
        AttributeError, TypeError, ValueError, KeyError: an unexpected structure.
    """
    sd_meta: dict[str, int] = {}
    for fqn, m in dict(md.state_dict_metadata or {}).items():
        if not isinstance(fqn, str):
            raise TypeError(f"state_dict_metadata key {fqn!r} is not a string")
        chunks = getattr(m, "chunks", None)
        sd_meta[fqn] = (len(chunks) if chunks is not None else 0) or 1
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


def _item(s: Scan, rel: str, fqn: str, info: _Entry, comp: str) -> Any:
    try:
        with open(s.path(rel), "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
    except OSError as e:
        s.add("CK-F108", f"item {fqn} cannot be read: {e}", path=rel, component=comp)
        return None
    if blob[:4] == b"PK\x03\x04":
        zf, why = _load._open_zip(io.BytesIO(blob))
        if zf is None:
            s.add("CK-F102", f"item {fqn} is damaged ({why})", path=rel, component=comp)
            return None
        try:
            with zf:
                bad = zf.testzip()
        except _load.ZIP_READ_ERRORS as e:
            s.add("CK-F102", f"item {fqn} is damaged ({e})", path=rel, component=comp)
            return None
        if bad is not None:
            s.add(
                "CK-F101", f"item {fqn}: member {bad!r} fails its CRC-32", path=rel, component=comp
            )
            return None
    try:
        with torch.serialization.safe_globals(_load.SAFE_GLOBALS):
            return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:  # not a torch.save blob (another serialisation): skip
        s.add(
            "CK-F108", f"item {fqn} cannot be read: {_load._errname(e)}", path=rel, component=comp
        )
        return None


def _top(fqn: str, planner: dict[str, Any]) -> str:
    path = planner.get(fqn)
    if isinstance(path, tuple | list) and path:
        return str(path[0])
    return fqn.split(".", 1)[0]


def _component_of(fqn: str, planner: dict[str, Any]) -> str:
    comps, _ = classify([_top(fqn, planner)])
    return next(iter(comps), "checkpoint")
