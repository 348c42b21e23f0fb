#!/usr/bin/env python
"""Async-save benchmark: training stall, extra peak RAM and time to durable.

Compares, on one synthetic ~1 GiB training state and in the same run:

* ``ck_sync``: ``CheckpointManager.save(ts)`` (write, fsync, verify, ``latest``, rotate);
* ``ck_async``: ``CheckpointManager.save(ts, async_=True)`` then ``wait()``;
* ``ck_async_nv``: the same with ``verify_after_save=False`` (what staging alone costs);
* ``dcp_sync`` / ``dcp_async``: ``torch.distributed.checkpoint.save`` / ``async_save``
  (``future.result()`` = durable), single process.

Each mode runs in its own fresh ``python async_bench.py --one MODE`` child, so its peak
RSS is its own. A child builds the state, warms up on a tiny save (imports and first-call
costs paid), records ``VmRSS``, resets ``VmHWM`` (``/proc/self/clear_refs``), then saves
``--saves`` times (default 2: the first async save allocates the staging buffers, later
ones reuse them). It reports per save: ``stall`` (how long the call blocked the training
loop), ``durable`` (call start until the checkpoint is on disk and, for ckptkit,
verified), and the extra peak RSS over all saves (``VmHWM`` minus the RSS before).

    python benchmarks/async_bench.py              # 1 GiB
    python benchmarks/async_bench.py --quick      # 0.25 GiB
    python benchmarks/async_bench.py --size-gb 2 --dir /mnt/nvme --json out.json

Targets (issue "CheckpointManager hardening"): stall <= 15% of the synchronous save,
extra peak RAM <= 1.05x the state, time to durable <= 1.2x the synchronous save.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GiB = 1024**3
MODES = ("ck_sync", "ck_async", "ck_async_nv", "dcp_sync", "dcp_async")
"""``ck_async_nv``: async without the post-save verify, to separate staging from verify."""


# --------------------------------------------------------------------------- #
# child side
# --------------------------------------------------------------------------- #


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _make_state(nbytes: int) -> Any:
    """A model of 8 big fp32 matrices plus a few small tensors, ``nbytes`` in all."""
    import torch

    n_big = 8
    per = nbytes // n_big // 4
    cols = 4096
    rows = max(1, per // cols)
    model = torch.nn.Module()
    model.mats = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(rows, cols), requires_grad=False) for _ in range(n_big)]
    )
    model.norm = torch.nn.LayerNorm(cols)
    return model


def _bump(model: Any) -> None:
    """Change the weights between saves, as a training step would."""
    import torch

    with torch.no_grad():
        for p in model.mats:
            p.add_(1.0)


def _dcp_init() -> str:
    """Start a one-rank gloo group if DCP needs one; return how DCP runs."""
    import torch.distributed as dist

    if dist.is_initialized():
        return "gloo world_size=1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return "gloo world_size=1"


def run_one(mode: str, size_gb: float, workdir: Path, saves: int) -> dict[str, Any]:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    nbytes = int(size_gb * GiB)
    model = _make_state(nbytes)
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    note = ""
    if mode.startswith("ck_"):
        import ckptkit

        ts = ckptkit.TrainState(model=model, step=0)
        warm = ckptkit.CheckpointManager(workdir / "warm", keep_last=1)
        warm.save(ckptkit.TrainState(model=torch.nn.Linear(8, 8), step=0), async_=True)
        warm.close()
        mgr = ckptkit.CheckpointManager(
            workdir / "run", keep_last=1, verify_after_save=mode != "ck_async_nv"
        )

        def one(step: int) -> tuple[float, float]:
            ts.step = step
            t0 = time.perf_counter()
            mgr.save(ts, async_=mode.startswith("ck_async"))
            t_ret = time.perf_counter()
            mgr.wait()
            return t_ret - t0, time.perf_counter() - t0

    else:
        import torch.distributed.checkpoint as dcp

        note = _dcp_init()
        small = {"w": torch.randn(8, 8)}
        if mode == "dcp_async":
            dcp.async_save(small, checkpoint_id=str(workdir / "warm")).result()
        else:
            dcp.save(small, checkpoint_id=str(workdir / "warm"))

        def one(step: int) -> tuple[float, float]:
            sd = model.state_dict()
            out = workdir / f"dcp-{step}"
            t0 = time.perf_counter()
            if mode == "dcp_async":
                fut = dcp.async_save(sd, checkpoint_id=str(out))
                t_ret = time.perf_counter()
                fut.result()
            else:
                dcp.save(sd, checkpoint_id=str(out))
                t_ret = time.perf_counter()
            # DCP does not fsync by default; flush so "durable" means the same for all.
            for f in out.rglob("*"):
                if f.is_file():
                    fd = os.open(f, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            done = time.perf_counter() - t0
            prev = workdir / f"dcp-{step - 1}"
            shutil.rmtree(prev, ignore_errors=True)  # keep_last=1, like the manager
            return t_ret - t0, done

    rss0 = _status_kib("VmRSS") * 1024
    hwm_ok = _reset_hwm()
    per_save = []
    for i in range(saves):
        stall, durable = one(i + 1)
        per_save.append({"stall": stall, "durable": durable})
        _bump(model)
    peak = _status_kib("VmHWM") * 1024
    return {
        "mode": mode,
        "state_bytes": state_bytes,
        "saves": per_save,
        "extra_peak": peak - rss0 if hwm_ok else None,
        "note": note,
    }


# --------------------------------------------------------------------------- #
# parent side
# --------------------------------------------------------------------------- #


def _fresh(mode: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    wd = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=base))
    cmd = [
        sys.executable,
        __file__,
        "--one",
        mode,
        "--size-gb",
        str(args.size_gb),
        "--saves",
        str(args.saves),
        "--workdir",
        str(wd),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    finally:
        shutil.rmtree(wd, ignore_errors=True)
    if proc.returncode != 0:
        return {"mode": mode, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0, help="state size in GiB (default 1.0)")
    ap.add_argument("--quick", action="store_true", help="0.25 GiB state")
    ap.add_argument(
        "--saves",
        type=int,
        default=3,
        help="saves per mode; the first allocates staging, 'steady' is the median of the rest",
    )
    ap.add_argument("--dir", type=Path, default=Path("."), help="where the temp dirs go")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.size_gb = 0.25
    if args.one:
        print(json.dumps(run_one(args.one, args.size_gb, args.workdir, args.saves)))
        return 0

    base = Path(tempfile.mkdtemp(prefix="ckptkit-async-bench-", dir=args.dir))
    try:
        results = {m: _fresh(m, args, base) for m in args.modes.split(",")}
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"\nasync save, {args.size_gb:g} GiB state, {os.cpu_count()} CPUs, "
        f"{args.saves} saves per mode (fresh process each)\n"
    )
    hdr = (
        f"{'mode':<12} {'stall 1st':>10} {'stall':>8} {'durable 1st':>12} "
        f"{'durable':>8} {'extra peak':>11}"
    )
    print(hdr)
    print("-" * len(hdr))
    summary: dict[str, dict[str, float | None]] = {}
    for m, r in results.items():
        if "error" in r:
            print(f"{m:<12} failed: {' '.join(r['error'])}")
            continue
        s = r["saves"]
        xp = r["extra_peak"] / r["state_bytes"] if r["extra_peak"] is not None else None
        rest = s[1:] or s
        summary[m] = {
            "stall_first": s[0]["stall"],
            "stall": statistics.median(x["stall"] for x in rest),
            "durable_first": s[0]["durable"],
            "durable": statistics.median(x["durable"] for x in rest),
            "extra_peak_x": xp,
        }
        v = summary[m]
        print(
            f"{m:<12} {_fmt_s(v['stall_first']):>10} {_fmt_s(v['stall']):>8} "
            f"{_fmt_s(v['durable_first']):>12} {_fmt_s(v['durable']):>8} "
            f"{('n/a' if xp is None else f'{xp:.2f}x'):>11}"
        )
    print(
        "\nseconds; '1st' = first save (allocates staging), otherwise the median of the "
        "later saves;\nextra peak = peak RSS during all saves minus RSS before, over the state size"
    )

    sync, asy = summary.get("ck_sync"), summary.get("ck_async")
    if sync and asy:
        ref = sync["durable"] or 1e-9
        checks = [
            ("stall (steady) / sync save", asy["stall"] / ref, 0.15),
            ("stall (first save) / sync save", asy["stall_first"] / ref, None),
            ("extra peak RAM / state", asy["extra_peak_x"], 1.05),
            ("time to durable / sync save", asy["durable"] / ref, 1.2),
        ]
        nv = summary.get("ck_async_nv")
        if nv:
            checks.append(("extra peak RAM / state, no verify", nv["extra_peak_x"], None))
        dcp = summary.get("dcp_async")
        dsync = summary.get("dcp_sync")
        if dcp and dsync:
            checks += [
                (
                    "DCP async stall / DCP sync save",
                    dcp["stall"] / (dsync["durable"] or 1e-9),
                    None,
                ),
                ("DCP async extra peak RAM / state", dcp["extra_peak_x"], None),
            ]
        print()
        for name, val, target in checks:
            if val is None:
                print(f"  {name:<34} n/a")
                continue
            verdict = "" if target is None else (" OK" if val <= target else " MISSED")
            tgt = "" if target is None else f" (target <= {target:g})"
            print(f"  {name:<34} {val:6.2f}{tgt}{verdict}")
    if args.json:
        args.json.write_text(
            json.dumps({"size_gb": args.size_gb, "results": results, "summary": summary}, indent=2)
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
