"""CK-C020: a component the checkpoint's own content implies, found absent (native saves).

The evidence is ``initial_lr`` in the optimizer's param groups, written by every torch LR
scheduler when it is attached; the finding names the scheduler when the groups carry its
signature. The foreign formats are in ``tests/verify/foreign/test_implied.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint.commit import save_state
from ckptkit.verify.runner import verify

Sched = Callable[[torch.optim.Optimizer], object]

SCHEDULERS: dict[str, Sched] = {
    "an LR scheduler": lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.5),
    "a OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=50),
    "a SWALR": lambda o: torch.optim.swa_utils.SWALR(o, swa_lr=0.05, anneal_epochs=5),
    "a CyclicLR": lambda o: torch.optim.lr_scheduler.CyclicLR(o, 0.001, 0.1, step_size_up=4),
}


def _trained(make: Sched | None, *, sgd: bool = False) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if sgd
        else torch.optim.AdamW(model.parameters(), lr=0.01)
    )
    sch = make(opt) if make is not None else None
    for _ in range(3):
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if sch is not None:
            sch.step()  # type: ignore[attr-defined]
    return model, opt, sch


def _c020(path: Path, **kw: object) -> list[str]:
    return [f.message for f in verify(path, progress=False, **kw).findings if f.code == codes.C020]


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_left_out_of_the_trainstate_is_named(tmp_path: Path, name: str) -> None:
    model, opt, _sch = _trained(SCHEDULERS[name], sgd=name == "a CyclicLR")
    save_state(ckptkit.TrainState(model=model, optimizer=opt, step=3), tmp_path / "c", fsync=False)
    (msg,) = _c020(tmp_path / "c")
    assert f"had {name} attached" in msg and "'initial_lr'" in msg
    assert "no scheduler state" in msg


def test_where_the_schedule_stood_is_quoted(tmp_path: Path) -> None:
    model, opt, _ = _trained(SCHEDULERS["an LR scheduler"])
    save_state(ckptkit.TrainState(model=model, optimizer=opt, step=3), tmp_path / "c", fsync=False)
    (msg,) = _c020(tmp_path / "c")
    lr, start = opt.param_groups[0]["lr"], opt.param_groups[0]["initial_lr"]
    assert f"group 0 is at lr {lr:g}, the schedule started at {start:g}" in msg


def test_silent_when_the_scheduler_is_saved_or_never_existed(tmp_path: Path) -> None:
    model, opt, sch = _trained(SCHEDULERS["a OneCycleLR"])
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sch, step=3)  # type: ignore[arg-type]
    save_state(ts, tmp_path / "with", fsync=False)
    assert _c020(tmp_path / "with") == []
    model, opt, _ = _trained(None)
    save_state(ckptkit.TrainState(model=model, optimizer=opt, step=3), tmp_path / "none", fsync=False)
    assert _c020(tmp_path / "none") == []


def test_plain_save_of_a_state_dict(tmp_path: Path) -> None:
    model, opt, sch = _trained(SCHEDULERS["an LR scheduler"])
    ckptkit.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "p")
    assert len(_c020(tmp_path / "p")) == 1
    ckptkit.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(),
         "lr_scheduler": sch.state_dict()},  # type: ignore[attr-defined]
        tmp_path / "q",
    )
    assert _c020(tmp_path / "q") == []


def test_weights_expectation_asks_for_no_training_state(tmp_path: Path) -> None:
    model, opt, _ = _trained(SCHEDULERS["an LR scheduler"])
    ckptkit.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "p")
    assert _c020(tmp_path / "p", expect="weights") == []
