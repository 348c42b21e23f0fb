"""``torch.distributed.checkpoint`` as a storage engine, without its unsafe reads.

Sharded model and optimizer state (FSDP2 / DTensor, or any state at any world size when
``TrainState(storage="dcp")``) is written by DCP into ``dcp/`` inside the checkpoint;
ckptkit's manifest lists every file with its digest, so verify covers it like any other.

DCP's own reader unpickles ``.metadata`` with plain ``pickle.load`` and the non-tensor
items (``BYTE_IO``: optimizer param groups, plain values) with
``torch.load(weights_only=False)``: a file anyone can write would run code on restore.
Here, reading goes through:

* :func:`read_metadata`: ``.metadata`` must be listed in the manifest; its bytes are read
  once, checked against the digest, then unpickled with an allow-list of DCP's metadata
  classes (:class:`MetadataUnpickler`), never plain pickle;
* :func:`coverage`: what ``.metadata`` asks a load to read, checked against the manifest
  before any shard is opened (every storage entry names a listed shard, its byte range lies
  inside the size the manifest records, every item has a storage entry) and, given proven
  bytes, every non-tensor item parses with ``weights_only=True``. The reader and native
  verify both call it, so verify cannot call "good" what the reader refuses;
* :class:`VerifyingReader`: each ``.distcp`` shard is read once, in file order, hashed on
  the way (each byte read once, as issue 11 asks) and checked against the manifest when
  its last byte is read; tensors are parsed by ``torch.load(weights_only=True)``;
  non-tensor items are parsed only after their file's digest matched, also with
  ``weights_only=True`` (:class:`SafeLoadPlanner`). A shard not listed in the manifest
  is refused before it is opened.

Every exception DCP raises (``CheckpointException`` is a ``BaseException``) is turned into
a ckptkit error here, so restore can fall back and no ``BaseException`` leaves a ckptkit
API.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import math
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import IO, Any, cast

import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError, DistributedError
from ckptkit.format import digest
from ckptkit.format import manifest as mf
from ckptkit.storage import files, fs
from ckptkit.storage.fs import Location

DCP_DIR = "dcp"
"""Subdirectory of a checkpoint holding ``torch.distributed.checkpoint`` files."""
DCP_COMPONENT = "dcp"
"""``component`` of the manifest entries of DCP files (they hold model and optimizer)."""
METADATA = ".metadata"
METADATA_REL = f"{DCP_DIR}/{METADATA}"
MAX_METADATA_BYTES = 1 << 30
"""Refuse a ``.metadata`` larger than this before reading it."""
MARK = "ckptkit.dcp.Writer"
"""The mark :class:`ckptkit.dcp.Writer` leaves in the ``.metadata`` it writes (in DCP's
``storage_meta.modules``): :func:`written_here`."""
METADATA_BYTES_PER_CHUNK = 16
"""A ``.metadata`` may declare one chunk or storage entry per this many bytes of its pickle
(beyond :data:`FREE_CHUNKS`): a genuine one takes about 100 bytes per chunk, a pickle that
repeats a reference to one chunk 2 (a million chunks in 2 MB took ``check`` 83 s and a load
minutes to plan). Counted right after the unpickle, before any work per chunk
(``CK-F027``), so the work a ``.metadata`` can cause grows with its size, never faster."""
FREE_CHUNKS = 4096
"""Chunks and storage entries any ``.metadata`` may declare, whatever its size."""

_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "collections": frozenset({"OrderedDict"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"}),
    "builtins": frozenset({"set", "frozenset", "slice", "complex"}),
}
"""Globals a DCP ``.metadata`` pickle may name: its dataclasses, dtypes, sizes, paths."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickle a DCP ``.metadata``: torch's metadata dataclasses, dtypes, nothing else.

    Example:
        >>> import io, pickle
        >>> MetadataUnpickler(io.BytesIO(pickle.dumps(torch.Size([2])))).load()
        torch.Size([2])
        >>> MetadataUnpickler(io.BytesIO(pickle.dumps(os.system))).load()
        Traceback (most recent call last):
        ...
        _pickle.UnpicklingError: global posix.system is not allowed in DCP metadata
    """

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in _ALLOWED.get(module, frozenset()):
            return getattr(importlib.import_module(module), name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")


def loads_metadata(data: bytes) -> Any:
    """Unpickle ``.metadata`` bytes with :class:`MetadataUnpickler`, then bound what they
    declare: at most one chunk or storage entry per :data:`METADATA_BYTES_PER_CHUNK` bytes.

    The one unpickle of a ``.metadata`` (every reader, ``ckptkit verify`` included).

    Raises:
        UnsafeInputError: ``CK-F027`` more chunks than the bytes allow (named ``.metadata``;
            callers that know its path inside the checkpoint re-name it).
        pickle.UnpicklingError: a global outside the allow-list (never executed).
        Exception: whatever a damaged pickle raises; callers treat any as damage.
    """
    md = MetadataUnpickler(io.BytesIO(data)).load()
    declared = _declared_chunks(md)
    limit = max(FREE_CHUNKS, len(data) // METADATA_BYTES_PER_CHUNK)
    if declared > limit:
        raise codes.error(
            codes.F027,
            f"declares {declared} chunks and storage entries in {len(data)} bytes (at most "
            f"{limit}: one per {METADATA_BYTES_PER_CHUNK} bytes); refused before any work per "
            "chunk",
            path=METADATA,
        )
    return md


def written_here(md: Any) -> bool:
    """Whether ``.metadata`` ``md`` was written by :class:`ckptkit.dcp.Writer` (its mark):
    such a directory is committed only once its manifest is there.

    Example:
        >>> from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
        >>> written_here(Metadata({}, storage_meta=StorageMeta(modules=[MARK])))
        True
    """
    modules = getattr(getattr(md, "storage_meta", None), "modules", None)
    return isinstance(modules, list) and MARK in modules


def _declared_chunks(md: Any) -> int:
    """The chunks and storage entries ``md`` declares, counted without looking into them
    (what is not DCP's structure counts nothing here: :func:`coverage` says what it is)."""
    n = 0
    storage = getattr(md, "storage_data", None)
    if isinstance(storage, dict):
        n += len(storage)
    items = getattr(md, "state_dict_metadata", None)
    if isinstance(items, dict):
        for m in items.values():
            chunks = getattr(m, "chunks", None)
            if isinstance(chunks, list):
                n += len(chunks)
    return n


# --- writing ------------------------------------------------------------------------------------


def save(
    state_dict: dict[str, Any], root: Location, *, fsync: bool = True, process_group: Any = None
) -> dict[str, tuple[str, int]]:
    """Write ``state_dict`` (DTensors stay sharded) with DCP into ``root/dcp`` (collective).

    Without a process group this is a one-process DCP save (``no_dist``), the world of one.
    Every byte is hashed on its way to the file (:class:`HashingFileSystem`), locally and
    on an object store alike: nothing is read back.

    Returns:
        ``{name inside dcp/: (xxh3-128, size)}`` of the files this rank wrote (the
        coordinator's include ``.metadata``).

    Raises:
        CkptkitError: DCP failed (its ``CheckpointException`` translated).
    """
    import torch.distributed.checkpoint as dcp

    writer = writer_for(root / DCP_DIR, sync_files=fsync, thread_count=2)
    with translated("DCP save"), quiet():
        dcp.save(state_dict, storage_writer=writer, process_group=process_group)
    return dict(writer.fs.digests)


def writer_for(where: Location, **kwargs: Any) -> Any:
    """DCP's file writer for ``where``, with every file it writes hashed on the way out
    (``writer.fs.digests``)."""
    from torch.distributed.checkpoint import FileSystemWriter

    writer: Any = FileSystemWriter(fs.url(where), **kwargs)
    writer.path, writer.fs = hashing_filesystem(where)
    return writer


def hashing_filesystem(where: Location) -> tuple[Any, HashingFileSystem]:
    """DCP's path and filesystem for the DCP directory ``where`` (its local filesystem, or
    its fsspec one on an object store, as ``FsspecWriter`` sets up), hashing every file
    written through it.

    Returns:
        ``(path as DCP's writer keeps it, filesystem)``: assign them to a DCP writer's
        ``path`` and ``fs``.
    """
    inner: Any
    if fs.is_local(where):
        from torch.distributed.checkpoint.filesystem import FileSystem

        inner = FileSystem()
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem

        inner = FsspecFileSystem()
    return inner.init_path(fs.url(where)), HashingFileSystem(inner)


def files_of(root: Location, rank: int) -> list[str]:
    """The DCP files rank ``rank`` wrote under ``root/dcp`` (rank 0 also owns ``.metadata``)."""
    d = root / DCP_DIR
    names = [p.name for p in d.iterdir()] if fs.kind(d) == "dir" else []
    rels = sorted(f"{DCP_DIR}/{n}" for n in names if re.fullmatch(rf"__{rank}_\d+\.distcp", n))
    if rank == 0 and METADATA in names:
        rels.append(f"{DCP_DIR}/{METADATA}")
    return rels


class HashingFileSystem:
    """A DCP filesystem (local or fsspec) that hashes every stream written through it.

    DCP writes each ``.distcp`` file and ``.metadata`` through ``writer.fs.create_stream``;
    wrapping that one call gives the digest of every byte as it goes to the file, in the
    same pass (``digests``: ``{file name: (xxh3-128, size)}``). ``.metadata`` is written as
    ``.metadata.tmp`` and renamed: its digest follows the rename. Every other call is the
    wrapped filesystem's own.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.digests: dict[str, tuple[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            # Unpickling (DCP's process-based async save sends the writer to its worker)
            # looks attributes up before ``__dict__`` is restored: without this, the lookup
            # of ``self.inner`` recursed forever.
            raise AttributeError(name)
        return getattr(self.inner, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self.inner.create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            tee = _HashingStream(stream)
            yield tee
        # Recorded only once the stream closed cleanly: a failed write leaves no digest.
        self.digests[PurePosixPath(os.fspath(path)).name] = (tee.hexdigest(), tee.size)

    def rename(self, path: Any, new_path: Any) -> None:
        self.inner.rename(path, new_path)
        old = PurePosixPath(os.fspath(path)).name
        if old in self.digests:
            self.digests[PurePosixPath(os.fspath(new_path)).name] = self.digests.pop(old)


class _HashingStream(io.RawIOBase):
    """A write-only pass-through that hashes and counts what goes by (``tell`` included)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner
        self._h = digest.new()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        with memoryview(b) as mv, mv.cast("B") as flat:
            self._h.update(flat)
            self._inner.write(flat)
            self.size += len(flat)
            return len(flat)

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        # DCP fsyncs each file through ``stream.fileno()``; without it, it falls back to a
        # whole-system ``os.sync()``.
        return int(self._inner.fileno())

    def flush(self) -> None:
        self._inner.flush()

    def hexdigest(self) -> str:
        return str(self._h.hexdigest())


# --- reading ------------------------------------------------------------------------------------


class Listed(Mapping[str, mf.FileEntry]):
    """The files of a DCP directory a manifest lists, by name inside it: every name with
    the size recorded for it (:attr:`sizes`), and each entry (its digest) when it is first
    asked for. A partial manifest (a restoring rank's) holds the entries of the rank
    manifests it read; the entry of another file comes from the rank manifest that lists
    it, read then (:meth:`ckptkit.format.manifest.Manifest.entry`). So a DCP load, which learns
    which files it reads only from its plan, reads the rank manifests of those files and
    of the files it is to check (:func:`check_unread`), not every rank's.

    Example:
        >>> fe = mf.FileEntry("dcp/__0_0.distcp", 5, "0" * 32, rank=0)
        >>> listed = Listed.whole({"__0_0.distcp": fe})
        >>> dict(listed.sizes), listed["__0_0.distcp"].rank, "x" in listed
        ({'__0_0.distcp': 5}, 0, False)
    """

    def __init__(
        self,
        sizes: Mapping[str, int],
        entry: Callable[[str], mf.FileEntry | None],
        writers: Mapping[str, int] | None = None,
    ) -> None:
        self.sizes = sizes
        """Every listed name with its recorded size: what :func:`coverage` checks."""
        self.writers = writers or {}
        """The rank that wrote each file, where the manifest says (:func:`check_unread`)."""
        self.unlisted = codes.F021
        """The code of a shard ``.metadata`` names that is not here: ``CK-F021`` (a
        manifest's list: refused unread), ``CK-F105`` of a :meth:`directory`'s (missing)."""
        self._entry = entry

    @classmethod
    def whole(cls, entries: Mapping[str, mf.FileEntry]) -> Listed:
        """Of entries all at hand (one manifest of every file: a foreign DCP directory's)."""
        return cls({n: fe.size for n, fe in entries.items()}, entries.get)

    @classmethod
    def directory(cls, sizes: Mapping[str, int]) -> Listed:
        """The files present in a DCP directory no manifest lists (a plain DCP checkpoint
        that was not adopted), with their sizes: :func:`coverage` holds ``.metadata`` to
        them, a shard it names that is not there being missing (``CK-F105``)."""
        listed = cls(sizes, lambda name: None)
        listed.unlisted = codes.F105
        return listed

    @classmethod
    def of(cls, listed: Mapping[str, mf.FileEntry]) -> Listed:
        """``listed`` itself, or its entries as a :class:`Listed`."""
        return listed if isinstance(listed, Listed) else cls.whole(listed)

    def __getitem__(self, name: str) -> mf.FileEntry:
        fe = self._entry(name) if name in self.sizes else None
        if fe is None:
            raise KeyError(name)
        return fe

    def __contains__(self, name: object) -> bool:
        return name in self.sizes

    def __iter__(self) -> Iterator[str]:
        return iter(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)


def entries(man: mf.Manifest) -> Listed:
    """The manifest's DCP files, keyed by their path inside ``dcp/`` (:class:`Listed`): of a
    partial manifest every file the root records, each entry read when it is needed."""
    prefix = DCP_DIR + "/"
    sizes = man.file_sizes()
    if sizes is None:  # a partial read of a root without sizes: its own entries only
        sizes = {f.path: f.size for f in man.files}
    writers = {p: r.rank for r in man.ranks for p in r.files or ()}
    return Listed(
        {p[len(prefix) :]: n for p, n in sizes.items() if p.startswith(prefix)},
        lambda name: man.entry(prefix + name),
        {p[len(prefix) :]: r for p, r in writers.items() if p.startswith(prefix)},
    )


def read_metadata(root: Location, man: mf.Manifest) -> Any:
    """Read ``dcp/.metadata``: listed, digest-checked, then unpickled with the allow-list.

    Raises:
        IncompleteCheckpointError: ``CK-F001`` the file is missing.
        IntegrityError: not listed (``CK-F021``), size or digest mismatch (``CK-F002/3``),
            or damaged (``CK-F108``).
        UnsafeInputError: not a regular file (``CK-F022``) or it names a global outside
            the allow-list (``CK-F023``).
    """
    return read_metadata_file(root / METADATA_REL, entries(man).get(METADATA), rel=METADATA_REL)


def read_metadata_file(path: Location, fe: mf.FileEntry | None, *, rel: str) -> Any:
    """Read a DCP ``.metadata`` at ``path`` against its manifest entry ``fe``: listed,
    digest-checked, then unpickled with the allow-list (:func:`loads_metadata`).

    The one way ckptkit opens a ``.metadata`` it will act on: the native reader and
    verify (through :func:`read_metadata`) and :mod:`ckptkit.dcp`.

    Raises:
        As :func:`read_metadata`; ``rel`` is the path the errors name.
    """
    if fe is None:
        raise codes.error(
            codes.F021, "DCP metadata is not listed in the manifest: refusing to read it", path=rel
        )
    if fe.size > MAX_METADATA_BYTES:
        raise codes.error(codes.M006, f"DCP metadata declares {fe.size} bytes", path=rel)
    data = read_verified(path, fe, rel=rel)
    try:
        return loads_metadata(data)
    except CkptkitError as e:
        raise type(e)(e.what, path=rel, code=e.code, hint=e.hint) from None
    except pickle.UnpicklingError as e:
        if "not allowed" in str(e):
            raise codes.error(codes.F023, f"{e}; not executed", path=rel) from None
        raise codes.error(codes.F108, f"damaged pickle: {e}", path=rel) from None
    except Exception as e:  # untrusted bytes: any failure is damage, never a traceback
        raise codes.error(codes.F108, f"damaged pickle: {type(e).__name__}: {e}", path=rel) from None


def read_verified(path: Location, fe: mf.FileEntry, *, rel: str) -> bytes:
    """Read a whole small file, refusing non-regular files, and check size and digest."""
    if not fs.is_local(path):
        if fs.kind(path) is None:
            raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel)
        data = fs.read_small(path, fe.size)
    else:
        with open_regular(path, rel=rel) as f:
            size = os.fstat(f.fileno()).st_size
            if size != fe.size:
                raise codes.error(
                    codes.F002, f"size is {size} bytes, the manifest records {fe.size}", path=rel
                )
            data = f.read(fe.size + 1)
    if len(data) != fe.size:
        raise codes.error(codes.F002, "file changed size while it was read", path=rel)
    got = digest.hexdigest_bytes(data)
    if got != fe.xxh3_128:
        raise codes.error(
            codes.F003, f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)", path=rel
        )
    return data


@contextlib.contextmanager
def open_regular(path: Location, *, rel: str) -> Iterator[io.BufferedReader]:
    """Open a listed local file for reading, only if it is a regular file (never blocks).

    Raises:
        IncompleteCheckpointError: ``CK-F001`` it does not exist.
        UnsafeInputError: ``CK-F022`` it is a FIFO, device, directory or symlink.
        UnreadableError: ``CK-F025`` it cannot be read now (a permission, an I/O error).
    """
    try:
        raw = files.open_regular(str(path), code=codes.F022, rel=rel)
    except FileNotFoundError:
        raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel) from None
    except OSError as e:  # a permission or I/O error is not damage: the classifier says
        raise codes.read_error(e, path=rel) from None
    with io.BufferedReader(cast(Any, raw)) as f:
        yield f


# --- coverage: what .metadata asks a load to read ---------------------------------------------


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
            load_byte_item(_untransformed(raw, it.descriptors), fqn=it.fqn, rel=it.rel)
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
        return fs.read_ranges(path, [(it.offset, it.offset + it.length)])[0]
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
        it = _item(idx, info, byte_io=idx.fqn in byte_io and idx.offset is None, prefix=prefix)
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


def _item(idx: Any, info: Any, *, byte_io: bool = False, prefix: str = DCP_DIR) -> Item:
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


def _untransformed(raw: bytes, descriptors: Sequence[str]) -> bytes:
    """The item's bytes after DCP's load transforms (none for what ckptkit writes)."""
    if not descriptors:
        return raw
    from torch.distributed.checkpoint.filesystem import _StorageReaderTransforms

    stream = _StorageReaderTransforms().transform_load_stream(
        cast(Any, None), descriptors, io.BytesIO(raw)
    )
    return bytes(stream.read(-1))


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
                        raw = _untransformed(bytes(buf), it.descriptors)
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


def check_file(path: Location, fe: mf.FileEntry, *, rel: str) -> None:
    """Hash a whole file (one read, :class:`Shard`) and compare size and digest with its entry."""
    with open_shard(path, rel=rel, expected_size=fe.size) as shard:
        shard.verify(fe)


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
            return it if it is not None else _item(idx, self.storage_data[idx], prefix=self._prefix)

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


SHARD_CHUNK = 1 << 20
"""Bytes a shard read moves (and then hashes, while they are still in the CPU cache) per
step: hashing right behind the copy makes the digest cost a cache read, not a second
pass over memory."""
READ_GAP = 64 << 10
"""A read that starts at most this far past the hashed prefix hashes the gap first (the
zip headers between the records of a ``torch.save`` item); a read further ahead (the zip
directory at an item's end, which ``torch.load`` reads first) is hashed when the prefix
reaches it, re-read then: a few hundred bytes per item."""


class Shard:
    """One listed DCP file, read once: each byte hashed in file order as it is read.

    The reader of a load asks for byte ranges (:meth:`read_into`, or :meth:`item`, the
    file-like view ``torch.load`` parses), and the bytes land straight in the caller's
    buffer (a tensor's storage): a plain ``pread`` locally, as DCP's own reader does; a
    copy out of the one download remotely. Bytes that extend the hashed prefix are hashed
    right after they land, in :data:`SHARD_CHUNK` steps; :meth:`verify` hashes what no
    read asked for and compares the digest with the manifest's. There is no memory map
    (a file cut short while mapped kills the process with ``SIGBUS``; a short ``pread``
    is an error with a code).

    Open one with :func:`open_shard`.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "s"; _ = p.write_bytes(b"abcdef")
        >>> fe = mf.FileEntry(path="s", size=6, xxh3_128=digest.hexdigest_bytes(b"abcdef"))
        >>> with open_shard(fs.location(p), rel="s", expected_size=6) as sh:
        ...     buf = bytearray(2); _ = sh.read_into(2, memoryview(buf)); sh.verify(fe)
        >>> bytes(buf)
        b'cd'
    """

    def __init__(self, read_at: Callable[[int, memoryview], int], size: int, *, rel: str) -> None:
        """``read_at(pos, dst)`` reads up to ``len(dst)`` bytes at ``pos`` into ``dst``
        and returns how many (0 at the end of the file)."""
        self.size = size
        self.rel = rel
        self._read_at = read_at
        self._h = digest.new()
        self.hashed = 0
        """Bytes ``[0, hashed)`` are in the digest."""
        self._scratch: bytearray | None = None

    def read_into(self, pos: int, dst: memoryview) -> int:
        """Fill ``dst`` (a flat byte view) with the bytes at ``pos``; return how many
        (fewer only at the end of the file).

        Raises:
            IntegrityError: ``CK-F002`` the file got shorter while it was read.
            CkptkitError: ``CK-F025``/``CK-F004`` the read failed (:func:`ckptkit.codes.read_error`).
        """
        n = max(0, min(len(dst), self.size - pos))
        if self.hashed < pos <= self.hashed + READ_GAP:
            self.hash_to(pos)
        done = 0
        while done < n:
            k = min(SHARD_CHUNK, n - done)
            at = pos + done
            with dst[done : done + k] as part:
                self._fill(at, part)
                if at <= self.hashed < at + k:
                    with part[self.hashed - at :] as fresh:
                        self._h.update(fresh)
                    self.hashed = at + k
            done += k
        return n

    def hash_to(self, end: int) -> None:
        """Hash ``[hashed, end)``, reading it now (bytes no read asked for, or asked for
        ahead of the prefix)."""
        end = min(end, self.size)
        while self.hashed < end:
            k = min(SHARD_CHUNK, end - self.hashed)
            if self._scratch is None or len(self._scratch) < k:
                self._scratch = bytearray(k)
            with memoryview(self._scratch)[:k] as part:
                self._fill(self.hashed, part)
                self._h.update(part)
            self.hashed += k

    def verify(self, fe: mf.FileEntry) -> None:
        """Hash the rest of the file and compare with the manifest's digest.

        Raises:
            IntegrityError: ``CK-F003`` the digest does not match.
        """
        got = self.hexdigest()
        if got != fe.xxh3_128:
            raise codes.error(
                codes.F003,
                f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)",
                path=self.rel,
            )

    def hexdigest(self) -> str:
        """The digest of the whole file (what no read asked for is read now)."""
        self.hash_to(self.size)
        return str(self._h.hexdigest())

    def item(self, offset: int, length: int) -> IO[bytes]:
        """The bytes ``[offset, offset + length)`` as a seekable file (what ``torch.load``
        reads), every read going through :meth:`read_into`."""
        return cast(IO[bytes], _ItemReader(self, offset, length))

    def _fill(self, pos: int, dst: memoryview) -> None:
        got = 0
        try:
            while got < len(dst):
                with dst[got:] as rest:
                    k = self._read_at(pos + got, rest)
                if not k:
                    break
                got += k
        except OSError as e:
            raise codes.read_error(e, path=self.rel) from None
        if got != len(dst):
            raise codes.error(
                codes.F002,
                f"file changed size while it was read (ended at byte {pos + got} of {self.size})",
                path=self.rel,
            )


@contextlib.contextmanager
def open_shard(path: Location, *, rel: str, expected_size: int | None) -> Iterator[Shard]:
    """Open a listed file for one hashed read (:class:`Shard`): locally with ``pread``
    on the open file, remotely from one streamed download.

    Args:
        path: the file.
        rel: how errors name it.
        expected_size: the size the manifest records (None: whatever it is now).

    Raises:
        IncompleteCheckpointError: ``CK-F001`` missing.
        IntegrityError: ``CK-F002`` its size is not ``expected_size``.
        UnsafeInputError: ``CK-F022`` not a regular file.
        CkptkitError: ``CK-F025`` it cannot be read now.
    """
    if not fs.is_local(path):
        if fs.kind(path) is None:
            raise codes.error(codes.F001, "file listed in the manifest is missing", path=rel)
        size = fs.size(path)
        _check_size(size, expected_size, rel)
        buf = bytearray(size)
        try:
            got = fs.read_into(path, buf) if size else 0
        except OSError as e:
            raise codes.read_error(e, path=rel) from None
        if got != size:
            raise codes.error(codes.F002, f"read {got} of {size} bytes", path=rel)
        with memoryview(buf) as whole:

            def copy_at(pos: int, dst: memoryview) -> int:
                n = max(0, min(len(dst), size - pos))
                dst[:n] = whole[pos : pos + n]
                return n

            yield Shard(copy_at, size, rel=rel)
        return
    with open_regular(path, rel=rel) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        _check_size(size, expected_size, rel)
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        yield Shard(lambda pos, dst: os.preadv(fd, [dst], pos), size, rel=rel)


def _check_size(size: int, expected: int | None, rel: str) -> None:
    if expected is not None and size != expected:
        raise codes.error(
            codes.F002, f"size is {size} bytes, the manifest records {expected}", path=rel
        )


class _ItemReader(io.RawIOBase):
    """A seekable view of one item's bytes in a :class:`Shard` (what ``torch.load`` reads).

    Each read lands in the caller's buffer (the tensor's storage) directly.
    """

    def __init__(self, shard: Shard, offset: int, length: int) -> None:
        super().__init__()
        self._shard = shard
        self._off = offset
        self._len = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        with memoryview(b) as dst, dst.cast("B") as flat:
            n = max(0, min(len(flat), self._len - self._pos))
            with flat[:n] as out:
                n = self._shard.read_into(self._off + self._pos, out)
        self._pos += n
        return n

    def readall(self) -> bytes:
        buf = bytearray(max(0, self._len - self._pos))
        n = self.readinto(buf)
        return bytes(buf[:n])


# --- errors -------------------------------------------------------------------------------------


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn DCP's ``CheckpointException`` (a ``BaseException``) into a ckptkit error."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        raise translate(e, what) from None
    except CkptkitError:
        raise
    except OSError as e:
        if codes.transient(e):
            raise codes.read_error(e, path=what) from None
        raise DistributedError(
            f"{what} failed: {type(e).__name__}: {e}",
            hint="the DCP files do not fit this model/optimizer or are damaged; restore "
            "another checkpoint",
        ) from e
    except (RuntimeError, ValueError, KeyError, AssertionError) as e:
        raise DistributedError(
            f"{what} failed: {type(e).__name__}: {e}",
            hint="the DCP files do not fit this model/optimizer or are damaged; restore "
            "another checkpoint",
        ) from e


def translate(exc: BaseException, what: str) -> CkptkitError:
    """The ckptkit error for a DCP ``CheckpointException``: the first ckptkit error inside
    it (raised by our reader on some rank), else a :class:`DistributedError` naming each
    rank's failure."""
    failures: Mapping[int, Any] = getattr(exc, "failures", {}) or {}
    for rank, wrapped in sorted(failures.items()):
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(inner, CkptkitError):
            if len(failures) > 1 or rank != 0:
                inner.what += f" (on rank {rank})"
                inner.args = (inner._render(),)
            return inner
    parts = []
    for rank, wrapped in sorted(failures.items()):
        inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        parts.append(f"rank {rank}: {type(inner).__name__}: {inner}")
    return DistributedError(
        f"{what} failed: " + (" | ".join(parts) or str(exc)),
        hint="the DCP files do not fit this model/optimizer, or a rank failed; see the "
        "message, then restore another checkpoint",
    )


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    # DCP warns once per call without a process group ("assuming the intent is to load in a
    # single process"): that is exactly the world-size-1 save/resume we mean to do.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*process group.*")
        warnings.filterwarnings("ignore", message=".*single process.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        yield


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
    "DCP_COMPONENT",
    "DCP_DIR",
    "FREE_CHUNKS",
    "MARK",
    "METADATA",
    "METADATA_BYTES_PER_CHUNK",
    "METADATA_REL",
    "SHARD_CHUNK",
    "HashingFileSystem",
    "Item",
    "ItemBytes",
    "Layout",
    "MetadataUnpickler",
    "Shard",
    "ShardPass",
    "check_file",
    "check_shards",
    "check_unread",
    "classes",
    "coverage",
    "entries",
    "entry_problem",
    "files_of",
    "hashing_filesystem",
    "layout",
    "load",
    "load_byte_item",
    "load_tensor_item",
    "loads_metadata",
    "open_regular",
    "open_shard",
    "read_item",
    "read_metadata",
    "read_metadata_file",
    "read_state",
    "read_verified",
    "rel_in",
    "save",
    "translate",
    "writer_for",
    "written_here",
]
