"""Issues 23 and 39: ``prune --delete-corrupt`` deletes damage only (``codes.damage``), never
a checkpoint whose bytes are intact. A wrong or new key never empties a run: under a key,
unsigned checkpoints list as ``untrusted`` and are never restored, but they are kept; a run
signed with another key refuses the writer outright (CK-R012). A renamed checkpoint
(CK-S020) and a framework file that needs code (CK-F103) are ``unsound`` and kept the same
way. Real damage under the right key is still deleted."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from hostile import STEPS, make_run, train_state

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.errors import SignatureError
from ckptkit.run import directory as runs
from ckptkit.run import retain


def _prune_delete_corrupt(run_dir: Path, key: bytes | None) -> set[str]:
    run = runs.open_run(run_dir, readonly=False, key=key)
    try:
        runs.prune(run, retain.Policy(keep_last=5, delete_corrupt=True))
    finally:
        run.close()
    return {p.name for p in run_dir.iterdir() if p.name.startswith("step-")}


def test_unsigned_checkpoints_survive_delete_corrupt_under_a_new_key(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")  # saved without a key
    key = secrets.token_bytes(32)
    with ckptkit.CheckpointManager(run, readonly=True, key=key) as mgr:
        assert {c.status for c in mgr.list()} == {"untrusted"}
    assert _prune_delete_corrupt(run, key) == {step_dir_name(s) for s in STEPS}


def test_checkpoints_signed_with_another_key_survive_delete_corrupt(tmp_path: Path) -> None:
    old_key, new_key = secrets.token_bytes(32), secrets.token_bytes(32)
    ts = train_state()
    with ckptkit.CheckpointManager(tmp_path / "run", key=old_key) as mgr:
        for s in STEPS:
            ts.step = s
            mgr.save(ts)
    with pytest.raises(SignatureError) as e:
        _prune_delete_corrupt(tmp_path / "run", new_key)
    assert e.value.code == codes.R012
    assert {p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("step-")} == {
        step_dir_name(s) for s in STEPS
    }


def test_damage_under_the_right_key_is_still_deleted(tmp_path: Path) -> None:
    key = secrets.token_bytes(32)
    ts = train_state()
    run = tmp_path / "run"
    with ckptkit.CheckpointManager(run, key=key) as mgr:
        for s in STEPS:
            ts.step = s
            mgr.save(ts)
    shard = next(p for p in (run / step_dir_name(STEPS[0])).iterdir() if p.suffix == ".safetensors")
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with ckptkit.CheckpointManager(run, key=key) as mgr:
        mgr.list(verify=True)
    assert _prune_delete_corrupt(run, key) == {step_dir_name(STEPS[-1])}


def test_a_renamed_checkpoint_survives_delete_corrupt(tmp_path: Path) -> None:
    """``mv step-00000020 step-00000030``: misplaced (CK-S020), never restored, but its
    bytes are whole and it may be the only copy of step 20."""
    run = make_run(tmp_path / "run")
    (run / step_dir_name(STEPS[-1])).rename(run / step_dir_name(STEPS[-1] + 10))
    with ckptkit.CheckpointManager(run) as mgr:
        mgr.list(verify=True)
        r = mgr.restore(train_state(seed=5))
        assert r is not None and r.step == STEPS[0]
    assert _prune_delete_corrupt(run, None) == {
        step_dir_name(STEPS[0]), step_dir_name(STEPS[-1] + 10)
    }


def test_a_framework_file_needing_code_survives_delete_corrupt(tmp_path: Path) -> None:
    """A Lightning ``.ckpt`` holding a numpy scalar: Lightning's own ``weights_only`` load
    refuses it (CK-F103), so it is never good, but its bytes are whole: kept."""
    import numpy as np
    import torch

    d = tmp_path / "checkpoints"
    d.mkdir()
    for step in (10, 20):
        torch.save(
            {
                "global_step": step, "epoch": 0, "pytorch-lightning_version": "2.6.6",
                "state_dict": {"w": torch.ones(2)},
                "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
                "lr_schedulers": [], "loops": {}, "hyper_parameters": {},
                "callbacks": {"best": np.float64(1.0)} if step == 20 else {},
            },
            d / f"epoch=0-step={step}.ckpt",
        )
    run = runs.open_run(d, readonly=False)
    try:
        assert {c.step: c.status for c in runs.listing(run, verify=True)} == {
            10: "verified", 20: "unsound"
        }
        runs.prune(run, retain.Policy(keep_last=5, delete_corrupt=True))
    finally:
        run.close()
    assert (d / "epoch=0-step=20.ckpt").exists()


def test_a_completeness_finding_is_not_damage_a_ckptkit_dcp_run_survives(tmp_path: Path) -> None:
    """Issue 39: a ``ckptkit.dcp`` run written as docs/dcp.md says (``step=`` to the writer,
    no step inside the state dict) fails CK-C001 on intact bytes; ``ls --verify`` used to
    record both checkpoints corrupt and ``prune --keep-last 1 --delete-corrupt`` deleted
    both. Now they list ``unsound``, and no option deletes them."""
    import json

    import torch
    from click.testing import CliRunner

    import ckptkit.checkpoint.dcp
    from ckptkit.cli import main

    run = tmp_path / "run"
    for step in (10, 20):
        m = torch.nn.Linear(4, 4)
        o = torch.optim.AdamW(m.parameters())
        m(torch.randn(2, 4)).sum().backward()
        o.step()
        ckptkit.dcp.save({"model": m.state_dict(), "optimizer": o.state_dict()},
                         run / f"step-{step}", step=step)
    res = CliRunner().invoke(main, ["ls", "--verify", "--json", str(run)])
    rows = json.loads(res.output)["checkpoints"]
    assert [(r["step"], r["status"]) for r in rows] == [(10, "unsound"), (20, "unsound")], rows
    assert all(codes.C001 in r["problem"] for r in rows)
    res = CliRunner().invoke(main, ["prune", "--keep-last", "1", "--delete-corrupt", str(run)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("step-")) == [
        "step-10", "step-20"
    ]
