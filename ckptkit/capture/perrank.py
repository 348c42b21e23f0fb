"""Per-rank model state of a multi-rank save: what every rank must hold alike, and the
buffers each rank keeps for itself.

A multi-rank save with safetensors storage writes the model and optimizer once, their
shards split over the ranks (:data:`ckptkit.checkpoint.commit.SPREAD`). That is right for what data
parallelism keeps in step on every rank (parameters, through the gradients, and the
optimizer state), and wrong for two things:

* **Buffers that differ by design.** DDP does not keep buffers in step: each rank's
  forward updates BatchNorm's running statistics from its own batch. With
  ``broadcast_buffers=False`` they stay apart; with the default (True) rank 0's are
  broadcast at the start of every forward, and that forward moves each rank's away again.
  Written once, every rank would come back with the statistics of whichever rank wrote
  the model's file.
* **A layout that differs.** A parameter (or buffer, or optimizer tensor) that some ranks
  hold and others do not cannot be written once for all of them.

So before writing, the ranks compare (:func:`plan`: one fixed-size gather of 33 bytes per
rank to rank 0, one small broadcast back; what a rank exchanges does not grow with the
world size):

* their layouts differ: every rank refuses the save with ``CK-S022``, naming the tensors,
  the ranks holding them, and the fix; nothing is written;
* their buffers differ: each rank writes its buffers into its own file
  (``buffers-rankNNNNN.safetensors``) listed in its own manifest
  (:attr:`ckptkit.format.ranks.RankManifest.buffers`, tree ``buffers/rankNNNNN``), and the
  model's shards hold the parameters only (:func:`own_buffers`);
* their buffers agree (or the model has none): they are written once, with the model.

On restore, rank ``r`` takes the buffers of :func:`source`: its own when the checkpoint
holds them (always, at the saved world size: a bitwise resume), else rank 0's. It is the
rule the per-rank RNG states follow, and at another world size it is the sound one: the
data split changed, so no saved rank's statistics belong to a new rank; with DDP's default
``broadcast_buffers=True`` the first forward gives every rank rank 0's anyway; with False
each rank's statistics are its own running estimate, and a rank that existed keeps its
own while a new one starts from rank 0's. ``docs/distributed.md`` documents it and the
restore says it in its notes.

DCP storage (sharded models) is out of this module's scope: DCP writes a plain-tensor
buffer once, as torchtitan does.

Example:
    >>> import torch
    >>> from ckptkit.collective import Solo
    >>> plan(Solo(), {"model/w": torch.ones(2)}, {}).own_buffers  # one rank: nothing differs
    False
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from ckptkit import codes
from ckptkit.collective import Collective, describe, gather_fixed
from ckptkit.format import manifest as mf
from ckptkit.format import tree as tree_mod
from ckptkit.format.ranks import RANK_BUFFERS, rank_key, rank_of

RECORD = struct.Struct("<B16s16s")
"""What each rank sends: ok flag, digest of its layout, digest of its buffers' bytes."""
MAX_NAMED = 5
"""Tensors a layout refusal names (the rest are counted)."""


@dataclass(frozen=True)
class Plan:
    """What the ranks of a save agreed on (the same on every rank)."""

    own_buffers: bool = False
    """The ranks' buffers differ: each rank writes its own (:func:`own_buffers`)."""
    refused: str | None = None
    """Why the save is refused (``CK-S022``): the ranks' layouts differ."""


def plan(
    coll: Collective,
    spread: Mapping[str, torch.Tensor],
    buffers: Mapping[str, torch.Tensor],
) -> Plan:
    """Compare this rank's layout and buffers with the other ranks' (collective).

    Every rank must call it at the same point; a rank that fails to hash still takes part
    (the save is then refused on every rank, naming it).

    Args:
        coll: the ranks of the save.
        spread: this rank's tensors the save writes once for every rank, by manifest key
            (``model/a.weight``, ``optimizer/state/0/exp_avg``).
        buffers: this rank's model buffers, by manifest key (:func:`buffers_of`).

    Returns:
        The same plan on every rank; an empty one for a world of one.

    Raises:
        StateError: ``CK-S022`` the ranks hold different layouts (on every rank).
        DistributedError: a collective failed (a peer died).
    """
    if coll.world_size == 1:
        return Plan()
    table: dict[str, str] = {}
    try:
        table = {k: _shape(t) for k, t in spread.items()}
        record = RECORD.pack(1, _digest(sorted(table.items())), _buffers_digest(buffers))
    except Exception as e:
        record, table = RECORD.pack(0, b"\0" * 16, b"\0" * 16), {"": describe(e)}
    rows = gather_fixed(coll, record)
    layouts: dict[bytes, list[int]] = {}
    decided: Plan | None = None
    if rows is not None:
        unpacked = [RECORD.unpack(r) for r in rows]
        for r, (ok, layout, _) in enumerate(unpacked):
            layouts.setdefault(layout if ok else b"failed%d" % r, []).append(r)
        if len(layouts) == 1:
            decided = Plan(own_buffers=len({b for _, _, b in unpacked}) > 1)
    decided = coll.broadcast(decided)
    if decided is None:  # layouts differ: one table per distinct layout names the tensors
        senders = coll.broadcast(sorted(ranks[0] for ranks in layouts.values()))
        tables = coll.gather(table if coll.rank in senders else None)
        decided = coll.broadcast(
            Plan(refused=_differences(layouts, tables)) if tables is not None else None
        )
    if decided.refused is not None:
        raise codes.error(codes.S022, decided.refused)
    return decided


def buffers_of(encoded: tree_mod.Encoded, names: Collection[str]) -> dict[str, torch.Tensor]:
    """The model buffers (state-dict names ``names``) of an encoded TrainState tree, by
    manifest key; empty when the tree holds no model (DCP storage).

    Example:
        >>> import torch
        >>> enc = tree_mod.encode({"model": {"w": torch.ones(1), "bn.running_mean": torch.zeros(1)}})
        >>> list(buffers_of(enc, {"bn.running_mean"}))
        ['model/bn.running_mean']
    """
    refs = _model_refs(encoded.tree)
    return {refs[n]: encoded.tensors[refs[n]] for n in names if n in refs}


def own_buffers(encoded: tree_mod.Encoded, names: Collection[str], rank: int) -> tree_mod.Encoded:
    """``encoded`` with the model's buffers (``names``) moved out of ``model`` into this
    rank's own state, ``buffers/rankNNNNN`` (tensor keys ``buffers/rankNNNNN/<name>``).

    Example:
        >>> import torch
        >>> enc = tree_mod.encode({"model": {"w": torch.ones(1), "bn.running_mean": torch.zeros(1)}})
        >>> mine = own_buffers(enc, {"bn.running_mean"}, 1)
        >>> list(mine.tree["model"]), list(mine.tensors)
        (['w'], ['model/w', 'buffers/rank00001/bn.running_mean'])
    """
    refs = _model_refs(encoded.tree)
    model = encoded.tree["model"] if refs else {}
    mine = rank_key(rank)
    tensors = dict(encoded.tensors)
    moved: dict[str, Any] = {}
    for name in (n for n in model if n in names and n in refs):
        key = f"{RANK_BUFFERS}/{mine}/{tree_mod.key_segment(name)}"
        tensors[key] = encoded.tensors[refs[name]]
        moved[name] = {**model[name], "key": key}
    if not moved:
        return encoded
    out = {
        **encoded.tree,
        "model": {n: v for n, v in model.items() if n not in moved},
        RANK_BUFFERS: {mine: moved},
    }
    used = {k for _, k in tree_mod.iter_tensor_refs(out)}  # a buffer tied to a parameter stays
    return tree_mod.Encoded(out, {k: t for k, t in tensors.items() if k in used})


def source(keys: Collection[str], rank: int) -> str | None:
    """The saved per-rank state rank ``rank`` restores from (``keys``: the rank keys of the
    saved states): its own, else rank 0's (the base of a fresh RNG stream, the buffers
    every rank would get from DDP's first broadcast), else the first; None when there is
    none.

    Example:
        >>> source({"rank00000", "rank00001"}, 1), source({"rank00000"}, 5)
        ('rank00001', 'rank00000')
    """
    if rank_key(rank) in keys:
        return rank_key(rank)
    if rank_key(0) in keys:
        return rank_key(0)
    return min(keys, default=None)


def holders(manifest: mf.Manifest) -> frozenset[int]:
    """The ranks whose own buffers the checkpoint holds, as far as a reader of ``manifest``
    can tell: those its tree holds and those whose manifests the root records as holding
    them (:attr:`~ckptkit.format.ranks.RankRef.heads`), read or not.

    Example:
        >>> from ckptkit.format.ranks import RankRef, rank_manifest_path
        >>> ref = RankRef(1, rank_manifest_path(1), 9, "0" * 32, (), (RANK_BUFFERS,))
        >>> m = mf.Manifest(files=(), tensors=(), tree={}, components={}, env={}, ranks=(ref,))
        >>> sorted(holders(m))
        [1]
    """
    held = manifest.tree.get(RANK_BUFFERS) if isinstance(manifest.tree, Mapping) else None
    out = {r for r in map(rank_of, held if isinstance(held, Mapping) else ()) if r is not None}
    out |= {r.rank for r in manifest.ranks if RANK_BUFFERS in (r.heads or ())}
    return frozenset(out)


def problems(tree: Mapping[str, Any]) -> list[str]:
    """What in a TrainState tree's per-rank buffers could not be restored (empty: nothing).

    Example:
        >>> problems({"model": {"w": 1}, "buffers": {"rank00000": {"w": 2}}})
        ["rank00000: 'w' is also in the model state"]
    """
    held = tree.get(RANK_BUFFERS)
    if held is None:
        return []
    model = tree.get("model")
    if not isinstance(held, Mapping) or not held or not isinstance(model, Mapping):
        return ["not one mapping of buffers per rank ('rank00000': ...) beside a model state"]
    out = []
    for key, bufs in held.items():
        if rank_of(key) is None or not isinstance(bufs, Mapping):
            out.append(f"{key!r} is not a rank's key holding a mapping of buffers")
            continue
        out += [f"{key}: {n!r} is also in the model state" for n in bufs if n in model]
    return out


def restored_model(tree: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The model state a rank restores: the model's shared state and the buffers saved by
    the rank keyed ``key`` (:func:`source`).

    Example:
        >>> restored_model({"model": {"w": 1}, "buffers": {"rank00001": {"b": 2}}}, "rank00001")
        {'w': 1, 'b': 2}
    """
    return {**tree["model"], **tree[RANK_BUFFERS][key]}


def _model_refs(state_tree: Any) -> dict[str, str]:
    """State-dict name -> tensor key of the plain tensor entries of an encoded tree's model."""
    model = state_tree.get("model") if isinstance(state_tree, Mapping) else None
    if not isinstance(model, Mapping) or tree_mod.TAG in model:
        return {}
    return {
        n: ref["key"]
        for n, ref in model.items()
        if isinstance(ref, Mapping) and ref.get(tree_mod.TAG) == "tensor"
    }


def _shape(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def _digest(items: list[tuple[str, str]]) -> bytes:
    h = xxhash.xxh3_128()
    for k, v in items:
        h.update(f"{k}\0{v}\n".encode())
    return h.digest()


def _buffers_digest(buffers: Mapping[str, torch.Tensor]) -> bytes:
    """Digest of the buffers' keys and bytes (a copy to host for a device tensor)."""
    h = xxhash.xxh3_128()
    for k in sorted(buffers):
        t = buffers[k].detach()
        h.update(f"{k}\0{_shape(t)}\n".encode())
        if t.numel():
            flat = t.contiguous().reshape(-1)
            h.update(flat.cpu().view(torch.uint8).numpy().data)
    return h.digest()


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (f", … (+{len(ranks) - 8})" if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _differences(layouts: Mapping[bytes, list[int]], tables: list[Any]) -> str:
    """Rank 0: the message naming the tensors the ranks' layouts disagree on (``layouts``:
    ranks by layout digest; the first rank of each sent its table)."""
    classes = [(sorted(ranks), tables[min(ranks)]) for ranks in layouts.values()]
    failed = [(ranks, t[""]) for ranks, t in classes if "" in t]
    if failed:
        return "; ".join(f"{_ranks(r)} could not describe its state: {m}" for r, m in failed)
    every = sorted(r for ranks, _ in classes for r in ranks)
    lines = []
    keys = sorted({k for _, t in classes for k in t}, key=lambda k: (not k.startswith("model/"), k))
    for key in keys:
        shapes: dict[str, list[int]] = {}
        for ranks, t in classes:
            if key in t:
                shapes.setdefault(t[key], []).extend(ranks)
        holding = sorted(r for rs in shapes.values() for r in rs)
        if holding != every:
            missing = [r for r in every if r not in holding]
            lines.append(
                f"'{key}' ({' or '.join(shapes)}) is held by {_ranks(holding)}, not by "
                f"{_ranks(missing)}"
            )
        elif len(shapes) > 1:
            lines.append(
                f"'{key}' is " + " but ".join(f"{s} on {_ranks(sorted(r))}" for s, r in shapes.items())
            )
    shown = lines[:MAX_NAMED] + ([f"and {len(lines) - MAX_NAMED} more"] if len(lines) > MAX_NAMED else [])
    return (
        "the ranks hold different model/optimizer state, so it cannot be written once for "
        "all of them: " + "; ".join(shown)
    )


__all__ = [
    "RECORD",
    "Plan",
    "buffers_of",
    "holders",
    "own_buffers",
    "plan",
    "problems",
    "restored_model",
    "source",
]
