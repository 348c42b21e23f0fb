"""Scale: what a save, a restore and a verify cost as functions of ranks and tensors
(issue 27 item 4: a measured cost model).

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
- ``parse``: ``ckptkit.checkpoint.manifest_io.read`` (read, parse, validate), every rank at
  once, as every rank does at the start of a restore;
- ``plan``: :func:`plan_restore`, restore's work before any tensor byte is read;
- ``verify``: ``ckptkit.verify`` on rank 0 (today's verify runs in one process).

**Simulation** (``--sim-ranks`` x ``--sim-tensors``): rank 0's side of a commit with W
ranks of T tensors each, built from the real classes: each rank's
:class:`~ckptkit.commit.RankPart` (a :class:`~ckptkit.storage.shards.RankFiles` with a real
RNG file and state, rank 0's relabelled, plus one file of T
:class:`~ckptkit.manifest.TensorEntry`) is pickled as the gather sends it, then each phase
runs in a fresh process (its peak RSS from a clean heap):

- ``commit_rank0``: :func:`commit_rank0`: unpickle the W parts, ``StateSave.build``,
  ``Manifest.to_json`` (what rank 0 does between the gather and the write);
- ``parse``: :func:`parse_manifest`: ``Manifest.from_json`` of that JSON (what verify
  does, and every rank inside its restore plan);
- ``plan``: :func:`plan_restore` on a checkpoint laid out from that manifest (its files
  sparse, of the listed sizes): every rank's restore planning;
- ``partial_read``: :func:`partial_manifest_work`: what one restoring rank reads of the
  per-rank layout (items 1 and 3): a real root of W rank records and the rank's own
  manifest of T entries, read by ``manifest_io.read(only=...)`` (the other W-1 rank
  manifests are not read, so not written). Measured for every point;
- payloads: the pickled part one rank sends, what rank 0 receives (W-1 parts) and what
  every rank received before item 2 (the all-gather: also W-1 parts, on every rank).

A point predicted (from the largest point run so far, linear in W*T) to exceed
``--budget-s`` or ``--budget-gib`` is not run; its figures are extrapolated from a least
squares fit ``a + b*W*T`` over the points that ran, and marked so. The manifest work that
a later layout changes is one function per phase (:func:`commit_rank0`,
:func:`parse_manifest`, :func:`plan_restore`, :func:`partial_manifest_work`): rerun this
script once per-rank manifests land, with those functions pointed at the new code.

Usage::

    python benchmarks/scale_bench.py                      # full: ~10 min on 2 cores
    python benchmarks/scale_bench.py --quick --json out.json
    python benchmarks/scale_bench.py --no-real --sim-ranks 64,256 --sim-tensors 100
    python benchmarks/scale_bench.py --json scale.json --plot docs/performance-scale.png

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
"""Simulated phases run (or extrapolated past the budget); the partial read always runs."""


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
# the manifest work, one function per phase (point these at the new code after item 1)


def plan_restore(path: Path) -> Any:
    """Restore's planning on one rank, before any tensor byte is read.

    The first step of :func:`ckptkit.restore.restore_candidate`, called as it calls it: the
    manifest read and validated, completeness and consistency checked (a stat of every
    listed file; with DCP storage, ``.metadata`` read, checked against its digest and
    unpickled with the allow-list). Today there is no per-rank choice to time after it:
    the safetensors reader reads every listed shard on every rank, and DCP's own planner
    picks a rank's chunks inside the read.
    """
    from ckptkit.verify.runner import verify_one

    return verify_one(path, families=("completeness", "consistency"), progress=False,
                      options={"scan_values": False, "read_files": False})


def commit_rank0(blobs: list[bytes], snap: Any, tmp: Path) -> str:
    """Rank 0 between the gather and the manifest write: unpickle the W parts it received,
    merge them (``StateSave.build``, ``tmp`` the checkpoint being committed) and serialise
    the manifest. The simulated parts carry their entries (one manifest of every rank's,
    the format before per-rank manifests)."""
    parts = [pickle.loads(b) for b in blobs]
    return str(snap.build(parts, tmp).to_json())


def parse_manifest(text: str) -> Any:
    """What every rank does with the manifest on restore, and verify once: parse and validate."""
    from ckptkit.manifest import Manifest

    return Manifest.from_json(text)


def partial_manifest_work(world: int, tensors: int, base: Base) -> dict[str, float]:
    """One restoring rank's manifest work in the per-rank layout (items 1 and 3), measured:
    ``manifest_io.read`` of a root listing ``world`` rank manifests (each record with its
    files and state keys, the tree with every rank's RNG state, as a save writes it), told
    to read rank 1's own manifest of ``tensors`` entries only. Returns seconds (the whole
    read; the root alone) and sizes."""
    from ckptkit import manifest as mf
    from ckptkit.checkpoint import manifest_io

    snap = base.snap
    own = _part(base, 1, tensors)
    mine = mf.RankManifest(1, 1, tuple(own.files.files), tuple(own.files.tensors))
    own_text = mine.to_json().encode()
    refs, rng = [], {}
    for r in range(world):
        if r == 1:
            refs.append(mine.ref(own_text))
        else:  # never read: its record as a save writes it, the manifest itself absent
            paths = (f"rng-{_rank_key(r)}.safetensors", f"tp/{_rank_key(r)}.safetensors")
            refs.append(mf.RankRef(r, mf.rank_manifest_path(r), len(own_text), f"{r:032x}",
                                   paths, ("rng", "tp")))
        rng[_rank_key(r)] = json.loads(json.dumps(own.rng).replace(_rank_key(1), _rank_key(r)))
    root = mf.Manifest(files=(), tensors=(), tree={"rng": rng}, components=snap.comps,
                       env=snap.env, step=1, ranks=tuple(refs))
    root_text = root.to_json().encode()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / mf.MANIFEST_NAME).write_bytes(root_text)
        (d / mf.RANKS_DIR).mkdir()
        (d / mf.rank_manifest_path(1)).write_bytes(own_text)
        manifest_io.read(d, only=lambda _root: ())  # warm-up: validators, file cache
        t0 = time.perf_counter()
        manifest_io.read(d, only=lambda _root: ())
        t1 = time.perf_counter()
        m = manifest_io.read(d, only=lambda _root: {1})
        t2 = time.perf_counter()
    assert m.read_ranks == {1} and len(m.tensors) == len(own.files.tensors)
    return {"s": t2 - t1, "root_s": t1 - t0, "own_s": (t2 - t1) - (t1 - t0),
            "root_bytes": len(root_text), "own_bytes": len(own_text)}


# --------------------------------------------------------------------------------------------
# simulation: synthetic parts made of the real classes


def _rank_key(r: int) -> str:
    from ckptkit.capture.state import rank_key

    return str(rank_key(r))


@dataclass
class Base:
    """Rank 0's real capture of a tiny TrainState at world size W (``snap``), and the part
    it writes (``part``: its model file, its RNG file and state): what every simulated rank
    copies, so each part carries a real RNG state as a real rank's does."""

    snap: Any
    part: Any

    @classmethod
    def capture(cls, world: int) -> Base:
        import torch

        import ckptkit
        from ckptkit.collective import Solo
        from ckptkit.commit import StateSave
        from ckptkit.storage import fs

        ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=1,
                                parallel=ckptkit.ParallelConfig(world_size=world, rank=0))
        snap = StateSave.capture(ts, Solo(), step=1, fields={})
        snap.fsync = False
        with tempfile.TemporaryDirectory() as tmp:
            part = snap.write(fs.location(tmp), Solo())
        return cls(snap, part)


def _part(base: Base, rank: int, tensors: int) -> Any:
    """What rank ``rank`` sends rank 0 in a save where it holds ``tensors`` own tensors: a
    RankPart with rank 0's real RNG file and state relabelled for this rank, plus one file of
    T tensor entries (its shards). Rank 0's part also lists the replicated model file."""
    from ckptkit.commit import RankPart
    from ckptkit.manifest import FileEntry, TensorEntry
    from ckptkit.storage.shards import RankFiles

    rk, r0 = _rank_key(rank), _rank_key(0)
    own = [f for f in base.part.files.files if f.component == "rng"]
    files = [replace(f, path=f.path.replace(r0, rk), rank=rank) for f in own]
    entries = [replace(t, key=t.key.replace(r0, rk), file=t.file.replace(r0, rk))
               for t in base.part.files.tensors if t.file in {f.path for f in own}]
    if rank == 0:
        files += [f for f in base.part.files.files if f not in own]
        entries += [t for t in base.part.files.tensors if t.file not in {f.path for f in own}]
    path = f"tp/{rk}.safetensors"
    nb = SHARD_NUMEL * 4
    entries += [TensorEntry(f"tp/{rk}/w{i:05d}", path, "F32", (SHARD_NUMEL,), (i * nb, (i + 1) * nb))
                for i in range(tensors)]
    files.append(FileEntry(path, tensors * (nb + 64) + 8, f"{rank:032x}", rank=rank))
    rng = json.loads(json.dumps(base.part.rng).replace(r0, rk))
    rng["rank"] = rank
    return RankPart(files=RankFiles(files=files, tensors=entries), rng=rng,
                    rng_fingerprint=f"{rank:016x}")  # distinct, as real ranks' states are


def _part_manifest(base: Base, tensors: int) -> str:
    """The JSON of one rank's own manifest (item 1's layout): its files, tensors and subtree."""
    from ckptkit import manifest as mf

    part = _part(base, 1, tensors)
    return str(mf.Manifest(files=tuple(part.files.files), tensors=tuple(part.files.tensors),
                           tree={"rng": {_rank_key(1): part.rng}}, components={}, env={},
                           step=1).to_json())


def part_bytes(base: Base, rank: int, tensors: int) -> int:
    """The pickled size of one rank's part (what the gather sends per rank)."""
    return len(pickle.dumps(_part(base, rank, tensors)))


def sim_phase(world: int, tensors: int, phase: str, text_path: Path) -> dict[str, Any]:
    """One simulated phase of one point, in this process: a fresh process per phase (see
    :func:`run_sim`), so each peak RSS starts from a clean heap. ``commit_rank0`` writes the
    manifest JSON to ``text_path``; ``parse`` and ``plan`` read it."""
    from ckptkit.manifest import MAX_MANIFEST_BYTES

    base = Base.capture(world)
    parse_manifest(_part_manifest(base, 10))  # warm-up: the schema validator is built once
    out: dict[str, Any] = {}
    if phase == "commit_rank0":
        blobs = [pickle.dumps(_part(base, r, tensors)) for r in range(world)]
        with timed_region() as c:
            text = commit_rank0(blobs, base.snap, text_path.parent)
        text_path.write_text(text)
        out["manifest_bytes"] = len(text.encode())
        out["over_reader_limit"] = out["manifest_bytes"] > MAX_MANIFEST_BYTES
    elif phase == "parse":
        text = text_path.read_text()
        with timed_region() as c:
            man = parse_manifest(text)
        assert len(man.tensors) >= world * tensors
    else:
        text = text_path.read_text()
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = _lay_out(Path(tmp), text, parse_manifest(text))
            del text
            with timed_region() as c:
                rep = plan_restore(ckpt)
        out["plan_findings"] = sorted({f"{f.code} {f.severity}" for f in rep.findings})
    out[phase] = c
    return out


def _lay_out(root: Path, text: str, man: Any) -> Path:
    """A checkpoint directory for restore planning: the manifest and every listed file as a
    sparse file of the listed size (planning stats files; it reads no tensor byte)."""
    (root / "manifest.json").write_text(text)
    for f in man.files:
        q = root / f.path
        q.parent.mkdir(parents=True, exist_ok=True)
        with open(q, "wb") as fh:
            fh.truncate(f.size)
    return root


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
            rep = plan_restore(path)
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


def at(fit: dict[str, Any], x: float) -> float:
    """The fit's value at ``x``."""
    return float(fit["a"] + fit["b"] * x)


def run_sim(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Every (W, T) point: run the ones within budget (fresh process each, smallest first),
    extrapolate the rest; payloads and one rank's partial read are computed for every point."""
    from ckptkit.manifest import MAX_MANIFEST_BYTES

    grid = sorted(((w, t) for w in args.sim_ranks for t in args.sim_tensors), key=lambda p: p[0] * p[1])
    ran: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for w, t in grid:
        n = w * t
        row: dict[str, Any] = {"world": w, "tensors": t, "entries": n}
        base = Base.capture(w)
        one = part_bytes(base, w - 1, t)
        row["payload"] = {
            "rank_sent": one, "rank0_received": (w - 1) * one,
            "allgather_received_per_rank": (w - 1) * one,
        }
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
            text = scratch / f"sim-{w}x{t}.json"
            try:
                for ph in SIM_MEASURED:
                    r = subprocess.run(
                        [sys.executable, __file__, "--sim-phase", f"{w},{t},{ph},{text}"],
                        capture_output=True, text=True, check=True,
                        timeout=max(60.0, 3 * args.budget_s))
                    row.update(json.loads(r.stdout.strip().splitlines()[-1]))
            except subprocess.TimeoutExpired:
                row["ran"] = False
                row["skipped_because"] = "killed at the time limit"
            else:
                row["ran"] = True
                ran.append(row)
            finally:
                text.unlink(missing_ok=True)
        print(f"  sim W={w:5d} T={t:6d}: " + (
            ", ".join(f"{ph} {row[ph]['s']:.3f} s" for ph in SIM_MEASURED)
            if row["ran"] else f"not run ({row['skipped_because']})"), file=sys.stderr)
        rows.append(row)
    fits: dict[str, dict[str, Any]] = {}
    for ph in SIM_MEASURED:
        fits[f"{ph} seconds"] = fit_of([(r["entries"], r[ph]["s"]) for r in ran], "W*T", "s")
        fits[f"{ph} peak RSS"] = fit_of([(r["entries"], r[ph]["rss"]) for r in ran], "W*T", "bytes")
    fits["manifest size"] = fit_of([(r["entries"], r["manifest_bytes"]) for r in ran], "W*T", "bytes")
    fits["bytes a rank sends (its part)"] = fit_of(
        sorted({(r["tensors"], r["payload"]["rank_sent"]) for r in rows}), "T", "bytes")
    fits["per-rank manifests, one restoring rank's read (root + own)"] = fit_of(
        [(r["world"] + r["tensors"], r["partial_read"]["s"]) for r in rows], "W+T", "s")
    for row in rows:
        if row["ran"]:
            continue
        if not ran:
            continue
        n = row["entries"]
        for ph in SIM_MEASURED:
            row[ph] = {"s": at(fits[f"{ph} seconds"], n), "rss": at(fits[f"{ph} peak RSS"], n),
                       "extrapolated": True}
        row["manifest_bytes"] = at(fits["manifest size"], n)
        row["over_reader_limit"] = row["manifest_bytes"] > MAX_MANIFEST_BYTES
    return {"points": rows, "fits": fits}


# --------------------------------------------------------------------------------------------
# targets, report, plot


def targets(real: list[dict[str, Any]], sim: dict[str, Any],
            fits: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets as checks, with the one-manifest figures and the per-rank read."""
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
    if pt is not None and "parse" in pt:
        work = max(pt["plan"]["s"], pt["commit_rank0"]["s"])
        how = "extrapolated" if pt["plan"].get("extrapolated") else "measured"
        out.append({
            "target": f"manifest work on any rank <= {TARGET_S:g} s at {TARGET_RANKS} ranks x "
                      f"{TARGET_TENSORS} tensors (today: one manifest)",
            "value_s": work, "how": how, "pass": work <= TARGET_S,
            "detail": f"rank 0 merges and writes it in {_fmt_s(pt['commit_rank0']['s'])}; every "
                      f"rank's restore plans in {_fmt_s(pt['plan']['s'])}, of which the parse "
                      f"is {_fmt_s(pt['parse']['s'])} ({how}); manifest "
                      f"{_fmt_b(pt['manifest_bytes'])}"
                      + (" (over the reader's 256 MiB limit: refused, CK-M006)"
                         if pt.get("over_reader_limit") else ""),
        })
        part = pt["partial_read"]
        out.append({
            "target": "the same, a restoring rank with per-rank manifests (items 1, 3): the "
                      "root and its own rank manifest",
            "value_s": part["s"], "how": "measured", "pass": part["s"] <= TARGET_S,
            "detail": f"manifest_io.read(only=own rank): root of {TARGET_RANKS} records "
                      f"({_fmt_b(part['root_bytes'])}) {part['root_s'] * 1e3:.0f} ms + own "
                      f"manifest of {TARGET_TENSORS} tensors {part['own_s'] * 1e3:.0f} ms",
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
        before = {r["world"]: r["payload"]["allgather_received_per_rank"] for r in rows}
        out.append({
            "target": f"bytes per rank per commit independent of world size (ranks > 0), "
                      f"simulated table, T={t}, gather to rank 0 (today)",
            "value": now, "how": "computed", "pass": max(now.values()) <= min(now.values()) * 1.05,
            "detail": ", ".join(f"W={w}: {_fmt_b(b)}" for w, b in now.items())
                      + f"; rank 0 receives {_fmt_b(rows[-1]['payload']['rank0_received'])} "
                        f"at W={rows[-1]['world']}",
        })
        out.append({
            "target": f"the same before item 2 (all-gather), T={t}",
            "value": before, "how": "computed",
            "pass": max(before.values()) <= min(before.values()) * 1.05,
            "detail": ", ".join(f"W={w}: {_fmt_b(b)}" for w, b in before.items()),
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
    return [f"- {k}: {f['a']:.3g} + {f['b']:.3g}·({f['x']}) {f['unit']} ({f['points']} points)"
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
            "all obj. coll. bytes/rank | manifest | DCP .metadata | parse | restore plan | verify (rank 0) |",
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
                f"{_fmt_b(r['manifest_bytes'])} | {_fmt_b(r['dcp_metadata_bytes'])} | "
                f"{both('parse_s', _fmt_s)} | {both('plan_s', _fmt_s)} | {_fmt_s(a.get('verify_s'))} |")
        lines += ["", "Real runs, rank 0, fitted on the runs above (x = W*T; with W processes on "
                  "this host's cores):", ""]
        lines += _formulas(res["real_fits"])
        lines.append("")
    sim = res["sim"]
    if sim:
        lines += [
            "Simulation (rank 0's commit, every rank's parse and restore plan of today's one manifest; "
            "*italic*: extrapolated from the fit; payloads computed from one rank's pickled part; "
            "per-rank manifests: one restoring rank's read of the root and its own, measured):", "",
            "| ranks | T/rank | entries | manifest | rank 0 commit | its peak RSS | parse (every rank) | "
            "its peak RSS | restore plan (every rank) | its peak RSS | bytes sent/rank | "
            "rank 0 receives | all-gather (before item 2)/rank | per-rank: root + own read |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sim["points"]:
            def it(x: str, r: dict[str, Any] = r) -> str:
                return f"*{x}*" if not r["ran"] else x
            c, p, q, pl = r["commit_rank0"], r["parse"], r["plan"], r["payload"]
            lines.append(
                f"| {r['world']} | {r['tensors']} | {r['entries']:,} | "
                f"{it(_fmt_b(r.get('manifest_bytes')))}"
                f"{' (over 256 MiB limit)' if r.get('over_reader_limit') else ''} | "
                f"{it(_fmt_s(c.get('s')))} | {it(_fmt_b(c.get('rss')))} | {it(_fmt_s(p.get('s')))} | "
                f"{it(_fmt_b(p.get('rss')))} | {it(_fmt_s(q.get('s')))} | {it(_fmt_b(q.get('rss')))} | "
                f"{_fmt_b(pl['rank_sent'])} | "
                f"{_fmt_b(pl['rank0_received'])} | {_fmt_b(pl['allgather_received_per_rank'])} | "
                f"{_fmt_s(r['partial_read']['s'])} |")
        lines += ["", "Formulas (least squares over the points that ran; x = W*T entries unless said):", ""]
        lines += _formulas(sim["fits"])
        lines.append("- payload: a rank sends p(T) bytes (its part); rank 0 receives (W-1)·p(T); "
                     "before item 2 every rank received (W-1)·p(T)")
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
    for ph, label, color in (("commit_rank0", "sim: rank 0 commit (build + JSON)", "C0"),
                             ("parse", "sim: parse + validate, every rank", "C1"),
                             ("plan", "sim: restore plan, every rank", "C7")):
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
                color="C2", ms=3, label="per-rank manifests: a restoring rank's read (root + own)")
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
