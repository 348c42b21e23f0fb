"""kill -9 at many moments of a save: nothing committed is lost, nothing half-written loads.

A *zygote* process imports torch and ckptkit and builds the state once, then forks one
writer per trial (a real process, killed with SIGKILL), so a trial costs a save, not an
interpreter start. The kill times are stratified over the measured duration of a save
(open, lock, leftovers cleanup, write, fsync, manifest, rename, verify, ``latest``,
rotation) in random order, with a few landing just after it ends. After each kill the
test checks, from this process:

* every directory that looks committed (``step-N/manifest.json``) verifies;
* no committed checkpoint was lost: if the new step did not commit, the run is exactly
  as before; if it did, the ``keep_last`` newest are all there;
* ``latest`` names a committed checkpoint;
* opening a writer removes the leftovers (and only them);
* ``restore`` picks the newest committed checkpoint, verified while it is read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.catalog import LATEST, STEP_RE
from ckptkit.manager import CheckpointManager
from ckptkit.storage import atomic
from ckptkit.verify.runner import verify_one

pytestmark = pytest.mark.slow

TRIALS = 36
KEEP_LAST = 2
SIZE_MB = 24
"""State size: one save (write + fsync + verify + rotate) takes ~0.5-1 s on a 2-core box."""

_ZYGOTE = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    import torch
    torch.set_num_threads(1)
    import ckptkit

    root, trials, size_mb, keep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(0)
    rows = size_mb * 2**20 // 4 // 1024 // 4
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, rows, bias=False) for _ in range(4)])

    def child(step):
        try:
            mgr = ckptkit.CheckpointManager(root, keep_last=keep)
            mgr.save(ckptkit.TrainState(model=model, step=step))
            mgr.close()
        finally:
            os._exit(0)

    def trial(step, delay):
        pid = os.fork()
        if pid == 0:
            child(step)
        t0 = time.perf_counter()
        killed = False
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if delay is not None and time.perf_counter() - t0 >= delay:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                killed = True
                break
            time.sleep(0.002)
        return time.perf_counter() - t0, killed

    # Calibrate: two whole saves (the second one also rotates and cleans up).
    trial(1, None)
    full, _ = trial(2, None)
    rng = random.Random(1234)
    slots = list(range(trials))
    rng.shuffle(slots)
    print(json.dumps({"calibrated": full}), flush=True)
    for i, slot in enumerate(slots):
        sys.stdin.readline()
        delay = full * 1.05 * (slot + rng.random()) / trials
        took, killed = trial(3 + i, delay)
        print(json.dumps({"step": 3 + i, "delay": delay, "killed": killed}), flush=True)
    """
)


def _committed(root: Path) -> set[int]:
    return {
        int(m.group(1))
        for p in root.iterdir()
        if (m := STEP_RE.match(p.name)) and atomic.is_committed(p)
    }


def _check(root: Path, before: set[int], step: int) -> set[int]:
    after = _committed(root)
    for s in after:
        rep = verify_one(root / f"step-{s:08d}", progress=False)
        assert rep.ok, f"step {s} looks committed but fails verify: {rep.errors}"
    if step in after:
        newest = sorted(before | {step})[-KEEP_LAST:]
        assert set(newest) <= after, f"lost committed checkpoints: {set(newest) - after}"
        assert after <= before | {step}
    else:
        assert after == before, f"run changed although step {step} never committed"
    if (root / LATEST).exists():
        assert int((root / LATEST).read_text().strip().split("-")[1]) in after

    mgr = CheckpointManager(root, keep_last=KEEP_LAST)  # a writer: cleans leftovers
    mgr._writer()
    assert atomic.leftovers(root) == []
    assert not list(root.glob("*.tmp"))
    assert _committed(root) == after  # cleanup touched nothing committed
    model = torch.nn.Sequential(
        *[torch.nn.Linear(1024, SIZE_MB * 2**20 // 4 // 1024 // 4, bias=False) for _ in range(4)]
    )
    res = mgr.restore(ckptkit.TrainState(model=model))
    assert res is not None and res.step == max(after)
    mgr.close()
    return after


def test_sigkill_at_many_moments_of_a_save(tmp_path: Path) -> None:
    root = tmp_path / "run"
    z = subprocess.Popen(
        [sys.executable, "-c", _ZYGOTE, str(root), str(TRIALS), str(SIZE_MB), str(KEEP_LAST)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert z.stdin is not None and z.stdout is not None
    try:
        first = json.loads(z.stdout.readline())
        print(f"one save takes {first['calibrated']:.2f} s")
        assert 0.05 < first["calibrated"] < 30, first
        before = _committed(root)
        assert before == {1, 2}
        outcomes = []
        for _ in range(TRIALS):
            z.stdin.write("go\n")
            z.stdin.flush()
            line = z.stdout.readline()
            assert line, "zygote died"
            t = json.loads(line)
            before = _check(root, before, t["step"])
            outcomes.append((t["killed"], t["step"] in before))
        killed = [o for o in outcomes if o[0]]
        # The kills really spread over the save: some before the commit, some after it.
        print(f"{len(killed)} kills, {sum(c for _, c in killed)} after the commit")
        assert len(killed) >= 30, outcomes
        assert any(not c for _, c in killed) and any(c for _, c in killed)
    finally:
        z.kill()
        z.wait()
        z.stdin.close()
        z.stdout.close()
