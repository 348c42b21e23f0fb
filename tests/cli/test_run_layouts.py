"""Run-level commands on a framework layout: ls, prune, rollback, adopt RUN through open_run.

A toy layout (``toy-N.pt`` files written with ``torch.save``) is registered the way an
integration registers its own; the commands must list, verify, rotate and adopt through
it, with the same exit codes as a native run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from ckptkit.checkpoint.catalog import CheckpointInfo
from ckptkit.cli import main
from ckptkit.codes import Finding
from ckptkit.errors import CkptkitError
from ckptkit.run import directory as runs
from ckptkit.storage.fs import Location
from ckptkit.verify.foreign.adopt import adopted_path
from ckptkit.verify.runner import verify

NAME = re.compile(r"toy-(\d+)\.pt$")


class ToyRun:
    """A directory of ``toy-N.pt``: status from ``ckptkit verify`` of each file."""

    layout = "toy"

    def __init__(self, root: Path, readonly: bool) -> None:
        self._root = root
        self.readonly = readonly
        self.removed: list[int] = []

    @property
    def root(self) -> Location:
        return self._root

    def checkpoints(self) -> list[CheckpointInfo]:
        out = []
        for p in sorted(self._root.glob("toy-*.pt")):
            m = NAME.search(p.name)
            assert m is not None
            ok = verify(p).ok
            out.append(CheckpointInfo(
                step=int(m.group(1)), path=p, status="verified" if ok else "corrupt",
                size=p.stat().st_size, time=p.stat().st_mtime,
                problem=None if ok else "does not verify",
            ))
        return out

    def reverify(self, info: CheckpointInfo) -> list[Finding]:
        return verify(Path(str(info.path))).reports[0].errors

    def remove(self, info: CheckpointInfo) -> bool:
        p = Path(str(info.path))
        if not p.exists():
            return False
        p.unlink()
        self.removed.append(info.step)
        return True

    def fence(self) -> None:
        if self.readonly:
            raise CkptkitError("read-only", path=self._root, hint="open it writable")

    def leftovers(self) -> list[Location]:
        return []

    def close(self) -> None:
        pass

    def resume_hint(self, info: CheckpointInfo) -> str:
        return f"toy.resume({Path(str(info.path)).name!r})"


def _detect(root: Location, options: dict[str, Any]) -> ToyRun | None:
    p = Path(str(root))
    if p.is_dir() and any(p.glob("toy-*.pt")):
        return ToyRun(p, readonly=options.get("readonly", True))
    return None


@pytest.fixture
def toy_layout() -> Iterator[None]:
    runs.register("toy", _detect)
    try:
        yield
    finally:
        runs.DETECTORS[:] = [(n, d) for n, d in runs.DETECTORS if n != "toy"]


def _toy_run(root: Path, steps: list[int]) -> Path:
    root.mkdir()
    for s in steps:
        m = torch.nn.Linear(3, 2)
        torch.save({"model": m.state_dict()}, root / f"toy-{s}.pt")
    return root


def test_open_run_finds_the_registered_layout_and_falls_back_to_native(
    tmp_path: Path, toy_layout: None
) -> None:
    run = runs.open_run(_toy_run(tmp_path / "r", [1]))
    assert run.layout == "toy"
    assert runs.open_run(tmp_path).layout == "ckptkit"
    with pytest.raises(ValueError, match="registered already"):
        runs.register("toy", _detect)


def test_ls_lists_a_framework_run_and_fails_on_a_corrupt_checkpoint(
    tmp_path: Path, toy_layout: None
) -> None:
    root = _toy_run(tmp_path / "r", [10, 20])
    r = CliRunner().invoke(main, ["ls", str(root)])
    assert r.exit_code == 0, r.output
    assert "2 checkpoints, 2 verified" in r.output and "(toy run)" in r.output
    doc = json.loads(CliRunner().invoke(main, ["ls", str(root), "--json"]).output)
    assert doc["layout"] == "toy" and [c["step"] for c in doc["checkpoints"]] == [10, 20]
    (root / "toy-20.pt").write_bytes(b"PK\x03\x04 not a zip any more")
    r = CliRunner().invoke(main, ["ls", str(root)])
    assert r.exit_code == 1 and "corrupt" in r.output


def test_prune_rotates_a_framework_run_and_keeps_the_newest_good(
    tmp_path: Path, toy_layout: None
) -> None:
    root = _toy_run(tmp_path / "r", [1, 2, 3, 4])
    dry = CliRunner().invoke(main, ["prune", str(root), "--keep-last", "2", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert sorted(p.name for p in root.iterdir()) == [f"toy-{s}.pt" for s in (1, 2, 3, 4)]
    # The newest is damaged: it is no longer good, so the two kept good are 2 and 3.
    (root / "toy-4.pt").write_bytes(b"garbage")
    r = CliRunner().invoke(main, ["prune", str(root), "--keep-last", "2"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in root.iterdir()) == ["toy-2.pt", "toy-3.pt", "toy-4.pt"]


def test_rollback_names_the_framework_resume_call(tmp_path: Path, toy_layout: None) -> None:
    root = _toy_run(tmp_path / "r", [5, 6])
    r = CliRunner().invoke(main, ["rollback", str(root)])
    assert r.exit_code == 0, r.output
    assert "roll back to:" in r.output and "toy-6.pt" in r.output
    assert "resume: toy.resume('toy-6.pt')" in r.output
    choice = runs.rollback(root)
    assert choice.checkpoint.step == 6 and choice.resume == "toy.resume('toy-6.pt')"
    assert choice.to_dict()["resume"] == choice.resume


def test_adopt_run_dir_adopts_every_checkpoint_of_the_layout(
    tmp_path: Path, toy_layout: None
) -> None:
    root = _toy_run(tmp_path / "r", [1, 2])
    r = CliRunner().invoke(main, ["adopt", str(root)])
    assert r.exit_code == 0, r.output
    for s in (1, 2):
        assert adopted_path(root / f"toy-{s}.pt").is_file()
    doc = json.loads(CliRunner().invoke(main, ["adopt", str(root), "--json"]).output)
    assert isinstance(doc, list) and len(doc) == 2


def test_adopt_plain_dir_of_foreign_files_and_empty_dir(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    torch.save({"model": torch.nn.Linear(2, 2).state_dict()}, root / "a.pt")
    r = CliRunner().invoke(main, ["adopt", str(root)])
    assert r.exit_code == 0, r.output
    assert adopted_path(root / "a.pt").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(main, ["adopt", str(empty)])
    assert r.exit_code == 2 and "no foreign checkpoint here" in r.output


def test_ls_on_unclaimed_foreign_files_says_what_is_there(tmp_path: Path) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    torch.save({"model": torch.nn.Linear(2, 2).state_dict()}, root / "a.pt")
    r = CliRunner().invoke(main, ["ls", str(root)])
    assert r.exit_code == 0
    assert "0 checkpoints" in r.stdout
    assert "holds 1 foreign checkpoint(s): a.pt (torch-save)" in r.stderr
