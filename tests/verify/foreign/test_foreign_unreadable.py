"""Issue 23 item 5 on framework layouts: a foreign checkpoint that cannot be read *now* (a
permission, EIO) is ``unreadable``, never ``corrupt``, and ``--delete-corrupt`` keeps it.

The foreign loaders used to code every failed read as damage (CK-F102/F104/F108), and the
scan then called every component "required but missing"; a Lightning file whose permission
was wrong for a moment was recorded corrupt and deleted by ``prune --delete-corrupt``.
Tests run as root here, so the failure is simulated in-process (``open`` of one file
raises), the same way for every loader.
"""

from __future__ import annotations

import builtins
import errno
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from ckptkit import codes
from ckptkit.run import directory as runs
from ckptkit.run import retain
from ckptkit.verify.foreign.report import verify_foreign


@pytest.fixture
def refuse_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path, int], None]]:
    """``refuse(path, errno)``: every ``open`` of ``path`` fails with that errno from now
    on; ``refuse(path, 0)``: the fault is fixed."""
    real = builtins.open
    refused: dict[str, int] = {}

    def fake(file: Any, *a: Any, **k: Any) -> Any:
        err = refused.get(str(file), 0)
        if err:
            raise OSError(err, errno.errorcode[err], str(file))
        return real(file, *a, **k)

    monkeypatch.setattr(builtins, "open", fake)
    yield lambda p, err: refused.__setitem__(str(p), err)


def _lightning_ckpt(path: Path, step: int) -> None:
    torch.manual_seed(step)
    torch.save(
        {
            "global_step": step,
            "epoch": 0,
            "pytorch-lightning_version": "2.6.6",
            "state_dict": {"w": torch.randn(3)},
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
            "lr_schedulers": [],
            "loops": {},
            "callbacks": {},
            "hyper_parameters": {},
        },
        path,
    )


def _errors(path: Path, fmt: str) -> list[str]:
    return [f.code for f in verify_foreign(path, fmt).findings if f.severity is codes.ERROR]


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO, errno.ESTALE])
def test_a_torch_file_that_cannot_be_read_now_is_unreadable_only(
    tmp_path: Path, refuse_open: Callable[[Path, int], None], err: int
) -> None:
    p = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3}, p)
    refuse_open(p, err)
    found = _errors(p, "torch-save")
    assert found == [codes.UNREADABLE], found
    assert codes.outcome(found) == "unreadable"


def test_a_safetensors_file_that_cannot_be_read_now_is_unreadable_only(
    tmp_path: Path, refuse_open: Callable[[Path, int], None]
) -> None:
    p = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(2)}, str(p))
    refuse_open(p, errno.EACCES)
    assert _errors(p, "safetensors") == [codes.UNREADABLE]


def test_a_truncated_torch_file_is_still_damage(tmp_path: Path) -> None:
    p = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 3}, p)
    p.write_bytes(p.read_bytes()[:100])
    found = _errors(p, "torch-save")
    assert found and codes.outcome(found) == "corrupt", found


def test_an_unreadable_lightning_checkpoint_is_listed_unreadable_and_never_deleted(
    tmp_path: Path, refuse_open: Callable[[Path, int], None]
) -> None:
    d = tmp_path / "checkpoints"
    d.mkdir()
    for step in (10, 20):
        _lightning_ckpt(d / f"epoch=0-step={step}.ckpt", step)
    newest = d / "epoch=0-step=20.ckpt"
    run = runs.open_run(d, readonly=False)
    try:
        assert run.layout == "lightning"
        refuse_open(newest, errno.EACCES)
        status = {c.step: c.status for c in runs.listing(run, verify=True)}
        assert status == {10: "verified", 20: "unreadable"}
        plan = runs.prune(run, retain.Policy(keep_last=1, delete_corrupt=True))
        assert newest.exists() and 20 in {c.step for c in plan.keep}
        refuse_open(newest, 0)  # the permission is fixed: tried again, and good
        status = {c.step: c.status for c in runs.listing(run, verify=True)}
        assert status == {10: "verified", 20: "verified"}
    finally:
        run.close()
