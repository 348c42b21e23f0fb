"""Replica agreement at save time: every rank hashes its copy of each replicated tensor, and
one small collective says whether the copies agree.

Data-parallel replicas hold the same bytes for a replicated tensor (DDP's parameters and
optimizer moments, the replicate dimension of HSDP, anything the commit writes once for
several ranks). A faulty accelerator, a memory error or a non-deterministic kernel can make
one replica differ while the loss still looks fine; the save writes one rank's copy and the
divergence goes unnoticed until days later. Hashing costs one xxh3-128 pass over what the
rank holds, and comparing costs one gather of a fixed 48-byte record per rank to rank 0 and
one small answer back (what a rank exchanges does not grow with the world size):

1. each rank hashes its replicated tensors (:func:`digests`) and sends one record: the
   digest of the *set* of tensors it holds (which ranks are replicas of which: the same
   set means the same tensors), the digest of its (key, digest) pairs, and their count
   (:func:`check`, through :func:`ckptkit.collective.gather_fixed`);
2. ranks holding the same set must send the same digest of digests: rank 0 reads the
   records and tells every rank which groups disagree (a broadcast). Only when some do,
   one rank of each distinct digest of digests in those groups sends its per-tensor table
   to rank 0 (typically two tables, whatever the world size), which names the divergent
   tensors and the ranks outside the majority copy, and tells every rank.

Every rank returns the same :class:`~ckptkit.format.records.Replicas` (rank 0's), so every rank
can act on it (raise or warn) alike. What
counts as replicated is :func:`replicated`: the commit's spread state (:data:`ckptkit.checkpoint.commit.SPREAD`)
and, for DCP state, plain tensors (DCP writes them once) and each DTensor shard keyed by
its offsets (ranks holding the same shard are replicas: HSDP's replicate dimension).

Example:
    >>> import torch
    >>> from ckptkit.collective import Solo
    >>> check(Solo(), {"model/w": torch.ones(2)}, policy="raise") is None  # one rank: no replicas
    True
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from ckptkit.collective import Collective, gather_fixed
from ckptkit.format import records

log = logging.getLogger("ckptkit")

RECORD = struct.Struct("<B16s16sQ7x")
"""What each rank sends: ok flag, digest of the key set, digest of digests, tensor count
(padded to 48 bytes)."""
_FAILED = RECORD.pack(0, b"\0" * 16, b"\0" * 16, 0)


def replicated(
    tensors: Mapping[str, torch.Tensor],
    *,
    spread: tuple[str, ...],
    dcp_state: Mapping[str, Any] | None = None,
    buffers: Collection[str] = (),
) -> dict[str, torch.Tensor]:
    """The tensors of a save that other ranks hold copies of, by a key that names the copy.

    Args:
        tensors: the save's tensors by manifest key (``model/a.weight``).
        spread: the top-level keys whose tensors every rank holds the same bytes of.
        dcp_state: the state written through DCP: a plain tensor is replicated on every
            rank (DCP writes it once), a DTensor's local shard is replicated on the ranks
            holding the same shard (key ``dcp/FQN@offsets``).
        buffers: the model's buffer names, left out: DDP keeps parameters in step through
            the gradients, not buffers (it broadcasts them from rank 0 before a forward,
            and the forward updates BatchNorm's running statistics from each rank's own
            batch), so their copies differ between healthy ranks.

    Example:
        >>> import torch
        >>> sorted(replicated({"model/w": torch.ones(1), "model/bn.running_mean": torch.ones(1),
        ...                    "rng/rank0/x": torch.ones(1)},
        ...                   spread=("model",), buffers={"bn.running_mean"}))
        ['model/w']
    """
    skip = {f"model/{b}" for b in buffers}
    out = {
        k: t for k, t in tensors.items() if k.split("/", 1)[0] in spread and k not in skip
    }
    if dcp_state is not None:
        skip = {f"dcp/{k}" for k in skip}
        for fqn, value in _flatten(dcp_state, "dcp"):
            local = _local_shard(value)
            if local is not None and fqn not in skip:
                out[fqn if local[0] is None else f"{fqn}@{local[0]}"] = local[1]
    return out


def _flatten(obj: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        return [kv for k, v in obj.items() for kv in _flatten(v, f"{prefix}/{k}")]
    if isinstance(obj, list | tuple):
        return [kv for i, v in enumerate(obj) for kv in _flatten(v, f"{prefix}/{i}")]
    return [(prefix, obj)]


def _local_shard(value: Any) -> tuple[str | None, torch.Tensor] | None:
    """``(offsets or None, local tensor)`` of a DCP value; None when it is not a tensor."""
    if not isinstance(value, torch.Tensor):
        return None
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        chunks = value.__create_chunk_list__()
        offsets = ",".join(str(int(o)) for o in chunks[0].offsets) if chunks else ""
        return offsets, value.to_local()
    return None, value


def tensor_digest(t: torch.Tensor) -> bytes:
    """xxh3-128 of a tensor's bytes with its dtype and shape (a copy to host for a device tensor).

    Example:
        >>> tensor_digest(torch.zeros(2)) == tensor_digest(torch.zeros(2)), len(tensor_digest(torch.zeros(2)))
        (True, 16)
    """
    t = t.detach()
    h = xxhash.xxh3_128()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        flat = t.contiguous().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        h.update(flat.view(torch.uint8).numpy().data)
    return h.digest()


def digests(tensors: Mapping[str, torch.Tensor]) -> dict[str, bytes]:
    """Every tensor's :func:`tensor_digest`, in key order.

    Example:
        >>> list(digests({"b": torch.ones(1), "a": torch.ones(1)}))
        ['a', 'b']
    """
    return {k: tensor_digest(tensors[k]) for k in sorted(tensors)}


def check(
    coll: Collective,
    tensors: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]],
    *,
    policy: records.ReplicaPolicy,
) -> records.Replicas | None:
    """Compare this rank's replicated tensors with the other ranks' copies (collective).

    Every rank must call it at the same point. A failure to hash on any rank is logged and
    makes the check skip on every rank (a diagnostic never costs the save), never a hang:
    the failed rank still takes part in the collectives.

    Args:
        coll: the ranks of the save.
        tensors: this rank's replicated tensors (:func:`replicated`), or a function that
            selects them: it is called inside the check, so a rank that fails to select
            its tensors still takes part in the collective (as a rank that failed to hash).
        policy: the saver's ``on_divergence``, recorded with the result.

    Returns:
        The same record on every rank; None for one process, or when the check could not
        run.

    Raises:
        DistributedError: a collective failed (a peer died).
    """
    if coll.world_size == 1:
        return None
    mine: dict[str, bytes] = {}
    try:
        held = tensors() if callable(tensors) else tensors
        mine = digests(held)
        record = RECORD.pack(1, _key_set(held), _combined(mine), len(mine))
    except Exception as e:  # a diagnostic must never cost the save
        log.error("ckptkit: rank %d could not hash its replicas (%s: %s)", coll.rank, type(e).__name__, e)
        record = _FAILED
    gathered = gather_fixed(coll, record)  # rank 0 alone receives every rank's record
    plan = coll.broadcast(_plan([RECORD.unpack(r) for r in gathered]) if gathered else None)
    if plan.failed:
        log.warning(
            "ckptkit: replica check skipped: rank(s) %s could not hash their copies",
            ", ".join(map(str, plan.failed)),
        )
        return None
    if not plan.classes:
        return records.Replicas(coll.world_size, plan.groups, plan.compared, policy)
    # Ranks with the same digest of digests hold the same per-tensor digests: one table
    # per distinct copy of the state is enough to name every tensor and every rank. Only
    # on a mismatch, and only to rank 0, which tells every rank what it found.
    senders = {members[0] for cls in plan.classes for members in cls.values()}
    tables = coll.gather({k: d.hex() for k, d in mine.items()} if coll.rank in senders else None)
    found: list[records.Divergence] = []
    if tables is not None:
        found = sorted(
            (d for cls in plan.classes for d in _divergent(cls, tables)), key=lambda d: d.key
        )
    return coll.broadcast(
        records.Replicas(
            coll.world_size,
            plan.groups,
            plan.compared,
            policy,
            divergent=tuple(found[: records.MAX_DIVERGENT]),
            more=max(0, len(found) - records.MAX_DIVERGENT),
        )
        if tables is not None
        else None
    )


@dataclass(frozen=True)
class _Plan:
    """What rank 0 read in every rank's record, told to every rank."""

    failed: list[int]
    """Ranks that could not hash their copies (the check then skips)."""
    groups: int
    """Replica groups (ranks holding the same tensors) of more than one rank."""
    compared: int
    """Tensors compared across copies, all groups together."""
    classes: list[dict[bytes, list[int]]]
    """For each group whose copies differ: its ranks by digest of digests."""


def _plan(rows: list[tuple[Any, ...]]) -> _Plan:
    failed = [r for r, row in enumerate(rows) if not row[0]]
    if failed:
        return _Plan(failed, 0, 0, [])
    groups: dict[bytes, list[int]] = {}
    for r, (_, keyset, _, _) in enumerate(rows):
        groups.setdefault(keyset, []).append(r)
    shared = [ranks for ranks in groups.values() if len(ranks) > 1]
    bad = [ranks for ranks in shared if len({rows[r][2] for r in ranks}) > 1]
    compared = sum(rows[ranks[0]][3] for ranks in shared)
    return _Plan([], len(shared), compared, [_classes(ranks, rows) for ranks in bad])


def _key_set(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """Digest of which tensors a rank holds (keys, dtypes, shapes): its replica group."""
    h = xxhash.xxh3_128()
    for k in sorted(tensors):
        t = tensors[k]
        h.update(f"{k}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
    return h.digest()


def _combined(mine: Mapping[str, bytes]) -> bytes:
    h = xxhash.xxh3_128()
    for k in sorted(mine):
        h.update(k.encode() + b"\0" + mine[k])
    return h.digest()


def _classes(ranks: list[int], rows: list[tuple[Any, ...]]) -> dict[bytes, list[int]]:
    """The ranks of one replica group by the digest of digests they sent."""
    out: dict[bytes, list[int]] = {}
    for r in ranks:
        out.setdefault(rows[r][2], []).append(r)
    return out


def _divergent(classes: dict[bytes, list[int]], tables: list[Any]) -> list[records.Divergence]:
    """The tensors whose copies differ within one replica group (``classes``: its ranks by
    digest of digests; the first rank of each sent its table)."""
    out = []
    first = next(iter(classes.values()))[0]
    ranks = sorted(r for members in classes.values() for r in members)
    for key in tables[first]:
        copies: dict[str, list[int]] = {}
        for members in classes.values():
            copies.setdefault(tables[members[0]][key], []).extend(members)
        if len(copies) == 1:
            continue
        copies = {d: sorted(rs) for d, rs in copies.items()}
        sizes = sorted((len(v) for v in copies.values()), reverse=True)
        minority: tuple[int, ...] | None = None
        if sizes[0] > sizes[1]:
            top = max(copies.values(), key=len)
            minority = tuple(r for r in ranks if r not in top)
        out.append(
            records.Divergence(key, {d: tuple(v) for d, v in copies.items()}, minority)
        )
    return out


__all__ = ["RECORD", "check", "digests", "replicated", "tensor_digest"]
