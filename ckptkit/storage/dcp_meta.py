"""A DCP directory's ``.metadata`` and the manifest's list of its files, read safely.

Names and limits of a DCP directory inside a checkpoint; ``.metadata`` read only when the
manifest lists it, digest-checked, then unpickled with an allow-list of DCP's metadata
classes (:class:`MetadataUnpickler`) and bounded in the chunks it may declare, never plain
pickle; the manifest's entries of the DCP files by name (:class:`Listed`).
"""

from __future__ import annotations

import importlib
import io
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.storage.dcp_shard import read_verified
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
        >>> import io, os, pickle
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


__all__ = [
    "DCP_COMPONENT",
    "DCP_DIR",
    "FREE_CHUNKS",
    "MARK",
    "METADATA",
    "METADATA_BYTES_PER_CHUNK",
    "METADATA_REL",
    "MetadataUnpickler",
    "entries",
    "loads_metadata",
    "read_metadata",
    "read_metadata_file",
    "written_here",
]
