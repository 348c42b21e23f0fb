"""The catalogue of hostile checkpoints: every way the suite damages or forges the newest
checkpoint of a native run, in one place, so one audit (tests/verify/
test_verdict_audit.py) can ask verify, ls, prune and restore about each and check that
they agree.

A damage is ``damage(step_dir, run_dir)``: it edits the newest checkpoint of a run saved
by :func:`make_run` (steps 10 and 20, model + AdamW + LR scheduler) and returns the FIFOs
it made (a reader blocked on one is woken through it when a deadline passes). Damages that
rewrite the manifest recompute its digest, as an attacker who knows the format would: only
the checks behind the digest stand in the way.

Add a case here, not in a test module, when a test builds a new kind of hostile checkpoint:
the audit then holds every reader to the same verdict on it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import ckptkit
from ckptkit.format import manifest as mf
from ckptkit.storage import digest

STEPS = (10, 20)
"""The steps of a run made by :func:`make_run`; damages edit the last one."""

Damage = Callable[[Path, Path], list[Path]]


@dataclass(frozen=True)
class Case:
    damage: Damage
    storage: str = "tensors"
    """The run's storage (``tensors`` or ``dcp``)."""
    restorable: bool = False
    """True when the damaged checkpoint is still restorable (the damage is harmless)."""
    restorable_without_key: bool = False
    """True for a tamper only a key can tell (digests recomputed, a signature stripped):
    restorable when the run has no key; under :data:`KEY` nothing here is."""

    def good(self, key: bytes | None) -> bool:
        """Whether the damaged checkpoint is restorable for a reader with ``key``: under a
        key, no case is (every one edits what the signature covers, or the bytes)."""
        if key is not None:
            return False
        return self.restorable or self.restorable_without_key


class Payload:
    """A pickle that would create ``marker`` when unpickled without restriction."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


MARKER = "PWNED"
"""A file no case may ever create: its existence means pickled code ran."""

KEY = b"hostile-catalogue-hmac-key-0123456789"
"""The key of a signed run (:func:`make_run` with ``key=KEY``): the audit runs every case
with it as well as without."""


def train_state(seed: int = 0, storage: str = "tensors") -> ckptkit.TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    sched.step()
    return ckptkit.TrainState(
        model=model, optimizer=opt, scheduler=sched, step=0, storage=storage  # type: ignore[arg-type]
    )


def make_run(run: Path, storage: str = "tensors", key: bytes | None = None) -> Path:
    """A run with the checkpoints of :data:`STEPS`, each verified at save (signed with
    ``key`` when given)."""
    ts = train_state(storage=storage)
    with ckptkit.CheckpointManager(run, keep_last=5, key=key) as mgr:
        for s in STEPS:
            ts.step = s
            mgr.save(ts)
    return run


# --- manifest edits ------------------------------------------------------------------------


def _manifest(d: Path) -> dict[str, Any]:
    return json.loads((d / "manifest.json").read_text())  # type: ignore[no-any-return]


def rewrite(d: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as ``d``'s manifest with its digest recomputed."""
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))


def relist(d: Path, obj: dict[str, Any], rel: str) -> None:
    """Make ``obj``'s entry for file ``rel`` match its bytes (an attacker can hash too)."""
    hexd, size = digest.hash_file(d / rel)
    for f in obj["files"]:
        if f["path"] == rel:
            f["xxh3_128"], f["size"] = hexd, size


def tree_value(value: Any, key: str = "x") -> Damage:
    def damage(d: Path, run: Path) -> list[Path]:
        obj = _manifest(d)
        obj["tree"][key] = value
        rewrite(d, obj)
        return []

    return damage


HOSTILE_TREES: dict[str, Any] = {
    "unknown-tag": {"$t": "from-the-future"},
    "tag-not-a-string": {"$t": 5},
    "unhashable-key": {"$t": "dict", "items": [[{"a": 1}, 2]]},
    "unhashable-key-in-tuple": {"$t": "dict", "items": [[{"$t": "tuple", "items": [{"a": 1}]}, 2]]},
    "tensor-as-dict-key": {"$t": "dict", "items": [[{"$t": "tensor", "key": "model/w"}, 2]]},
    "bad-base64": {"$t": "bytes", "b64": "abc"},
    "base64-not-str": {"$t": "bytes", "b64": 12},
    "non-string-tensor-key": {"$t": "tensor", "key": 5},
    "list-tensor-key": {"$t": "tensor", "key": ["model/w"]},
    "unlisted-tensor": {"$t": "tensor", "key": "model/zzz"},
    "requires-grad-not-bool": {"$t": "tensor", "key": "model/w", "requires_grad": "yes"},
    "tensor-and-ndarray": {"$t": "ndarray", "key": "model/w"},
    "bf16-ndarray": {"$t": "ndarray", "key": "model/b"},
    "huge-numpy-dtype": {"$t": "npscalar", "dtype": "V99999999999999999999", "v": 1},
    "subarray-numpy-dtype": {"$t": "npscalar", "dtype": "(100000,100000)f8", "v": 1},
    "npscalar-out-of-range": {"$t": "npscalar", "dtype": "i1", "v": 1000},
    "npscalar-list-value": {"$t": "npscalar", "dtype": "f8", "v": [1, 2]},
    "npscalar-overflow": {"$t": "npscalar", "dtype": "f8", "v": 10**400},
    "npscalar-negative-overflow": {"$t": "npscalar", "dtype": "f8", "v": -(10**400)},
    "npscalar-f2-past-range": {"$t": "npscalar", "dtype": "f2", "v": 1e300},
    "npscalar-int-for-float": {"$t": "npscalar", "dtype": "f8", "v": 1},
    "null-tag": {"$t": None},
    "float-list": {"$t": "float", "v": []},
    "float-huge-int": {"$t": "float", "v": 10**400},
    "device-unparsable": {"$t": "device", "v": "cuda:x:y"},
    "device-not-str": {"$t": "device", "v": 3},
    "dtype-unknown": {"$t": "dtype", "v": "_dynamo"},
    "size-negative": {"$t": "size", "items": [-1]},
    "size-huge": {"$t": "size", "items": [2**70]},
    "float-not-nonfinite": {"$t": "float", "v": "1e5"},
    "tuple-items-not-list": {"$t": "tuple", "items": {"a": 1}},
    "tuple-extra-field": {"$t": "tuple", "items": [], "x": 1},
    "dict-item-not-pair": {"$t": "dict", "items": [[1, 2, 3]]},
    "missing-field": {"$t": "tuple"},
}
"""Malformed tagged values of the manifest's tree (format/tree.py's encoding): each is
``CK-M009`` for verify, load and inspect alike (tests/verify/test_hostile_manifest.py)."""


def _scheduler_value(field: str, value: Any) -> Damage:
    """Set a field of the saved LR scheduler state (the resume guard and the scheduler read it)."""

    def damage(d: Path, run: Path) -> list[Path]:
        obj = _manifest(d)
        sched = obj["tree"]["scheduler"]
        state = sched.get("state_dict", sched)
        state[field] = value
        rewrite(d, obj)
        return []

    return damage


def _state_value(place: tuple[str | int, ...], value: Any) -> Damage:
    """Set one value inside a saved state component (``("optimizer", "param_shapes", 0)``)."""

    def damage(d: Path, run: Path) -> list[Path]:
        obj = _manifest(d)
        parent = obj["tree"]
        for key in place[:-1]:
            parent = parent[key]
        parent[place[-1]] = value
        rewrite(d, obj)
        return []

    return damage


def _zeroed_torch_rng(d: Path, run: Path) -> list[Path]:
    """torch's CPU RNG state zeroed in its shard (no mt19937 state is all zeros: torch
    refuses it), shard and manifest re-hashed: only the bytes say it is unusable."""
    obj = _manifest(d)
    entry = next(t for t in obj["tensors"] if t["key"].endswith("/torch_cpu"))
    shard = d / entry["file"]
    data = bytearray(shard.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    begin, end = entry["offsets"]
    data[start + begin : start + end] = bytes(end - begin)
    shard.write_bytes(bytes(data))
    relist(d, obj, entry["file"])
    rewrite(d, obj)
    return []


def _manifest_text(edit: Callable[[str], str]) -> Damage:
    def damage(d: Path, run: Path) -> list[Path]:
        p = d / "manifest.json"
        p.write_text(edit(p.read_text()))
        return []

    return damage


def _manifest_step(step: int) -> Damage:
    """The manifest of the newest directory claims another step (a mislabelled copy)."""

    def damage(d: Path, run: Path) -> list[Path]:
        obj = _manifest(d)
        obj["step"] = step
        rewrite(d, obj)
        return []

    return damage


def _copy_of_older(d: Path, run: Path) -> list[Path]:
    """``cp -r step-10 step-20``: a whole, valid checkpoint under the wrong step's name."""
    shutil.rmtree(d)
    shutil.copytree(run / ckptkit_step_dir(STEPS[0]), d)
    return []


def ckptkit_step_dir(step: int) -> str:
    from ckptkit.checkpoint.catalog import step_dir_name

    return step_dir_name(step)


# --- file edits ----------------------------------------------------------------------------


def _first_file(d: Path) -> Path:
    return d / _manifest(d)["files"][0]["path"]


def _file_kind(kind: str) -> Damage:
    def damage(d: Path, run: Path) -> list[Path]:
        p = _first_file(d)
        data = p.read_bytes()
        p.unlink()
        if kind == "missing":
            return []
        if kind == "truncated":
            p.write_bytes(data[: len(data) // 2])
        elif kind == "flipped-byte":
            b = bytearray(data)
            b[-1] ^= 0x01
            p.write_bytes(bytes(b))
        elif kind == "garbage":
            p.write_bytes(b"\x00garbage" * 7)
        elif kind == "directory":
            p.mkdir()
        elif kind == "fifo":
            os.mkfifo(p)
            return [p]
        elif kind == "symlink-outside":
            outside = run.parent / "outside.bin"
            outside.write_bytes(data)
            os.symlink(outside, p)
        return []

    return damage


# --- DCP storage ---------------------------------------------------------------------------


def forge_dcp(d: Path, marker: Path, *, list_metadata: bool) -> None:
    """Turn tensors-storage checkpoint ``d`` into one that claims DCP storage, its
    ``.metadata`` a pickle that would create ``marker`` (listed in the manifest with a
    matching digest, or not listed at all)."""
    (d / "dcp").mkdir()
    meta = d / "dcp" / ".metadata"
    meta.write_bytes(pickle.dumps(Payload(marker)))
    obj = _manifest(d)
    obj["tree"].pop("model", None)
    obj["tree"].pop("optimizer", None)
    obj["tree"]["dcp"] = {"dir": "dcp", "keys": ["model", "optimizer"]}
    obj["components"]["model"]["where"] = ["dcp/.metadata"]
    obj["components"]["optimizer"]["where"] = ["dcp/.metadata"]
    if list_metadata:  # the attacker can compute xxh3 too: the digest matches
        hexd, size = digest.hash_file(meta)
        obj["files"].append(
            {"path": "dcp/.metadata", "size": size, "xxh3_128": hexd, "component": "dcp"}
        )
    gone = {f["path"] for f in obj["files"] if f["path"].startswith(("model", "optimizer"))}
    obj["files"] = [f for f in obj["files"] if f["path"] not in gone]
    obj["tensors"] = [t for t in obj["tensors"] if t["file"] not in gone]
    for rel in gone:
        (d / rel).unlink()
    rewrite(d, obj)


def _forged_dcp(list_metadata: bool) -> Damage:
    def damage(d: Path, run: Path) -> list[Path]:
        forge_dcp(d, run.parent / MARKER, list_metadata=list_metadata)
        return []

    return damage


def _dcp_metadata(edit: Callable[[Any, Path], None]) -> Damage:
    """Edit the DCP ``.metadata`` of a DCP-storage checkpoint (this is our own file, read
    here with DCP's reader), re-list it in the manifest and recompute the digest."""

    def damage(d: Path, run: Path) -> list[Path]:
        import torch.distributed.checkpoint as dcp_api

        md = dcp_api.FileSystemReader(str(d / "dcp")).read_metadata()
        edit(md, run)
        (d / "dcp" / ".metadata").write_bytes(pickle.dumps(md))
        obj = _manifest(d)
        relist(d, obj, "dcp/.metadata")
        rewrite(d, obj)
        return []

    return damage


def _storage_items(md: Any, byte_io: bool) -> list[Any]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    return [
        idx for idx in md.storage_data
        if isinstance(md.state_dict_metadata[idx.fqn], BytesStorageMetadata) == byte_io
    ]


def _offset_past_shard(md: Any, run: Path) -> None:
    idx = _storage_items(md, byte_io=False)[0]
    info = md.storage_data[idx]
    md.storage_data[idx] = dataclass_replace(info, offset=info.offset + 10**9)


def _unlisted_relative_path(md: Any, run: Path) -> None:
    idx = _storage_items(md, byte_io=False)[0]
    md.storage_data[idx] = dataclass_replace(md.storage_data[idx], relative_path="elsewhere.distcp")


def dataclass_replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def _byte_io_global(d: Path, run: Path) -> list[Path]:
    """A BYTE_IO item of the shard replaced by a pickle naming a global; shard and
    manifest re-hashed (test_trust's forged item, as a catalogue case)."""
    import torch.distributed.checkpoint as dcp_api

    md = dcp_api.FileSystemReader(str(d / "dcp")).read_metadata()
    idx = _storage_items(md, byte_io=True)[0]
    info = md.storage_data[idx]
    shard = d / "dcp" / info.relative_path
    data = bytearray(shard.read_bytes())
    evil = pickle.dumps(Payload(run.parent / MARKER), protocol=2)
    assert len(evil) <= info.length, "payload must fit the item's slot"
    data[info.offset : info.offset + len(evil)] = evil
    shard.write_bytes(bytes(data))
    obj = _manifest(d)
    relist(d, obj, f"dcp/{info.relative_path}")
    rewrite(d, obj)
    return []


# --- what only a key tells ------------------------------------------------------------------
# An attacker who can write the run directory can hash too: each of these leaves digests
# that match, so only a signature stands in the way (issue 39).


def _keyless_writer(d: Path, run: Path) -> list[Path]:
    """The newest step as a writer without the key saved it (other weights): saved in a
    run beside this one and moved in (a key-less writer is refused in a signed run)."""
    side = run.parent / "keyless-side"
    ts = train_state(seed=9, storage="dcp" if (d / "dcp").exists() else "tensors")
    ts.step = STEPS[-1]
    with ckptkit.CheckpointManager(side, keep_last=5) as mgr:
        mgr.save(ts)
    shutil.rmtree(d)
    shutil.move(str(side / d.name), str(d))
    shutil.rmtree(side)
    return []


def _weights_replaced(d: Path, run: Path) -> list[Path]:
    """A model tensor's bytes replaced, its file re-hashed and the manifest's digest
    recomputed; the old signature (if any) kept."""
    obj = _manifest(d)
    entry = next(t for t in obj["tensors"] if t["key"].startswith("model/"))
    shard = d / entry["file"]
    data = bytearray(shard.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    begin, end = entry["offsets"]
    data[start + begin : start + end] = torch.full(
        ((end - begin) // 4,), 9.0, dtype=torch.float32
    ).numpy().tobytes()
    shard.write_bytes(bytes(data))
    relist(d, obj, entry["file"])
    rewrite(d, obj)
    return []


def _signature_stripped(d: Path, run: Path) -> list[Path]:
    obj = _manifest(d)
    obj.pop("signature", None)
    rewrite(d, obj)
    return []


def _replicas_deleted(d: Path, run: Path) -> list[Path]:
    """A replica-divergent newest step (signed with :data:`KEY` in a signed run), whose
    ``replicas`` record someone without the key deleted (the divergence guard bypassed)."""
    obj = _manifest(d)
    signed = obj.pop("signature", None) is not None
    obj["replicas"] = {
        "ranks": 2, "groups": 1, "tensors": 2, "policy": "warn",
        "divergent": [{"key": "model/w", "copies": {"aa": [0], "bb": [1]}, "minority": None}],
    }
    rewrite(d, obj)
    if signed:
        again = mf.Manifest.from_json((d / "manifest.json").read_text()).signed(KEY)
        (d / "manifest.json").write_text(again.to_json())
    obj = _manifest(d)
    del obj["replicas"]
    rewrite(d, obj)
    return []


# --- the catalogue -------------------------------------------------------------------------

CASES: dict[str, Case] = {
    **{f"tree:{name}": Case(tree_value(v)) for name, v in HOSTILE_TREES.items()},
    "tree:deep-nesting": Case(tree_value(json.loads("[" * 900 + "]" * 900))),
    "manifest:truncated": Case(_manifest_text(lambda t: t[: len(t) // 2])),
    "manifest:nan": Case(_manifest_text(lambda t: t.replace('"step": 20', '"step": NaN', 1))),
    "manifest:duplicate-key": Case(
        _manifest_text(lambda t: t.replace('"step": 20,', '"step": 20, "step": 21,', 1))
    ),
    "manifest:step-differs-from-directory": Case(_manifest_step(30)),
    "manifest:copy-of-an-older-step": Case(_copy_of_older),
    "scheduler:last-epoch-not-int": Case(_scheduler_value("last_epoch", "three")),
    "scheduler:last-epoch-list": Case(_scheduler_value("last_epoch", [1, 2])),
    "scheduler:base-lrs-string": Case(_scheduler_value("base_lrs", "x")),
    "scheduler:type-differs-from-summary": Case(_state_value(("scheduler", "type"), "CyclicLR")),
    "optimizer:param-groups-not-a-list": Case(
        _state_value(("optimizer", "state_dict", "param_groups"), "x")
    ),
    "optimizer:params-renumbered": Case(
        _state_value(("optimizer", "state_dict", "param_groups", 0, "params"), [3, 2, 1, 0])
    ),
    "optimizer:param-shape-string": Case(_state_value(("optimizer", "param_shapes", 0, 0), "x")),
    "optimizer:step-string": Case(
        _state_value(("optimizer", "state_dict", "state", "items", 0, 1, "step"), "x")
    ),
    "rng:python-state-huge-int": Case(
        _state_value(("rng", "rank00000", "python", "state", 0), 10**400)
    ),
    "rng:numpy-bit-generator-unknown": Case(
        _state_value(("rng", "rank00000", "numpy", "bit_generator"), "x")
    ),
    "rng:state-of-another-rank": Case(_state_value(("rng", "rank00000", "rank"), 3)),
    "rng:torch-state-zeroed": Case(_zeroed_torch_rng),
    "progress:step-list": Case(_state_value(("progress", "step"), [])),
    "progress:micro-step-past-window": Case(_state_value(("progress", "micro_step"), 5)),
    **{f"file:{k}": Case(_file_kind(k)) for k in (
        "missing", "truncated", "flipped-byte", "garbage", "directory", "fifo", "symlink-outside"
    )},
    "dcp:forged-unlisted-metadata": Case(_forged_dcp(list_metadata=False)),
    "dcp:forged-listed-metadata": Case(_forged_dcp(list_metadata=True)),
    "dcp:offset-past-shard": Case(_dcp_metadata(_offset_past_shard), storage="dcp"),
    "dcp:unlisted-relative-path": Case(_dcp_metadata(_unlisted_relative_path), storage="dcp"),
    "dcp:byte-io-needs-a-global": Case(_byte_io_global, storage="dcp"),
    "key:keyless-writer": Case(_keyless_writer, restorable_without_key=True),
    "key:keyless-writer-dcp": Case(_keyless_writer, storage="dcp", restorable_without_key=True),
    "key:weights-replaced-digests-recomputed": Case(_weights_replaced, restorable_without_key=True),
    "key:signature-stripped": Case(_signature_stripped, restorable_without_key=True),
    "key:replicas-record-deleted": Case(_replicas_deleted, restorable_without_key=True),
}
"""Every hostile newest checkpoint of the suite (see the module docstring)."""
