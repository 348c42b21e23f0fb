"""The README's DataLoader loop resumes bitwise: this test drills the block as written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ckptkit.drill.config import DrillConfig
from ckptkit.drill.runner import cleanup, run_drill

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

PREAMBLE = '''\
import torch
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
dataset = torch.utils.data.TensorDataset(torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g))
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + 0.05 * s))
loss_fn = torch.nn.functional.mse_loss
'''


def readme_loop() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"### A DataLoader loop that resumes bitwise.*?```python\n(.*?)```",
                      text, flags=re.S)
    assert block, "README.md lost its DataLoader loop"
    return block.group(1)


@pytest.mark.slow
def test_the_readme_loop_resumes_bitwise(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PREAMBLE + readme_loop())
    # W = 5 is mid-epoch (3 batches of 32 per epoch), N = 5 crosses two epoch boundaries.
    rep = run_drill(DrillConfig(command=[sys.executable, str(script)], steps_before=5,
                                steps_after=5, timeout=300, workdir=tmp_path / "drill"))
    assert rep.ok, (rep.diagnosis.evidence, [c.to_dict() for c in rep.checks])
    twin = next(c for c in rep.checks if c.name == "twin")
    assert {"loss", "lr", "rng", "batch_hash", "cursor", "opt_step"} <= set(twin.detail["compared"])
    assert set(twin.detail["modes"].values()) == {"bitwise"}
    cleanup(rep)
