"""The drill finds a framework's step-W checkpoint through the run layouts (runs.open_run).

A toy single-file layout (``toy-N.pt`` with an adopted manifest beside it, the way a
Lightning ``.ckpt`` is adopted) and a Trainer-like folder layout: the snapshot keeps the
framework's name, carries the adopted manifest, and ``checkpoint_facts`` reads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptkit.checkpoint.catalog import CheckpointInfo, Status
from ckptkit.codes import Finding
from ckptkit.drill.continuity import checkpoint_facts
from ckptkit.drill.snapshots import _framework_snapshot
from ckptkit.run import directory as runs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.adopt import Notes, adopt_checkpoint, adopted_path

NAME = re.compile(r"toy-(\d+)\.pt$")


class ToyRun:
    """``toy-N.pt`` files: verified when adopted, committed otherwise."""

    layout = "toy"

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Location:
        return self._root

    def checkpoints(self) -> list[CheckpointInfo]:
        out = []
        for p in sorted(self._root.glob("toy-*.pt")):
            m = NAME.search(p.name)
            assert m is not None
            status: Status = "verified" if adopted_path(p).is_file() else "committed"
            out.append(CheckpointInfo(step=int(m.group(1)), path=p, status=status,
                                      size=p.stat().st_size, time=0.0))
        return out

    def reverify(self, info: CheckpointInfo) -> list[Finding]:
        return []

    def remove(self, info: CheckpointInfo) -> bool:
        return False

    def fence(self) -> None:
        pass

    def leftovers(self) -> list[Location]:
        return []

    def close(self) -> None:
        pass


def _detect(root: Location, options: dict[str, Any]) -> ToyRun | None:
    p = Path(str(root))
    return ToyRun(p) if p.is_dir() and any(p.glob("toy-*.pt")) else None


@pytest.fixture
def toy_layout() -> Iterator[None]:
    runs.register("toy-file", _detect)
    try:
        yield
    finally:
        runs.DETECTORS[:] = [(n, d) for n, d in runs.DETECTORS if n != "toy-file"]


def _save(p: Path) -> None:
    torch.save({"model": torch.nn.Linear(2, 2).state_dict()}, p)


def test_a_single_file_checkpoint_is_snapshotted_with_its_adopted_manifest(
    tmp_path: Path, toy_layout: None
) -> None:
    ckpt_dir, work = tmp_path / "ckpt", tmp_path / "work"
    ckpt_dir.mkdir()
    for s in (5, 10):
        _save(ckpt_dir / f"toy-{s}.pt")
    # Not adopted yet: while the reference runs it is not taken (no digests beside it).
    assert _framework_snapshot(ckpt_dir, 10, work, ended=False) is None
    adopt_checkpoint(ckpt_dir / "toy-10.pt", notes=Notes(step=10, data={"snapshot": "d1"}))
    snap = _framework_snapshot(ckpt_dir, 10, work, ended=False)
    assert snap is not None and snap.name == "toy-10.pt" and snap.is_file()
    assert adopted_path(snap).is_file()
    facts = checkpoint_facts(snap)
    assert facts["step"] == 10 and facts["data_declared"] is True
    assert _framework_snapshot(ckpt_dir, 7, work, ended=True) is None


def test_a_committed_checkpoint_is_taken_once_the_reference_ended(
    tmp_path: Path, toy_layout: None
) -> None:
    ckpt_dir, work = tmp_path / "ckpt", tmp_path / "work"
    ckpt_dir.mkdir()
    _save(ckpt_dir / "toy-3.pt")
    snap = _framework_snapshot(ckpt_dir, 3, work, ended=True)
    assert snap is not None and snap.read_bytes() == (ckpt_dir / "toy-3.pt").read_bytes()


def test_a_native_or_empty_directory_is_left_to_the_native_lookup(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    assert _framework_snapshot(tmp_path / "ckpt", 1, tmp_path / "w", ended=True) is None
    assert _framework_snapshot(tmp_path / "nope", 1, tmp_path / "w", ended=True) is None


def test_a_trainer_folder_keeps_its_name(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "out"
    folder = ckpt_dir / "checkpoint-4"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text('{"global_step": 4}')
    snap = _framework_snapshot(ckpt_dir, 4, tmp_path / "w", ended=True)  # committed, ended
    assert snap is not None and snap.name == "checkpoint-4"
    assert (snap / "trainer_state.json").is_file()
