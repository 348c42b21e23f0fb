"""Checksums for every ``torch.distributed.checkpoint`` save, and a reader that checks them.

A drop-in storage layer for plain DCP::

    import torch.distributed.checkpoint as dcp
    import ckptkit.checkpoint.dcp

    dcp.save(state_dict, storage_writer=ckptkit.dcp.Writer("ckpt/step-100", step=100))
    dcp.load(state_dict, storage_reader=ckptkit.dcp.Reader("ckpt/step-100"))

or the wrappers :func:`save`, :func:`async_save` and :func:`load` (which also turn DCP's
``CheckpointException``, a ``BaseException``, into the ckptkit error inside it).

Writing. :class:`Writer` is DCP's own ``FileSystemWriter`` (its fsspec filesystem for a
URL such as ``s3://``) whose filesystem hashes every stream as DCP writes it
(:class:`ckptkit.storage.dcp_write.HashingFileSystem`): each rank knows the xxh3-128 and size
of its ``.distcp`` files when the last byte is written, nothing is read back. The digests
travel to the coordinator with DCP's own write results; after DCP has written
``.metadata``, the coordinator commits ``ckptkit-manifest.json`` (:data:`MANIFEST_NAME`)
atomically (temporary, fsync, rename, directory fsync; one PUT on an object store),
HMAC-signed when a key is configured. The manifest is the commit marker: a directory with
``.metadata`` and no manifest is an incomplete save.

It is the manifest ``ckptkit adopt`` writes (``user.adopted.files`` holds every file's
size and digest), so ``ckptkit verify``, ``ls``, ``whatis`` and the run layouts read it
with no DCP-specific code.

Reading. :class:`Reader` reads the manifest (and checks its signature), reads
``.metadata`` once, checks its digest and unpickles it with an allow-list of DCP's
metadata classes (never plain ``pickle``), checks that every item ``.metadata`` points at
lies in a listed file, inside the size the manifest records (``coverage``), then reads
each shard once, hashing it as the tensors are parsed from the same bytes, and refuses it
when its last byte does not match. Non-tensor items are parsed with
``torch.load(weights_only=True)`` only after their file's digest matched. A refusal is a
:class:`ckptkit.errors.CkptkitError` carrying the finding code (``CK-M001`` no manifest,
``CK-F002`` size, ``CK-F003`` digest, ...).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as _dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.storage import WriteResult

from ckptkit import codes
from ckptkit.checkpoint import lookahead as lookahead_mod
from ckptkit.checkpoint import manifest_io
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format import signing
from ckptkit.storage import dcp_engine as store
from ckptkit.storage import dcp_errors, dcp_items, dcp_meta, dcp_write, fs
from ckptkit.storage.fs import Location

MANIFEST_NAME = mf.ADOPTED_SUFFIX
"""``ckptkit-manifest.json``: the manifest's name inside the DCP directory (beside
``.metadata``); written last, it is the commit marker."""
WRITER = "ckptkit.dcp"
"""``user.adopted.writer`` of a manifest written at save time (``ckptkit adopt`` writes none)."""

_SafeLoadPlanner, _VerifyingReader = store.classes()


@dataclass(frozen=True)
class _DigestedWriteResult(WriteResult):  # type: ignore[misc]
    """DCP's write result of one item, with the digest of the file it lies in.

    DCP gathers every rank's write results to the coordinator for ``.metadata``; the
    digests ride along (``finish`` keeps only ``storage_data`` for ``.metadata``).
    """

    file_xxh3_128: str = ""
    file_size: int = -1


class Writer(FileSystemWriter):  # type: ignore[misc]
    """DCP's ``FileSystemWriter``, hashing every byte it writes and committing a manifest.

    Args:
        path: the checkpoint directory: a local path or an fsspec URL (``s3://b/run/step-5``).
        key: an HMAC key to sign the manifest with; None uses the configured one
            (``CKPTKIT_HMAC_KEY`` / ``CKPTKIT_HMAC_KEY_FILE``: :func:`ckptkit.format.signing.resolve_key`),
            if any.
        step: the training step to record (``ckptkit ls`` and the run layouts show it).
        lookahead: the manifest's ``lookahead`` (what the next step will use, for the
            resume guard): :func:`ckptkit.checkpoint.lookahead.record` of the live optimizer and
            scheduler, as an integration builds it. None with a ``step``: the look-ahead
            of that step alone (the next step number and an RNG fingerprint), computed
            here, when the writer is built (the instant of the save call).
        **kwargs: ``FileSystemWriter``'s own (``thread_count``, ``sync_files``, ...).

    After the save, :attr:`manifest` holds what the coordinator committed (None on the
    other ranks).

    Example:
        >>> import tempfile, warnings, torch, torch.distributed.checkpoint as dcp
        >>> d = tempfile.mkdtemp() + "/step-1"
        >>> with warnings.catch_warnings():  # DCP warns that no process group is up
        ...     warnings.simplefilter("ignore")
        ...     _ = dcp.save({"w": torch.ones(2)}, storage_writer=Writer(d, step=1))
        >>> read_manifest(d).step
        1
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key: bytes | str | None = None,
        step: int | None = None,
        lookahead: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        loc = fs.location(path)
        super().__init__(fs.url(loc), **kwargs)
        self.path, self.hashing = dcp_write.hashing_filesystem(loc)
        """DCP's filesystem (local or fsspec), hashing every file written (``digests``)."""
        self.fs = cast(Any, self.hashing)
        self.key = signing.resolve_key(key)
        self.step = mf.check_step(step) if step is not None else None
        if lookahead is None and self.step is not None:
            # Now, not at commit: the commit comes after the bytes are written (in the
            # background for an async save), when the run may have stepped on.
            lookahead = lookahead_mod.record(step=self.step)
        self.lookahead: dict[str, Any] | None = dict(lookahead) if lookahead is not None else None
        """The look-ahead the manifest records (None: none)."""
        self.manifest: mf.Manifest | None = None
        """The manifest the coordinator committed (after ``finish``)."""
        self._coordinator = False

    @property
    def location(self) -> Location:
        """Where the checkpoint is being written."""
        return fs.location(os.fspath(self.path))

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            checkpoint_id = fs.url(fs.location(checkpoint_id))
        super().reset(checkpoint_id)
        self.hashing.digests.clear()
        self.manifest = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if not self.use_collectives:
            raise codes.error(
                codes.F021,
                "ckptkit.dcp.Writer needs DCP's collectives (one .metadata for all ranks); "
                "use_collectives=False writes one per rank",
                path=fs.url(self.location),
            )
        self._coordinator = is_coordinator

    def storage_meta(self) -> Any:
        # DCP's own record of the save, with this writer's mark (its ``modules``, a list
        # DCP keeps but never reads): ``ckptkit verify`` then knows a ``.metadata`` left
        # without its manifest by a save that died as an uncommitted ckptkit.dcp save.
        meta = super().storage_meta()
        if meta is not None:
            meta.modules = [*meta.modules, dcp_meta.MARK]
        return meta

    def prepare_local_plan(self, plan: Any) -> Any:
        plan = super().prepare_local_plan(plan)
        if self._coordinator:
            # Overwriting a checkpoint: the old manifest goes first, so a crash mid-save
            # leaves a directory that says "not committed", never old digests over new
            # bytes. DCP gathers the plans before any rank writes, so this precedes them.
            where = self.location / MANIFEST_NAME
            if fs.kind(where) is not None:
                fs.remove_file(where)
        return plan

    def write_data(self, plan: Any, planner: Any) -> torch.futures.Future[list[WriteResult]]:
        fut = super().write_data(plan, planner)

        def digested(done: torch.futures.Future[list[WriteResult]]) -> list[WriteResult]:
            out: list[WriteResult] = []
            for wr in done.value():
                hexd, size = self.hashing.digests[wr.storage_data.relative_path]
                out.append(
                    _DigestedWriteResult(
                        index=wr.index,
                        size_in_bytes=wr.size_in_bytes,
                        storage_data=wr.storage_data,
                        file_xxh3_128=hexd,
                        file_size=size,
                    )
                )
            return out

        return cast("torch.futures.Future[list[WriteResult]]", fut.then(digested))

    def finish(self, metadata: Any, results: list[list[WriteResult]]) -> None:
        files: dict[str, tuple[str, int]] = {}
        for wr_list in results:
            for wr in wr_list:
                name = wr.storage_data.relative_path
                if not isinstance(wr, _DigestedWriteResult):
                    raise codes.error(
                        codes.F021,
                        f"a rank wrote {name} without hashing it (not through "
                        "ckptkit.dcp.Writer): refusing to commit a manifest that cannot "
                        "vouch for it",
                        path=fs.url(self.location / name),
                    )
                files[name] = (wr.file_xxh3_128, wr.file_size)
        super().finish(metadata, results)
        files[dcp_meta.METADATA] = self.hashing.digests[dcp_meta.METADATA]
        self.manifest = commit(
            self.location, files, key=self.key, step=self.step, lookahead=self.lookahead
        )


def commit(
    where: Location,
    files: Mapping[str, tuple[str, int]],
    *,
    key: bytes | None = None,
    step: int | None = None,
    lookahead: Mapping[str, Any] | None = None,
) -> mf.Manifest:
    """Write the manifest of the DCP directory ``where``: ``files`` with their digests.

    Atomic: a temporary sibling, fsync, rename, directory fsync (one PUT on an object
    store). What is written is read back through the parser first, as every reader will.

    Args:
        where: the DCP directory.
        files: ``{name inside it: (xxh3-128, size)}``, ``.metadata`` included.
        key: sign with this key (already resolved).
        step: the step to record.
        lookahead: the look-ahead to record (the manifest's ``lookahead``, the field the
            native path writes, which verify and the resume guard read).
    """
    record = {
        "format": "dcp",
        "target": where.name,
        "files": [
            {"path": name, "size": size, "xxh3_128": hexd}
            for name, (hexd, size) in sorted(files.items())
        ],
        "missing": [],
        "findings": [],
        "writer": WRITER,
    }
    man = mf.Manifest(
        files=(),
        tensors=(),
        tree=None,
        components={},
        env={"torch": torch.__version__, "python": platform.python_version()},
        step=step,
        lookahead=dict(lookahead) if lookahead is not None else None,
        user={"adopted": record},
    )
    if key is not None:
        man = man.signed(key)
    text = man.to_json()
    target = where / MANIFEST_NAME
    man = mf.Manifest.from_json(text, path=fs.url(target), key=key)
    fs.replace_bytes(target, text.encode())
    fs.sync_dir(where)  # the rename is durable (nothing to do on an object store)
    return man


class Reader(_VerifyingReader):  # type: ignore[misc,valid-type]
    """DCP's ``FileSystemReader``, reading only what the manifest vouches for.

    Args:
        path: the checkpoint directory (a local path or an fsspec URL).
        key: the HMAC key the manifest must be signed with; None uses the configured one,
            if any (with none configured, signatures are not required).

    With plain ``dcp.load`` a refusal reaches the caller inside DCP's
    ``CheckpointException`` (a refused manifest or ``.metadata`` as DCP's
    ``AssertionError`` with the finding code in its text, kept in :attr:`refusal`; a
    refused shard as the ckptkit error itself); :func:`load` raises the ckptkit error.

    Example:
        >>> import tempfile, warnings, torch, torch.distributed.checkpoint as dcp
        >>> d = tempfile.mkdtemp() + "/step-1"
        >>> _ = save({"w": torch.ones(2)}, d)
        >>> sd = {"w": torch.zeros(2)}
        >>> with warnings.catch_warnings():  # DCP warns that no process group is up
        ...     warnings.simplefilter("ignore")
        ...     dcp.load(sd, storage_reader=Reader(d))
        >>> sd["w"].tolist()
        [1.0, 1.0]
    """

    def __init__(self, path: str | os.PathLike[str], *, key: bytes | str | None = None) -> None:
        loc = fs.location(path)
        super().__init__(loc, None, {}, prefix="")
        self.key = signing.resolve_key(key)
        self.manifest: mf.Manifest | None = None
        """The manifest the load was checked against (after DCP read the metadata)."""
        self.refusal: CkptkitError | None = None
        """Why the checkpoint was refused before any shard was read (plain ``dcp.load``
        reports it as an ``AssertionError`` naming the code inside its
        ``CheckpointException``)."""

    @property
    def location(self) -> Location:
        """The checkpoint being read."""
        return cast(Location, self._dir)

    @property
    def listed(self) -> dcp_meta.Listed:
        """The manifest's files (after DCP read the metadata), by name."""
        return self._listed

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(checkpoint_id)
        if checkpoint_id is not None:
            self._dir = fs.location(checkpoint_id)
        self.checked.clear()

    def read_metadata(self, *args: Any) -> Any:
        # No ``**kwargs``: DCP then never retries with rank-local metadata (``__0.metadata``,
        # which a manifest does not cover) after the global one was refused.
        try:
            man, md, listed = open_checked(self._dir, key=self.key)
        except CkptkitError as e:
            # DCP turns a metadata failure into an AssertionError carrying only its text;
            # the error itself stays here for :func:`load` (and any caller) to raise.
            self.refusal = e
            raise
        self.manifest, self._metadata, self._listed = man, md, dcp_meta.Listed.whole(listed)
        return super().read_metadata(*args)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            fs.location(checkpoint_id)
        except CkptkitError:
            return False
        return True


def open_checked(
    where: Location, *, key: bytes | None = None
) -> tuple[mf.Manifest, Any, dict[str, mf.FileEntry]]:
    """Everything a load of the DCP directory ``where`` checks before any shard is opened.

    The manifest (present: committed; signed with ``key`` when one is given), its file
    list, ``.metadata`` (listed, digest-checked, unpickled with the allow-list) and the
    coverage of every item by a listed file (:func:`ckptkit.storage.dcp_items.coverage`).

    Returns:
        ``(manifest, .metadata, {file name: its entry})``.

    Raises:
        CkptkitError: the first problem, with its finding code.
    """
    man = manifest_io.read_path(where / MANIFEST_NAME, key=key)
    listed = {fe.path: fe for fe in mf.adopted_files(man, path=MANIFEST_NAME)}
    md = dcp_meta.read_metadata_file(where / dcp_meta.METADATA, listed.get(dcp_meta.METADATA), rel=dcp_meta.METADATA)
    problems = dcp_items.coverage(md, listed, prefix="")
    if problems:
        raise problems[0]
    return man, md, listed


def read_manifest(path: str | os.PathLike[str], *, key: bytes | str | None = None) -> mf.Manifest:
    """Read the manifest of a DCP directory (and check its signature under ``key``).

    Raises:
        IncompleteCheckpointError: ``CK-M001`` there is none: the save did not finish (or
            the directory was not written through :class:`Writer`, nor adopted).
        CkptkitError: the ``CK-M`` code of what makes it invalid.

    Example:
        >>> read_manifest("/nonexistent")
        Traceback (most recent call last):
        ...
        ckptkit.errors.IncompleteCheckpointError: CK-M001 /nonexistent/ckptkit-manifest.json: ...
    """
    where = fs.location(path)
    return manifest_io.read_path(where / MANIFEST_NAME, key=signing.resolve_key(key))


def check(path: str | os.PathLike[str], *, key: bytes | str | None = None) -> mf.Manifest:
    """Check a DCP directory from its bytes, reading each once; raise the first problem.

    What :class:`Reader` checks before and during a load, without loading: the manifest
    and its signature, ``.metadata`` (digest, allow-listed unpickle, chunk count),
    coverage, then every listed file's size and digest, every tensor item parsed and held
    to its chunk and every non-tensor item parsed, with ``weights_only=True``
    (:func:`ckptkit.storage.dcp_engine.check_shards`, the shard pass ``ckptkit verify`` makes
    too). Use it to pick the newest step that loads.

    Returns:
        The manifest, when everything matches.

    Raises:
        CkptkitError: the first problem, with its finding code.

    Example:
        >>> import tempfile, torch
        >>> d = tempfile.mkdtemp() + "/step-2"
        >>> _ = save({"w": torch.ones(2)}, d, step=2)
        >>> check(d).step
        2
    """
    where = fs.location(path)
    man, md, listed = open_checked(where, key=signing.resolve_key(key))
    read = store.check_shards(where, md, listed, prefix="")
    problems = [
        *read.file_problems,
        *read.problems,
        *dcp_items.coverage(md, listed, prefix="", item_bytes=read.item_bytes),
    ]
    if problems:
        raise problems[0]
    return man


def save(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    key: bytes | str | None = None,
    step: int | None = None,
    lookahead: Mapping[str, Any] | None = None,
    process_group: Any = None,
    **writer_kwargs: Any,
) -> mf.Manifest | None:
    """``dcp.save`` through :class:`Writer` (collective when a process group is up).

    ``lookahead`` as :class:`Writer`'s: given, or that of ``step`` alone.

    Returns:
        The committed manifest on the coordinator, None on the other ranks.

    Raises:
        CkptkitError: the save failed (DCP's ``CheckpointException`` translated).

    Example:
        >>> import tempfile, torch
        >>> save({"w": torch.ones(2)}, tempfile.mkdtemp() + "/step-3", step=3).step
        3
    """
    writer = Writer(path, key=key, step=step, lookahead=lookahead, **writer_kwargs)
    with dcp_errors.translated("DCP save"), dcp_errors.quiet():
        _dcp.save(state_dict, storage_writer=writer, process_group=process_group)
    return writer.manifest


def async_save(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    key: bytes | str | None = None,
    step: int | None = None,
    lookahead: Mapping[str, Any] | None = None,
    process_group: Any = None,
    **writer_kwargs: Any,
) -> Any:
    """``dcp.async_save`` through :class:`Writer`: returns once the state is staged.

    ``lookahead`` as :class:`Writer`'s (computed before the call returns).

    Without a process group DCP warns, from its background thread, that it saves in a
    single process (the world of one).

    Returns:
        DCP's future: its ``result()`` is DCP's (the manifest is committed when it is
        done); a failure in the background raises there, as DCP's does.

    Example:
        >>> import tempfile, warnings, torch
        >>> d = tempfile.mkdtemp() + "/step-4"
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     _ = async_save({"w": torch.ones(2)}, d, step=4).result()
        >>> check(d).step
        4
    """
    writer = Writer(path, key=key, step=step, lookahead=lookahead, **writer_kwargs)
    with dcp_errors.translated("DCP async save"), dcp_errors.quiet():
        return _dcp.async_save(state_dict, storage_writer=writer, process_group=process_group)


def load(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    key: bytes | str | None = None,
    process_group: Any = None,
) -> mf.Manifest:
    """``dcp.load`` through :class:`Reader`, in place (resharding), every byte checked.

    Shards this rank's plan does not read are hashed by the rank they are assigned to,
    so a load checks every listed file.

    Returns:
        The manifest the load was checked against.

    Raises:
        CkptkitError: the checkpoint is incomplete, damaged or unsafe (the finding code),
            or does not fit ``state_dict``. After a refusal ``state_dict`` is undefined
            (a refused shard's bytes may already be in the tensors it fed): load again
            from a checkpoint that verifies, or choose one with :func:`check` first.

    Example:
        >>> import tempfile, torch
        >>> d = tempfile.mkdtemp() + "/step-5"
        >>> _ = save({"w": torch.ones(2)}, d, step=5)
        >>> sd = {"w": torch.zeros(2)}; load(sd, d).step, sd["w"].tolist()
        (5, [1.0, 1.0])
    """
    reader = Reader(path, key=key)
    try:
        with dcp_errors.translated("DCP load"), dcp_errors.quiet():
            _dcp.load(
                state_dict,
                storage_reader=reader,
                planner=_SafeLoadPlanner(),
                process_group=process_group,
            )
    except CkptkitError:
        if reader.refusal is not None:
            raise reader.refusal from None
        raise
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    else:
        rank, world = 0, 1
    store.check_unread(reader, reader.location, reader.listed, rank=rank, world=world, prefix="")
    assert reader.manifest is not None
    return cast(mf.Manifest, reader.manifest)


__all__ = [
    "MANIFEST_NAME",
    "WRITER",
    "Reader",
    "Writer",
    "async_save",
    "check",
    "commit",
    "load",
    "open_checked",
    "read_manifest",
    "save",
]
