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
import zipfile
from collections import defaultdict
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
    sd_meta: dict[str, Any] = dict(getattr(md, "state_dict_metadata", {}) or {})
    storage: dict[Any, Any] = dict(getattr(md, "storage_data", {}) or {})
    planner: dict[str, Any] = dict(getattr(md, "planner_data", {}) or {})

    # Every item covered by a storage entry.
    covered: dict[str, int] = defaultdict(int)
    for idx in storage:
        covered[getattr(idx, "fqn", str(idx))] += 1
    uncovered = []
    for fqn, m in sd_meta.items():
        need = len(getattr(m, "chunks", ())) or 1
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
    by_file: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for idx, info in storage.items():
        by_file[str(info.relative_path)].append((getattr(idx, "fqn", str(idx)), info))
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
        end = max(int(i.offset) + int(i.length) for _, i in items)
        if size < end:
            bad_files.add(rel)
            short = sorted({f for f, i in items if int(i.offset) + int(i.length) > size})
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
        files = sorted(
            {
                str(i.relative_path)
                for idx, i in storage.items()
                if getattr(idx, "fqn", None) in set(fqns)
            }
        )
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
            if info.transform_descriptors or not (comp in ("model", "optimizer") or want_step):
                continue
            obj = _item(s, rel, fqn, info, comp)
            if isinstance(obj, torch.Tensor):
                s.nonfinite(comp, [(fqn, obj)], path=rel)
            elif want_step:
                s.step = as_int(obj)


def _item(s: Scan, rel: str, fqn: str, info: Any, comp: str) -> Any:
    with open(s.path(rel), "rb") as f:
        f.seek(int(info.offset))
        blob = f.read(int(info.length))
    if blob[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(blob)) as zf:
                bad = zf.testzip()
        except zipfile.BadZipFile as e:
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
        s.add("CK-F108", f"item {fqn} cannot be read: {type(e).__name__}", path=rel, component=comp)
        return None


def _top(fqn: str, planner: dict[str, Any]) -> str:
    path = planner.get(fqn)
    if isinstance(path, tuple | list) and path:
        return str(path[0])
    return fqn.split(".", 1)[0]


def _component_of(fqn: str, planner: dict[str, Any]) -> str:
    comps, _ = classify([_top(fqn, planner)])
    return next(iter(comps), "checkpoint")
