"""Issue 24 review: the run layer's own bugs, each reproduced.

* An adopted manifest that does not check under the run's key (or cannot be read) says no
  step: an Accelerate ``checkpoint_I`` with one and no intent record is listed with its
  step unknown (never at its save count ``I``), adopting it again needs ``--step``, and a
  resume passes it over as corrupt instead of refusing it as the "newest complete" one.
* An emergency checkpoint the run already holds is pinned by rank 0 only (the lock holder);
  another rank pinning tried to take the run lock.
* ``ckptkit adopt`` on a run whose lock a live writer holds is refused before anything is
  written (it raced the writer's settle step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from ckptkit.checkpoint.catalog import INDEX, SIGNED
from ckptkit.errors import CkptkitError
from ckptkit.run import Run
from ckptkit.run.layouts.hf import open_hf
from ckptkit.run.layouts.lightning import LightningLayout
from ckptkit.signals import emergency
from ckptkit.verify.foreign.adopt import adopted_path

KEY = b"k" * 32
OTHER = b"o" * 32


def _accelerate_checkpoint(project: Path, number: int) -> Path:
    p = project / "checkpoints" / f"checkpoint_{number}"
    p.mkdir(parents=True)
    save_file({"w": torch.ones(3)}, str(p / "model.safetensors"))
    (p / "random_states_0.pkl").write_bytes(b"")
    return p


def _adopted_under_another_key(tmp_path: Path) -> Path:
    """``checkpoint_1`` adopted at step 80, signed with OTHER; no intent record."""
    p = _accelerate_checkpoint(tmp_path / "proj", 1)
    with open_hf(p.parent, "accelerate", readonly=False, key=OTHER) as run:
        a = run.adopt(p, step=80, force=True, expect="weights")
        index = Path(str(run.meta)) / INDEX
    assert a.manifest is not None
    # Planted: whoever signed it with another key left no record that the run is signed
    # (a writer with KEY would be refused in a run signed with OTHER, CK-R012).
    idx = json.loads(index.read_text())
    del idx[SIGNED]
    index.write_text(json.dumps(idx))
    return p


def test_a_manifest_signed_with_another_key_says_no_step(tmp_path: Path) -> None:
    p = _adopted_under_another_key(tmp_path)
    with open_hf(p.parent, "accelerate", key=KEY) as run:
        (info,) = run.checkpoints()
        assert info.status == "untrusted" and "CK-M011" in (info.problem or "")
        assert not info.step_known  # not the save count 1 as if it were known
        assert run.step_of(p) is None  # nor the step the unchecked manifest claims


def test_an_unreadable_or_invalid_manifest_says_no_step(tmp_path: Path) -> None:
    p = _accelerate_checkpoint(tmp_path / "proj", 1)
    adopted_path(p).write_text("{not json")
    with open_hf(p.parent, "accelerate", key=KEY) as run:
        (info,) = run.checkpoints()
        assert info.status == "corrupt" and not info.step_known


def test_adopting_again_never_takes_the_step_of_another_keys_manifest(tmp_path: Path) -> None:
    p = _adopted_under_another_key(tmp_path)
    before = adopted_path(p).read_bytes()
    with (
        open_hf(p.parent, "accelerate", readonly=False, key=KEY) as run,
        pytest.raises(CkptkitError, match="step is unknown") as ei,
    ):
        run.adopt(p, force=True, expect="weights")
    assert "ckptkit adopt --step N" in (ei.value.hint or "")
    assert adopted_path(p).read_bytes() == before  # not signed again at its claimed step


def test_a_corrupt_checkpoint_of_unknown_step_is_passed_over_on_resume(tmp_path: Path) -> None:
    p = _adopted_under_another_key(tmp_path)
    with open_hf(p.parent, "accelerate", readonly=False, key=KEY) as run:
        chosen = run.resume_target()  # before: refused as "the newest complete checkpoint"
    assert chosen.info is None
    (why,) = chosen.passed
    assert why.startswith("checkpoint_1: untrusted: CK-M011")


# --- the emergency checkpoint pins on rank 0 only --------------------------------------------


class _Run:
    def __init__(self) -> None:
        self.pinned: list[tuple[str, str]] = []

    def pin(self, path: Path, label: str) -> None:
        self.pinned.append((Path(str(path)).name, label))


def _host(tmp_path: Path) -> Any:
    policy = SimpleNamespace(should_save=lambda v: True, saved=lambda step: None, pin="emergency")
    return SimpleNamespace(
        watch=None, emergency=policy, wait=lambda: None, root=tmp_path,
        trajectory=SimpleNamespace(holds=lambda step: True), run=_Run(),
    )


@pytest.mark.parametrize(("rank", "pins"), [(0, [("step-00000007", "emergency")]), (1, [])])
def test_only_rank_zero_pins_an_emergency_checkpoint_the_run_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: int, pins: list[tuple[str, str]]
) -> None:
    monkeypatch.setattr(emergency, "current", lambda: SimpleNamespace(rank=rank, world=2))
    monkeypatch.setattr(emergency, "any_true", lambda coll, due: True)  # the ranks agreed
    host = _host(tmp_path)
    verdict = SimpleNamespace(summary=lambda: "loss spike")
    path = emergency.emergency_checkpoint(host, SimpleNamespace(step=7), verdict=verdict)
    assert path is not None and Path(str(path)).name == "step-00000007"  # every rank names it
    assert host.run.pinned == pins


# --- ckptkit adopt is refused while a live writer holds the run -------------------------------


def test_cli_adopt_is_refused_while_a_live_writer_holds_the_run(tmp_path: Path) -> None:
    f = tmp_path / "epoch=0-step=2.ckpt"
    torch.save({"state_dict": {"w": torch.ones(3)}, "global_step": 2,
                "pytorch-lightning_version": "2.6"}, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTKIT_")}
    with Run(tmp_path, LightningLayout(), readonly=False):  # the training run, holding the lock
        proc = subprocess.run(
            [sys.executable, "-m", "ckptkit", "adopt", str(f), "--expect", "weights"],
            env=env, capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr, proc.stderr  # names the holder
    assert not adopted_path(f).exists()  # nothing written beside the writer's files
