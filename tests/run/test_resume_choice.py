"""Issue 24: on several ranks the choice of what to resume from is made once, by rank 0.

Before, every rank chose for itself: each opened the run writable, whichever won the lock
adopted the unadopted newest checkpoint, and a rank that lost read it again while it could
still be unadopted; ranks could load different states. Now rank 0 chooses (and alone
adopts) and broadcasts the choice, or its refusal, to every rank
(:func:`ckptkit.run.resume_target`).
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
import torch
from _launch import launch
from safetensors.torch import save_file

from ckptkit.verify.foreign.adopt import adopted_path

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

WORKER = Path(__file__).parents[1] / "ranks" / "_resume_worker.py"


def _lightning_run(d: Path) -> Path:
    """A Fabric run (one process) whose newest file, step 4, was never adopted."""
    L = pytest.importorskip("lightning")
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from ckptkit.integrations.lightning import FabricCheckpoints

    fabric = L.Fabric(accelerator="cpu", devices=1)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = FabricCheckpoints(fabric, d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck.save(2, {"model": model, "optimizer": opt, "step": 2})
    ck.close()
    newest = d / "step=4.ckpt"
    # Lightning's own writer: what a kill after the file, before its adoption, leaves.
    TorchCheckpointIO().save_checkpoint(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 4}, newest
    )
    assert not adopted_path(newest).exists()
    return newest


def _step_unknown_run(project: Path) -> Path:
    """An Accelerate ``checkpoints/`` whose only checkpoint is whole (its files verify: a
    damaged one would be passed over, not refused) but has no known step: no adopted
    manifest, no intent record, only a save count in its name."""
    ckpt = project / "checkpoints" / "checkpoint_0"
    ckpt.mkdir(parents=True)
    save_file({"w": torch.ones(2)}, str(ckpt / "model.safetensors"))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    torch.save(opt.state_dict(), ckpt / "optimizer.bin")
    rng = {"step": 0, "random_state": random.getstate(), "torch_manual_seed": torch.get_rng_state()}
    torch.save(rng, ckpt / "random_states_0.pkl")  # Accelerate's last file: complete
    return project / "checkpoints"


def test_every_rank_resumes_rank_0s_choice_and_only_rank_0_adopts(tmp_path: Path) -> None:
    newest = _lightning_run(tmp_path / "lit")
    acc = _step_unknown_run(tmp_path / "acc")
    codes, res = launch(2, tmp_path / "out", worker=WORKER, lightning=str(tmp_path / "lit"),
                        accelerate=str(acc))
    assert codes == [0, 0], res
    r0, r1 = res
    assert r0 is not None and r1 is not None
    assert r0["chosen"] == r1["chosen"] == str(newest)
    assert adopted_path(newest).is_file()  # adopted on the spot, by rank 0
    assert True in r0["writable"]  # rank 0 opened the run as its writer for the choice
    assert r1["writable"] == []  # rank 1 opened nothing: no lock, no adoption
    # Rank 0's refusal reaches every rank (no rank waits for a choice that never comes).
    assert r0["failure"] is not None and r0["failure"] == r1["failure"]
    assert "its step is unknown" in r0["failure"]
    assert f"ckptkit adopt --step N {acc / 'checkpoint_0'}" in r0["failure"]
