#!/usr/bin/env python
"""``ckptkit.dcp`` vs plain DCP: what the digests and the checks cost, in the same run.

Four modes on one synthetic model-sized state (``--size-mb`` of fp32 tensors, a few
non-tensor values), single process, the same DCP writer settings on both sides:

* ``dcp_save``: ``dcp.save(sd, storage_writer=FileSystemWriter(d))``;
* ``ck_save``: ``dcp.save(sd, storage_writer=ckptkit.dcp.Writer(d))`` (hashing as it
  writes, manifest committed after ``.metadata``);
* ``dcp_load``: ``dcp.load(sd, storage_reader=FileSystemReader(d))``;
* ``ck_load``: ``ckptkit.dcp.load(sd, d)`` (manifest, restricted ``.metadata``, coverage,
  every byte hashed as it is parsed, non-tensor items with ``weights_only=True``).

Two settings, both reported as a ratio ckptkit / plain:

* ``warm``: one process, every mode already run once, then ``--repeats`` rounds with the
  modes interleaved (plain and ckptkit alternate which goes first); the median per mode;
* ``fresh``: each measurement in a new ``python dcp_bench.py --one MODE`` process (imports
  done, nothing else run before the timed call): what a job's first save or a restart's
  load costs. The median over ``--repeats`` processes per mode.

The files stay in the page cache between a save and the loads (as on a node that just
wrote them); both sides read the same bytes.

    python benchmarks/dcp_bench.py                 # 256 MiB, 5 repeats
    python benchmarks/dcp_bench.py --repeats 15    # a shared machine: more rounds
    python benchmarks/dcp_bench.py --quick         # 32 MiB, 3 repeats
    python benchmarks/dcp_bench.py --size-mb 1024 --dir /mnt/nvme --json out.json

Target (issue 26): writer <= 1.05x and reader <= 1.05x plain DCP.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

MODES = ("dcp_save", "ck_save", "dcp_load", "ck_load")
PAIRS = (("save", "dcp_save", "ck_save"), ("load", "dcp_load", "ck_load"))


def make_state(size_mb: int) -> dict[str, Any]:
    """Tensors of a few sizes (as a model has) adding up to ``size_mb``, plus values."""
    import torch

    g = torch.Generator().manual_seed(0)
    budget = size_mb * (1 << 20) // 4
    sd: dict[str, Any] = {"model": {}, "step": 1234, "meta": {"lr": 3e-4, "name": "bench"}}
    i = 0
    while budget > 0:
        n = min(budget, (1 << 20) if i % 4 else (4 << 20))
        sd["model"][f"layer{i}.weight"] = torch.randn(n, generator=g)
        budget -= n
        i += 1
    return sd


def blank_like(sd: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        "model": {k: torch.empty_like(v) for k, v in sd["model"].items()},
        "step": 0,
        "meta": {"lr": 0.0, "name": ""},
    }


def run_mode(mode: str, sd: dict[str, Any], root: Path) -> float:
    """Time one call of ``mode``; saves go to ``root/<mode>``, loads read ``root/ck_save``
    (written by ckptkit's writer, so it has a manifest; DCP's reader ignores it)."""
    import torch.distributed.checkpoint as dcp

    import ckptkit.checkpoint.dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode.endswith("_save"):
            d = root / mode
            shutil.rmtree(d, ignore_errors=True)
            writer: Any = (
                dcp.FileSystemWriter(str(d)) if mode == "dcp_save" else ckptkit.dcp.Writer(d)
            )
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=writer)
            return time.perf_counter() - t0
        target = blank_like(sd)
        d = root / "ck_save"
        t0 = time.perf_counter()
        if mode == "dcp_load":
            dcp.load(target, storage_reader=dcp.FileSystemReader(str(d)))
        else:
            ckptkit.dcp.load(target, d)
        return time.perf_counter() - t0


def warm(sd: dict[str, Any], root: Path, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for m in ("ck_save", *MODES):  # first calls paid; ck_save first: the loads read it
        run_mode(m, sd, root)
    for r in range(repeats):
        for _what, plain, ours in PAIRS:
            order = (plain, ours) if r % 2 == 0 else (ours, plain)
            for m in order:
                times[m].append(run_mode(m, sd, root))
    return times


def fresh(size_mb: int, root: Path, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(repeats):
        for _what, plain, ours in PAIRS:
            order = (plain, ours) if r % 2 == 0 else (ours, plain)
            for m in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", m, "--size-mb", str(size_mb), "--dir", str(root)],
                    capture_output=True, text=True, timeout=1800, check=True,
                )
                times[m].append(float(out.stdout.strip().splitlines()[-1]))
    return times


def table(results: dict[str, dict[str, list[float]]], size_mb: int) -> str:
    lines = [
        f"ckptkit.dcp vs plain DCP, {size_mb} MiB state, medians (s). 'paired': the median",
        "of each round's ratio (both sides measured back to back, so a load that comes and",
        "goes on a shared machine touches both); steadier there than the ratio of medians",
        "",
        "| setting | op | plain DCP | ckptkit.dcp | ratio | paired |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for setting, times in results.items():
        for what, plain, ours in PAIRS:
            p, o = statistics.median(times[plain]), statistics.median(times[ours])
            paired = statistics.median(a / b for a, b in zip(times[ours], times[plain], strict=True))
            lines.append(f"| {setting} | {what} | {p:.3f} | {o:.3f} | {o / p:.3f}x | {paired:.3f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="32 MiB, 3 repeats")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--skip-fresh", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.size_mb, a.repeats = 32, 3
    if a.one:
        print(run_mode(a.one, make_state(a.size_mb), a.dir))
        return
    root = Path(tempfile.mkdtemp(prefix="dcp_bench-", dir=a.dir))
    try:
        sd = make_state(a.size_mb)
        results = {"warm": warm(sd, root, a.repeats)}
        if not a.skip_fresh:
            results["fresh"] = fresh(a.size_mb, root, a.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(results, a.size_mb))
    if a.json:
        a.json.write_text(json.dumps({"size_mb": a.size_mb, "times": results}, indent=1))


if __name__ == "__main__":
    main()
