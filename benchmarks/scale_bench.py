"""Scale: what a save, a restore and a verify cost as functions of ranks and tensors
(issue 27 item 4: a measured cost model), in the per-rank manifest layout.

A multi-rank save writes one manifest per rank (``ranks/rank-NNNNN.json``,
:class:`~ckptkit.format.ranks.RankManifest`: the rank's files, tensor entries and its own RNG
state), each written by the rank itself (``manifest_io.write_rank``), and rank 0 commits a
small root ``manifest.json`` (schema_version 2) that lists them
(:class:`~ckptkit.format.ranks.RankRef`: path, size, digest, files, state keys) with the
run-level facts (tree without the RNG states, components, data cursors, RNG fingerprints).
A rank sends rank 0 a :class:`~ckptkit.checkpoint.commit.RankPart`: the record of its manifest, which
files hold each component, its RNG fingerprint and sampler cursor.

Two parts, one report:

**Real runs** (``--ranks 1,2,4,8``): that many gloo ranks on this host, each holding a small
replicated model (the same two ``Linear`` layers on every rank, as under DDP) plus
``--tensors-per-rank`` T distinct per-rank tensors (DTensor ``Shard(0)`` parameters, a
16-float shard each, as tensor parallelism leaves them; with DTensors, ``TrainState``
stores model state through DCP). Every rank times, after a barrier, medians of
``--repeat``:

- ``commit``: ``CheckpointManager.save`` (sync; ``verify_after_save=False`` so the
  read-back verify is its own phase), with the peak RSS it adds (VmHWM, reset through
  ``/proc/self/clear_refs``), the bytes ckptkit's collectives sent and received
  (:func:`ckptkit.collective.metered`), and the bytes of every object collective of the
  save including DCP's own planning (:func:`object_traffic`, which wraps
  ``torch.distributed``'s object collectives);
- ``parse``: ``ckptkit.checkpoint.manifest_io.read`` (the root and every rank manifest),
  every rank at once;
- ``plan``: :func:`plan_restore` on each rank, as restore calls it (the manifests that rank
  needs; with DCP storage that is every one);
- ``verify``: ``ckptkit.verify`` on rank 0 (today's verify runs in one process).

**Simulation** (``--sim-ranks`` x ``--sim-tensors``): W ranks of T tensors each, built from
the real classes: each rank's :class:`~ckptkit.format.ranks.RankManifest` (rank 0's real RNG
file and state relabelled for the rank, plus one file of T
:class:`~ckptkit.format.manifest.TensorEntry`; rank 0's also lists the replicated model) written by
``manifest_io.write_rank`` with its files as sparse files, and the part it sends pickled
as the gather sends it (all outside the timed regions); then each phase runs in a fresh
process (its peak RSS from a clean heap):

- ``commit_rank0``: :func:`commit_rank0`: unpickle the W parts, ``StateSave.root`` (the
  root rank 0 commits), ``manifest_io.with_ranks`` (the read-back of every rank manifest
  that ``StateSave.build`` does before the commit: O(W*T) on rank 0), ``to_json``;
- ``parse``: :func:`parse_manifest`: a full ``manifest_io.read`` of the root and the W rank
  manifests (what verify and ``ckptkit ls`` do);
- ``plan``: :func:`plan_restore` on rank 1 as restore calls it. In this layout every rank
  lists tensors besides its RNG state, so ``manifests_to_read`` picks every rank manifest
  (the safetensors reader loads every shard on every rank);
- ``partial_read``: :func:`partial_manifest_work`: the root a save commits and what a
  restoring rank needs at least, rank 0's manifest (the replicated model the root's tree
  references) and its own: ``manifest_io.read(only={0, 1})``, the other W-2 manifests
  never read (so not written). Measured for every point;
- payloads: the pickled part one rank sends and what rank 0 receives (W-1 parts).

A point predicted (from the largest point run so far, linear in W*T) to exceed
``--budget-s`` or ``--budget-gib`` is not run; its figures are extrapolated from a least
squares fit ``a + w*W + b*W*T`` over the points that ran (a cost per rank manifest besides
the cost per entry; ``a + b*W*T`` where the points cannot tell them apart), and marked so. The manifest work is
one function per phase (:func:`commit_rank0`, :func:`parse_manifest`,
:func:`plan_restore`, :func:`partial_manifest_work`): point them at new code and rerun.

Usage::

    python benchmarks/scale_bench.py                      # full: 7-10 min on 2 cores
    python benchmarks/scale_bench.py --quick --json out.json
    python benchmarks/scale_bench.py --no-real --sim-ranks 64,256 --sim-tensors 100
    python benchmarks/scale_bench.py --json scale.json --plot docs/img/performance-scale.png

All ranks of a real run share this host's cores and loopback: their times include the
contention of W processes on the cores there are, and are upper bounds for one rank per
host. Results and the formulas: docs/performance.md, "Scale: cost model (issue 27)".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_bench import _port
from io_bench import MemProbe

GiB = 1 << 30
SHARD_NUMEL = 16
"""Floats in each per-rank tensor: the table's cost is per entry, not per byte."""
TARGET_RANKS, TARGET_TENSORS, TARGET_S = 4096, 1000, 1.0
"""The issue's target: manifest work on any rank <= 1 s at 4,096 ranks x 1,000 tensors."""
SIM_MEASURED = ("commit_rank0", "parse", "plan")
"""Simulated phases run (or extrapolated past the budget): each O(W*T). The partial read
always runs."""


# --------------------------------------------------------------------------------------------
# measuring


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


@contextlib.contextmanager
def timed_region() -> Iterator[dict[str, float]]:
    """Wall time and extra peak RSS (bytes) of the block: ``{"s": ..., "rss": ...}``."""
    out: dict[str, float] = {}
    with MemProbe(interval=0.05) as mem:
        t0 = time.perf_counter()
        yield out
        out["s"] = time.perf_counter() - t0
    out["rss"] = float(mem.extra_rss if mem.extra_rss is not None else mem.extra_anon)


@contextlib.contextmanager
def object_traffic() -> Iterator[Counter[str]]:
    """Count the pickled bytes of every ``torch.distributed`` object collective of this
    process in the block (ckptkit's and DCP's planning alike): ``sent`` and ``received``.
    Tensor collectives (ckptkit's 4-byte all-reduces, barriers) are not counted.

    :func:`ckptkit.collective.metered` counts ckptkit's own collectives only; a DCP save
    also gathers every rank's plan to rank 0 and sends the global metadata back, through
    the same four functions wrapped here.
    """
    import torch.distributed as dist

    count: Counter[str] = Counter()

    def size(obj: Any) -> int:
        return len(pickle.dumps(obj))  # what the object collectives send

    real = {n: getattr(dist, n) for n in
            ("gather_object", "broadcast_object_list", "scatter_object_list", "all_gather_object")}
    me = dist.get_rank()
    if dist.get_world_size() == 1:  # a world of one sends nothing anywhere
        yield count
        return

    def gather_object(obj: Any, object_gather_list: Any = None, dst: Any = None, group: Any = None,
                      group_dst: Any = None) -> Any:
        out = real["gather_object"](obj, object_gather_list, dst=dst, group=group, group_dst=group_dst)
        if object_gather_list is None:  # not the destination: this rank sends its object
            count["sent"] += size(obj)
        else:  # the destination receives every other rank's
            count["received"] += sum(size(o) for o in object_gather_list) - size(obj)
        return out

    def broadcast_object_list(object_list: Any, src: Any = None, group: Any = None,
                              device: Any = None, group_src: Any = None) -> Any:
        out = real["broadcast_object_list"](object_list, src=src, group=group, device=device,
                                            group_src=group_src)
        root = group_src if group_src is not None else (src if src is not None else 0)
        mine = dist.get_rank(group) if group is not None and group_src is not None else me
        count["sent" if mine == root else "received"] += sum(size(o) for o in object_list)
        return out

    def scatter_object_list(scatter_object_output_list: Any, scatter_object_input_list: Any = None,
                            src: Any = None, group: Any = None, group_src: Any = None) -> Any:
        out = real["scatter_object_list"](scatter_object_output_list, scatter_object_input_list,
                                          src=src, group=group, group_src=group_src)
        if scatter_object_input_list is not None:
            count["sent"] += sum(size(o) for o in scatter_object_input_list) - size(
                scatter_object_output_list[0])
        else:
            count["received"] += size(scatter_object_output_list[0])
        return out

    def all_gather_object(object_list: Any, obj: Any, group: Any = None) -> Any:
        out = real["all_gather_object"](object_list, obj, group=group)
        count["sent"] += size(obj)
        count["received"] += sum(size(o) for o in object_list) - size(obj)
        return out

    for n, f in (("gather_object", gather_object), ("broadcast_object_list", broadcast_object_list),
                 ("scatter_object_list", scatter_object_list),
                 ("all_gather_object", all_gather_object)):
        setattr(dist, n, f)
    try:
        yield count
    finally:
        for n, f in real.items():
            setattr(dist, n, f)


# --------------------------------------------------------------------------------------------
# the manifest work, one function per phase (pointed at the per-rank layout)


def plan_restore(path: Path, rank: int | None = None) -> Any:
    """Restore's planning on rank ``rank``, before any tensor byte is read.

    The first step of :func:`ckptkit.run.restore.restore_candidate`, called as it calls it: the
    manifest read and validated (of a multi-rank root, only the rank manifests this rank
    needs: :func:`~ckptkit.capture.state.manifests_to_read`), completeness and consistency
    checked (a stat of every listed file; with DCP storage, ``.metadata`` read, checked
    against its digest and unpickled with the allow-list). ``rank`` None: every manifest.
    """
    from ckptkit.capture.state import manifests_to_read
    from ckptkit.verify.runner import verify_one

    only = None if rank is None else (lambda root: manifests_to_read(root, rank))
    return verify_one(path, families=("completeness", "consistency"), progress=False,
                      options={"scan_values": False, "read_files": False}, only=only)


def commit_rank0(blobs: list[bytes], snap: Any, tmp: Path) -> tuple[str, dict[str, float]]:
    """Rank 0 between the gather and the manifest write: unpickle the W parts it received
    (records of the rank manifests already written in ``tmp``), ``StateSave.build`` (the
    root, ``StateSave.root``, then the read-back of the rank manifests rank 0 would read to
    restore: ``manifests_to_read(root, 0)``) and serialise what it commits (``to_json``:
    the root). Returns the JSON and the seconds of each step (``root_s`` timed apart, once
    more: ``readback_s`` is the build less it)."""
    from ckptkit.storage import fs

    t0 = time.perf_counter()
    parts = [pickle.loads(b) for b in blobs]
    t1 = time.perf_counter()
    snap.root(parts)
    t2 = time.perf_counter()
    man = snap.build(parts, fs.location(tmp))
    t3 = time.perf_counter()
    text = str(man.to_json())
    t4 = time.perf_counter()
    return text, {"unpickle_s": t1 - t0, "root_s": t2 - t1,
                  "readback_s": max(0.0, (t3 - t2) - (t2 - t1)), "json_s": t4 - t3}


def parse_manifest(ckpt: Path) -> Any:
    """A full read: the root and every rank manifest it lists, parsed, checked and merged
    (``manifest_io.read``): what verify and ``ckptkit ls`` do."""
    from ckptkit.checkpoint import manifest_io

    return manifest_io.read(ckpt)


def partial_manifest_work(world: int, tensors: int, base: Base) -> dict[str, Any]:
    """One restoring rank's manifest work in the per-rank layout, measured: the root a
    save of ``world`` ranks commits (``StateSave.root`` of the ranks' parts), rank 0's and
    rank 1's manifests of ``tensors`` entries each (with their RNG states) and their files
    as sparse files. Times, for rank 1: the root and rank 0's manifest
    (``manifest_io.read(only={0})``: the least any reader reads, as the root's tree
    references the replicated model rank 0's manifest lists) and the root, rank 0's and
    its own (``only={0, 1}``). Also counts the manifests restore's own choice
    (``manifests_to_read``) reads in this layout: every rank's, as each lists tensors
    besides its RNG state (the safetensors reader loads every shard on every rank).

    The other ranks' records hold the files and state keys the real rank's manifest lists
    (so restore's choice is the real one); their size and digest are placeholders, as
    those manifests are never read (asserted: ``manifest_io.rank_reads``), so not written.
    """
    from ckptkit.capture.state import manifests_to_read
    from ckptkit.checkpoint import manifest_io
    from ckptkit.format import manifest as mf

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        parts = [_written(d, base, r, tensors) for r in (0, 1)]
        like = parts[1].ref
        for r in range(2, world):  # never read: the record a save writes, no manifest behind it
            parts.append(_part(base, r, 1, placeholder=like))
        root = base.snap.root(parts)
        root_text = root.to_json().encode()
        (d / mf.MANIFEST_NAME).write_bytes(root_text)
        want = manifests_to_read(manifest_io.read(d, only=lambda _root: {0}), 1)
        manifest_io.read(d, only=lambda _root: {0})  # warm-up: validators, file cache
        times: dict[int, list[float]] = {1: [], 2: []}
        manifest_io.rank_reads.clear()
        for _ in range(5):  # interleaved, the best of 5 each: the host is shared
            for n in times:
                t0 = time.perf_counter()
                m = manifest_io.read(d, only=lambda _root, n=n: set(range(n)))
                times[n].append(time.perf_counter() - t0)
        reads = set(manifest_io.rank_reads)
        shared_s, s = min(times[1]), min(times[2])
    assert reads == {0, 1} and m.read_ranks == ({0, 1} if world > 2 else None), (reads, m.read_ranks)
    assert len(m.tensors) == 2 * tensors + 6, len(m.tensors)  # + the model's 2, 2 RNG each
    return {"s": s, "shared_s": shared_s, "own_s": s - shared_s,
            "root_bytes": len(root_text), "own_bytes": parts[1].ref.size,
            "rank0_bytes": parts[0].ref.size,
            "restore_reads": world if want is None else len(want)}


# --------------------------------------------------------------------------------------------
# simulation: synthetic parts made of the real classes


def _rank_key(r: int) -> str:
    from ckptkit.capture.state import rank_key

    return str(rank_key(r))


@dataclass
class Base:
    """Rank 0's real capture of a tiny TrainState at world size W (``snap``), and the part
    it writes (``part``: its model file, its RNG file; its RNG state is in ``snap``'s tree):
    what every simulated rank copies, so each rank manifest carries a real RNG state as a
    real rank's does."""

    snap: Any
    part: Any

    @classmethod
    def capture(cls, world: int) -> Base:
        import torch

        import ckptkit
        from ckptkit.checkpoint.commit import StateSave
        from ckptkit.collective import Solo
        from ckptkit.storage import fs

        ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=1,
                                parallel=ckptkit.ParallelConfig(world_size=world, rank=0))
        snap = StateSave.capture(ts, Solo(), step=1, fields={})
        snap.fsync = False
        with tempfile.TemporaryDirectory() as tmp:
            part = snap.write(fs.location(tmp), Solo())
        return cls(snap, part)


def _rank_manifest(base: Base, rank: int, tensors: int) -> Any:
    """The manifest rank ``rank`` writes in a save where it holds ``tensors`` own tensors:
    rank 0's real RNG file and state relabelled for this rank, plus one file of T tensor
    entries (its shards). Rank 0's also lists the replicated model file."""
    from ckptkit.format.manifest import FileEntry, TensorEntry
    from ckptkit.format.ranks import RANK_STATE, RankManifest

    rk, r0 = _rank_key(rank), _rank_key(0)
    own = [f for f in base.part.files.files if f.component == "rng"]
    names = {f.path for f in own}
    files = [replace(f, path=f.path.replace(r0, rk), rank=rank) for f in own]
    entries = [replace(t, key=t.key.replace(r0, rk), file=t.file.replace(r0, rk))
               for t in base.part.files.tensors if t.file in names]
    if rank == 0:
        files += [f for f in base.part.files.files if f not in own]
        entries += [t for t in base.part.files.tensors if t.file not in names]
    path = f"tp/{rk}.safetensors"
    nb = SHARD_NUMEL * 4
    entries += [TensorEntry(f"tp/{rk}/w{i:05d}", path, "F32", (SHARD_NUMEL,), (i * nb, (i + 1) * nb))
                for i in range(tensors)]
    files.append(FileEntry(path, tensors * (nb + 64) + 8, f"{rank:032x}", rank=rank))
    rng = json.loads(json.dumps(base.snap.encoded.tree[RANK_STATE][r0]).replace(r0, rk))
    rng["rank"] = rank
    return RankManifest(rank, base.snap.step, tuple(files), tuple(entries), rng=rng)


def _part(base: Base, rank: int, tensors: int, out: Any = None, placeholder: Any = None) -> Any:
    """What rank ``rank`` sends rank 0 (a RankPart: the record of its manifest, which files
    hold each component, its RNG fingerprint and sampler cursor), its manifest written into
    ``out`` by ``manifest_io.write_rank`` when given. ``placeholder``: a record whose size
    and digest this one takes (a manifest never read, so never written)."""
    from ckptkit.checkpoint import manifest_io
    from ckptkit.checkpoint.commit import RankPart
    from ckptkit.checkpoint.read import files_by_head
    from ckptkit.storage.shards import RankFiles

    mine = _rank_manifest(base, rank, tensors)
    if out is not None:
        ref = manifest_io.write_rank(out, mine, fsync=False)
    elif placeholder is not None:
        ref = replace(mine.ref(b""), size=placeholder.size, xxh3_128=f"{rank:032x}")
    else:
        ref = mine.ref(mine.to_json().encode())
    return RankPart(files=RankFiles(), ref=ref, where=files_by_head(mine.tensors),
                    dcp_files=[], rng_fingerprint=f"{rank:016x}",  # distinct, as real ranks'
                    sampler=base.part.sampler)


def part_bytes(base: Base, rank: int, tensors: int) -> int:
    """The pickled size of one rank's part (what the gather sends per rank)."""
    return len(pickle.dumps(_part(base, rank, tensors)))


def _written(ckpt: Path, base: Base, rank: int, tensors: int) -> Any:
    """Rank ``rank``'s share of a save at ``ckpt``: its files as sparse files of the listed
    sizes (restore planning stats them; nothing here reads a tensor byte) and its manifest,
    written by ``manifest_io.write_rank``; returns its part."""
    from ckptkit.storage import fs

    for f in _rank_manifest(base, rank, tensors).files:
        _touch(ckpt / f.path, f.size)
    return _part(base, rank, tensors, fs.location(ckpt))


def _touch(q: Path, size: int) -> None:
    q.parent.mkdir(parents=True, exist_ok=True)
    with open(q, "wb") as fh:
        fh.truncate(size)


def _lay_out(ckpt: Path, base: Base, world: int, tensors: int) -> list[bytes]:
    """A multi-rank checkpoint being committed at ``ckpt``: every rank's files and manifest
    (:func:`_written`); returns the pickled parts rank 0 receives (the root is its to
    write)."""
    ckpt.mkdir(parents=True, exist_ok=True)
    return [pickle.dumps(_written(ckpt, base, r, tensors)) for r in range(world)]


def sim_phase(world: int, tensors: int, phase: str, ckpt: Path) -> dict[str, Any]:
    """One simulated phase of one point, in this process: a fresh process per phase (see
    :func:`run_sim`), so each peak RSS starts from a clean heap. ``commit_rank0`` lays out
    the checkpoint at ``ckpt`` (every rank's files and manifest, untimed) and writes its
    root; ``parse`` and ``plan`` read it."""
    from ckptkit.checkpoint import manifest_io
    from ckptkit.format.manifest import MAX_MANIFEST_BYTES

    base = Base.capture(world)
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: the schema validators are built once
        small = Path(tmp) / "c"
        text, _ = commit_rank0(_lay_out(small, base, 2, 10), base.snap, small)
        (small / "manifest.json").write_text(text)
        plan_restore(small, 1)
    out: dict[str, Any] = {}
    if phase == "commit_rank0":
        blobs = _lay_out(ckpt, base, world, tensors)
        with timed_region() as c:
            text, steps = commit_rank0(blobs, base.snap, ckpt)
        c.update(steps)
        (ckpt / "manifest.json").write_text(text)
        out["manifest_bytes"] = len(text.encode())
        out["rank_manifests_bytes"] = sum(pickle.loads(b).ref.size for b in blobs)
        out["over_reader_limit"] = out["manifest_bytes"] > MAX_MANIFEST_BYTES
    elif phase == "parse":
        manifest_io.rank_reads.clear()
        with timed_region() as c:
            man = parse_manifest(ckpt)
        assert len(man.tensors) >= world * tensors and len(manifest_io.rank_reads) == world
    else:
        manifest_io.rank_reads.clear()
        with timed_region() as c:
            rep = plan_restore(ckpt, 1)
        out["plan_findings"] = sorted({f"{f.code} {f.severity}" for f in rep.findings})
        out["plan_reads"] = len(manifest_io.rank_reads)
    out[phase] = c
    return out


# --------------------------------------------------------------------------------------------
# real runs


def real_worker(spec: dict[str, Any]) -> None:
    """One rank of a real run: save, parse, plan and verify ``repeat`` times; write results."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import ckptkit
    from ckptkit.checkpoint import manifest_io
    from ckptkit.collective import leave, metered

    rank, world, tensors = spec["rank"], spec["world"], spec["tensors"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the replicated part: the same on every rank
    model = torch.nn.Module()
    model.replicated = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
    gen = torch.Generator().manual_seed(1 + rank)  # this rank's own shards
    model.shards = torch.nn.ParameterDict({
        f"w{i:05d}": torch.nn.Parameter(DTensor.from_local(
            torch.randn(SHARD_NUMEL, generator=gen), mesh, [Shard(0)], run_check=False))
        for i in range(tensors)})
    ts = ckptkit.TrainState(model=model)
    mgr = ckptkit.CheckpointManager(spec["dir"], keep_last=2, verify_after_save=False)
    samples: dict[str, list[float]] = {}

    def add(name: str, v: float) -> None:
        samples.setdefault(name, []).append(float(v))

    path: Path | None = None
    for r in range(spec["repeat"]):
        ts.step = r + 1
        dist.barrier()
        with timed_region() as c, metered() as traffic, object_traffic() as objs:
            path = Path(str(mgr.save(ts)))
        dist.barrier()
        add("commit_s", c["s"])
        add("commit_rss", c["rss"])
        add("ck_sent", sum(traffic.sent.values()))
        add("ck_received", sum(traffic.received.values()))
        add("obj_sent", objs["sent"])
        add("obj_received", objs["received"])
        dist.barrier()
        with timed_region() as p:
            manifest_io.read(path)
        add("parse_s", p["s"])
        add("parse_rss", p["rss"])
        dist.barrier()
        with timed_region() as q:
            rep = plan_restore(path, rank)
        assert not rep.errors, rep.errors
        add("plan_s", q["s"])
        add("plan_rss", q["rss"])
        dist.barrier()
        if rank == 0:
            with timed_region() as v:
                res = ckptkit.verify(path)
            assert res.ok, res
            add("verify_s", v["s"])
            add("verify_rss", v["rss"])
        dist.barrier()
    assert path is not None
    out = {k: _median(v) for k, v in samples.items()}
    out["manifest_bytes"] = (path / "manifest.json").stat().st_size
    out["rank_manifests_bytes"] = sum(q.stat().st_size for q in (path / "ranks").glob("*.json"))
    meta = path / "dcp" / ".metadata"
    out["dcp_metadata_bytes"] = meta.stat().st_size if meta.exists() else 0
    mgr.close()
    Path(spec["out"]).write_text(json.dumps(out))
    dist.barrier()
    leave(0)  # no teardown (ckptkit.collective.leave says why)


def run_real(world: int, tensors: int, args: argparse.Namespace, scratch: Path) -> list[dict[str, Any]]:
    """Launch ``world`` ranks (as dist_bench does) and return each rank's medians."""
    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CKPTKIT_NO_PROGRESS": "1"}
    d = scratch / f"real-{world}x{tensors}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    procs = []
    for r in range(world):
        spec = {"rank": r, "world": world, "tensors": tensors, "port": port, "repeat": args.repeat,
                "dir": str(d / "run"), "out": str(d / f"rank{r}.json")}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                      env=env))
    try:
        codes = [p.wait(timeout=args.real_timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise SystemExit(f"real run {world} ranks x {tensors} tensors failed: exit codes {codes}")
    res = [json.loads((d / f"rank{r}.json").read_text()) for r in range(world)]
    shutil.rmtree(d, ignore_errors=True)
    return res


def summarize_real(world: int, tensors: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's figures and the worst of the other ranks'."""
    r0, others = ranks[0], ranks[1:]
    shared = [k for k in r0 if others and k in others[0]]  # verify runs on rank 0 only
    return {
        "world": world, "tensors": tensors, "entries": world * tensors,
        "rank0": r0, "others_max": {k: max(r[k] for r in others) for k in shared},
        "manifest_bytes": r0["manifest_bytes"], "dcp_metadata_bytes": r0["dcp_metadata_bytes"],
        "per_rank": ranks,
    }


# --------------------------------------------------------------------------------------------
# simulation driver and fits


def fit_linear(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b*x`` (numpy); ``a`` clamped to >= 0 for one-point fits."""
    import numpy as np

    if len(points) == 1:
        x, y = points[0]
        return 0.0, y / x
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    a, b = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)[0]
    return float(a), float(b)


def fit_of(points: list[tuple[float, float]], x: str, unit: str) -> dict[str, Any]:
    """A named linear fit: ``{"a", "b", "x", "unit", "points"}`` (empty without points)."""
    if not points:
        return {}
    a, b = fit_linear(points)
    return {"a": a, "b": b, "x": x, "unit": unit, "points": len(points)}


def fit_per_rank(points: list[tuple[int, int, float]], unit: str) -> dict[str, Any]:
    """Least squares ``y = a + w*W + b*W*T`` over ``(W, W*T, y)`` points: a cost per rank
    manifest (opening it, its RNG state, its schema check) besides the cost per entry.
    Falls back to :func:`fit_of` in W*T where the points cannot tell the two apart."""
    import numpy as np

    if len(points) >= 3:
        a = np.array([[1.0, w, n] for w, n, _ in points])
        if np.linalg.matrix_rank(a) == 3:
            c = np.linalg.lstsq(a, np.array([y for *_, y in points], dtype=float), rcond=None)[0]
            return {"a": float(c[0]), "w": float(c[1]), "b": float(c[2]), "x": "W*T",
                    "unit": unit, "points": len(points)}
    return fit_of([(n, y) for _, n, y in points], "W*T", unit)


def at(fit: dict[str, Any], x: float, world: float = 0.0) -> float:
    """The fit's value at ``x`` (and ``world`` ranks, for :func:`fit_per_rank`)."""
    return float(fit["a"] + fit.get("w", 0.0) * world + fit["b"] * x)


def run_sim(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Every (W, T) point: run the ones within budget (fresh process each, smallest first),
    extrapolate the rest; payloads, the root and one rank's partial read are measured for
    every point."""
    from ckptkit.format.manifest import MAX_MANIFEST_BYTES

    grid = sorted(((w, t) for w in args.sim_ranks for t in args.sim_tensors), key=lambda p: p[0] * p[1])
    ran: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for w, t in grid:
        n = w * t
        row: dict[str, Any] = {"world": w, "tensors": t, "entries": n}
        base = Base.capture(w)
        one = part_bytes(base, w - 1, t)
        row["payload"] = {"rank_sent": one, "rank0_received": (w - 1) * one}
        part = partial_manifest_work(w, t, base)
        row["partial_read"] = {"rss": None, **part}
        big = max(ran, key=lambda r: r["entries"], default=None)
        pred_s = pred_rss = 0.0
        if big is not None:
            scale = n / big["entries"]
            pred_s = sum(big[ph]["s"] for ph in SIM_MEASURED) * scale
            pred_rss = max(big[ph]["rss"] for ph in SIM_MEASURED) * scale
        if pred_s > args.budget_s or pred_rss > args.budget_gib * GiB:
            row["ran"] = False
            row["skipped_because"] = f"predicted {pred_s:.0f} s, {pred_rss / GiB:.1f} GiB"
        else:
            ckpt = scratch / f"sim-{w}x{t}"
            try:
                for ph in SIM_MEASURED:
                    r = subprocess.run(
                        [sys.executable, __file__, "--sim-phase", f"{w},{t},{ph},{ckpt}"],
                        capture_output=True, text=True, check=True,
                        timeout=max(120.0, 6 * args.budget_s))
                    row.update(json.loads(r.stdout.strip().splitlines()[-1]))
            except subprocess.TimeoutExpired:
                row["ran"] = False
                row["skipped_because"] = "killed at the time limit"
            else:
                row["ran"] = True
                ran.append(row)
            finally:
                shutil.rmtree(ckpt, ignore_errors=True)
        print(f"  sim W={w:5d} T={t:6d}: partial read {part['s']:.3f} s; " + (
            ", ".join(f"{ph} {row[ph]['s']:.3f} s" for ph in SIM_MEASURED)
            if row["ran"] else f"not run ({row['skipped_because']})"), file=sys.stderr)
        rows.append(row)
    fits: dict[str, dict[str, Any]] = {}
    for ph in SIM_MEASURED:
        fits[f"{ph} seconds"] = fit_per_rank(
            [(r["world"], r["entries"], r[ph]["s"]) for r in ran], "s")
        fits[f"{ph} peak RSS"] = fit_per_rank(
            [(r["world"], r["entries"], r[ph]["rss"]) for r in ran], "bytes")
    fits["rank 0's read-back seconds"] = fit_per_rank(
        [(r["world"], r["entries"], r["commit_rank0"]["readback_s"]) for r in ran], "s")
    fits["rank 0's root build seconds"] = fit_of(
        [(r["world"], r["commit_rank0"]["root_s"]) for r in ran], "W", "s")
    fits["root manifest size"] = fit_of(
        sorted({(r["world"], r["partial_read"]["root_bytes"]) for r in rows}), "W", "bytes")
    fits["rank manifest size"] = fit_of(
        sorted({(r["tensors"], r["partial_read"]["own_bytes"]) for r in rows}), "T", "bytes")
    fits["bytes a rank sends (its part)"] = fit_of(
        sorted({(r["tensors"], r["payload"]["rank_sent"]) for r in rows}), "T", "bytes")
    fits["a restoring rank's read (root + rank 0's + own)"] = fit_of(
        [(r["world"] + r["tensors"], r["partial_read"]["s"]) for r in rows], "W+T", "s")
    for row in rows:
        row.setdefault("manifest_bytes", row["partial_read"]["root_bytes"])  # the same root
        row.setdefault("rank_manifests_bytes", row["world"] * row["partial_read"]["own_bytes"])
        row["over_reader_limit"] = row["manifest_bytes"] > MAX_MANIFEST_BYTES
        if row["ran"] or not ran:
            continue
        n, w = row["entries"], row["world"]
        for ph in SIM_MEASURED:
            row[ph] = {"s": at(fits[f"{ph} seconds"], n, w),
                       "rss": at(fits[f"{ph} peak RSS"], n, w), "extrapolated": True}
        row["commit_rank0"]["readback_s"] = at(fits["rank 0's read-back seconds"], n, w)
        row["commit_rank0"]["root_s"] = at(fits["rank 0's root build seconds"], row["world"])
    return {"points": rows, "fits": fits}


# --------------------------------------------------------------------------------------------
# targets, report, plot


def targets(real: list[dict[str, Any]], sim: dict[str, Any],
            fits: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets as checks: the real runs' DCP layout, the simulated per-rank
    layout (a restoring rank's read, restore's plan, rank 0's commit, a full read) and the
    bytes per rank."""
    out: list[dict[str, Any]] = []
    plan = fits.get("restore plan seconds")
    if plan and plan["points"] >= 2:
        v = at(plan, TARGET_RANKS * TARGET_TENSORS)
        out.append({
            "target": f"manifest work on any rank <= {TARGET_S:g} s at {TARGET_RANKS} ranks x "
                      f"{TARGET_TENSORS} tensors, real runs' layout (DCP shards)",
            "value_s": v, "how": "extrapolated", "pass": v <= TARGET_S,
            "detail": f"restore plan of rank 0 fitted over the real runs (1-8 ranks, W processes "
                      f"on this host's cores: an upper bound) and extrapolated: {_fmt_s(v)}",
        })
    pts = {(r["world"], r["tensors"]): r for r in sim["points"]}
    pt = pts.get((TARGET_RANKS, TARGET_TENSORS))
    at_target = f"<= {TARGET_S:g} s at {TARGET_RANKS} ranks x {TARGET_TENSORS} tensors"
    if pt is not None:
        part = pt["partial_read"]
        out.append({
            "target": f"a restoring rank's manifest work {at_target}: the root, rank 0's "
                      "manifest (the replicated model) and its own",
            "value_s": part["s"], "how": "measured", "pass": part["s"] <= TARGET_S,
            "detail": f"manifest_io.read(only={{0, 1}}): root of {TARGET_RANKS} records "
                      f"({_fmt_b(part['root_bytes'])}) and rank 0's manifest "
                      f"{_fmt_s(part['shared_s'])}, + own manifest of {TARGET_TENSORS} tensors "
                      f"({_fmt_b(part['own_bytes'])}) {_fmt_s(part['own_s'])}",
        })
    if pt is not None and "parse" in pt:
        how = {ph: "extrapolated" if pt[ph].get("extrapolated") else "measured"
               for ph in SIM_MEASURED}
        c = pt["commit_rank0"]
        out.append({
            "target": f"restore's own plan on a rank {at_target}, the simulated layout (each "
                      f"rank lists T tensors of its own: manifests_to_read picks every rank's "
                      f"manifest)",
            "value_s": pt["plan"]["s"], "how": how["plan"], "pass": pt["plan"]["s"] <= TARGET_S,
            "detail": f"plan_restore on rank 1: {_fmt_s(pt['plan']['s'])} ({how['plan']}), "
                      f"it reads all {TARGET_RANKS} rank manifests "
                      f"({_fmt_b(pt['rank_manifests_bytes'])})",
        })
        out.append({
            "target": f"rank 0's commit {at_target}",
            "value_s": c["s"], "how": how["commit_rank0"], "pass": c["s"] <= TARGET_S,
            "detail": f"{_fmt_s(c['s'])} ({how['commit_rank0']}): the root from the parts in "
                      f"{_fmt_s(c.get('root_s'))}, the read-back of every rank manifest "
                      f"(StateSave.build) {_fmt_s(c.get('readback_s'))}; root "
                      f"{_fmt_b(pt['manifest_bytes'])}",
        })
        out.append({
            "target": f"a full read (verify, ckptkit ls) {at_target}",
            "value_s": pt["parse"]["s"], "how": how["parse"], "pass": pt["parse"]["s"] <= TARGET_S,
            "detail": f"manifest_io.read of the root and {TARGET_RANKS} rank manifests: "
                      f"{_fmt_s(pt['parse']['s'])} ({how['parse']})",
        })
    multi = [r for r in real if r["world"] > 1]
    for t in sorted({r["tensors"] for r in multi}):
        rows = sorted((r for r in multi if r["tensors"] == t), key=lambda r: r["world"])
        if len(rows) < 2:
            continue
        for key, what in (("ck", "ckptkit's collectives"), ("obj", "all object collectives (with DCP's)")):
            per = {r["world"]: r["others_max"][f"{key}_sent"] + r["others_max"][f"{key}_received"]
                   for r in rows}
            lo, hi = min(per.values()), max(per.values())
            out.append({
                "target": f"bytes per rank per commit independent of world size (ranks > 0), "
                          f"real runs, T={t}, {what}",
                "value": per, "how": "measured", "pass": hi <= lo * 1.05,
                "detail": ", ".join(f"W={w}: {_fmt_b(b)}" for w, b in per.items()),
            })
    sims = sim["points"]
    if sims:
        t = max(r["tensors"] for r in sims)
        rows = sorted((r for r in sims if r["tensors"] == t), key=lambda r: r["world"])
        now = {r["world"]: r["payload"]["rank_sent"] for r in rows}
        out.append({
            "target": f"bytes per rank per commit independent of world size (ranks > 0), "
                      f"simulated, T={t}, gather to rank 0 (the part: a record of its manifest)",
            "value": now, "how": "computed", "pass": max(now.values()) <= min(now.values()) * 1.05,
            "detail": ", ".join(f"W={w}: {_fmt_b(b)}" for w, b in now.items())
                      + f"; rank 0 receives {_fmt_b(rows[-1]['payload']['rank0_received'])} "
                        f"at W={rows[-1]['world']}",
        })
    return out


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def _fmt_b(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, n in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= n:
            return f"{x / n:.1f} {unit}"
    return f"{x:.0f} B"


def _formulas(fits: dict[str, dict[str, Any]]) -> list[str]:
    return [f"- {k}: {f['a']:.3g}" + (f" + {f['w']:.3g}·W" if "w" in f else "")
            + f" + {f['b']:.3g}·({f['x']}) {f['unit']} ({f['points']} points)"
            for k, f in fits.items() if f]


def real_fits(real: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rank 0's phases of the real runs against W*T."""
    out = {}
    for key, name in (("commit_s", "commit seconds"), ("parse_s", "parse seconds"),
                      ("plan_s", "restore plan seconds"), ("verify_s", "verify seconds"),
                      ("commit_rss", "commit peak RSS")):
        out[name] = fit_of([(r["entries"], r["rank0"][key]) for r in real if key in r["rank0"]],
                           "W*T", "bytes" if key.endswith("rss") else "s")
    return out


def report(res: dict[str, Any]) -> str:
    """Markdown tables of the real runs, the simulation, the formulas and the targets."""
    lines = [f"host: {res['host']}; {res['when']}; repeat {res['repeat']} (medians)", ""]
    if res["real"]:
        lines += [
            "Real runs (gloo, all ranks on this host; rank 0 | worst other rank):", "",
            "| ranks | T/rank | commit | commit peak RSS | ckptkit coll. bytes/rank | "
            "all obj. coll. bytes/rank | root + rank manifests | DCP .metadata | parse | restore plan | verify (rank 0) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in res["real"]:
            a, o = r["rank0"], r["others_max"]

            def both(k: str, fmt: Callable[[float | None], str], a: dict[str, Any] = a,
                     o: dict[str, Any] = o) -> str:
                return fmt(a.get(k)) + (f" \\| {fmt(o.get(k))}" if o else "")

            def io(p: str, a: dict[str, Any] = a, o: dict[str, Any] = o) -> str:
                s = f"{_fmt_b(a[p + '_sent'])} out, {_fmt_b(a[p + '_received'])} in"
                if o:
                    s += f" \\| {_fmt_b(o[p + '_sent'])} out, {_fmt_b(o[p + '_received'])} in"
                return s

            lines.append(
                f"| {r['world']} | {r['tensors']} | {both('commit_s', _fmt_s)} | "
                f"{both('commit_rss', _fmt_b)} | {io('ck')} | {io('obj')} | "
                f"{_fmt_b(r['manifest_bytes'])} + {_fmt_b(a.get('rank_manifests_bytes'))} | "
                f"{_fmt_b(r['dcp_metadata_bytes'])} | "
                f"{both('parse_s', _fmt_s)} | {both('plan_s', _fmt_s)} | {_fmt_s(a.get('verify_s'))} |")
        lines += ["", "Real runs, rank 0, fitted on the runs above (x = W*T; with W processes on "
                  "this host's cores):", ""]
        lines += _formulas(res["real_fits"])
        lines.append("")
    sim = res["sim"]
    if sim:
        lines += [
            "Simulation, the per-rank layout (rank 0's commit, a full read, restore's plan on "
            "rank 1 in a fresh process each; *italic*: extrapolated from the fit; the root, "
            "the payloads and a restoring rank's read of the root, rank 0's and its own "
            "manifest measured at every point):", "",
            "| ranks | T/rank | entries | root | rank manifests (all) | rank 0 commit | "
            "of which read-back | its peak RSS | full read (verify, ls) | its peak RSS | "
            "restore plan (reads all here) | its peak RSS | bytes sent/rank | rank 0 receives | "
            "root + rank 0's + own read |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sim["points"]:
            def it(x: str, r: dict[str, Any] = r) -> str:
                return f"*{x}*" if not r["ran"] else x
            c, p, q, pl = r["commit_rank0"], r["parse"], r["plan"], r["payload"]
            lines.append(
                f"| {r['world']} | {r['tensors']} | {r['entries']:,} | "
                f"{_fmt_b(r['manifest_bytes'])}"
                f"{' (over 256 MiB limit)' if r.get('over_reader_limit') else ''} | "
                f"{_fmt_b(r['rank_manifests_bytes'])} | "
                f"{it(_fmt_s(c.get('s')))} | {it(_fmt_s(c.get('readback_s')))} | "
                f"{it(_fmt_b(c.get('rss')))} | {it(_fmt_s(p.get('s')))} | "
                f"{it(_fmt_b(p.get('rss')))} | {it(_fmt_s(q.get('s')))} | {it(_fmt_b(q.get('rss')))} | "
                f"{_fmt_b(pl['rank_sent'])} | {_fmt_b(pl['rank0_received'])} | "
                f"{_fmt_s(r['partial_read']['s'])} |")
        lines += ["", "Formulas (least squares over the points that ran, or over every point "
                  "for sizes and the partial read):", ""]
        lines += _formulas(sim["fits"])
        lines.append("- payload: a rank sends p bytes (its part, independent of T); rank 0 "
                     "receives (W-1)·p")
        lines.append("")
    lines += ["Targets:", ""]
    for t in res["targets"]:
        lines.append(f"- **{'PASS' if t['pass'] else 'FAIL'}** {t['target']}: {t['detail']}")
    return "\n".join(lines)


def plot(res: dict[str, Any], path: str) -> None:
    """Log-log plot of each phase against W*T entries (matplotlib, the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'ckptkit[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=80)
    pts = res["sim"]["points"] if res["sim"] else []
    for ph, label, color in (("commit_rank0", "sim: rank 0 commit (root + read-back)", "C0"),
                             ("parse", "sim: full read (verify, ls)", "C1"),
                             ("plan", "sim: restore plan (reads every rank manifest here)", "C7")):
        for ran, mk in ((True, "o-"), (False, "x:")):
            xs = [r["entries"] for r in pts if r["ran"] == ran and ph in r]
            ys = [r[ph]["s"] for r in pts if r["ran"] == ran and ph in r]
            if xs:
                order = sorted(range(len(xs)), key=xs.__getitem__)
                ax.plot([xs[i] for i in order], [ys[i] for i in order], mk, color=color,
                        label=label + ("" if ran else " (extrapolated)"), ms=4)
    xs = sorted(pts, key=lambda r: r["entries"])
    if xs:
        ax.plot([r["entries"] for r in xs], [r["partial_read"]["s"] for r in xs], "s--",
                color="C2", ms=3, label="sim: a rank's read of root + rank 0's + own manifest")
    for key, label, color in (("commit_s", "real: commit (rank 0)", "C3"),
                              ("parse_s", "real: parse (rank 0)", "C4"),
                              ("plan_s", "real: restore plan (rank 0)", "C5"),
                              ("verify_s", "real: verify (rank 0)", "C6")):
        rr = sorted(res["real"], key=lambda r: r["entries"])
        if rr:
            ax.plot([r["entries"] for r in rr], [r["rank0"].get(key, float("nan")) for r in rr],
                    "^", color=color, ms=5, label=label)
    ax.axhline(TARGET_S, color="k", lw=0.8, ls="--")
    ax.axvline(TARGET_RANKS * TARGET_TENSORS, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("entries in the job (ranks x tensors per rank)")
    ax.set_ylabel("seconds")
    ax.set_title("ckptkit manifest work vs job size (target: 1 s at 4096 x 1000)", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --------------------------------------------------------------------------------------------


FULL: dict[str, Any] = {"ranks": [1, 2, 4, 8], "tensors_per_rank": [100, 1000], "repeat": 3,
                        "sim_ranks": [64, 256, 1024, 4096], "sim_tensors": [100, 1000, 10000]}
QUICK: dict[str, Any] = {"ranks": [1, 2], "tensors_per_rank": [10], "repeat": 1,
                         "sim_ranks": [2, 4], "sim_tensors": [10]}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=_ints, help="real runs: world sizes (1,2,4,8)")
    ap.add_argument("--tensors-per-rank", type=_ints,
                    help="real runs: distinct tensors per rank (100,1000)")
    ap.add_argument("--repeat", type=int, help="real runs: medians of N saves (3)")
    ap.add_argument("--sim-ranks", type=_ints, help="simulated world sizes (64,256,1024,4096)")
    ap.add_argument("--sim-tensors", type=_ints, help="simulated tensors per rank (100,1000,10000)")
    ap.add_argument("--budget-s", type=float, default=60.0,
                    help="simulated points predicted to take longer are extrapolated")
    ap.add_argument("--budget-gib", type=float, default=6.0,
                    help="simulated points predicted to need more peak RSS are extrapolated")
    ap.add_argument("--real-timeout", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true",
                    help="tiny defaults: ranks 1,2; T 10; sim W 2,4 x T 10; repeat 1")
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--plot", default=None, help="write the log-log plot (PNG) here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sim-phase", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        real_worker(json.loads(args.worker))
        return
    if args.sim_phase:
        w, t, phase, text = args.sim_phase.split(",", 3)
        print(json.dumps(sim_phase(int(w), int(t), phase, Path(text))))
        return
    for k, v in (QUICK if args.quick else FULL).items():
        if getattr(args, k) is None:  # what is given explicitly stays
            setattr(args, k, v)
    import torch

    res: dict[str, Any] = {
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
                f"torch {torch.__version__}",
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "repeat": args.repeat, "real": [], "sim": None,
    }
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="ckptkit-scale-"))
    try:
        if not args.no_real:
            for t in args.tensors_per_rank:
                for w in args.ranks:
                    t0 = time.perf_counter()
                    res["real"].append(summarize_real(w, t, run_real(w, t, args, scratch)))
                    print(f"  real W={w} T={t}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        if not args.no_sim:
            res["sim"] = run_sim(args, scratch)
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    res["real_fits"] = real_fits(res["real"])
    res["targets"] = targets(res["real"], res["sim"] or {"points": []}, res["real_fits"])
    print(report(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    if args.plot:
        plot(res, args.plot)


if __name__ == "__main__":
    main()
