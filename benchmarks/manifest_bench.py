"""Manifest parse + validate: the v0.1 path (jsonschema) against the current one (jsonschema-rs).

    python benchmarks/manifest_bench.py [--tensors 150,1000,10000] [--repeat 5] [--no-fresh]

For each size a real checkpoint is saved (model weights + AdamW state as tensors, so the
tree, tensor table and files look like a training run's), then its ``manifest.json`` bytes
are parsed and validated, in the same process and after a warm-up:

* ``before``: what v0.1's ``Manifest.from_json`` did: ``json.loads``, Python ``jsonschema``
  (Draft 2020-12, sorted ``iter_errors``), the digest, the semantic checks, the dataclasses.
* ``after``: today's ``Manifest.from_json``, which does more (strict JSON: duplicate keys,
  non-finite numbers, nesting; the state tree decoded as ``load`` decodes it) with
  ``jsonschema-rs``.

The table gives medians (ms), before/after, and after against the anchor: a bare
``json.loads`` of the same bytes (with the cyclic GC paused, as the current path runs). A second table repeats the first call in a
fresh process per size (validator construction included, imports excluded). The last
table counts how many times one call of each public read path validates a manifest.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import torch

import ckptkit
from ckptkit.format import digest, validation
from ckptkit.format import manifest as mf
from ckptkit.verify.describe import describe


def make_checkpoint(root: Path, n_tensors: int) -> Path:
    """Save a model + AdamW-shaped state of about ``n_tensors`` tensors (4 per parameter)."""
    params = max(1, n_tensors // 4)
    model = {f"layers.{i // 8}.block{i % 8}.weight": torch.zeros(4) for i in range(params)}
    state = {
        i: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)}
        for i in range(params)
    }
    groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
               "params": list(range(params))}]
    d = root / f"ckpt-{n_tensors}"
    ckptkit.save({"model": model, "optimizer": {"state": state, "param_groups": groups},
                  "step": 3}, d, step=3)
    return d


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


_OLD_VALIDATOR: jsonschema.Draft202012Validator | None = None


def before(text: bytes) -> mf.Manifest:
    """v0.1's parse: json.loads, jsonschema (sorted iter_errors), digest, semantics, dataclasses."""
    global _OLD_VALIDATOR
    if _OLD_VALIDATOR is None:
        _OLD_VALIDATOR = jsonschema.Draft202012Validator(validation.schema())
    obj = json.loads(text, parse_constant=_reject_constant)
    errs = sorted(_OLD_VALIDATOR.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    if errs:
        raise ValueError(errs[0].message)
    body = {k: v for k, v in obj.items() if k != "manifest_digest"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    if digest.hexdigest_bytes(canon.encode()) != obj["manifest_digest"]:
        raise ValueError("digest")
    mf.check_semantics(obj)
    return mf.Manifest.from_dict(obj)


def after(text: bytes) -> mf.Manifest:
    return mf.Manifest.from_json(text)


def _loads_no_gc(text: bytes) -> Any:
    """The anchor: bare json.loads under the same GC conditions as the current path."""
    with mf._gc_paused():
        return json.loads(text)


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: validators built, caches filled
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def stages_ms(text: bytes, repeat: int) -> dict[str, float]:
    """Where the current path spends its time (each stage alone, warm)."""
    obj = validation.strict_json(text, "m")
    dtypes = {t["key"]: t["dtype"] for t in obj["tensors"]}
    from ckptkit.format import tree

    return {
        "strict json": median_ms(lambda: validation.strict_json(text, "m"), repeat),
        "schema (rs)": median_ms(lambda: validation.check_schema(obj, "m"), repeat),
        "nesting": median_ms(lambda: validation.too_deep(obj), repeat),
        "digest": median_ms(lambda: validation.canonical(obj), repeat),
        "semantics": median_ms(lambda: mf.check_semantics(obj), repeat),
        "tree decode": median_ms(lambda: tree.check(obj["tree"], dtypes), repeat),
        "dataclasses": median_ms(lambda: mf.Manifest.from_dict(obj), repeat),
    }


def count_validations(ckpt: Path) -> dict[str, int]:
    """How many times one call of each read path validates the manifest."""
    calls = [0]
    real = validation.check_schema

    def spy(obj: dict[str, Any], path: str) -> None:
        calls[0] += 1
        real(obj, path)

    out: dict[str, int] = {}
    mf.check_schema = spy  # type: ignore[assignment]  # the name the root's parse calls
    try:
        for name, fn in (
            ("ckptkit.load", lambda: ckptkit.load(ckpt)),
            ("ckptkit.verify", lambda: ckptkit.verify(ckpt)),
            ("describe (inspect)", lambda: describe(ckpt)),
        ):
            calls[0] = 0
            fn()
            out[name] = calls[0]
        with tempfile.TemporaryDirectory() as run:
            mgr = ckptkit.CheckpointManager(run)
            ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=1)
            mgr.save(ts)
            mgr.wait()  # the post-save verify may run in the background
            calls[0] = 0
            mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=2))
            mgr.wait()
            out["CheckpointManager.save (2nd, with its verify)"] = calls[0]
            mgr2 = ckptkit.CheckpointManager(run)
            calls[0] = 0
            mgr2.restore(ckptkit.TrainState(model=torch.nn.Linear(2, 2)))
            out["CheckpointManager.restore (fresh manager)"] = calls[0]
            calls[0] = 0
            mgr2.list(verify=True)
            out["CheckpointManager.list(verify=True), 2 ckpts"] = calls[0]
            mgr.close()
            mgr2.close()
    finally:
        mf.check_schema = real  # type: ignore[assignment]
    return out


def one(path: str) -> None:
    """Fresh-process child: first call of each path (validator built), then warm."""
    text = Path(path).read_bytes()
    t0 = time.perf_counter()
    before(text)
    b = time.perf_counter() - t0
    t0 = time.perf_counter()
    after(text)
    a = time.perf_counter() - t0
    print(json.dumps({"before_ms": b * 1e3, "after_ms": a * 1e3}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tensors", default="150,1000,10000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-fresh", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.one)
        return
    sizes = [int(x) for x in args.tensors.split(",")]
    with tempfile.TemporaryDirectory() as root:
        rows = []
        fresh = []
        for n in sizes:
            ckpt = make_checkpoint(Path(root), n)
            p = ckpt / "manifest.json"
            text = p.read_bytes()
            nt = len(json.loads(text)["tensors"])
            rep = args.repeat if n <= 1000 else max(2, math.ceil(args.repeat / 2))
            anchor = median_ms(lambda t=text: _loads_no_gc(t), rep)
            b = median_ms(lambda t=text: before(t), rep)
            a = median_ms(lambda t=text: after(t), rep)
            rows.append((nt, len(text), anchor, b, a, stages_ms(text, rep)))
            if not args.no_fresh:
                r = subprocess.run([sys.executable, __file__, "--one", str(p)], check=True,
                                   capture_output=True, text=True)
                fresh.append((nt, json.loads(r.stdout.strip().splitlines()[-1])))
        ver = importlib.metadata.version
        print(f"torch {torch.__version__}, jsonschema {ver('jsonschema')}, jsonschema-rs "
              f"{ver('jsonschema-rs')}, python {sys.version.split()[0]}; warm medians of "
              f"{args.repeat} (10k: fewer)")
        print("\n| tensors | manifest | json.loads (anchor) | before (jsonschema) | "
              "after (jsonschema-rs) | speed-up | after / json.loads |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for nt, size, anchor, b, a, _ in rows:
            print(f"| {nt} | {size / 1e6:.2f} MB | {anchor:.1f} ms | {b:.1f} ms | {a:.1f} ms | "
                  f"{b / a:.1f}x | {a / anchor:.1f}x |")
        print("\nafter, by stage (ms, each stage alone):\n")
        names = list(rows[0][5])
        print("| tensors | " + " | ".join(names) + " |")
        print("|---:|" + "---:|" * len(names))
        for nt, _, _, _, _, st in rows:
            print(f"| {nt} | " + " | ".join(f"{st[k]:.1f}" for k in names) + " |")
        if fresh:
            print("\nfresh process, first call (validator built; imports excluded):\n")
            print("| tensors | before | after | speed-up |")
            print("|---:|---:|---:|---:|")
            for nt, r in fresh:
                print(f"| {nt} | {r['before_ms']:.1f} ms | {r['after_ms']:.1f} ms | "
                      f"{r['before_ms'] / r['after_ms']:.1f}x |")
        counts = count_validations(make_checkpoint(Path(root), 150))
        print("\nvalidations per call:\n")
        print("| call | manifest validations |")
        print("|---|---:|")
        for k, v in counts.items():
            print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
