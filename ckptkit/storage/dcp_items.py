"""The items a DCP ``.metadata`` asks a load to read: checked against the manifest, parsed safely.

:func:`coverage` is the one rule for DCP coverage, applied by the readers and by verify
before any shard is opened; :func:`load_byte_item` and :func:`load_tensor_item` parse one
item with ``weights_only=True``, as every reader parses it.
"""

from __future__ import annotations

import functools
import io
import math
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any, cast

import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.storage import fs, transfer
from ckptkit.storage.dcp_meta import DCP_DIR, METADATA, Listed
from ckptkit.storage.dcp_shard import open_regular
from ckptkit.storage.fs import Location


@dataclass(frozen=True)
class Item:
    """One ``storage_data`` entry of ``.metadata``: where the bytes of one item lie."""

    fqn: str
    """The item's name in the saved state dict."""
    name: str
    """The shard file holding it, by its name inside ``dcp/`` (``relative_path``)."""
    offset: int
    length: int
    byte_io: bool
    """A non-tensor value (DCP's ``BYTE_IO``): loaded as a whole ``torch.save`` blob."""
    descriptors: tuple[str, ...]
    """DCP stream transforms applied to the stored bytes (none for what ckptkit writes)."""
    shape: tuple[int, ...] | None = None
    """Of a tensor chunk: its sizes, as ``.metadata`` declares them (the stored tensor must
    have them: :func:`load_tensor_item`); None for any other entry."""
    dtype: torch.dtype | None = None
    """Of a tensor chunk: the tensor's dtype, as ``.metadata`` declares it."""
    offset_key: tuple[int, ...] | None = None
    """The chunk's offsets in its tensor (its storage index's); None for a non-tensor item."""
    prefix: str = DCP_DIR
    """Where the DCP directory lies inside the checkpoint (``dcp`` in a native one; empty
    when the checkpoint is the DCP directory itself, as :mod:`ckptkit.dcp` writes it)."""

    @property
    def rel(self) -> str:
        return rel_in(self.prefix, self.name)


def rel_in(prefix: str, name: str) -> str:
    """The path of ``name`` of a DCP directory at ``prefix`` inside a checkpoint.

    Example:
        >>> rel_in("dcp", ".metadata"), rel_in("", ".metadata")
        ('dcp/.metadata', '.metadata')
    """
    return f"{prefix}/{name}" if prefix else name


ItemBytes = Callable[[Item], "bytes | None"]
"""An item's stored bytes, read from a shard whose digest matched; None: not proven, so
not parsed."""


def coverage(
    md: Any,
    listed: Mapping[str, mf.FileEntry],
    *,
    item_bytes: ItemBytes | None = None,
    prefix: str = DCP_DIR,
) -> list[CkptkitError]:
    """Everything a load of ``md`` would refuse, checked before any shard is opened.

    The one rule for DCP coverage: the readers (:func:`load`, :mod:`ckptkit.dcp`) raise the
    first problem before DCP plans a read, and verify (native, and of a ``ckptkit.dcp``
    directory) reports each as a finding, so a checkpoint verify calls good is one the
    reader will read. Checked, against the files ``listed`` (the manifest's list, never
    the files present):

    * ``.metadata`` has DCP's structure (``CK-F108``) and every transform it names is
      one DCP's reader knows (``CK-F108``);
    * every item of the state dict has a storage entry (``CK-F105``);
    * every chunk of a tensor lies inside the tensor and its storage entry holds at least
      its bytes (``CK-F026``: :func:`layout`);
    * every storage entry names a shard the manifest lists, by a plain file name
      (``CK-F021``): an unlisted file would be read without a digest;
    * its byte range lies inside the size the manifest records for that shard
      (``CK-F106``); the reader and verify's file scan both prove the file has that size;
    * with ``item_bytes``, every non-tensor item parses with ``weights_only=True``
      (:func:`load_byte_item`: ``CK-F023`` a global, ``CK-F108`` damage). The reader
      parses them the same way as it reads each proven shard; tensor items are parsed in
      the shard read itself (:func:`check_shards`, :func:`load_tensor_item`).

    Args:
        md: ``.metadata`` as :func:`read_metadata` returned it (unpickled safely, but its
            fields can hold anything).
        listed: the manifest's DCP entries (:func:`entries`), or a :class:`Listed`.
        item_bytes: reads an item's bytes from a proven shard; None checks structure only.
        prefix: where the DCP directory lies inside the checkpoint (:attr:`Item.prefix`):
            the paths the problems name.

    Returns:
        The problems as ckptkit errors (code, path, message), in metadata order; empty
        when a load would accept the metadata.

    Example:
        >>> coverage(torch.Size([1]), {})[0].code
        'CK-F108'
    """
    md_rel = rel_in(prefix, METADATA)
    try:
        lay = layout(md, prefix)
    except Exception as e:  # untrusted structure: any failure is damage, never a traceback
        return [
            codes.error(
                codes.F108,
                f"DCP metadata has an unexpected structure: {type(e).__name__}: {e}"[:300],
                path=md_rel,
            )
        ]
    problems: list[CkptkitError] = []
    if lay.missing:
        problems.append(
            codes.error(
                codes.F105,
                f"{len(lay.missing)} item(s) of the state dict have no storage entry in "
                ".metadata, e.g. " + ", ".join(lay.missing[:4]),
                path=md_rel,
            )
        )
    problems.extend(codes.error(codes.F026, why, path=md_rel) for why in lay.misfits)
    files = Listed.of(listed)
    for it in lay.items:
        problem = entry_problem(it, files.sizes, unlisted=files.unlisted)
        if problem is not None:
            problems.append(problem)
            continue
        if item_bytes is None or not it.byte_io:
            continue
        raw = item_bytes(it)
        if raw is None:
            continue  # its shard is not proven: the file findings say why
        try:
            load_byte_item(untransformed(raw, it.descriptors), fqn=it.fqn, rel=it.rel)
        except CkptkitError as e:
            problems.append(e)
    return problems


def entry_problem(
    it: Item, sizes: Mapping[str, int], *, unlisted: str = codes.F021
) -> CkptkitError | None:
    """Why a load must not read ``it`` (an unlisted shard, a range past its end), or None.
    ``sizes``: the listed shards' sizes by name (:attr:`Listed.sizes`); ``unlisted``: the
    code of a shard not among them (:attr:`Listed.unlisted`)."""
    if "/" in it.name or "\\" in it.name or it.name in ("", ".", "..", METADATA):
        return codes.error(
            codes.F021,
            f"DCP metadata places item {it.fqn} in {it.name!r}, which is not a shard file "
            "of this checkpoint: refusing to read it",
            path=rel_in(it.prefix, METADATA),
        )
    size = sizes.get(it.name)
    if size is None and unlisted == codes.F105:
        return codes.error(
            codes.F105, f"shard {it.name} is missing: it holds item {it.fqn}", path=it.rel
        )
    if size is None:
        return codes.error(
            codes.F021,
            "DCP metadata names a shard the manifest does not list: refusing to read it",
            path=it.rel,
        )
    if it.offset < 0 or it.length < 0 or it.offset + it.length > size:
        return codes.error(
            codes.F106,
            f"item {it.fqn} lies past the end of the shard ({it.offset}+{it.length} > "
            f"{size} bytes)",
            path=it.rel,
        )
    return None


def load_byte_item(data: bytes, *, fqn: str, rel: str, map_location: Any = None) -> Any:
    """Parse one non-tensor DCP item with ``weights_only=True``, as the reader loads it.

    DCP's own planner uses ``weights_only=False`` here; a value that needs a global is
    refused, never executed.

    Raises:
        UnsafeInputError: ``CK-F023`` the pickle names a global outside torch's
            weights-only allow-list.
        IntegrityError: ``CK-F108`` the bytes are not a loadable ``torch.save`` blob.
    """
    return _weights_only(io.BytesIO(data), fqn=fqn, rel=rel, map_location=map_location)


def load_tensor_item(stream: IO[bytes], it: Item, *, map_location: Any = "cpu") -> torch.Tensor:
    """Parse one tensor chunk of a DCP shard, as every reader parses it: with the same
    ``weights_only=True`` rules as a non-tensor item (:func:`load_byte_item`), then held to
    the sizes and dtype ``.metadata`` declares for the chunk.

    The one parse of a tensor item: a load (:class:`VerifyingReader`), ``ckptkit.dcp.check``
    and ``ckptkit verify`` (:func:`check_shards`).

    Raises:
        UnsafeInputError: ``CK-F023`` the pickle names a global outside the allow-list
            (never executed); ``CK-F026`` it holds no tensor, or one of another shape or
            dtype than its chunk (two items that swap storage).
        IntegrityError: ``CK-F108`` the bytes are not a loadable ``torch.save`` blob.

    Example:
        >>> buf = io.BytesIO(); torch.save(torch.ones(2), buf); _ = buf.seek(0)
        >>> it = Item("w", "__0_0.distcp", 0, 0, False, (), shape=(3,), dtype=torch.float32)
        >>> load_tensor_item(buf, it)
        Traceback (most recent call last):
        ...
        ckptkit.errors.UnsafeInputError: CK-F026 dcp/__0_0.distcp: item w holds a tensor of shape (2,) ...
    """
    t = _weights_only(stream, fqn=it.fqn, rel=it.rel, map_location=map_location)
    if not isinstance(t, torch.Tensor):
        raise codes.error(
            codes.F026, f"item {it.fqn} holds a {type(t).__name__}, not a tensor", path=it.rel
        )
    if it.shape is not None and (tuple(t.shape) != it.shape or t.dtype != it.dtype):
        raise codes.error(
            codes.F026,
            f"item {it.fqn} holds a tensor of shape {tuple(t.shape)} and {t.dtype}; "
            f".metadata declares its chunk {it.shape} and {it.dtype}",
            path=it.rel,
        )
    return t


def _weights_only(stream: IO[bytes], *, fqn: str, rel: str, map_location: Any) -> Any:
    """``torch.load(weights_only=True)`` of one item, every failure a finding code."""
    try:
        return torch.load(stream, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "global" in str(e).lower():
            raise codes.error(
                codes.F023,
                f"item {fqn} needs code to unpickle ({first[:200]}); not executed",
                path=rel,
            ) from None
        raise codes.error(codes.F108, f"item {fqn} is a damaged pickle: {first[:200]}", path=rel) from None
    except CkptkitError:
        raise  # the shard read under it failed (a short file, a read error): its code
    except Exception as e:  # untrusted bytes: any failure is damage, never a traceback
        raise codes.error(
            codes.F108, f"item {fqn} cannot be read: {type(e).__name__}: {e}"[:300], path=rel
        ) from None


def read_item(root: Location, it: Item) -> bytes:
    """The stored bytes of one item, read from its shard under ``root`` (no digest).

    Callers read only shards whose digest they proved; the range was checked by
    :func:`entry_problem`.

    Raises:
        IncompleteCheckpointError: ``CK-F001`` the shard is missing.
        UnsafeInputError: ``CK-F022`` it is not a regular file.
        OSError: reading failed.
    """
    path = root / it.rel
    if not fs.is_local(path):
        return transfer.read_ranges(path, [(it.offset, it.offset + it.length)])[0]
    with open_regular(path, rel=it.rel) as f:
        f.seek(it.offset)
        return f.read(it.length)


@dataclass(frozen=True)
class Layout:
    """What a ``.metadata`` asks a load to read (:func:`layout`)."""

    items: list[Item]
    """Every storage entry, in ``.metadata`` order."""
    missing: list[str]
    """Items of the state dict with no storage entry for some chunk (``CK-F105``)."""
    misfits: list[str]
    """Why a chunk does not fit its tensor, one message each (``CK-F026``)."""

    def item(self, idx: Any) -> Item | None:
        """The item of storage index ``idx`` (a ``MetadataIndex``), or None."""
        return self._by_index.get(_index_key(idx.fqn, idx.offset))

    @functools.cached_property
    def _by_index(self) -> dict[tuple[str, tuple[int, ...] | None], Item]:
        return {_index_key(it.fqn, it.offset_key): it for it in self.items}


def layout(md: Any, prefix: str = DCP_DIR) -> Layout:
    """The storage entries of ``md``, each tensor chunk with the sizes and dtype it must
    hold, the items with no storage entry, and the chunks that do not fit their tensor
    (outside its size, or more bytes than their storage entry holds).

    Raises:
        AttributeError, TypeError, ValueError, KeyError: not DCP's structure.
    """
    from torch.distributed.checkpoint._extension import ExtensionRegistry
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    if not isinstance(md, Metadata):
        raise TypeError(f"the pickle holds a {type(md).__name__}, not DCP Metadata")
    sd_meta, storage = md.state_dict_metadata, md.storage_data
    if not isinstance(sd_meta, dict) or not isinstance(storage, dict):
        raise TypeError("state_dict_metadata and storage_data must be dicts")
    byte_io: set[str] = set()
    missing: list[str] = []
    misfits: list[str] = []
    chunks: dict[tuple[str, tuple[int, ...] | None], tuple[tuple[int, ...], torch.dtype]] = {}
    for fqn, m in sd_meta.items():
        if not isinstance(fqn, str):
            raise TypeError(f"state_dict_metadata key {fqn!r} is not a string"[:200])
        if isinstance(m, BytesStorageMetadata):
            byte_io.add(fqn)
            needed = [MetadataIndex(fqn)]
        elif isinstance(m, TensorStorageMetadata) and isinstance(m.chunks, list):
            size = _dims(m.size, fqn)
            dtype = getattr(m.properties, "dtype", None)
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"item {fqn} declares dtype {dtype!r}"[:200])
            needed = []
            for c in m.chunks:
                offsets, sizes = _dims(c.offsets, fqn), _dims(c.sizes, fqn)
                if len(offsets) != len(size) or len(sizes) != len(size) or any(
                    o + n > d for o, n, d in zip(offsets, sizes, size, strict=True)
                ):
                    misfits.append(
                        f"item {fqn} of size {list(size)}: its chunk at {list(offsets)} of "
                        f"sizes {list(sizes)} lies outside it"[:300]
                    )
                chunks[_index_key(fqn, offsets)] = (sizes, dtype)
                needed.append(MetadataIndex(fqn, offsets))
        else:
            raise TypeError(f"item {fqn} has metadata of type {type(m).__name__}"[:200])
        if any(ix not in storage for ix in needed):
            missing.append(fqn)
    registry = ExtensionRegistry()
    items: list[Item] = []
    for idx, info in storage.items():
        if not isinstance(idx, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise TypeError(f"storage_data entry {idx!r}: {info!r}"[:200])
        it = item(idx, info, byte_io=idx.fqn in byte_io and idx.offset is None, prefix=prefix)
        registry.from_descriptor_list(list(it.descriptors))  # ValueError: unknown to DCP
        chunk = chunks.get(_index_key(it.fqn, it.offset_key))
        if chunk is not None:
            it = replace(it, shape=chunk[0], dtype=chunk[1])
            need = math.prod(chunk[0]) * chunk[1].itemsize
            if not it.descriptors and need > it.length:
                misfits.append(
                    f"item {it.fqn}: its chunk of sizes {list(chunk[0])} x {chunk[1]} needs "
                    f"{need} bytes, its storage entry holds {it.length}"[:300]
                )
        items.append(it)
    return Layout(items, missing, misfits)


def _index_key(fqn: str, offset: Any) -> tuple[str, tuple[int, ...] | None]:
    return fqn, None if offset is None else tuple(offset)


def _dims(v: Any, fqn: str) -> tuple[int, ...]:
    """A size or offset of a tensor: non-negative integers (else not DCP's structure)."""
    if not isinstance(v, Sequence) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v
    ):
        raise TypeError(f"item {fqn} declares sizes or offsets {v!r}"[:200])
    return tuple(v)


def item(idx: Any, info: Any, *, byte_io: bool = False, prefix: str = DCP_DIR) -> Item:
    """One storage entry (``MetadataIndex`` → ``_StorageInfo``) as an :class:`Item`.

    Raises:
        TypeError: a field of the wrong type.
    """
    fqn, name = idx.fqn, info.relative_path
    if not isinstance(fqn, str) or not isinstance(name, str):
        raise TypeError(f"storage_data entry {idx!r}: {info!r}"[:200])
    descriptors = tuple(info.transform_descriptors or ())
    if not all(isinstance(d, str) for d in descriptors):
        raise TypeError(f"item {fqn} names transforms {descriptors!r}"[:200])
    return Item(
        fqn=fqn,
        name=name,
        offset=_byte_count(info.offset, fqn),
        length=_byte_count(info.length, fqn),
        byte_io=byte_io,
        descriptors=descriptors,
        offset_key=None if idx.offset is None else _dims(idx.offset, fqn),
        prefix=prefix,
    )


def _byte_count(v: Any, fqn: str) -> int:
    """An offset or length as DCP would use it: an ``int`` (negatives: :func:`entry_problem`)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"item {fqn} has a byte offset/length {v!r} that is not an integer"[:200])
    return v


def untransformed(raw: bytes, descriptors: Sequence[str]) -> bytes:
    """The item's bytes after DCP's load transforms (none for what ckptkit writes)."""
    if not descriptors:
        return raw
    from torch.distributed.checkpoint.filesystem import _StorageReaderTransforms

    stream = _StorageReaderTransforms().transform_load_stream(
        cast(Any, None), descriptors, io.BytesIO(raw)
    )
    return bytes(stream.read(-1))


__all__ = [
    "Item",
    "ItemBytes",
    "Layout",
    "coverage",
    "entry_problem",
    "item",
    "layout",
    "load_byte_item",
    "load_tensor_item",
    "read_item",
    "rel_in",
    "untransformed",
]
