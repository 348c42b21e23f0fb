"""Every save path records the look-ahead of the next step, through one computation."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint import lookahead, manifest_io
from ckptkit.format import records
from ckptkit.format.numbers import is_real
from ckptkit.signals import guard


def _state(step: int = 0, *, scheduler: bool = True) -> ckptkit.TrainState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if scheduler else None
    return ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched,
                              sampler=ckptkit.ResumableSampler(8, seed=1), step=step)


def _train(ts: ckptkit.TrainState, steps: int) -> None:
    for _ in range(steps):
        ts.model(torch.ones(2, 3)).sum().backward()
        assert ts.optimizer is not None
        ts.optimizer.step()
        if ts.scheduler is not None:
            ts.scheduler.step()
        ts.step += 1


def test_ckptkit_save_of_a_train_state_records_the_look_ahead_and_a_resume_checks_it(
    tmp_path: Path,
) -> None:
    ts = _state()
    _train(ts, 2)
    path = tmp_path / "run" / "step-00000002"
    man = ckptkit.save(ts, path)
    guard = man.lookahead["guard"]
    assert (guard["next_step"], guard["sched_epoch"], guard["opt_step"]) == (3, 2, 2)
    assert guard["sample_ids"] == ts.sampler.next_indices(guard["k"])
    assert manifest_io.read(path).lookahead == man.lookahead
    resumed = _state(scheduler=False)  # the scheduler left out: its position is lost
    with ckptkit.CheckpointManager(tmp_path / "run") as mgr:
        result = mgr.restore(resumed)
    assert result is not None and result.guard is not None
    assert [f.code for f in result.guard.findings] == [codes.D003]
    result.guard.close()


def test_a_writer_without_a_train_state_records_what_its_objects_give() -> None:
    # What the DCP writer calls with a state dict's objects (no TrainState, no model).
    ts = _state()
    _train(ts, 3)
    la = lookahead.record(step=3, optimizer=ts.optimizer, scheduler=ts.scheduler)
    assert la is not None
    assert la["guard"]["next_step"] == 4 and la["guard"]["sched_epoch"] == 3
    assert la["guard"]["lr"] == [g["lr"] for g in ts.optimizer.param_groups]  # type: ignore[union-attr]
    assert "sample_ids" not in la["guard"]
    full = lookahead.record(ts)  # the whole TrainState: the same facts, and the sampler's
    assert full is not None
    assert {k: full["guard"][k] for k in la["guard"]} == la["guard"]
    assert "sample_ids" in full["guard"]


def test_a_save_records_the_look_ahead_without_a_provider_filled_at_import(tmp_path: Path) -> None:
    """The look-ahead is computed in the checkpoint layer: no global a module above fills.

    ``import ckptkit`` imports the resume guard (through the manager), so a fresh process
    cannot show the save working without it; what it shows is that the writer's look-ahead
    does not come through any hook: checkpoint/lookahead.py holds no module-level state, the
    guard's names are the checkpoint layer's functions, and a fresh process that imports
    only the checkpoint writer records the full look-ahead.
    """
    src = Path(lookahead.__file__).read_text()
    tree = ast.parse(src)
    assert not any(isinstance(n, ast.Global) for n in ast.walk(tree)), "a global statement"
    assert not hasattr(lookahead, "provide") and not hasattr(lookahead, "_PROVIDER")
    for node in tree.body:  # module-level assignments: constants and type aliases only
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" not in ast.unparse(node):
            value = node.value
            assert not isinstance(value, (ast.Dict, ast.List, ast.Set, ast.Call)), ast.unparse(node)
            assert not (isinstance(value, ast.Constant) and value.value is None), ast.unparse(node)
    assert guard.lookahead_of is lookahead.lookahead_of and guard.compute is lookahead.compute
    assert guard.lookahead is lookahead.lookahead
    assert guard.problems is records.lookahead_problems

    script = textwrap.dedent(f"""
        import json, sys
        import torch
        import ckptkit.checkpoint.io as io
        from ckptkit.capture.state import TrainState
        m = torch.nn.Linear(2, 1)
        ts = TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.25), step=6)
        man = io.save(ts, {str(tmp_path / "ck")!r})
        print(json.dumps({{"guard_imported": "ckptkit.signals.guard" in sys.modules,
                          "lookahead": man.lookahead}}))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    la = out["lookahead"]["guard"]
    assert (la["next_step"], la["lr"], la["opt_step"], la["rng_v"]) == (7, [0.25], 0, 2)
    assert manifest_io.read(tmp_path / "ck").lookahead == out["lookahead"]


@pytest.mark.parametrize("value", [0, 1, -3, 0.5, 2**1023, 2**1024, 10**400, -(10**400),
                                   float("inf"), float("nan"), True, "1", None,
                                   torch.tensor(0.1), torch.tensor([0.1]), torch.tensor(True),
                                   torch.tensor(1 + 1j), torch.tensor(3)])
def test_the_look_ahead_reads_a_number_as_the_component_validators_do(value: object) -> None:
    # The look-ahead's validator and the component validators share format.numbers.is_real.
    got = records.lookahead_problems({"loss_scale": value}, {}) == []
    assert got == is_real(value)
