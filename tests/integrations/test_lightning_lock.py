"""Issue 24: Lightning and Fabric take the run lock when training starts, not at a save.

Before, ``CkptkitIO`` first opened the run (and took its lock) at the first save: a second
live writer of the same directory trained until then and was found only at its save. Now
``CkptkitCallback.on_fit_start`` (rank 0, each directory ``CkptkitIO`` will write) and
``FabricCheckpoints`` (rank 0, when made) take it, and a second writer is refused before
its first step, the holder named. Also: a ``file://`` directory is the local directory it
names (before, ``file:///tmp/x`` became a relative ``file:/tmp/x``).
"""

from __future__ import annotations

import select
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

L = pytest.importorskip("lightning")

from ckptkit.errors import LockHeldError  # noqa: E402
from ckptkit.integrations.lightning import (  # noqa: E402
    CkptkitCallback,
    CkptkitIO,
    FabricCheckpoints,
)
from ckptkit.integrations.lightning.checkpoint_io import local_dir  # noqa: E402

pytestmark = pytest.mark.integration

HOLDER = """
import sys
from ckptkit.run.layouts.lightning import LightningLayout
from ckptkit.run import Run
run = Run(sys.argv[1], LightningLayout(), readonly=False)
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
run.close()
"""
DEADLINE = 120.0


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A checkpoint directory whose run lock another live process (its pid) holds."""
    d = tmp_path / "ckpts"
    log = tmp_path / "holder.log"
    with log.open("w") as err, subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(d)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            end = time.monotonic() + DEADLINE
            line = ""
            while not line and proc.poll() is None and time.monotonic() < end:
                ready, _, _ = select.select([proc.stdout], [], [], end - time.monotonic())
                if ready:
                    line = proc.stdout.readline()
            assert line.strip() == "held", (line, proc.poll(), log.read_text())
            yield d, proc.pid
        finally:
            proc.stdin.close()
            proc.wait(timeout=DEADLINE)


class _Counted(L.LightningModule):  # type: ignore[misc, name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.steps = 0

    def training_step(self, batch: Any, idx: int) -> torch.Tensor:
        self.steps += 1
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_second_trainer_writer_is_refused_before_its_first_step(
    held: tuple[Path, int],
) -> None:
    d, pid = held
    module = _Counted()
    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, plugins=[CkptkitIO(lock_timeout=0)],
        callbacks=[CkptkitCallback(),
                   L.pytorch.callbacks.ModelCheckpoint(dirpath=d, every_n_train_steps=1,
                                                       save_top_k=-1)],
        default_root_dir=d.parent,
    )
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    with warnings.catch_warnings(), pytest.raises(LockHeldError) as e:
        warnings.simplefilter("ignore")
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    assert module.steps == 0
    assert f"pid {pid}" in str(e.value)
    assert not list(d.glob("*.ckpt"))


def test_a_second_fabric_writer_is_refused_when_it_is_made(held: tuple[Path, int]) -> None:
    d, pid = held
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[CkptkitIO(lock_timeout=0)])
    with pytest.raises(LockHeldError) as e:
        FabricCheckpoints(fabric, d)
    assert f"pid {pid}" in str(e.value)


def test_a_file_url_is_the_local_directory_it_names(tmp_path: Path) -> None:
    assert local_dir(f"file://{tmp_path}/ckpts", "dirpath") == tmp_path / "ckpts"
    fabric = L.Fabric(accelerator="cpu", devices=1)
    ck = FabricCheckpoints(fabric, f"file://{tmp_path}/ckpts")
    try:
        assert ck.dir == tmp_path / "ckpts"
        assert ck.path(3) == tmp_path / "ckpts" / "step=3.ckpt"
    finally:
        ck.close()
