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
import os
import pickle
import stat
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from ckptkit import codes
from ckptkit import manifest as mf
from ckptkit.errors import CkptkitError, DistributedError
from ckptkit.storage import digest

DCP_DIR = "dcp"
"""Subdirectory of a checkpoint holding ``torch.distributed.checkpoint`` files."""
DCP_COMPONENT = "dcp"
"""``component`` of the manifest entries of DCP files (they hold model and optimizer)."""
METADATA = ".metadata"
MAX_METADATA_BYTES = 1 << 30
"""Refuse a ``.metadata`` larger than this before reading it."""

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
    """Unpickle ``.metadata`` bytes with :class:`MetadataUnpickler`.

    Raises:
        pickle.UnpicklingError: a global outside the allow-list (never executed).
        Exception: whatever a damaged pickle raises; callers treat any as damage.
    """
    return MetadataUnpickler(io.BytesIO(data)).load()


# --- writing ------------------------------------------------------------------------------------


def save(
    state_dict: dict[str, Any], root: Path, *, fsync: bool = True, process_group: Any = None
) -> None:
    """Write ``state_dict`` (DTensors stay sharded) with DCP into ``root/dcp`` (collective).

    Without a process group this is a one-process DCP save (``no_dist``), the world of one.

    Raises:
        CkptkitError: DCP failed (its ``CheckpointException`` translated).
    """
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(root / DCP_DIR), sync_files=fsync, thread_count=2)
    with _translated("DCP save"), _quiet():
        dcp.save(state_dict, storage_writer=writer, process_group=process_group)


def files_of(root: Path, rank: int) -> list[str]:
    """The DCP files rank ``rank`` wrote under ``root/dcp`` (rank 0 also owns ``.metadata``)."""
    d = root / DCP_DIR
    rels = sorted(f"{DCP_DIR}/{p.name}" for p in d.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (d / METADATA).exists():
        rels.append(f"{DCP_DIR}/{METADATA}")
    return rels


# --- reading ------------------------------------------------------------------------------------


def entries(man: mf.Manifest) -> dict[str, mf.FileEntry]:
    """The manifest's DCP file entries, keyed by their path inside ``dcp/``."""
    prefix = DCP_DIR + "/"
    return {f.path[len(prefix) :]: f for f in man.files if f.path.startswith(prefix)}


def read_metadata(root: Path, man: mf.Manifest) -> Any:
    """Read ``dcp/.metadata``: listed, digest-checked, then unpickled with the allow-list.

    Raises:
        IncompleteCheckpointError: ``CK-F001`` the file is missing.
        IntegrityError: not listed (``CK-F021``), size or digest mismatch (``CK-F002/3``),
            or damaged (``CK-F108``).
        UnsafeInputError: not a regular file (``CK-F022``) or it names a global outside
            the allow-list (``CK-F023``).
    """
    rel = f"{DCP_DIR}/{METADATA}"
    fe = entries(man).get(METADATA)
    if fe is None:
        raise codes.error(
            "CK-F021", "DCP metadata is not listed in the manifest: refusing to read it", path=rel
        )
    if fe.size > MAX_METADATA_BYTES:
        raise codes.error("CK-M006", f"DCP metadata declares {fe.size} bytes", path=rel)
    data = read_verified(root / rel, fe, rel=rel)
    try:
        return loads_metadata(data)
    except pickle.UnpicklingError as e:
        if "not allowed" in str(e):
            raise codes.error("CK-F023", f"{e}; not executed", path=rel) from None
        raise codes.error("CK-F108", f"damaged pickle: {e}", path=rel) from None
    except Exception as e:  # untrusted bytes: any failure is damage, never a traceback
        raise codes.error("CK-F108", f"damaged pickle: {type(e).__name__}: {e}", path=rel) from None


def read_verified(path: Path, fe: mf.FileEntry, *, rel: str) -> bytes:
    """Read a whole small file, refusing non-regular files, and check size and digest."""
    with open_regular(path, rel=rel) as f:
        size = os.fstat(f.fileno()).st_size
        if size != fe.size:
            raise codes.error(
                "CK-F002", f"size is {size} bytes, the manifest records {fe.size}", path=rel
            )
        data = f.read(fe.size + 1)
    if len(data) != fe.size:
        raise codes.error("CK-F002", "file changed size while it was read", path=rel)
    got = digest.hexdigest_bytes(data)
    if got != fe.xxh3_128:
        raise codes.error(
            "CK-F003", f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)", path=rel
        )
    return data


@contextlib.contextmanager
def open_regular(path: Path, *, rel: str) -> Iterator[io.BufferedReader]:
    """Open ``path`` for reading only if it is a regular file (never blocks on a FIFO).

    Raises:
        IncompleteCheckpointError: ``CK-F001`` it does not exist.
        UnsafeInputError: ``CK-F022`` it is a FIFO, device, directory or symlink.
    """
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        )
    except FileNotFoundError:
        raise codes.error("CK-F001", "file listed in the manifest is missing", path=rel) from None
    except OSError as e:
        raise codes.error(
            "CK-F022", f"cannot be opened as a regular file ({e.strerror})", path=rel
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise codes.error("CK-F022", f"is a {_kind(mode)}, not a regular file", path=rel)
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symlink"),
    ):
        if test(mode):
            return name
    return "special file"


def load(
    state_dict: dict[str, Any],
    root: Path,
    man: mf.Manifest,
    *,
    verify_rank: int = 0,
    verify_world: int = 1,
) -> None:
    """Read DCP state of ``root/dcp`` into ``state_dict`` in place, resharding (collective).

    Every byte is read once and checked against the manifest on the way; shard files no
    rank reads are hashed by the rank they are assigned to (``verify_rank`` of
    ``verify_world``), so every listed file is checked by someone.

    Raises:
        CkptkitError: any failure, on every rank (DCP propagates failures to all ranks).
    """
    import torch.distributed.checkpoint as dcp

    md = read_metadata(root, man)
    listed = entries(man)
    planner_cls, reader_cls = _classes()
    reader = reader_cls(root / DCP_DIR, md, listed)
    with _translated("DCP load"), _quiet():
        dcp.load(state_dict, storage_reader=reader, planner=planner_cls())
    mine = sorted(n for n in listed if n != METADATA)[verify_rank::verify_world]
    for name in mine:
        if name not in reader.checked:
            check_file(root / DCP_DIR / name, listed[name], rel=f"{DCP_DIR}/{name}")


def check_file(path: Path, fe: mf.FileEntry, *, rel: str) -> None:
    """Hash a whole file (streaming) and compare size and digest with its entry."""
    with open_regular(path, rel=rel) as f:
        size = os.fstat(f.fileno()).st_size
        if size != fe.size:
            raise codes.error(
                "CK-F002", f"size is {size} bytes, the manifest records {fe.size}", path=rel
            )
        h = digest.new()
        while chunk := f.read(digest.CHUNK):
            h.update(chunk)
    got = h.hexdigest()
    if got != fe.xxh3_128:
        raise codes.error(
            "CK-F003", f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)", path=rel
        )


def _set_element(root: Any, path: Any, value: Any) -> None:
    from torch.distributed.checkpoint._traverse import set_element

    set_element(root, path, value)


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    from torch.distributed._shard._utils import narrow_tensor_by_index

    return cast(torch.Tensor, narrow_tensor_by_index(tensor, offsets, lengths))


@functools.cache
def _classes() -> tuple[type, type]:
    """The DCP reader and planner subclasses, built on first use.

    ``torch.distributed.checkpoint`` takes about a second to import; a run that never
    touches DCP storage never pays for it.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):  # type: ignore[misc]
        """DCP's default load planner with non-tensor items parsed by ``weights_only=True``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                _set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    class VerifyingReader(FileSystemReader):  # type: ignore[misc]
        """A DCP ``FileSystemReader`` that reads each listed shard once, hashing as it goes.

        Args:
            path: the ``dcp/`` directory.
            metadata: the already verified and safely unpickled ``.metadata``.
            listed: the manifest's entries of the DCP files, keyed by name inside ``dcp/``.
        """

        def __init__(self, path: Path, metadata: Any, listed: Mapping[str, mf.FileEntry]) -> None:
            super().__init__(str(path))
            self._metadata = metadata
            self._listed = dict(listed)
            self._dir = Path(path)
            self.checked: set[str] = set()
            """Shard names whose digest was checked by a read."""

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

        def _read_file(self, name: str, reqs: Sequence[Any], planner: Any) -> None:
            from torch.distributed.checkpoint.planner import LoadItemType

            rel = f"{DCP_DIR}/{name}"
            fe = self._listed.get(name)
            if fe is None or "/" in name or name in ("", ".", ".."):
                raise codes.error(
                    "CK-F021",
                    "DCP metadata names a shard the manifest does not list: refusing to read it",
                    path=rel,
                )
            spans = sorted(
                reqs,
                key=lambda r: (
                    self.storage_data[r.storage_index].offset,
                    self.storage_data[r.storage_index].length,
                ),
            )
            deferred: list[tuple[Any, bytes, Any]] = []
            with open_regular(self._dir / name, rel=rel) as f:
                size = os.fstat(f.fileno()).st_size
                if size != fe.size:
                    raise codes.error(
                        "CK-F002", f"size is {size} bytes, the manifest records {fe.size}", path=rel
                    )
                with digest.PipelinedHasher() as h:
                    pos = 0
                    for req in spans:
                        info = self.storage_data[req.storage_index]
                        off, length = int(info.offset), int(info.length)
                        if off < 0 or length < 0 or off + length > size:
                            raise codes.error(
                                "CK-F106",
                                f"item {req.storage_index.fqn} lies past the end of the "
                                f"shard ({off}+{length} > {size} bytes)",
                                path=rel,
                            )
                        if off < pos:  # overlapping items (never written by DCP): read again
                            f.seek(off)
                            buf = f.read(length)
                            f.seek(pos)
                        else:
                            _skip_hashed(f, off - pos, h, rel)
                            buf = _read_hashed(f, length, h, rel)
                            pos = off + length
                        stream = self.transforms.transform_load_stream(
                            req, info.transform_descriptors or (), io.BytesIO(buf)
                        )
                        if req.type == LoadItemType.BYTE_IO:
                            deferred.append((req, stream.read(-1), info))
                            continue
                        raw = stream if stream.seekable() else io.BytesIO(stream.read(-1))
                        tensor = cast(
                            torch.Tensor, torch.load(raw, map_location="cpu", weights_only=True)
                        )
                        tensor = _narrow(tensor, req.storage_offsets, req.lengths)
                        target = planner.resolve_tensor(req).detach()
                        if target.size() != tensor.size():
                            raise codes.error(
                                "CK-F106",
                                f"item {req.storage_index.fqn} has size {tuple(tensor.size())}, the "
                                f"model expects {tuple(target.size())}",
                                path=rel,
                            )
                        target.copy_(tensor)
                        planner.commit_tensor(req, target)
                    _skip_hashed(f, size - pos, h, rel)
                    got = h.hexdigest()
            if got != fe.xxh3_128:
                raise codes.error(
                    "CK-F003",
                    f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {got[:12]}…)",
                    path=rel,
                )
            self.checked.add(name)
            for req, data, _info in deferred:  # parsed only now that the bytes are proven
                planner.load_bytes(req, io.BytesIO(data))

    return SafeLoadPlanner, VerifyingReader


def _read_hashed(f: io.BufferedReader, n: int, h: digest.PipelinedHasher, rel: str) -> bytes:
    """Read exactly ``n`` bytes and queue them for hashing (``bytes`` are immutable, so the
    hasher thread may read them while the caller parses)."""
    parts = []
    left = n
    while left > 0:
        chunk = f.read(left)
        if not chunk:
            raise codes.error("CK-F002", "file ends inside an item (truncated)", path=rel)
        h.update(chunk)
        parts.append(chunk)
        left -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _skip_hashed(f: io.BufferedReader, n: int, h: digest.PipelinedHasher, rel: str) -> None:
    while n > 0:
        chunk = f.read(min(n, digest.CHUNK))
        if not chunk:
            raise codes.error("CK-F002", "file is shorter than its items (truncated)", path=rel)
        h.update(chunk)
        n -= len(chunk)


# --- errors -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn DCP's ``CheckpointException`` (a ``BaseException``) into a ckptkit error."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        raise translate(e, what) from None
    except CkptkitError:
        raise
    except (RuntimeError, ValueError, KeyError, AssertionError, OSError) as e:
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
def _quiet() -> Iterator[None]:
    # DCP warns once per call without a process group ("assuming the intent is to load in a
    # single process"): that is exactly the world-size-1 save/resume we mean to do.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*process group.*")
        warnings.filterwarnings("ignore", message=".*single process.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        yield


__all__ = [
    "DCP_COMPONENT",
    "DCP_DIR",
    "METADATA",
    "MetadataUnpickler",
    "check_file",
    "entries",
    "files_of",
    "load",
    "loads_metadata",
    "open_regular",
    "read_metadata",
    "read_verified",
    "save",
    "translate",
]
