"""The first save of a fresh training process, next to its second one and to torch.save's.

    python benchmarks/first_save.py [--size-mb 24] [--repeat 5]

Every training job pays its first ``mgr.save`` in a process that has never saved before,
and so do the drill's resumed run and a pre-emption save. Whatever the save path imports
lazily lands on that first call. Each measurement runs in its own fresh interpreter
(imports of torch and ckptkit done, the model built) and times, in that order:

* ``torch.save`` of the model's state dict, the anchor (first call, then a second);
* ``CheckpointManager.save`` of a ``TrainState`` (first call, then a second);
* the "v0.2" row imports ``torch.distributed.tensor`` inside the first save's timing,
  which is what ckptkit <= 0.2 paid (it imported it on every first save to look for
  DTensors; a DTensor cannot exist before that module is imported, so now it looks only
  when the process already has it).

Prints medians over ``--repeat`` fresh processes. Ratios against torch.save in the same
child are what count: the machine is shared and noisy, and a fresh process touches new
memory many times slower than a warm one, which both the anchor and ckptkit pay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

_CHILD = """
import importlib, json, os, sys, time
import torch
torch.set_num_threads(1)
import ckptkit

size_mb, root, preimport = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.manual_seed(0)
rows = size_mb * 2**20 // 4 // 1024 // 4
model = torch.nn.Sequential(*[torch.nn.Linear(1024, rows, bias=False) for _ in range(4)])
def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

out = {}
out["torch_first"] = timed(lambda: torch.save(model.state_dict(), os.path.join(root, "a.pt")))
out["torch_second"] = timed(lambda: torch.save(model.state_dict(), os.path.join(root, "b.pt")))
mgr = ckptkit.CheckpointManager(os.path.join(root, "run"), keep_last=2)
def first():
    if preimport:  # what the first save of v0.2 did inside the call
        importlib.import_module(preimport)
    mgr.save(ckptkit.TrainState(model=model, step=1))

out["ck_first"] = timed(first)
out["ck_second"] = timed(lambda: mgr.save(ckptkit.TrainState(model=model, step=2)))
out["dtensor_imported"] = "torch.distributed.tensor" in sys.modules
mgr.close()
print(json.dumps(out))
"""


def run_child(size_mb: int, preimport: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ckptkit-bench-") as root:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(size_mb), root, preimport],
            check=True, capture_output=True, text=True,
        ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mb", type=int, default=24, help="model size in MB (fp32)")
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per variant")
    args = ap.parse_args()
    run_child(args.size_mb, "")  # warm the page cache for torch's own files
    variants = {"now": "", "v0.2 (imports DTensor)": "torch.distributed.tensor"}
    print(f"{args.size_mb} MB model, median of {args.repeat} fresh processes (seconds)")
    print(f"{'variant':<26}{'torch 1st':>10}{'ck 1st':>9}{'ck 2nd':>9}"
          f"{'1st/torch':>11}{'1st/2nd':>9}  DTensor imported")
    for label, pre in variants.items():
        runs = [run_child(args.size_mb, pre) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "dtensor_imported"}
        print(f"{label:<26}{med['torch_first']:>10.3f}{med['ck_first']:>9.3f}"
              f"{med['ck_second']:>9.3f}{med['ck_first'] / med['torch_first']:>11.2f}"
              f"{med['ck_first'] / med['ck_second']:>9.2f}  {runs[0]['dtensor_imported']}")


if __name__ == "__main__":
    main()
