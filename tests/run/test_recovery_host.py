"""recovery.Host is a small public protocol: recovery never reaches into a manager's privates.

Issue 24: ``recovery.Host`` needed the manager's ``_maybe_writer`` and ``_good_statuses``
and wrote its catalog directly. The recovery now changes the run's records only through
the Host's public ``run`` (``may_record``/``pin``/``set_aside``), which ``CheckpointManager`` provides.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import ckptkit
from ckptkit.run.manager import CheckpointManager
from ckptkit.signals import recovery
from ckptkit.signals.recovery import ABANDONED

SRC = Path(recovery.__file__)


def _host_members() -> list[str]:
    tree = ast.parse(SRC.read_text())
    host = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Host")
    names: list[str] = []
    for node in host.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
        elif isinstance(node, ast.FunctionDef):
            names.append(node.name)
    return names


def test_host_protocol_names_only_public_members() -> None:
    members = _host_members()
    assert members and not [m for m in members if m.startswith("_")], members


def test_recovery_reaches_no_private_member_of_its_host() -> None:
    private = sorted(
        f"line {node.lineno}: host.{node.attr}"
        for node in ast.walk(ast.parse(SRC.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "host")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "host")
        )
    )
    assert not private, private


def test_checkpoint_manager_provides_every_host_member(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    missing = [m for m in _host_members() if not hasattr(mgr, m)]
    assert not missing, missing
    mgr.close()


def test_set_aside_moves_newer_checkpoints_and_repoints_latest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    for s in (10, 20, 30):
        ts.step = s
        mgr.save(ts)
    mgr.wait()
    dest = tmp_path / ABANDONED / "recovery-001"
    with mgr.run.may_record() as mine:
        assert mine
        moved = mgr.run.set_aside([c for c in mgr.run.checkpoints() if c.step > 10], dest)
    assert moved == ["step-00000020", "step-00000030"]
    assert sorted(p.name for p in dest.iterdir()) == ["step-00000020", "step-00000030"]
    assert [c.step for c in mgr.list()] == [10]
    latest = mgr.latest()
    assert latest is not None and latest.step == 10
    mgr.close()


def test_pin_marks_an_existing_checkpoint(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=7)
    mgr.save(ts)
    mgr.wait()
    mgr.run.pin(mgr.root / "step-00000007", "emergency")
    assert mgr.list()[0].pins == ("emergency",)
    mgr.close()
