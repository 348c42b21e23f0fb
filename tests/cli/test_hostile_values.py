"""Issue 23, reproduction 3: one hostile value in the newest manifest's state tree (digest
recomputed) used to crash every run-level command with a traceback. Each command runs in a
process of its own with a timeout (a fork of a warmed zygote, tests/zygote.py; one ``verify``
as a new ``python -m ckptkit``) and must exit with its documented code (docs/cli.md: 0 clean, 1
findings, 2 unreadable input) and a message naming the manifest and the key path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from zygote import Result, Zygote, fresh_ckptkit

import ckptkit
from ckptkit.format import manifest as mf

NEW, OLD = "step-00000002", "step-00000001"

HOSTILE = {
    "npscalar-10**400": {"$t": "npscalar", "dtype": "f8", "v": 10**400},
    "float-tag-list": {"$t": "float", "v": []},
}


def _state(step: int) -> ckptkit.TrainState:
    torch.manual_seed(step)
    model = torch.nn.Linear(3, 2)
    return ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              step=step)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of two verified steps, saved once per module."""
    root = tmp_path_factory.mktemp("saved") / "run"
    with ckptkit.CheckpointManager(root) as mgr:
        mgr.save(_state(1))
        mgr.save(_state(2))
    return root


def _planted(saved_run: Path, tmp_path: Path, hostile: str) -> Path:
    """A copy of the saved run; the newest manifest's tree carries the hostile value."""
    root = Path(shutil.copytree(saved_run, tmp_path / "run"))
    p = root / NEW / "manifest.json"
    obj: dict[str, Any] = json.loads(p.read_text())
    obj["tree"]["x"] = HOSTILE[hostile]
    obj["manifest_digest"] = mf.content_digest(obj)
    p.write_text(json.dumps(obj))
    return root


def _output(r: Result) -> tuple[int, str]:
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    return r.returncode, out


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_run_commands_report_the_value_without_a_traceback(
    saved_run: Path, tmp_path: Path, hostile: str, cli_zygote: Zygote
) -> None:
    run = _planted(saved_run, tmp_path, hostile)

    def _cli(*args: str) -> tuple[int, str]:
        return _output(cli_zygote.ckptkit(*args, timeout=300))

    named = f"{NEW}/manifest.json"
    # One case runs verify as typed (the file's one new interpreter); the rest fork.
    verify = fresh_ckptkit if hostile == "float-tag-list" else cli_zygote.ckptkit
    code, out = _output(verify("verify", run, timeout=300))
    assert code == 1 and "CK-M009" in out and "tree/x" in out and str(run / NEW) in out, out
    code, out = _cli("inspect", str(run / NEW))
    assert code == 2 and "CK-M009" in out and named in out and "tree/x" in out, out
    code, out = _cli("ls", str(run), "--json")
    assert code == 1, out
    status = {c["path"].rsplit("/", 1)[-1]: c for c in json.loads(out)["checkpoints"]}
    assert status[NEW]["status"] == "corrupt" and "tree/x" in status[NEW]["problem"]
    assert status[OLD]["status"] == "verified"
    code, out = _cli("rollback", str(run))
    assert code == 0 and f"{OLD}: picked" in out, out
    code, out = _cli("prune", str(run), "--keep-last", "1")
    assert code == 0 and (run / OLD / "manifest.json").is_file(), out
    assert (run / NEW).is_dir(), "prune deleted a corrupt checkpoint without --delete-corrupt"
