"""A framework checkpoint holding a pickle that needs code is never "good" when a resume loads
that file (issue 23, reproductions 1 and 2), with the real Accelerate and Trainer.

Accelerate loads ``custom_checkpoint_<i>.pkl`` with ``weights_only=False``: a planted one
would run its code on resume. The Trainer loads ``rng_state.pth`` with
``weights_only=True``: a planted one crashes the resume. Either way ``ckptkit verify`` exits
1, ``ls`` does not call the checkpoint verified (even after ``adopt --force``, whose manifest
cannot vouch for such a file), ``prune`` keeps the newest good checkpoint, and the resume
picks of the integrations take the previous checkpoint and say why. The payload only
creates a marker file; the tests assert it never appears. The commands run in processes of
their own: forks of a warmed zygote (tests/zygote.py), and once a new ``python -m ckptkit``.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from zygote import Result, Zygote, fresh_ckptkit

accelerate = pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from ckptkit.integrations.hf import AccelerateCheckpoints, resume_checkpoint  # noqa: E402

pytestmark = pytest.mark.integration

TIMEOUT = 180


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _cli(z: Zygote, *args: str) -> Result:
    """``ckptkit ARGS`` forked from the warmed zygote ``z``."""
    return z.ckptkit(*args, env={"CKPTKIT_NO_PROGRESS": "1"}, timeout=TIMEOUT)


def _statuses(z: Zygote, run_dir: Path, *extra: str) -> dict[str, tuple[int, str, str | None]]:
    """``ckptkit ls --json``: name -> (step, status, problem), newest last."""
    r = _cli(z, "ls", str(run_dir), "--json", *extra)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    return {
        Path(c["path"]).name: (c["step"], c["status"], c.get("problem"))
        for c in doc["checkpoints"]
    }


# --- Accelerate: custom_checkpoint_<i>.pkl (weights_only=False) ---------------------------------


class _Counter:
    """A registered object: Accelerate saves its state as ``custom_checkpoint_0.pkl``."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.n = int(sd["n"])


def _accelerate(project: Path) -> tuple[Any, AccelerateCheckpoints, _Counter, Any, Any]:
    acc = accelerate.Accelerator(
        cpu=True,
        project_config=accelerate.utils.ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True),
    )
    torch.manual_seed(0)
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = acc.prepare(m, opt)
    counter = _Counter()
    acc.register_for_checkpointing(counter)
    return acc, AccelerateCheckpoints(acc, m, opt), counter, m, opt


def _resume(project: Path) -> tuple[int, int]:
    """A fresh loop's ``resume()``: the step it resumes at and the counter it restored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _acc, ck, counter, _m, _opt = _accelerate(project)
        try:
            step = ck.resume()
        finally:
            ck.close()
    return step, counter.n


def test_a_planted_accelerate_custom_checkpoint_is_never_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cli_zygote: Zygote
) -> None:
    project = tmp_path / "proj"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc, ck, counter, m, opt = _accelerate(project)
        # Optimizer steps 0 and 1: the copy (no manifest, no intent record: its step is
        # unknown) is the newest checkpoint of the run by write order (as the attacker wants).
        for step in (0, 1):
            counter.n = step * 10 + 5
            acc.backward(m(torch.ones(1, 2)).sum())
            opt.step()
            ck.save(step)
        ck.close()
    ckpts = project / "checkpoints"
    good, planted = ckpts / "checkpoint_1", ckpts / "checkpoint_2"
    shutil.copytree(good, planted, ignore=shutil.ignore_patterns("ckptkit-manifest.json"))
    marker = tmp_path / "PAYLOAD-RAN"
    torch.save({"n": _Payload(marker)}, planted / "custom_checkpoint_0.pkl")

    # verify: an error (not a warning), naming how Accelerate would load it (as typed: a new
    # interpreter, third-party warnings off).
    env = {"CKPTKIT_NO_PROGRESS": "1", "PYTHONWARNINGS": "ignore"}
    r = fresh_ckptkit("verify", planted, env=env, timeout=TIMEOUT)
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "CK-F103" in r.stdout and "custom_checkpoint_0.pkl" in r.stdout
    assert "weights_only=False" in r.stdout and "would run that code" in r.stdout

    # The resume pick skips it, says why, and resumes checkpoint_1's state.
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        assert _resume(project) == (1, 15)
    assert any("checkpoint_2" in rec.getMessage() and "CK-F103" in rec.getMessage() for rec in caplog.records), [rec.getMessage() for rec in caplog.records]
    assert not marker.exists()
    # ls --verify reads the bytes and records the verdict in the run index.
    got = _statuses(cli_zygote, project, "--verify")
    assert got["checkpoint_2"][1] == "unsound" and "CK-F103" in (got["checkpoint_2"][2] or "")
    (project / ".ckptkit-index.json").unlink()  # forget it: the adopted manifest must say so too

    # Its step is known nowhere (no manifest, no intent): adopt never guesses it from the name.
    r = _cli(cli_zygote, "adopt", str(planted), "--force")
    assert r.returncode == 2 and "--step N" in r.stderr, r.stdout + r.stderr
    assert not (planted / "ckptkit-manifest.json").exists()
    # Adopted with --force at a step (an unsigned manifest): still not good, still not picked.
    r = _cli(cli_zygote, "adopt", str(planted), "--force", "--step", "2")
    assert r.returncode == 1 and (planted / "ckptkit-manifest.json").is_file(), r.stdout + r.stderr
    got = _statuses(cli_zygote, project)
    assert list(got)[-2:] == ["checkpoint_1", "checkpoint_2"]  # the planted one is the newest
    assert got["checkpoint_1"][1] == "verified"
    assert got["checkpoint_2"][1] == "unsound" and "CK-F103" in (got["checkpoint_2"][2] or ""), got
    assert _cli(cli_zygote, "verify", str(planted)).returncode == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        assert _resume(project) == (1, 15)
    assert any("checkpoint_2" in rec.getMessage() and "CK-F103" in rec.getMessage() for rec in caplog.records), [rec.getMessage() for rec in caplog.records]
    assert not marker.exists()


# --- Trainer: rng_state.pth (weights_only=True: the resume would crash) ------------------------------


def _plant_rng_state(ckpt: Path, marker: Path) -> None:
    torch.save({"python": _Payload(marker), "cpu": torch.get_rng_state()}, ckpt / "rng_state.pth")


def test_a_trainer_rng_state_needing_code_is_not_good(
    hf_run: Path, tmp_path: Path, cli_zygote: Zygote
) -> None:
    out = tmp_path / "out"
    shutil.copytree(hf_run, out)
    marker = tmp_path / "PAYLOAD-RAN"
    _plant_rng_state(out / "checkpoint-3", marker)

    r = _cli(cli_zygote, "verify", str(out / "checkpoint-3"))
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "CK-F103" in r.stdout and "rng_state.pth" in r.stdout and "crashes" in r.stdout
    assert resume_checkpoint(out) == str(out / "checkpoint-2")

    # Adopted (the planted one with --force): ls, prune and the resume pick agree.
    assert _cli(cli_zygote, "adopt", str(out / "checkpoint-2")).returncode == 0
    assert _cli(cli_zygote, "adopt", str(out / "checkpoint-3"), "--force").returncode == 1
    got = _statuses(cli_zygote, out)
    assert got["checkpoint-2"][1] == "verified"
    assert got["checkpoint-3"][1] == "unsound" and "CK-F103" in (got["checkpoint-3"][2] or "")
    r = _cli(cli_zygote, "prune", str(out), "--keep-last", "1")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()  # the newest good one is kept
    r = _cli(cli_zygote, "rollback", str(out))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert f"roll back to: {out / 'checkpoint-2'}" in r.stdout
    assert resume_checkpoint(out) == str(out / "checkpoint-2")
    assert not marker.exists()
