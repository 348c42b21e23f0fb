"""Checkpoints on S3: ckptkit against the client's own ``fs.put`` / ``fs.cat`` of the same bytes.

Starts a real S3 endpoint (``moto`` in server mode on a free local port, or ``--endpoint``
for a real one; credentials the standard AWS way) and, in one run, with the same s3fs
client:

- anchor ``fs.put``: upload the checkpoint's own files (from a local copy) with
  ``fs.put_file`` (s3fs's concurrent multipart upload);
- anchor ``fs.cat``: download them with ``fs.cat_file``;
- ``ckptkit.save`` / ``CheckpointManager.save`` to ``s3://`` (digests computed on the way
  out, manifest last, then a read-back verify for the manager);
- ``ckptkit.load`` / ``restore`` from ``s3://`` (parallel ranged reads into the tensors,
  every byte verified);
- an async manager save: the training stall against a synchronous one.

Targets (issue 15): save >= 0.9x ``fs.put``; restore >= 0.9x ``fs.cat``; async stall
<= 15% of a sync save. Ratios are anchor time / ckptkit time (> 1: ckptkit faster). Rounds
alternate the order; medians are reported. With moto the server itself (Python, on the
same 2 cores) bounds every number: the ratios compare clients, not the network.

Usage::

    python benchmarks/object_store_bench.py --mb 256 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import torch

import ckptkit


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def build(mb: int) -> ckptkit.TrainState:
    torch.manual_seed(0)
    numel = mb * (1 << 20) // 4 // 3
    width = 2048
    rows = max(1, numel // width // 4)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, rows, bias=False) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return ckptkit.TrainState(model=model, optimizer=opt, step=0, guard_k=0)


def med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256, help="state size in MiB (model + moments)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--endpoint", default=None, help="an S3 endpoint (default: start moto)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.environ.setdefault("CKPTKIT_NO_PROGRESS", "1")
    proc = None
    if args.endpoint is None:
        proc, endpoint = start_moto()
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
        )
    try:
        import fsspec

        fs = fsspec.filesystem("s3")
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        ts = build(args.mb)
        tree = {"model": ts.model.state_dict(), "optimizer": ts.optimizer.state_dict()}  # type: ignore[union-attr]
        nbytes = sum(t.numel() * t.element_size() for t in ts.model.state_dict().values()) * 3
        local = Path(tempfile.mkdtemp()) / "ck"
        ckptkit.save(tree, local, progress=False)
        files = sorted(f for f in local.iterdir() if f.is_file())
        samples: dict[str, list[float]] = {}

        def add(k: str, v: float) -> None:
            samples.setdefault(k, []).append(v)

        n = [0]
        put = [0]

        def op_put() -> None:
            n[0] += 1
            put[0] = n[0]
            t = time.perf_counter()
            for f in files:
                fs.put_file(str(f), f"{bucket}/put-{put[0]}/{f.name}")
            add("fs.put", time.perf_counter() - t)

        def op_cat() -> None:
            t = time.perf_counter()
            for f in files:
                fs.cat_file(f"{bucket}/put-{put[0]}/{f.name}")
            add("fs.cat", time.perf_counter() - t)

        def op_save() -> None:
            n[0] += 1
            t = time.perf_counter()
            ckptkit.save(tree, f"s3://{bucket}/save-{n[0]}", progress=False)
            add("ckptkit.save", time.perf_counter() - t)
            t = time.perf_counter()
            ckptkit.load(f"s3://{bucket}/save-{n[0]}", progress=False)
            add("ckptkit.load", time.perf_counter() - t)

        mgr = ckptkit.CheckpointManager(f"s3://{bucket}/run", keep_last=1)

        def op_mgr() -> None:
            n[0] += 1
            ts.step = n[0]
            t = time.perf_counter()
            mgr.save(ts)
            add("mgr.save stall", time.perf_counter() - t)
            mgr.wait()
            add("mgr.save settled", time.perf_counter() - t)
            t = time.perf_counter()
            mgr.restore(ts)
            add("mgr.restore", time.perf_counter() - t)
            n[0] += 1
            ts.step = n[0]
            t = time.perf_counter()
            mgr.save(ts, async_=True)
            add("mgr.save async stall", time.perf_counter() - t)
            mgr.wait()

        ops = [op_put, op_cat, op_save, op_mgr]
        op_put()  # warm-up: connections, allocations
        op_save()
        samples.clear()
        for r in range(args.repeat):
            for op in ops if r % 2 == 0 else list(reversed(ops)):
                op()
        mgr.close()
        res = {k: med(v) for k, v in samples.items()}
        out: dict[str, Any] = {"bytes": nbytes, "seconds": res}
        out["MB/s"] = {k: nbytes / v / 1e6 for k, v in res.items()}
        out["ratios"] = {
            "save: fs.put / ckptkit.save (target >= 0.9)": res["fs.put"] / res["ckptkit.save"],
            "save: fs.put / mgr.save stall": res["fs.put"] / res["mgr.save stall"],
            "restore: fs.cat / ckptkit.load (target >= 0.9)": res["fs.cat"] / res["ckptkit.load"],
            "restore: fs.cat / mgr.restore": res["fs.cat"] / res["mgr.restore"],
            "async stall / sync stall (target <= 0.15)": res["mgr.save async stall"]
            / res["mgr.save stall"],
        }
        print(json.dumps(out, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
