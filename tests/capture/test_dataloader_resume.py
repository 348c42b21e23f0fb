"""Exact resumes through real data loaders, in a fresh process (docs/drills.md "Data loaders").

``loader_script.py`` trains the same tiny model through each loader recipe: a plain
``DataLoader`` over a ``ResumableSampler`` (``for batch in loader`` with ``generator=``, or
``sampler.batches(loader)`` with 0 or 2 workers, with and without ``generator=``) and
torchdata's ``StatefulDataLoader`` (0 and 2 workers). One process runs each uninterrupted
and saves mid-epoch, at the end of an epoch and mid-way through the next; a second process
restores each of those checkpoints and runs on. Every step record (loss, the RNG at step
start, batch hash, sample ids, cursor, LR, optimizer step) and the final weights must be
bitwise equal, a plain ``for batch in loader`` loop without ``generator=`` included (the
resume guard puts its ``iter()``'s draw from the global RNG back). The recipe that is not
exact (a StatefulDataLoader without ``generator=``) must be reported by the resume guard
(CK-D008).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from loader_script import CONFIGS, EXACT, SAVES

from ckptkit.signals.recorder import read_jsonl

SCRIPTS = Path(__file__).parents[1] / "scripts"

pytestmark = pytest.mark.integration


COMPARED = ("loss", "rng", "batch_hash", "sample_ids", "cursor", "lr", "opt_step", "param_hash")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("loaders")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    for role in ("reference", "resumed"):  # each a fresh interpreter
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS / "loader_script.py"), str(out), role],
            capture_output=True, text=True, env=env, timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _records(out: Path, name: str, role: str, w: int) -> dict[int, dict[str, object]]:
    return {int(r["step"]): r for r in read_jsonl(out / f"{name}-{role}-{w}.jsonl")}


@pytest.mark.slow
@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("w", SAVES)
def test_resume_is_bitwise_exact(runs: Path, name: str, w: int) -> None:
    ref = _records(runs, name, "reference", 0)
    res = _records(runs, name, "resumed", w)
    assert sorted(res) == [s for s in sorted(ref) if s > w]
    for step, r in res.items():
        want = ref[step]
        diff = {k: (want.get(k), r.get(k)) for k in COMPARED if want.get(k) != r.get(k)}
        assert not diff, (name, w, step, diff)
        assert not r.get("guard"), r.get("guard")
    first = res[w + 1]
    assert first["rng_at"] == ("data" if CONFIGS[name]["loader"] == "plain" else "forward")
    if CONFIGS[name]["loader"] == "plain":
        assert all(len(x) == 3 for x in first["sample_ids"])  # [epoch, id, content hash]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stateful-w0"])
def test_a_global_rng_draw_at_iter_is_caught_by_the_guard(runs: Path, name: str) -> None:
    w = SAVES[0]  # mid-epoch: the uninterrupted run creates no iterator there
    ref = _records(runs, name, "reference", 0)
    res = _records(runs, name, "resumed", w)
    assert res[w + 1]["rng"] != ref[w + 1]["rng"]
    codes = [g["code"] for g in res[w + 1].get("guard") or []]
    assert "CK-D008" in codes, res[w + 1]
    message = next(g["message"] for g in res[w + 1]["guard"] if g["code"] == "CK-D008")
    assert "2 words" in message and "iter(DataLoader)" in message
