"""Shard files: how one rank's tensors reach files inside a checkpoint being committed,
and how one shard is read back (:func:`read_file`, local file or object alike).

One small interface, :class:`ShardWriter`, with two implementations:

* :class:`SafetensorsShards` — tensors of the encoded state tree, grouped by top-level key
  into safetensors files (split past ``shard_bytes``), hashed while written. Ownership
  says which rank writes which file: ``spread`` (replicated state every rank holds the
  same bytes of, e.g. DDP model and optimizer: files are planned identically everywhere
  and split over the ranks to write in parallel), ``rank`` (this rank's own state, e.g.
  its RNG) or ``rank0`` (replicated state written once).
* :class:`DcpShards` — model and optimizer through ``torch.distributed.checkpoint``
  (sharded DTensors stay sharded; DCP reshards on load), hashed after DCP wrote them.

A world of one runs the same code: every file is then rank 0's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from ckptkit import crashpoints
from ckptkit.collective import Collective
from ckptkit.format import manifest as mf
from ckptkit.format import tree
from ckptkit.format.dtypes import HeaderEntry
from ckptkit.storage import codec, dcp_meta, dcp_write, fs, remote, tensors
from ckptkit.storage.fs import Location

DEFAULT_SHARD_BYTES = 2 << 30
"""Largest shard file before a group is split (a tensor is never split)."""
IO_WORKERS = 2
"""Files written/read at once: enough to overlap hashing, syscalls and the disk queue."""
MIN_SPREAD_SHARD = 64 << 20
"""Smallest shard when replicated state is split over ranks (tiny models stay one file)."""

OnBytes = Callable[[int], None]


@dataclass
class RankFiles:
    """What one rank wrote: manifest entries for its files and their tensors."""

    files: list[mf.FileEntry] = field(default_factory=list)
    tensors: list[mf.TensorEntry] = field(default_factory=list)

    def extend(self, other: RankFiles) -> RankFiles:
        self.files += other.files
        self.tensors += other.tensors
        return self


class ShardWriter(Protocol):
    """Writes this rank's share of some state into the temporary checkpoint directory."""

    def write(self, tmp: Location, coll: Collective) -> RankFiles:
        """Write and hash this rank's files under ``tmp``; return their entries."""
        ...


@dataclass(frozen=True)
class ShardPlan:
    """Which tensors go to which file."""

    files: dict[str, list[str]]
    """Relative file name -> tensor keys, in write order."""
    component: dict[str, str | None]
    """Relative file name -> component it holds (the group name when it is one)."""


def plan_shards(
    encoded: tree.Encoded,
    *,
    grouper: tree.Grouper = tree.default_group,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    compress: codec.Compression | None = None,
) -> ShardPlan:
    """Group tensors by ``grouper(key)`` and split groups into shards of ``shard_bytes``.

    Example:
        >>> import torch
        >>> enc = tree.encode({"model": {"w": torch.ones(2)}, "opt": {"m": torch.ones(2)}})
        >>> plan_shards(enc).files
        {'model.safetensors': ['model/w'], 'opt.safetensors': ['opt/m']}
    """
    groups: dict[str, list[str]] = {}
    for key in encoded.tensors:
        groups.setdefault(grouper(key), []).append(key)
    suffix = ".safetensors" + (codec.SUFFIX[compress] if compress else "")
    files: dict[str, list[str]] = {}
    component: dict[str, str | None] = {}
    for group, keys in groups.items():
        shards: list[list[str]] = [[]]
        size = 0
        for k in keys:
            t = encoded.tensors[k]
            n = t.numel() * t.element_size()
            if shards[-1] and size + n > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(k)
            size += n
        base = group.split("-", 1)[0]
        comp = base if base in mf.COMPONENTS else None
        for i, ks in enumerate(shards):
            name = (
                f"{group}{suffix}"
                if len(shards) == 1
                else f"{group}-{i + 1:05d}-of-{len(shards):05d}{suffix}"
            )
            files[name] = ks
            component[name] = comp
    return ShardPlan(files=files, component=component)


def write_shards(
    encoded: tree.Encoded,
    plan: ShardPlan,
    root: Location,
    *,
    names: Sequence[str] | None = None,
    compress: codec.Compression | None = None,
    fsync: bool = True,
    on_bytes: OnBytes | None = None,
    rank: int | None = None,
) -> RankFiles:
    """Write the planned shard files ``names`` (default: all) into ``root``, hashing each."""

    def write_one(name: str) -> tuple[mf.FileEntry, list[mf.TensorEntry]]:
        items = [(k, encoded.tensors[k]) for k in plan.files[name]]
        meta = {"format": "pt", "writer": "ckptkit"}
        if fs.is_local(root):
            w = tensors.write_file(
                Path(str(root / name)),
                items,
                compress=compress,
                metadata=meta,
                on_bytes=on_bytes,
                fsync=fsync,
            )
        else:  # an object store: streamed, hashed on the way out
            w = remote.write_file(
                root / name, items, compress=compress, metadata=meta, on_bytes=on_bytes
            )
        fe = mf.FileEntry(
            path=name,
            size=w.size,
            xxh3_128=w.digest,
            compression=compress,
            raw_size=w.raw_size if compress else None,
            component=plan.component[name],
            rank=rank,
        )
        tes = [mf.TensorEntry(k, name, e.dtype, e.shape, e.offsets) for k, e in w.header.items()]
        crashpoints.reached("commit.file_written")
        return fe, tes

    todo = list(plan.files) if names is None else list(names)
    out = RankFiles()
    if not todo:
        return out
    with ThreadPoolExecutor(min(IO_WORKERS, len(todo)), thread_name_prefix="ckptkit-write") as pool:
        for fe, tes in pool.map(write_one, todo):
            out.files.append(fe)
            out.tensors += tes
    return out


def read_file(
    loc: Location,
    expected: tensors.Expected,
    wanted: dict[str, HeaderEntry],
    *,
    targets: dict[str, torch.Tensor] | None = None,
    on_bytes: OnBytes | None = None,
) -> dict[str, torch.Tensor]:
    """Read and verify one safetensors shard wherever it lives; its tensors by key.

    The read counterpart of :func:`write_shards`: a local file through
    :func:`ckptkit.storage.tensors.read_file` (``preadv`` into the destinations), an
    object through :func:`ckptkit.storage.remote.read_file` (parallel range requests);
    the same checks, codes and ``targets`` semantics either way.
    """
    local = fs.local_path(loc)
    if local is None:
        return remote.read_file(loc, expected, wanted, targets=targets, on_bytes=on_bytes)
    return tensors.read_file(local, expected, wanted, targets=targets, on_bytes=on_bytes)


def assign(sizes: Sequence[tuple[str, int]], world_size: int) -> dict[str, int]:
    """Assign files to ranks, biggest first to the least loaded rank (deterministic).

    Example:
        >>> assign([("a", 10), ("b", 6), ("c", 5)], 2)
        {'a': 0, 'b': 1, 'c': 1}
    """
    load = [0] * world_size
    out: dict[str, int] = {}
    for name, size in sorted(sizes, key=lambda x: (-x[1], x[0])):
        r = min(range(world_size), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += size
    order = {n: i for i, (n, _) in enumerate(sizes)}
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


@dataclass
class SafetensorsShards:
    """Tensors of an encoded tree, written as safetensors shards by their owner rank(s).

    Args:
        encoded: the tree and the tensors to write (a subset of the state's tensors).
        owner: ``spread`` (every rank holds the same bytes; files split over ranks),
            ``rank`` (this rank's own tensors) or ``rank0`` (written by rank 0 only).
    """

    encoded: tree.Encoded
    owner: Literal["spread", "rank", "rank0"]
    grouper: tree.Grouper = tree.default_group
    compress: codec.Compression | None = None
    shard_bytes: int = DEFAULT_SHARD_BYTES
    fsync: bool = True
    on_bytes: OnBytes | None = None
    rank_label: bool = True
    """Record the writing rank in each file entry (multi-rank layouts)."""

    def write(self, tmp: Location, coll: Collective) -> RankFiles:
        if self.owner == "rank0" and coll.rank != 0:
            return RankFiles()
        shard = self.shard_bytes
        if self.owner == "spread" and coll.world_size > 1:
            total = sum(t.numel() * t.element_size() for t in self.encoded.tensors.values())
            shard = min(shard, max(MIN_SPREAD_SHARD, -(-total // (2 * coll.world_size))))
        plan = plan_shards(
            self.encoded, grouper=self.grouper, shard_bytes=shard, compress=self.compress
        )
        names: list[str] | None = None
        if self.owner == "spread" and coll.world_size > 1:
            sizes = [
                (
                    n,
                    sum(
                        self.encoded.tensors[k].numel() * self.encoded.tensors[k].element_size()
                        for k in ks
                    ),
                )
                for n, ks in plan.files.items()
            ]
            owner = assign(sizes, coll.world_size)
            names = [n for n, r in owner.items() if r == coll.rank]
        return write_shards(
            self.encoded,
            plan,
            tmp,
            names=names,
            compress=self.compress,
            fsync=self.fsync,
            on_bytes=self.on_bytes,
            rank=coll.rank if self.rank_label and coll.world_size > 1 else None,
        )


@dataclass
class DcpShards:
    """Model and optimizer state written with ``torch.distributed.checkpoint`` into ``dcp/``.

    Collective: every rank must call :meth:`write`. Each rank hashes the files it writes
    as it writes them (rank 0 also ``.metadata``); the manifest lists them all.
    """

    state_dict: dict[str, Any]
    fsync: bool = True
    process_group: Any = None

    def write(self, tmp: Location, coll: Collective) -> RankFiles:
        hashed = dcp_write.save(
            self.state_dict, tmp, fsync=self.fsync, process_group=self.process_group
        )
        out = RankFiles()
        for rel in dcp_write.files_of(tmp, coll.rank):
            hexd, size = hashed[rel.split("/", 1)[1]]  # hashed on the way out, never read back
            out.files.append(
                mf.FileEntry(
                    path=rel,
                    size=size,
                    xxh3_128=hexd,
                    component=dcp_meta.DCP_COMPONENT,
                    rank=coll.rank if coll.world_size > 1 else None,
                )
            )
        return out


__all__ = [
    "DEFAULT_SHARD_BYTES",
    "IO_WORKERS",
    "DcpShards",
    "RankFiles",
    "SafetensorsShards",
    "ShardPlan",
    "ShardWriter",
    "assign",
    "plan_shards",
    "write_shards",
]
