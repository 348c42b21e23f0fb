"""A FIFO where a run keeps one of its own files is refused by name, never waited on (issue 23, #7).

``RUN/latest`` as a FIFO hung ``prune`` and restore; ``RUN/.ckptkit-index.json`` hung
``ls``, ``prune``, ``rollback`` and restore; a FIFO adopted manifest in a Lightning
directory hung ``ls``; a FIFO lock file gave a bare ``OSError`` ("Illegal seek"). Each
command runs in a process of its own with a timeout (a hang fails the test instead of the
suite): a fork of a warmed zygote (tests/zygote.py), and once a new ``python -m ckptkit``.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from zygote import Zygote, fresh_ckptkit

import ckptkit
from ckptkit.checkpoint.catalog import INDEX, LATEST, step_dir_name
from ckptkit.run.manager import CheckpointManager
from ckptkit.signals.recovery_log import LOG
from ckptkit.storage.lock import LOCK_NAME
from ckptkit.verify.foreign.adopted import adopted_path

TIMEOUT = 120
"""Seconds a command may take: far above its real time (a few seconds), far below a hang."""


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 10, 20 and 30, saved once per module; tests use a copy (:func:`run_dir`)."""
    torch.manual_seed(0)
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4))
    root = tmp_path_factory.mktemp("saved") / "run"
    with CheckpointManager(root, keep_last=10) as mgr:
        for s in (10, 20, 30):
            ts.step = s
            mgr.save(ts)
    return root


@pytest.fixture
def run_dir(saved_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved_run, tmp_path / "run"))


def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))


@pytest.mark.parametrize(
    ("name", "commands"),
    [
        (LATEST, [["ls"], ["prune", "--keep-last", "1"], ["rollback"]]),
        (INDEX, [["ls"], ["prune", "--keep-last", "1"], ["rollback"]]),
        (LOCK_NAME, [["prune", "--keep-last", "1"], ["ls", "--verify"]]),
        (LOG, [["ls"], ["rollback"]]),
    ],
)
def test_a_fifo_run_file_is_a_clear_error_naming_it(
    run_dir: Path, name: str, commands: list[list[str]], cli_zygote: Zygote
) -> None:
    f = _fifo(run_dir / name)
    for cmd in commands:
        r = cli_zygote.ckptkit(*cmd, run_dir, timeout=TIMEOUT)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "CK-F022" in r.stderr and f"{f}: is a FIFO (named pipe)" in r.stderr, r.stderr
        assert "remove" in r.stderr and "Traceback" not in r.stderr
    # Refused before anything was done: the FIFO is still there, no checkpoint deleted.
    assert f.is_fifo()
    assert _steps(run_dir) == [step_dir_name(s) for s in (10, 20, 30)]


def test_a_directory_as_lock_is_refused_the_same_way(run_dir: Path) -> None:
    """Run as typed (a new interpreter), not forked: the file's one such run."""
    (run_dir / LOCK_NAME).mkdir()
    r = fresh_ckptkit("prune", "--keep-last", "1", run_dir, timeout=TIMEOUT)
    assert r.returncode == 2 and "CK-F022" in r.stderr and "is a directory" in r.stderr


_RESTORE = textwrap.dedent(
    """
    import sys, torch, ckptkit
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4))
    try:
        with ckptkit.CheckpointManager(sys.argv[1], readonly=sys.argv[2] == "ro") as mgr:
            mgr.restore(ts)
    except ckptkit.UnsafeInputError as e:
        print(f"step={ts.step} {e}")
        sys.exit(3)
    print(f"restored step={ts.step}")
    """
)


@pytest.mark.parametrize("mode", ["ro", "rw"])
@pytest.mark.parametrize("name", [LATEST, INDEX])
def test_restore_refuses_a_fifo_run_file_before_loading_anything(
    run_dir: Path, name: str, mode: str, cli_zygote: Zygote
) -> None:
    f = _fifo(run_dir / name)
    r = cli_zygote.run(_RESTORE, str(run_dir), mode, timeout=TIMEOUT)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert r.stdout.startswith("step=0 ")  # the live state was not touched
    assert f"CK-F022 {f}: is a FIFO" in r.stdout and "remove" in r.stdout


def test_a_writer_on_a_run_whose_lock_is_a_fifo_fails_at_open(
    run_dir: Path, cli_zygote: Zygote
) -> None:
    f = _fifo(run_dir / LOCK_NAME)
    r = cli_zygote.run(_RESTORE, str(run_dir), "rw", timeout=TIMEOUT)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert f"CK-F022 {f}: is a FIFO" in r.stdout
    # A reader takes no lock: it restores.
    r = cli_zygote.run(_RESTORE, str(run_dir), "ro", timeout=TIMEOUT)
    assert r.returncode == 0 and "restored step=30" in r.stdout, (r.stdout, r.stderr)


def _lightning_ckpt(path: Path, step: int) -> None:
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.save(
        {"state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()],
         "global_step": step, "epoch": 0, "pytorch-lightning_version": "2.6.6"},
        path,
    )


def test_a_fifo_adopted_manifest_in_a_lightning_dir_is_a_finding(
    tmp_path: Path, cli_zygote: Zygote
) -> None:
    ck = tmp_path / "version_0" / "checkpoints"
    ck.mkdir(parents=True)
    for s in (5, 10, 15):
        _lightning_ckpt(ck / f"epoch=0-step={s}.ckpt", s)
    r = cli_zygote.ckptkit("adopt", str(ck), timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    f = _fifo(adopted_path(ck / "epoch=0-step=15.ckpt"))

    r = cli_zygote.ckptkit("ls", str(ck), "--json", timeout=TIMEOUT)
    assert r.returncode == 1, r.stderr
    rows = {c["step"]: c for c in json.loads(r.stdout)["checkpoints"]}
    assert [rows[s]["status"] for s in (5, 10, 15)] == ["verified", "verified", "corrupt"]
    assert f.name in rows[15]["problem"] and "FIFO" in rows[15]["problem"]
    assert "remove it" in rows[15]["problem"]

    r = cli_zygote.ckptkit("verify", str(ck / "epoch=0-step=15.ckpt"), timeout=TIMEOUT)
    assert r.returncode == 1 and "CK-M008" in r.stdout and f.name in r.stdout, r.stdout

    r = cli_zygote.ckptkit("prune", str(ck), "--keep-last", "1", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    # 15 is not good: 10 is the newest verified; 5 goes; the checkpoint beside the FIFO
    # is kept (corrupt is evidence unless --delete-corrupt) and the FIFO is left alone.
    left = sorted(p.name for p in ck.glob("*.ckpt"))
    assert left == ["epoch=0-step=10.ckpt", "epoch=0-step=15.ckpt"]
    assert f.is_fifo()


def test_a_fifo_adopted_manifest_in_a_trainer_dir_is_listed_corrupt(
    tmp_path: Path, cli_zygote: Zygote
) -> None:
    """The Trainer layout read the same FIFO as 'not adopted' (verify fails on it)."""
    out = tmp_path / "out"
    for s in (2, 4):
        d = out / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": s}))
    f = _fifo(out / "checkpoint-4" / "ckptkit-manifest.json")
    r = cli_zygote.ckptkit("ls", str(out), "--json", timeout=TIMEOUT)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["layout"] == "hf-trainer"
    rows = {c["step"]: c for c in doc["checkpoints"]}
    assert rows[2]["status"] == "committed" and "not adopted" in rows[2]["problem"]
    assert rows[4]["status"] == "corrupt" and "CK-M008" in rows[4]["problem"]
    assert "FIFO" in rows[4]["problem"] and f.is_fifo()
