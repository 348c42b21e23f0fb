"""CK-C020 on checkpoints of other tools: their own bytes show a scheduler was attached.

Each case is a real checkpoint of the tool (the session fixtures of ``conftest.py``) with
the scheduler's state missing as that tool's users lose it: Accelerate when the scheduler
is not passed to ``accelerator.prepare`` (no ``scheduler.bin``), Lightning when
``lr_schedulers`` is emptied. The Trainer needs ``scheduler.pt`` to resume at all, so its
reader already requires it (CK-C001) and CK-C020 stays silent rather than say it twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ckptkit import codes
from ckptkit.verify.runner import verify

pytestmark = pytest.mark.integration


def _codes(path: Path) -> dict[str, str]:
    return {f.code: f.message for f in verify(path, progress=False).findings}


def test_accelerate_without_scheduler_bin(
    accelerate_ckpt: Path, copy_ckpt: Callable[[Path], Path]
) -> None:
    assert codes.C020 not in _codes(accelerate_ckpt)
    ck = copy_ckpt(accelerate_ckpt)
    (ck / "scheduler.bin").unlink()
    found = _codes(ck)
    assert codes.C020 in found, found
    assert "initial_lr" in found[codes.C020] and "an LR scheduler" in found[codes.C020]


def test_lightning_with_its_schedulers_dropped(
    lightning_ckpts: dict[str, Path], copy_ckpt: Callable[[Path], Path]
) -> None:
    assert codes.C020 not in _codes(lightning_ckpts["full"])
    ck = copy_ckpt(lightning_ckpts["full"])
    obj = torch.load(ck, weights_only=True)
    obj["lr_schedulers"] = []
    torch.save(obj, ck)
    found = _codes(ck)
    assert codes.C020 in found, found


def test_trainer_without_scheduler_pt_is_c001_only(
    hf_ckpt: Path, copy_ckpt: Callable[[Path], Path]
) -> None:
    ck = copy_ckpt(hf_ckpt)
    (ck / "scheduler.pt").unlink()
    found = _codes(ck)
    assert codes.C001 in found and "scheduler.pt" in found[codes.C001]
    assert codes.C020 not in found
