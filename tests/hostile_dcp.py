"""The catalogue of hostile ``ckptkit.dcp`` directories: every way the suite damages or
forges a directory written by :func:`ckptkit.dcp.save`, in one place, so one test
(tests/checkpoint/test_dcp_agreement.py) can ask ``ckptkit verify``, ``ckptkit.dcp.check``
and ``ckptkit.dcp.load`` about each and check that they agree, with the same code.

A damage is ``damage(directory)``. Damages that rewrite ``.metadata`` or a shard commit a
new manifest with the new digests, as an attacker who can write the directory would (the
manifest is unsigned): only the checks behind the digests stand in the way. (The native
run's catalogue, of checkpoints a ``CheckpointManager`` wrote, is tests/hostile.py.)
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import ckptkit.checkpoint.dcp
from ckptkit import codes
from ckptkit.storage import dcp_meta, digest

MARKER = "PWNED"
"""A file no case may ever create beside the directory: its existence means pickled code ran."""


def train_state(seed: int = 0) -> dict[str, Any]:
    """A tiny model and AdamW after one step, plus a plain value (DCP's BYTE_IO item)."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 5)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": 7 + seed}


def fresh() -> dict[str, Any]:
    """A state of the same shapes to load into (other values)."""
    sd = train_state(seed=5)
    sd["step"] = -1
    return sd


@dataclass(frozen=True)
class Case:
    damage: Callable[[Path], None]
    code: str
    """The finding code every reader must report (verify) or raise (check, load)."""


class Payload:
    """A pickle that would create :data:`MARKER` beside the directory when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


# --- tools ------------------------------------------------------------------------------------


def manifest_obj(d: Path) -> dict[str, Any]:
    return json.loads((d / ckptkit.dcp.MANIFEST_NAME).read_text())  # type: ignore[no-any-return]


def write_manifest(d: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as the directory's (unsigned) manifest, its digest recomputed."""
    from ckptkit.format import manifest as mf

    obj["manifest_digest"] = mf.content_digest(obj)
    (d / ckptkit.dcp.MANIFEST_NAME).write_text(json.dumps(obj))


def recommit(d: Path) -> None:
    """Commit a manifest listing every file of ``d`` with its digest now."""
    files = {
        p.name: digest.hash_file(p)
        for p in d.iterdir()
        if p.name != ckptkit.dcp.MANIFEST_NAME and p.is_file()
    }
    ckptkit.dcp.commit(d, files, step=7)


def metadata(d: Path) -> Any:
    return dcp_meta.loads_metadata((d / dcp_meta.METADATA).read_bytes())


def write_metadata(d: Path, md: Any) -> None:
    (d / dcp_meta.METADATA).write_bytes(pickle.dumps(md))
    recommit(d)


def _entry(md: Any, fqn: str) -> tuple[Any, Any]:
    return next((i, s) for i, s in md.storage_data.items() if i.fqn == fqn)


# --- manifest edits ---------------------------------------------------------------------------


def _no_manifest(d: Path) -> None:
    """The save died after DCP wrote ``.metadata``, before the manifest (the commit)."""
    (d / ckptkit.dcp.MANIFEST_NAME).unlink()


def _unlisted(name: str) -> Callable[[Path], None]:
    """The manifest's entry for ``name`` removed (the file itself left in place)."""

    def damage(d: Path) -> None:
        obj = manifest_obj(d)
        rec = obj["user"]["adopted"]
        rec["files"] = [f for f in rec["files"] if f["path"] != name]
        write_manifest(d, obj)

    return damage


def _duplicate_entry(d: Path) -> None:
    """The shard listed twice: the second entry (a wrong digest) would win a dict build."""
    obj = manifest_obj(d)
    files = obj["user"]["adopted"]["files"]
    dup = dict(next(f for f in files if f["path"].endswith(".distcp")))
    dup["xxh3_128"] = "0" * 32
    files.append(dup)
    write_manifest(d, obj)


def _control_in_path(ch: str) -> Callable[[Path], None]:
    """A listed path with a NUL or other control character in it."""

    def damage(d: Path) -> None:
        obj = manifest_obj(d)
        files = obj["user"]["adopted"]["files"]
        files.append(dict(files[0], path=f"__0_0{ch}.distcp"))
        write_manifest(d, obj)

    return damage


# --- .metadata forgeries ------------------------------------------------------------------------


def _chunk_past_its_tensor(d: Path) -> None:
    """A chunk of ``model.weight`` declared larger than the tensor it is part of."""
    md = metadata(d)
    m = md.state_dict_metadata["model.weight"]
    c = m.chunks[0]
    m.chunks[0] = replace(c, sizes=torch.Size([s * 40 for s in c.sizes]))
    write_metadata(d, md)


def _tensor_larger_than_its_bytes(d: Path) -> None:
    """``model.weight`` (and its one chunk) declared with more elements than its stored
    bytes can hold."""
    md = metadata(d)
    m = md.state_dict_metadata["model.weight"]
    big = torch.Size([s * 40 for s in m.size])
    m.size = big
    m.chunks[0] = replace(m.chunks[0], sizes=big)
    write_metadata(d, md)


def _items_swap_storage(d: Path) -> None:
    """``model.weight`` and ``model.bias`` point at each other's bytes."""
    md = metadata(d)
    (wi, ws), (bi, bs) = _entry(md, "model.weight"), _entry(md, "model.bias")
    md.storage_data[wi], md.storage_data[bi] = bs, ws
    write_metadata(d, md)


def _tensor_item_runs_code(d: Path) -> None:
    """``model.weight``'s bytes replaced by a ``torch.save`` blob whose pickle names
    ``os.system`` (appended to the shard, the entry pointed at it)."""
    md = metadata(d)
    idx, info = _entry(md, "model.weight")
    shard = d / info.relative_path
    buf = io.BytesIO()
    torch.save(Payload(d.parent / MARKER), buf)
    blob = buf.getvalue()
    start = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(blob)
    md.storage_data[idx] = replace(info, offset=start, length=len(blob))
    write_metadata(d, md)


def _million_chunks(d: Path) -> None:
    """``model.weight`` declared with a million chunks, each a reference to the same
    object (a pickle memo hit: ~2 bytes a chunk)."""
    md = metadata(d)
    m = md.state_dict_metadata["model.weight"]
    m.chunks = [m.chunks[0]] * 1_000_000
    write_metadata(d, md)


CASES: dict[str, Case] = {
    "manifest:none (save cut after .metadata)": Case(_no_manifest, codes.M001),
    "manifest:shard-unlisted": Case(_unlisted("__0_0.distcp"), codes.F021),
    "manifest:metadata-unlisted": Case(_unlisted(".metadata"), codes.F021),
    "manifest:duplicate-entry": Case(_duplicate_entry, codes.M003),
    "manifest:nul-in-path": Case(_control_in_path("\x00"), codes.M005),
    "manifest:newline-in-path": Case(_control_in_path("\n"), codes.M005),
    "metadata:chunk-past-its-tensor": Case(_chunk_past_its_tensor, codes.F026),
    "metadata:tensor-larger-than-its-bytes": Case(_tensor_larger_than_its_bytes, codes.F026),
    "metadata:items-swap-storage": Case(_items_swap_storage, codes.F026),
    "metadata:tensor-item-runs-code": Case(_tensor_item_runs_code, codes.F023),
    "metadata:million-chunks": Case(_million_chunks, codes.F027),
}
