"""kill -9 at random moments of a save: nothing committed is lost, nothing half-written loads.

The supplement to ``test_crash_points.py`` (which stops a writer at every named point of a
save): here a real SIGKILL lands at a random moment, between the points too. Each trial is a
writer process forked from a warmed zygote (``tests/zygote.py``) that saves one step of a
24 MB model with ``CKPTKIT_CRASH_TRACE`` set, so the phases it reached are known when it
dies. The kill moments are calibrated on the trials themselves, never on a clock measured
once: the first trial saves whole and its trace gives the phases and how long each takes;
every later trial waits until its writer reaches a chosen phase (in random order, all of
them in turn), then kills it after a random part of that phase's measured length. A fast or
a slow machine moves the phases, not where the kills land.

After each kill the test checks, from this process, what the phase reached implies:

* past the rename (``commit.renamed`` traced), the new step is committed; before the
  manifest (``commit.manifest_written`` not traced), it is not;
* every directory that looks committed (``step-N/manifest.json``) verifies;
* no committed checkpoint was lost: if the new step did not commit, the run is exactly
  as before; if it did, the ``keep_last`` newest are all there;
* ``latest`` names a committed checkpoint;
* opening a writer removes the leftovers (and only them);
* ``restore`` picks the newest committed checkpoint, verified while it is read.

It asserts what each kill implies, never how many kills landed where.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit import crashpoints
from ckptkit.checkpoint.catalog import LATEST, STEP_RE
from ckptkit.run.manager import CheckpointManager
from ckptkit.storage import atomic
from ckptkit.verify.runner import verify_one

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRIALS = 16
KEEP_LAST = 2
SIZE_MB = 24

_WRITER = f"""
import sys
import torch
import ckptkit

root, step = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
rows = {SIZE_MB} * 2**20 // 4 // 1024 // 4
model = torch.nn.Sequential(*[torch.nn.Linear(1024, rows, bias=False) for _ in range(4)])
mgr = ckptkit.CheckpointManager(root, keep_last={KEEP_LAST})
mgr.save(ckptkit.TrainState(model=model, step=step))
mgr.close()
"""


def _model() -> torch.nn.Module:
    rows = SIZE_MB * 2**20 // 4 // 1024 // 4
    return torch.nn.Sequential(*[torch.nn.Linear(1024, rows, bias=False) for _ in range(4)])


def _read_trace(path: Path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        name, _, t = line.partition(" ")
        if t:  # a line cut by the kill has no time yet
            out.append((name, float(t)))
    return out


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
    mgr.run.writer()
    assert atomic.leftovers(root) == []
    assert not list(root.glob("*.tmp"))
    assert _committed(root) == after  # cleanup touched nothing committed
    res = mgr.restore(ckptkit.TrainState(model=_model()))
    assert res is not None and res.step == max(after)
    mgr.close()
    return after


def _kill_in_phase(child, trace: Path, phase: str, delay: float) -> bool:
    """Kill ``child`` ``delay`` seconds after it reaches ``phase``; False if it ended first."""
    deadline = time.monotonic() + 120
    while not any(name == phase for name, _ in _read_trace(trace)):
        if time.monotonic() > deadline:
            raise AssertionError(f"the writer never reached {phase}: {_read_trace(trace)}")
        try:
            os.kill(child.pid, 0)
        except ProcessLookupError:  # reaped: ended without reaching it (checked by the caller)
            return False
        time.sleep(0.001)
    time.sleep(delay)
    try:
        os.kill(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def test_sigkill_at_random_moments_of_a_save(zygote, tmp_path: Path) -> None:
    root = tmp_path / "run"
    for step in (1, 2):
        r = zygote.run(_WRITER, str(root), str(step))
        assert r.returncode == 0, r.stderr
    before = _committed(root)
    assert before == {1, 2}

    # Calibration: a whole save, traced, gives the phases and their lengths.
    trace = tmp_path / "trace-3"
    r = zygote.run(_WRITER, str(root), "3", env={crashpoints.TRACE_ENV: str(trace)})
    assert r.returncode == 0, r.stderr
    phases = _read_trace(trace)
    length = {
        name: max(0.0, nxt - t) for (name, t), (_, nxt) in itertools.pairwise(phases)
    }
    length[phases[-1][0]] = 0.05  # after the last point: the process's exit
    before = _check(root, before, 3)

    rng = random.Random(1234)
    order = [name for name, _ in phases]
    targets = [order[i % len(order)] for i in range(TRIALS)]
    rng.shuffle(targets)
    seen = []
    for i, phase in enumerate(targets):
        step = 4 + i
        trace = tmp_path / f"trace-{step}"
        child = zygote.start(_WRITER, str(root), str(step),
                             env={crashpoints.TRACE_ENV: str(trace)})
        killed = _kill_in_phase(child, trace, phase, rng.random() * length[phase])
        res = child.wait(timeout=120)
        reached = [name for name, _ in _read_trace(trace)]
        if killed:
            assert res.returncode in (-signal.SIGKILL, 0), res.stderr
        else:
            assert res.returncode == 0, res.stderr
        after = _check(root, before, step)
        if "commit.renamed" in reached:
            assert step in after, f"killed after the rename ({reached[-1]}), step lost"
        if "commit.manifest_written" not in reached:
            assert step not in after, f"killed before the manifest ({reached}), yet committed"
        seen.append((phase, reached[-1] if reached else "start", step in after))
        before = after
    print("phase aimed at -> last point reached, committed:", *seen, sep="\n  ")
