"""Foreign checkpoints written at test time by the real clients, on CPU, synthetic data.

A pytest plugin (``tests/conftest.py`` names it in ``pytest_plugins``): the foreign readers'
tests (tests/verify/foreign/) and the framework integrations' (tests/integrations/) share
these fixtures. Each fixture is session-scoped (written once per pytest process); tests
that damage a checkpoint copy it first with :func:`copy_of`. The ``pytest.importorskip`` guards only spare people without
the ``interop`` extra: CI installs it (``pip install -e .[interop]``), so nothing is
skipped there.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch


@contextmanager
def _third_party_quiet() -> Iterator[None]:
    """The clients warn about CPU-only runs, few workers and deprecations: not ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def copy_of(src: Path, dst_dir: Path) -> Path:
    """Copy a fixture checkpoint (file or directory) into ``dst_dir`` and return the copy."""
    dst = dst_dir / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)
    return dst


@pytest.fixture
def copy_ckpt(tmp_path: Path) -> Callable[[Path], Path]:
    """Copy a session fixture into this test's tmp dir before damaging it."""
    return lambda src: copy_of(src, tmp_path)


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 64, (8,), generator=g)
        return {"input_ids": x, "labels": x}


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers Trainer output dir with ``checkpoint-2`` and ``checkpoint-3``."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf") / "out"
    with _third_party_quiet():
        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
        model = transformers.GPT2LMHeadModel(cfg)
        args = transformers.TrainingArguments(
            output_dir=str(out),
            max_steps=3,
            save_steps=2,
            per_device_train_batch_size=4,
            report_to=[],
            use_cpu=True,
            logging_steps=1,
            disable_tqdm=True,
            seed=0,
        )
        transformers.Trainer(model=model, args=args, train_dataset=_Tokens()).train()
    return out


@pytest.fixture(scope="session")
def hf_ckpt(hf_run: Path) -> Path:
    return hf_run / "checkpoint-2"


@pytest.fixture(scope="session")
def accelerate_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``Accelerator(cpu=True).save_state`` folder after two optimizer steps."""
    accelerate = pytest.importorskip("accelerate")
    out = tmp_path_factory.mktemp("acc") / "state"
    with _third_party_quiet():
        acc = accelerate.Accelerator(cpu=True)
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        sch = torch.optim.lr_scheduler.StepLR(opt, 1)
        ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
        dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
        m, opt, dl, sch = acc.prepare(m, opt, dl, sch)
        for i, (x, y) in enumerate(dl):
            acc.backward(((m(x) - y) ** 2).mean())
            opt.step()
            sch.step()
            opt.zero_grad()
            if i == 1:
                break
        acc.save_state(str(out))
    return out


@pytest.fixture(scope="session")
def lightning_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full ModelCheckpoint ``.ckpt`` and a ``save_weights_only`` one."""
    L = pytest.importorskip("lightning")
    out = tmp_path_factory.mktemp("lightning")

    class LM(L.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, batch: list[torch.Tensor], _i: int) -> torch.Tensor:
            x, y = batch
            loss = ((self.lin(x) - y) ** 2).mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> dict[str, object]:
            o = torch.optim.Adam(self.parameters(), lr=1e-2)
            return {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.StepLR(o, 1)}

    with _third_party_quiet():
        torch.manual_seed(0)
        ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
        full = L.pytorch.callbacks.ModelCheckpoint(
            dirpath=out / "full", monitor="train_loss", save_top_k=2, every_n_train_steps=2
        )
        weights = L.pytorch.callbacks.ModelCheckpoint(
            dirpath=out / "weights", save_weights_only=True, every_n_train_steps=2
        )
        trainer = L.Trainer(
            max_steps=2,
            accelerator="cpu",
            enable_progress_bar=False,
            logger=False,
            enable_model_summary=False,
            callbacks=[full, weights],
        )
        trainer.fit(LM(), torch.utils.data.DataLoader(ds, batch_size=4))
    (f,) = sorted((out / "full").glob("*.ckpt"))
    (w,) = sorted((out / "weights").glob("*.ckpt"))
    return {"full": f, "weights": w}


@pytest.fixture(scope="session")
def dcp_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch.distributed.checkpoint directory (no process group), one file per item."""
    import torch.distributed.checkpoint as dcp

    out = tmp_path_factory.mktemp("dcp") / "step-3"
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    state = {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 3}
    with _third_party_quiet():  # "torch.distributed is disabled ... single process"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(out), single_file_per_rank=False))
    return out
