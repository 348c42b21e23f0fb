"""Rank-parallel verify: each rank of a job scans its share of a checkpoint's files.

``torchrun --nproc-per-node K -m ckptkit verify PATH --torchrun`` spreads the byte-level
work of verify (reading and hashing every listed file, the header parse and the NaN/Inf
scan of its single pass) over the ranks. Each rank reads the manifest, computes the same
split alone (:func:`split`: no communication), scans its share with the scan a
single-process verify uses (:meth:`CheckContext.scan_files`), and sends rank 0 one small
:class:`ScanRecord` per file. Rank 0 puts the scans back in its context and runs every
check exactly as a single-process verify does (:func:`ckptkit.verify.runner.verify_one`),
so the findings, their order and the report are the same: the ranks only decide who reads
which file.

What a rank sends is O(its files): path, size, digest, error texts, and the header only
when it differs from the one the manifest lists (rank 0 rebuilds a matching header from
its own manifest). Records of a rank that read another manifest (a checkpoint rewritten
meanwhile), or whose scan failed, are dropped, and rank 0 scans those files itself, so a
file is never reported unscanned.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptkit.checkpoint import manifest_io
from ckptkit.collective import Collective, TorchGroup
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format.dtypes import HeaderEntry
from ckptkit.storage import tensors_scan
from ckptkit.storage.fs import Location
from ckptkit.verify.context import CheckContext, FileScan


def split(entries: Sequence[mf.FileEntry], world: int) -> list[list[mf.FileEntry]]:
    """Assign ``entries`` to ``world`` ranks, balancing bytes; the same on every rank.

    Largest file first, each to the rank with the fewest bytes so far (ties: the lowest
    rank), ties between files broken by path: a deterministic greedy split that every rank
    computes alone from the manifest.

    Example:
        >>> fe = lambda p, n: mf.FileEntry(path=p, size=n, xxh3_128="0" * 32)
        >>> [[f.path for f in s] for s in split([fe("a", 5), fe("b", 3), fe("c", 2)], 2)]
        [['a'], ['b', 'c']]
    """
    out: list[list[mf.FileEntry]] = [[] for _ in range(world)]
    heap = [(0, r) for r in range(world)]
    for fe in sorted(entries, key=lambda f: (-f.size, f.path)):
        load, r = heapq.heappop(heap)
        out[r].append(fe)
        heapq.heappush(heap, (load + fe.size, r))
    return out


@dataclass(frozen=True)
class ScanRecord:
    """One file's scan as a rank sends it to rank 0: small, whatever the file's size."""

    path: str
    exists: bool
    outside: bool
    not_regular: str | None
    size: int | None
    digest: str | None
    header: dict[str, HeaderEntry] | None
    """The header read from the file, or None when it is the one the manifest lists
    (``header_listed``) or there was none."""
    header_listed: bool
    header_error: str | None
    header_error_code: str | None
    io_error: str | None
    io_error_code: str | None
    nonfinite: tuple[str, ...] | None
    """Tensors the value scan found NaN/Inf in; None when no value scan ran."""
    unchecked: tuple[str, ...]

    @classmethod
    def of(cls, s: FileScan, listed: Mapping[str, HeaderEntry]) -> ScanRecord:
        """The record of scan ``s``; ``listed`` is the header the manifest lists for its file."""
        same = s.header is not None and s.header == listed
        return cls(
            path=s.entry.path, exists=s.exists, outside=s.outside, not_regular=s.not_regular,
            size=s.size, digest=s.digest, header=None if same else s.header, header_listed=same,
            header_error=s.header_error, header_error_code=s.header_error_code,
            io_error=s.io_error, io_error_code=s.io_error_code,
            nonfinite=tuple(sorted(s.finite.nonfinite)) if s.finite is not None else None,
            unchecked=tuple(sorted(s.finite.unchecked)) if s.finite is not None else (),
        )

    def scan(self, fe: mf.FileEntry, listed: Mapping[str, HeaderEntry]) -> FileScan:
        """The scan this record stands for, as rank 0's checks read it."""
        finite: tensors_scan.FiniteScan | None = None
        if self.nonfinite is not None:
            finite = tensors_scan.FiniteScan({}, 0)  # the finished scan's verdicts, not its ranges
            finite.nonfinite.update(self.nonfinite)
            finite.unchecked.update(self.unchecked)
        return FileScan(
            fe, exists=self.exists, outside=self.outside, not_regular=self.not_regular,
            size=self.size, digest=self.digest,
            header=dict(listed) if self.header_listed else self.header,
            header_error=self.header_error, header_error_code=self.header_error_code,
            io_error=self.io_error, io_error_code=self.io_error_code, finite=finite,
        )


def _listed_headers(m: mf.Manifest) -> dict[str, dict[str, HeaderEntry]]:
    """File → the safetensors header the manifest lists for it."""
    out: dict[str, dict[str, HeaderEntry]] = {}
    for te in m.tensors:
        out.setdefault(te.file, {})[te.key] = te.header_entry()
    return out


def prescan(
    root: Location,
    group: Collective,
    *,
    key: bytes | None,
    workers: int,
    options: Mapping[str, Any],
) -> tuple[mf.Manifest | None, dict[str, FileScan]] | None:
    """Scan this rank's share of the files of checkpoint ``root``; gather them on rank 0.

    Collective: every rank of ``group`` calls it for the same checkpoint.

    Returns:
        On rank 0: the manifest it read (None when it could not: the runner reads it
        again and reports why) and the scans the ranks made, by path. None elsewhere.
    """
    try:
        m: mf.Manifest | None = manifest_io.read(root, key=key)
    except CkptkitError:
        m = None
    scans: list[FileScan] = []
    failed = False
    if m is not None:
        ctx = CheckContext(root=root, manifest=m, options=dict(options), workers=workers)
        try:
            scans = ctx.scan_files(split(m.files, group.world_size)[group.rank])
        except Exception:
            # A scan that raises raises on rank 0 too, where the single-process path
            # rescans the file: the error surfaces the way it would without ranks.
            failed = True
    headers = _listed_headers(m) if m is not None else {}
    mine = [ScanRecord.of(s, headers.get(s.entry.path, {})) for s in scans]
    ident = m.digest if m is not None else None
    got = group.gather((ident, failed, mine), dst=0)
    if got is None:
        return None
    out: dict[str, FileScan] = {}
    if m is None:
        return None, out
    for their_ident, their_failed, records in got:
        if their_failed or their_ident != ident:
            continue  # rank 0 scans these files itself (CheckContext.scan_all)
        for rec in records:
            fe = m.file(rec.path)
            if fe is not None:
                out[rec.path] = rec.scan(fe, headers.get(rec.path, {}))
    return m, out


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for each rank, and what :func:`join_torchrun` reads."""


def join_torchrun() -> TorchGroup:
    """Join the job torchrun started, over gloo (the reading needs no GPU).

    Raises:
        CkptkitError: this process was not started by torchrun (its variables are unset).

    Example:
        >>> # torchrun --nproc-per-node 4 -m ckptkit verify runs/exp1/ckpt --torchrun
        >>> # runs, on each rank: ckptkit.verify(path, group=join_torchrun())
    """
    import torch.distributed as dist

    unset = [v for v in TORCHRUN_ENV if v not in os.environ]
    if unset:
        raise CkptkitError(
            f"--torchrun needs the environment torchrun gives each rank ({', '.join(unset)} "
            "unset)",
            hint="start it as 'torchrun --nproc-per-node K -m ckptkit verify PATH --torchrun', "
            "or drop --torchrun (--workers N reads in parallel in one process)",
        )
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return TorchGroup()


def agree(group: Collective, code: int) -> int:
    """Rank 0's exit ``code`` on every rank, so the job exits with one status.

    The last collective of a ``--torchrun`` verify: each rank then ends with
    :func:`ckptkit.collective.leave` (a gloo rank's interpreter teardown can hang or abort
    after its work is done, and torchrun would report the job failed).
    """
    return int(group.broadcast(code, src=0))


__all__ = ["TORCHRUN_ENV", "ScanRecord", "agree", "join_torchrun", "prescan", "split"]
