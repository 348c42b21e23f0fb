"""Issue 24: one ``Run`` for every layout.

* Deleting needs the writer lock, always: a run opened read-only (a read-only
  ``CheckpointManager``, ``ls``) can neither fence, remove, pin nor record an intent, also
  when no other process holds the lock.
* One trust domain: manifests adopted through the run (the integrations, ``ckptkit
  adopt``) are signed with the run's HMAC key and checked like native ones (unsigned:
  ``CK-M010``, another key: ``CK-M011``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hostile import make_run

import ckptkit
from ckptkit.errors import NotWritableError
from ckptkit.run import Run
from ckptkit.run import directory as runs
from ckptkit.run.layouts.hf import open_hf
from ckptkit.run.layouts.lightning import LightningLayout, open_lightning
from ckptkit.verify.foreign.adopt import adopt_checkpoint, adopted_path
from ckptkit.verify.foreign.report import verify_foreign

KEY = b"k" * 32
OTHER = b"o" * 32


def _lightning_file(p: Path, step: int) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.ones(3) * step}, "global_step": step,
                "pytorch-lightning_version": "2.6"}, p)
    return p


def test_a_read_only_manager_refuses_to_delete_when_nobody_holds_the_lock(tmp_path: Path) -> None:
    root = make_run(tmp_path / "run")
    with ckptkit.CheckpointManager(root, readonly=True) as reader:
        newest = reader.list()[-1]
        with pytest.raises(NotWritableError, match="read-only"):
            reader.fence()
        with pytest.raises(NotWritableError, match="read-only"):
            reader.remove(newest)
    assert (Path(str(newest.path)) / "manifest.json").exists()


def _readonly_runs(tmp_path: Path) -> list[tuple[Run, Path]]:
    native = make_run(tmp_path / "native")
    trainer = tmp_path / "out" / "checkpoint-4"
    trainer.mkdir(parents=True)
    (trainer / "trainer_state.json").write_text("{}")
    acc = tmp_path / "proj" / "checkpoints" / "checkpoint_0"
    acc.mkdir(parents=True)
    (acc / "random_states_0.pkl").write_bytes(b"")
    light = _lightning_file(tmp_path / "light" / "epoch=0-step=2.ckpt", 2)
    return [
        (runs.native_run(native), native),
        (open_hf(trainer.parent, "hf-trainer"), trainer),
        (open_hf(acc.parent, "accelerate"), acc),
        (open_lightning(light.parent), light),
    ]


def test_every_read_only_run_refuses_to_delete_pin_or_record(tmp_path: Path) -> None:
    for run, _ in _readonly_runs(tmp_path):
        with run:
            _refuses_every_write(run)


def _refuses_every_write(run: Run) -> None:
    (info, *_) = run.checkpoints()
    policy = run.policy(keep_last=1, delete_corrupt=True)
    for act in (run.fence, lambda: run.remove(info), lambda: run.pin(info.path, "x"),
                lambda: run.intend("checkpoint_9", 9), lambda: run.prune(policy)):
        with pytest.raises(NotWritableError, match="read-only"):
            act()
    assert Path(str(info.path)).exists(), run.layout
    assert not run.record(info.path, "corrupt", why="a reader's claim")
    assert run.checkpoints()[0].status == info.status  # nothing was recorded


# --- one trust domain ------------------------------------------------------------------------


def test_settled_lightning_manifests_are_signed_and_checked_like_native_ones(
    tmp_path: Path,
) -> None:
    p = _lightning_file(tmp_path / "epoch=0-step=2.ckpt", 2)
    with Run(tmp_path, LightningLayout(), readonly=False, key=KEY) as run:
        settled = run.settle(p, step=None, force=True, expect="weights")
        assert settled.errors == []
    doc = json.loads(adopted_path(p).read_text())
    assert doc["signature"]["alg"]  # signed with the run's key
    with open_lightning(tmp_path, key=KEY) as same:
        assert [c.status for c in same.checkpoints()] == ["verified"]
    with open_lightning(tmp_path, key=OTHER) as other:
        (info,) = other.checkpoints()
        assert info.status == "untrusted" and "CK-M011" in (info.problem or "")
    codes = {f.code for f in verify_foreign(p, "lightning", key=OTHER).findings}
    assert "CK-M011" in codes


def test_an_unsigned_adopted_manifest_does_not_pass_under_a_key(tmp_path: Path) -> None:
    p = _lightning_file(tmp_path / "epoch=0-step=2.ckpt", 2)
    assert adopt_checkpoint(p, "lightning").manifest is not None  # no key: unsigned
    with open_lightning(tmp_path, key=KEY) as run:
        (info,) = run.checkpoints()
        assert info.status == "untrusted" and "CK-M010" in (info.problem or "")
    assert "CK-M010" in {f.code for f in verify_foreign(p, "lightning", key=KEY).findings}


def test_ckptkit_adopt_signs_with_the_key_and_verify_checks_it(tmp_path: Path) -> None:
    p = _lightning_file(tmp_path / "run" / "epoch=0-step=2.ckpt", 2)
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(KEY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTKIT_")}

    def cli(*args: str, key: bytes | None = None) -> subprocess.CompletedProcess[str]:
        e = dict(env, CKPTKIT_HMAC_KEY=key.decode()) if key is not None else env
        return subprocess.run([sys.executable, "-m", "ckptkit", *args], env=e,
                              capture_output=True, text=True, timeout=120)

    adopted = cli("adopt", str(p), "--expect", "weights", "--key-file", str(key_file))
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "signature" in json.loads(adopted_path(p).read_text())
    assert cli("verify", str(p), "--expect", "weights", key=KEY).returncode == 0
    wrong = cli("verify", str(p), "--expect", "weights", key=OTHER)
    assert wrong.returncode == 1 and "CK-M011" in wrong.stdout
