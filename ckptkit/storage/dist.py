"""Multi-rank saves and loads: collectives, file assignment, DCP storage (spec §7).

A multi-rank save is one commit made by many writers. Every rank writes its own files
into the temporary directory rank 0 created, hashes them, and sends the file and tensor
entries to rank 0 with an ``all_gather``; rank 0 writes the manifest last (the commit).
Anything a rank fails at travels in that gather as a message, so every rank learns of it
and the save commits nothing. A rank that dies makes the gather fail (connection lost or
the process group's timeout), which is the same outcome.

Sharded state (FSDP2 / DTensor) is written with ``torch.distributed.checkpoint`` into
``dcp/`` inside the checkpoint; ckptkit's manifest lists those files with their digests, so
verify covers them like any other file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ckptkit import codes
from ckptkit import manifest as mf
from ckptkit.errors import (
    CkptkitError,
    DistributedError,
)
from ckptkit.storage import digest

DCP_DIR = "dcp"
"""Subdirectory of a checkpoint holding ``torch.distributed.checkpoint`` files."""
DCP_COMPONENT = "dcp"
"""``component`` of the manifest entries of DCP files (they hold model and optimizer)."""


@dataclass(frozen=True)
class Group:
    """This process's place in the default process group."""

    rank: int
    world_size: int


def group() -> Group | None:
    """The default process group when one is initialised with more than one rank, else None.

    A world of one is the single-process path: nothing collective happens.

    Example:
        >>> group() is None
        True
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    return Group(rank=dist.get_rank(), world_size=world) if world > 1 else None


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``all_gather_object``)."""
    dist = torch.distributed
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def describe(exc: BaseException) -> str:
    """One-line description of an exception, to send to the other ranks."""
    return str(exc) if isinstance(exc, CkptkitError) else f"{type(exc).__name__}: {exc}"


def consensus(error: BaseException | None, *, what: str) -> None:
    """All ranks share their outcome; raise on every rank if any failed.

    The rank that failed re-raises its own exception; the others raise a
    :class:`DistributedError` naming the failed ranks and their messages.

    Raises:
        DistributedError: another rank failed.
    """
    outcomes = all_gather(None if error is None else describe(error))
    failed = [(r, m) for r, m in enumerate(outcomes) if m is not None]
    if not failed:
        return
    if error is not None:
        raise error
    raise DistributedError(
        f"{what} failed on rank(s) {', '.join(str(r) for r, _ in failed)}: "
        + " | ".join(f"rank {r}: {m}" for r, m in failed),
        hint="see that rank's log for the cause; the save committed nothing",
    )


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
    return dict(sorted(out.items(), key=lambda kv: [n for n, _ in sizes].index(kv[0])))


def hash_files(
    root: Path, rels: Sequence[str], *, component: str | None, rank: int | None
) -> list[mf.FileEntry]:
    """Manifest entries (size, xxh3-128) for files already written under ``root``."""
    out = []
    for rel in rels:
        hexd, size = digest.hash_file(root / rel)
        out.append(mf.FileEntry(path=rel, size=size, xxh3_128=hexd, component=component, rank=rank))
    return out


def dcp_files_of(root: Path, rank: int) -> list[str]:
    """The DCP files rank ``rank`` wrote under ``root/dcp`` (rank 0 also owns ``.metadata``)."""
    d = root / DCP_DIR
    rels = sorted(f"{DCP_DIR}/{p.name}" for p in d.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (d / ".metadata").exists():
        rels.append(f"{DCP_DIR}/.metadata")
    return rels


def dcp_save(state_dict: dict[str, Any], root: Path, *, fsync: bool = True) -> None:
    """Write ``state_dict`` (possibly DTensor-sharded) with DCP into ``root/dcp`` (collective)."""
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(root / DCP_DIR), sync_files=fsync, thread_count=2)
    with _quiet_dcp():
        dcp.save(state_dict, storage_writer=writer)


def dcp_load(state_dict: dict[str, Any], root: Path) -> None:
    """Read DCP files of ``root/dcp`` into ``state_dict`` in place, resharding (collective)."""
    import torch.distributed.checkpoint as dcp

    with _quiet_dcp():
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(str(root / DCP_DIR)))


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    # DCP warns once per call without a process group ("assuming the intent is to load in a
    # single process"): that is exactly the world-size-1 resume we mean to do.
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*process group.*")
        warnings.filterwarnings("ignore", message=".*single process.*")
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        yield


def verify_files(root: Path, entries: Sequence[mf.FileEntry]) -> None:
    """Check size and digest of files that are not read through ckptkit's verifying reader.

    Raises:
        IncompleteCheckpointError: ``CK-F001`` a file is missing.
        IntegrityError: ``CK-F002``/``CK-F003`` size or digest mismatch.
    """
    for fe in entries:
        p = root / fe.path
        who = f" (written by rank {fe.rank})" if fe.rank is not None else ""
        try:
            size = os.stat(p).st_size
        except FileNotFoundError:
            raise codes.error(
                "CK-F001", f"file listed in the manifest is missing{who}", path=p
            ) from None
        if size != fe.size:
            raise codes.error(
                "CK-F002", f"size is {size} bytes, the manifest records {fe.size}{who}", path=p
            )
        hexd, _ = digest.hash_file(p)
        if hexd != fe.xxh3_128:
            raise codes.error(
                "CK-F003",
                f"digest mismatch (expected {fe.xxh3_128[:12]}…, got {hexd[:12]}…){who}",
                path=p,
            )


__all__ = [
    "DCP_COMPONENT",
    "DCP_DIR",
    "Group",
    "all_gather",
    "assign",
    "broadcast",
    "consensus",
    "dcp_files_of",
    "dcp_load",
    "dcp_save",
    "describe",
    "group",
    "hash_files",
    "verify_files",
]
