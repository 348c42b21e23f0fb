"""``resume_target(reject=...)``: a caller passes over checkpoints it cannot resume from.

An integration knows things the run does not: torchtitan's default last step holds the
model only, and a full-state resume of it fails. The caller's ``reject`` names why; the
checkpoint is then passed over (and said so) like a damaged one, and the next is chosen.
"""

from __future__ import annotations

from pathlib import Path

import torch

import ckptkit
from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.run import NativeLayout, resume_target


def _run(root: Path) -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    with ckptkit.CheckpointManager(root) as mgr:
        for step in (10, 20, 30):
            mgr.save(ts, step=step)


def test_a_rejected_newest_checkpoint_is_passed_over_with_the_reason(tmp_path: Path) -> None:
    _run(tmp_path)
    asked: list[int] = []

    def reject(c: CheckpointInfo) -> str | None:
        asked.append(c.step)
        return "model only: a full-state resume needs the optimizer" if c.step == 30 else None

    chosen = resume_target(tmp_path, NativeLayout(), reject=reject)
    assert chosen.step == 20
    assert chosen.passed == ["step-00000030: model only: a full-state resume needs the optimizer"]
    assert asked == [30, 20]  # asked newest first, and no further than the choice


def test_without_reject_the_newest_is_chosen(tmp_path: Path) -> None:
    _run(tmp_path)
    assert resume_target(tmp_path, NativeLayout()).step == 30
    assert resume_target(tmp_path, NativeLayout(), reject=lambda c: "no").info is None
