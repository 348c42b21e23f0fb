"""Reading DCP state through ``torch.distributed.checkpoint``, without its unsafe reads.

Sharded model and optimizer state (FSDP2 / DTensor, or any state at any world size when
``TrainState(storage="dcp")``) is written by DCP into ``dcp/`` inside the checkpoint;
ckptkit's manifest lists every file with its digest, so verify covers it like any other.

DCP's own reader unpickles ``.metadata`` with plain ``pickle.load`` and the non-tensor
items (``BYTE_IO``: optimizer param groups, plain values) with
``torch.load(weights_only=False)``: a file anyone can write would run code on restore.
Here, reading goes through:

* :func:`~ckptkit.storage.dcp_meta.read_metadata`: ``.metadata`` must be listed in the
  manifest; its bytes are read once, checked against the digest, then unpickled with an
  allow-list of DCP's metadata classes (:class:`~ckptkit.storage.dcp_meta.MetadataUnpickler`),
  never plain pickle;
* :func:`~ckptkit.storage.dcp_items.coverage`: what ``.metadata`` asks a load to read,
  checked against the manifest before any shard is opened (every storage entry names a
  listed shard, its byte range lies inside the size the manifest records, every item has a
  storage entry) and, given proven bytes, every non-tensor item parses with
  ``weights_only=True``. The reader and native verify both call it, so verify cannot call
  "good" what the reader refuses;
* :class:`VerifyingReader`: each ``.distcp`` shard is read once, in file order, hashed on
  the way (each byte read once, as issue 11 asks) and checked against the manifest when
  its last byte is read; tensors are parsed by ``torch.load(weights_only=True)``;
  non-tensor items are parsed only after their file's digest matched, also with
  ``weights_only=True`` (:class:`SafeLoadPlanner`). A shard not listed in the manifest
  is refused before it is opened.

Every exception DCP raises (``CheckpointException`` is a ``BaseException``) is turned into
a ckptkit error (:mod:`ckptkit.storage.dcp_errors`), so restore can fall back and no
``BaseException`` leaves a ckptkit API.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.storage import dcp_items, fs
from ckptkit.storage.dcp_errors import quiet, translated
from ckptkit.storage.dcp_items import (
    Item,
    ItemBytes,
    Layout,
    coverage,
    entry_problem,
    layout,
    load_byte_item,
    load_tensor_item,
    rel_in,
    untransformed,
)
from ckptkit.storage.dcp_meta import (
    DCP_DIR,
    METADATA,
    METADATA_REL,
    Listed,
    entries,
    read_metadata_file,
)
from ckptkit.storage.dcp_shard import check_file, open_shard
from ckptkit.storage.fs import Location

# --- loading ------------------------------------------------------------------------------------


def load(
    state_dict: dict[str, Any],
    root: Location,
    man: mf.Manifest,
    *,
    verify_rank: int = 0,
    verify_world: int = 1,
) -> None:
    """Read DCP state of ``root/dcp`` into ``state_dict`` in place, resharding (collective).

    Every byte is read once and checked against the manifest on the way; shard files no
    rank reads are hashed by the rank they are assigned to (``verify_rank`` of
    ``verify_world``), so every listed file is checked by someone. Before DCP plans a
    read, :func:`coverage` refuses what native verify refuses.

    Raises:
        CkptkitError: any failure, on every rank (DCP propagates failures to all ranks).
    """
    import torch.distributed.checkpoint as dcp

    listed = entries(man)
    md = read_metadata_file(root / METADATA_REL, listed.get(METADATA), rel=METADATA_REL)
    problems = coverage(md, listed)
    if problems:
        raise problems[0]
    planner_cls, reader_cls = classes()
    reader = reader_cls(root / DCP_DIR, md, listed)
    with translated("DCP load"), quiet():
        dcp.load(state_dict, storage_reader=reader, planner=planner_cls())
    check_unread(reader, root / DCP_DIR, listed, rank=verify_rank, world=verify_world)


def check_unread(
    reader: Any,
    where: Location,
    listed: Mapping[str, mf.FileEntry],
    *,
    rank: int,
    world: int,
    prefix: str = DCP_DIR,
) -> None:
    """After a load, hash the listed shards assigned to this rank that its plan did not
    read (a partial load reads only some): each shard is assigned to one rank (``rank`` of
    ``world``), so every listed file is checked by someone. A shard goes to the rank that
    wrote it modulo ``world`` when the manifest says who did (:attr:`Listed.writers`): at
    the saved world size that is the rank whose plan reads it, so nothing is read twice and
    a rank reads no other rank's manifest for it; else shards go round the ranks in name
    order. ``reader`` is the :class:`VerifyingReader` of the load.

    Raises:
        CkptkitError: ``CK-F001/F002/F003/F022`` as :func:`check_file`.
    """
    listed = Listed.of(listed)
    names = sorted(n for n in listed if n != METADATA)
    writers = listed.writers
    if all(n in writers for n in names):
        mine = [n for n in names if writers[n] % world == rank]
    else:
        mine = names[rank::world]
    for name in mine:
        if name not in reader.checked:
            check_file(where / name, listed[name], rel=rel_in(prefix, name))


@dataclass
class ShardPass:
    """What one read of every listed shard established (:func:`check_shards`)."""

    digests: dict[str, tuple[str, int]]
    """``{name: (xxh3-128, size)}`` of every shard read whole."""
    file_problems: list[CkptkitError]
    """Shards that are missing, of another size or digest, not regular or unreadable
    (``CK-F001/F002/F003/F022/F025``), in name order."""
    problems: list[CkptkitError]
    """Tensor items of shards whose digest matched that do not parse or fit their chunk
    (:func:`load_tensor_item`), in file order."""
    item_bytes: ItemBytes
    """The bytes of each non-tensor item of a shard whose digest matched: the
    ``item_bytes`` of the :func:`coverage` call that parses them."""


def check_shards(
    where: Location,
    md: Any,
    listed: Mapping[str, mf.FileEntry],
    *,
    prefix: str = DCP_DIR,
    on_tensor: Callable[[Item, torch.Tensor], None] | None = None,
) -> ShardPass:
    """Read every listed shard of the DCP directory ``where`` once, checking size and
    digest; parse each tensor item as its bytes go by (:func:`load_tensor_item`, as a load
    parses it) and keep the bytes of each non-tensor item for :func:`coverage` to parse
    once the digest matched.

    The one shard pass of ``ckptkit.dcp.check`` and of ``ckptkit verify`` of a
    ``ckptkit.dcp`` directory (which scans each tensor for NaN/Inf through ``on_tensor``),
    so the two refuse the same items with the same codes. ``md`` must have passed
    :func:`coverage` (structure and ranges); a problem of an item in a shard whose digest
    does not match is the digest's (a file problem), not the item's.

    Returns:
        What the pass established (:class:`ShardPass`); every problem is returned, none
        raised.
    """
    lay = layout(md, prefix)
    files = Listed.of(listed)
    wanted: dict[str, list[Item]] = {}
    for it in lay.items:
        if entry_problem(it, files.sizes) is None and (it.byte_io or it.shape is not None):
            wanted.setdefault(it.name, []).append(it)
    out = ShardPass({}, [], [], lambda it: None)
    got: dict[tuple[str, int, int], bytes] = {}
    for name, fe in sorted(files.items()):
        if name == METADATA:
            continue
        kept: dict[tuple[str, int, int], bytes] = {}
        found: list[CkptkitError] = []
        try:
            with open_shard(where / name, rel=rel_in(prefix, name), expected_size=fe.size) as shard:
                for it in sorted(wanted.get(name, []), key=lambda i: (i.offset, i.length)):
                    buf = bytearray(it.length)
                    shard.read_into(it.offset, memoryview(buf))
                    if it.byte_io:
                        kept[(it.name, it.offset, it.length)] = bytes(buf)
                        continue
                    try:
                        raw = untransformed(bytes(buf), it.descriptors)
                        t = load_tensor_item(io.BytesIO(raw), it)
                    except CkptkitError as e:
                        found.append(e)
                    else:
                        if on_tensor is not None:
                            on_tensor(it, t)
                shard.verify(fe)
                out.digests[name] = (fe.xxh3_128, shard.size)
        except CkptkitError as e:
            out.file_problems.append(e)
            continue
        got.update(kept)
        out.problems.extend(found)
    out.item_bytes = lambda it: got.get((it.name, it.offset, it.length))
    return out


def _set_element(root: Any, path: Any, value: Any) -> None:
    from torch.distributed.checkpoint._traverse import set_element

    set_element(root, path, value)


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    from torch.distributed._shard._utils import narrow_tensor_by_index

    return cast(torch.Tensor, narrow_tensor_by_index(tensor, offsets, lengths))


def _place(planner: Any, read_item: Any, obj: Any) -> None:
    """Put a parsed non-tensor item into the state dict a DCP default planner loads,
    as its ``load_bytes`` does, without its ``torch.load(weights_only=False)``."""
    if planner.flatten_state_dict:
        _set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], obj)
    else:
        planner.state_dict[read_item.dest_index.fqn] = obj


def _places_plainly(planner: Any) -> bool:
    """Whether ``planner`` loads non-tensor items as DCP's default planner does (so
    :func:`_place` may put them in place for it)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    return isinstance(planner, DefaultLoadPlanner) and type(planner).load_bytes in (
        DefaultLoadPlanner.load_bytes,
        cast(Any, classes()[0]).load_bytes,
    )


@functools.cache
def classes() -> tuple[type, type]:
    """The DCP reader and planner subclasses, built on first use.

    ``torch.distributed.checkpoint`` takes about a second to import; a run that never
    touches DCP storage never pays for it.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):  # type: ignore[misc]
        """DCP's default load planner with non-tensor items parsed by ``weights_only=True``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.storage_index.fqn
            _place(self, read_item, load_byte_item(value.getvalue(), fqn=fqn, rel=DCP_DIR))

    class VerifyingReader(FileSystemReader):  # type: ignore[misc]
        """A DCP ``FileSystemReader`` that reads each listed shard once, hashing as it goes.

        Args:
            path: the DCP directory.
            metadata: the already verified and safely unpickled ``.metadata`` (a subclass
                that reads it itself sets ``_metadata`` and ``_listed`` before DCP asks).
            listed: the manifest's entries of the DCP files, keyed by name inside it.
            prefix: where the DCP directory lies inside the checkpoint (the paths errors
                name: :attr:`Item.prefix`).
        """

        def __init__(
            self,
            path: Location,
            metadata: Any,
            listed: Mapping[str, mf.FileEntry],
            *,
            prefix: str = DCP_DIR,
        ) -> None:
            super().__init__(fs.url(path))
            self._metadata = metadata
            self._listed = Listed.of(listed)
            self._dir = path
            self._prefix = prefix
            self.checked: set[str] = set()
            """Shard names whose digest was checked by a read."""
            self._layout: Layout | None = None

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            md = self._metadata
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

        def read_data(self, plan: Any, planner: Any) -> torch.futures.Future[None]:
            per_file: dict[str, list[Any]] = {}
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                per_file.setdefault(info.relative_path, []).append(item)
            for name, reqs in per_file.items():
                self._read_file(name, reqs, planner)
            fut: torch.futures.Future[None] = torch.futures.Future()
            fut.set_result(None)
            return fut

        def _load_item(
            self,
            req: Any,
            info: Any,
            item: IO[bytes],
            planner: Any,
            deferred: list[tuple[Any, bytes]],
            rel: str,
        ) -> None:
            """Parse one item from its shard: a tensor now, other values later."""
            from torch.distributed.checkpoint.planner import LoadItemType

            stream = self.transforms.transform_load_stream(
                req, info.transform_descriptors or (), item
            )
            if req.type == LoadItemType.BYTE_IO:
                deferred.append((req, bytes(stream.read(-1))))
                return
            raw = stream if stream.seekable() else io.BytesIO(stream.read(-1))
            tensor = load_tensor_item(raw, self._item_of(req))
            tensor = _narrow(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise codes.error(
                    codes.F106,
                    f"item {req.storage_index.fqn} has size {tuple(tensor.size())}, the model "
                    f"expects {tuple(target.size())}",
                    path=rel,
                )
            target.copy_(tensor)
            planner.commit_tensor(req, target)

        def _item_of(self, req: Any) -> Item:
            """The :class:`Item` of a read request: its storage entry, and of a tensor
            chunk the sizes and dtype ``.metadata`` declares for it (:func:`layout`)."""
            if self._layout is None:
                self._layout = layout(self._metadata, self._prefix)
            idx = req.storage_index
            it = self._layout.item(idx)
            return (
                it
                if it is not None
                else dcp_items.item(idx, self.storage_data[idx], prefix=self._prefix)
            )

        def _read_file(self, name: str, reqs: Sequence[Any], planner: Any) -> None:

            rel = rel_in(self._prefix, name)
            # The same rule coverage() applied to every entry before the load began.
            for req in reqs:
                problem = entry_problem(self._item_of(req), self._listed.sizes)
                if problem is not None:
                    raise problem
            fe = self._listed[name]
            spans = sorted(
                reqs,
                key=lambda r: (
                    self.storage_data[r.storage_index].offset,
                    self.storage_data[r.storage_index].length,
                ),
            )
            deferred: list[tuple[Any, bytes]] = []
            # One read of the shard, in file order: each item's bytes land in the tensor
            # storage torch.load allocates (as DCP's own reader reads them) and are hashed
            # right behind (Shard); what no item asks for is hashed in between.
            with open_shard(self._dir / name, rel=rel, expected_size=fe.size) as shard:
                for req in spans:
                    info = self.storage_data[req.storage_index]
                    shard.hash_to(info.offset)  # bytes this rank's plan skips
                    with shard.item(info.offset, info.length) as item:
                        try:
                            self._load_item(req, info, item, planner, deferred, rel)
                        except Exception:
                            # The item was refused or torch.load failed on these bytes:
                            # when the file does not match its digest, that is what the
                            # caller needs to hear (as check_shards decides).
                            try:
                                shard.verify(fe)
                            except CkptkitError as damaged:
                                raise damaged from None
                            raise
                shard.verify(fe)
            self.checked.add(name)
            for req, data in deferred:  # parsed only now that the bytes are proven
                fqn = req.storage_index.fqn
                obj = load_byte_item(data, fqn=fqn, rel=rel)
                if _places_plainly(planner):
                    _place(planner, req, obj)
                else:
                    # A planner with its own load_bytes (it may transform what it loads):
                    # it gets the bytes just parsed with weights_only=True, so whatever
                    # it unpickles names only globals on torch's allow-list.
                    planner.load_bytes(req, io.BytesIO(data))

    return SafeLoadPlanner, VerifyingReader


# --- reading every item (diff) --------------------------------------------------------------------


def read_state(
    where: Location, md: Any, listed: Mapping[str, mf.FileEntry], *, prefix: str = DCP_DIR
) -> dict[str, Any]:
    """Every item of the DCP directory ``where``, keyed by its state-dict name (the
    flattened ``fqn``; ``md.planner_data`` maps it back to its place in the nesting).

    What ``ckptkit diff`` and the drill's end-state check compare: no model or optimizer
    to load into, so each tensor is built from ``.metadata``'s size and dtype (sharded
    items are assembled whole, on CPU) and each non-tensor item comes back as it parses
    with ``weights_only=True``. The same checks as :func:`load`: :func:`coverage` before
    any shard is opened, each shard read once through :class:`VerifyingReader` (hashed on
    the way, refused when its digest does not match ``listed``), the shards no item lies
    in hashed after (:func:`check_unread`). Runs in this process only (``no_dist``), even
    inside a distributed job.

    Args:
        where: the DCP directory.
        md: its ``.metadata``, as :func:`read_metadata_file` returned it.
        listed: the digests of its files, by name inside it.
        prefix: where the DCP directory lies inside the checkpoint (the paths errors name).

    Raises:
        CkptkitError: the first problem, with its finding code; ``CK-F108`` also when a
            tensor's declared size or dtype is unusable or larger than its stored bytes
            (a ``.metadata`` must not make the reader allocate what the shards do not hold).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problems = coverage(md, listed, prefix=prefix)
    if problems:
        raise problems[0]
    stored: dict[str, int] = {}
    transformed: set[str] = set()
    for idx, info in md.storage_data.items():
        stored[idx.fqn] = stored.get(idx.fqn, 0) + info.length
        if info.transform_descriptors:
            transformed.add(idx.fqn)
    state: dict[str, Any] = {}
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            state[fqn] = None  # a non-tensor item: the planner puts what it parses here
            continue
        state[fqn] = _empty_like_stored(m, fqn, stored.get(fqn, 0), fqn in transformed, prefix)
    planner_cls, reader_cls = classes()
    reader = reader_cls(where, md, listed, prefix=prefix)
    with translated("DCP read"), quiet():
        dcp.load(
            state,
            storage_reader=reader,
            planner=planner_cls(flatten_state_dict=False, flatten_sharded_tensors=False),
            no_dist=True,
        )
    check_unread(reader, where, listed, rank=0, world=1, prefix=prefix)
    return state


def _empty_like_stored(m: Any, fqn: str, stored: int, transformed: bool, prefix: str) -> torch.Tensor:
    """A CPU tensor of the size and dtype ``.metadata`` declares for ``fqn``.

    Raises:
        CkptkitError: ``CK-F108`` the declaration is not a size and a dtype, or (for
            untransformed items) it needs more bytes than the shards store for it.
    """
    size, dtype = m.size, getattr(m.properties, "dtype", None)
    ok = isinstance(size, Sequence) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in size
    )
    if not ok or not isinstance(dtype, torch.dtype):
        raise codes.error(
            codes.F108,
            f"item {fqn} declares size {size!r} and dtype {dtype!r}"[:300],
            path=rel_in(prefix, METADATA),
        )
    need = math.prod(size) * dtype.itemsize
    if not transformed and need > stored:
        raise codes.error(
            codes.F108,
            f"item {fqn} declares {need} bytes of tensor data, its storage entries hold {stored}",
            path=rel_in(prefix, METADATA),
        )
    return torch.empty(tuple(size), dtype=dtype)


__all__ = [
    "ShardPass",
    "check_shards",
    "check_unread",
    "classes",
    "load",
    "read_state",
]
