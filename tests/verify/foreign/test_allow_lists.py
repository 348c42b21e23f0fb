"""A framework checkpoint is good only if each file a resume loads loads *as the framework
loads it* (issue 23 item 1): with the allow-list of that framework's ``weights_only=True``
load, not ckptkit's wider one.

ckptkit reads foreign pickles with torch's default list plus numpy arrays, dtypes and
scalars. Lightning resumes with torch's default list alone, so a ``.ckpt`` holding an
``np.float64`` (in a callback's state, say) verified OK and then crashed Lightning's resume.
The Trainer widens the list around its ``rng_state.pth`` load only, with numpy arrays and
dtypes but no scalars: its own RNG state must still pass, a numpy scalar there must not.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from zygote import Result, fresh_ckptkit

pytestmark = pytest.mark.integration

TIMEOUT = 180
ENV = {"CKPTKIT_NO_PROGRESS": "1", "PYTHONWARNINGS": "ignore"}


def _lightning_ckpt(path: Path, step: int, best: Any) -> Path:
    """A Lightning-shaped training checkpoint whose callback state holds ``best``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "global_step": step,
            "epoch": 0,
            "pytorch-lightning_version": "2.6.6",
            "state_dict": {"w": torch.ones(2)},
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}],
            "lr_schedulers": [],
            "loops": {},
            "callbacks": {"x": {"best": best}},
            "hyper_parameters": {},
        },
        path,
    )
    return path


def test_a_lightning_ckpt_holding_a_numpy_scalar_is_not_good(tmp_path: Path, cli_zygote: Any) -> None:
    def _cli(*args: str) -> Result:  # a fork of a warmed process: the first verify is fresh
        return cli_zygote.ckptkit(*args, env=ENV, timeout=TIMEOUT)  # type: ignore[no-any-return]

    run = tmp_path / "version_0"
    ck = run / "checkpoints"
    good = _lightning_ckpt(ck / "epoch=0-step=3.ckpt", 3, best=1.0)
    bad = _lightning_ckpt(ck / "epoch=0-step=5.ckpt", 5, best=np.float64(1.0))

    cloud_io = pytest.importorskip("lightning.fabric.utilities.cloud_io")
    # The reproduction is real: Lightning's own load (weights_only=None) refuses the file.
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        cloud_io._load(bad)
    cloud_io._load(good)

    r = fresh_ckptkit("verify", str(bad), env=ENV, timeout=TIMEOUT)  # as a user types it
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if "CK-F103" in ln)
    assert "error" in line and "epoch=0-step=5.ckpt" in line
    assert "multiarray.scalar" in line and "torch's default allow-list" in line
    assert "Lightning" in line and "weights_only=None" in line and "resume crashes" in line
    assert "float(x)" in r.stdout and "add_safe_globals" in r.stdout  # the fix
    # The positive control: the same checkpoint holding a plain float verifies.
    r = _cli("verify", str(good))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]

    # ls --verify, prune and rollback follow verify's verdict.
    r = _cli("ls", str(run), "--verify", "--json")
    assert r.returncode in (0, 1), r.stderr[-2000:]
    got = {Path(c["path"]).name: (c["status"], c.get("problem")) for c in json.loads(r.stdout)["checkpoints"]}
    assert got["epoch=0-step=3.ckpt"][0] == "verified"
    assert got["epoch=0-step=5.ckpt"][0] == "unsound" and "CK-F103" in (got["epoch=0-step=5.ckpt"][1] or "")
    r = _cli("prune", str(run), "--keep-last", "1")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert good.is_file()  # the newest good checkpoint is kept
    r = _cli("rollback", str(run))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "epoch=0-step=3.ckpt" in r.stdout

    # adopt refuses it; with --force its (unsigned) manifest cannot vouch for it either.
    r = _cli("adopt", str(bad))
    assert r.returncode == 2 and "CK-F103" in r.stderr and "numpy" in r.stderr, r.stderr[-2000:]
    r = _cli("adopt", str(bad), "--force")
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    for index in run.rglob(".ckptkit-index.json"):
        index.unlink()  # forget the recorded verdict: the adopted manifest must say it
    r = _cli("ls", str(run), "--json")
    got = {Path(c["path"]).name: (c["status"], c.get("problem")) for c in json.loads(r.stdout)["checkpoints"]}
    assert got["epoch=0-step=5.ckpt"][0] == "unsound" and "CK-F103" in (got["epoch=0-step=5.ckpt"][1] or "")


def test_the_trainer_rng_state_is_held_to_the_trainers_own_list(hf_run: Path, tmp_path: Path) -> None:
    from ckptkit.integrations.hf import resume_checkpoint
    from ckptkit.verify.foreign.report import verify_foreign

    out = tmp_path / "out"
    shutil.copytree(hf_run, out)
    rng = out / "checkpoint-3" / "rng_state.pth"

    # Built the way the Trainer builds it (numpy RNG state: an array and its dtype): the
    # Trainer's safe_globals() allows it, though torch's default list alone would not.
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
        rng,
    )
    rep = verify_foreign(out / "checkpoint-3", "hf-trainer")
    assert rep.ok, [f"{f.code} {f.message}" for f in rep.errors]
    assert resume_checkpoint(out) == str(out / "checkpoint-3")

    # A numpy scalar is outside the Trainer's list: its resume would crash.
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                "cpu": torch.random.get_rng_state(), "loss": np.float64(0.5)}, rng)
    rep = verify_foreign(out / "checkpoint-3", "hf-trainer")
    f = [f for f in rep.errors if f.code == "CK-F103"]
    assert f and f[0].path == "rng_state.pth", rep.findings
    assert "the Trainer's allow-list" in f[0].message and "multiarray.scalar" in f[0].message
    assert resume_checkpoint(out) == str(out / "checkpoint-2")

    # optimizer.pt is loaded with torch's default list: no numpy at all.
    rng.write_bytes((hf_run / "checkpoint-3" / "rng_state.pth").read_bytes())
    opt = out / "checkpoint-3" / "optimizer.pt"
    sd = torch.load(opt, weights_only=True)
    sd["param_groups"][0]["extra"] = np.arange(2, dtype=np.uint32)
    torch.save(sd, opt)
    rep = verify_foreign(out / "checkpoint-3", "hf-trainer")
    assert [f.path for f in rep.errors if f.code == "CK-F103"] == ["optimizer.pt"], rep.findings
