"""No foreign load path unpickles without an allow-list: an audit-hook test.

Hostile foreign checkpoints (a ``torch.save`` file, a legacy one, a raw pickle, a
Lightning ``.ckpt``, a DCP directory with a malicious ``.metadata``, an Accelerate folder
with a malicious ``random_states_0.pkl``, a Trainer folder with malicious
``optimizer.pt`` / ``rng_state.pth``) carry a ``__reduce__`` that would run
``os.system``. A fresh interpreter with ``sys.addaudithook`` runs ``verify``, ``inspect``
and ``adopt`` (library and CLI) over each; the hook records every ``pickle.find_class``
(raised only by an unrestricted unpickler: the allow-listed readers resolve globals
themselves) and every process launch. The test fails on any of them, or if the payload's
marker file appears. A control unpickle at the end proves the hook sees what it should.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


class _Payload:
    """Unpickling this runs a shell command (``posix.system``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _hostile(root: Path, marker: Path) -> dict[str, Path]:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    evil = _Payload(marker)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    out: dict[str, Path] = {}

    out["torch-save"] = root / "evil.pt"
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 1,
                "extra": evil}, out["torch-save"])
    out["legacy"] = root / "legacy.pt"
    torch.save({"model": m.state_dict(), "payload": evil}, out["legacy"],
               _use_new_zipfile_serialization=False)
    out["raw-pickle"] = root / "state.pkl"
    out["raw-pickle"].write_bytes(pickle.dumps({"model": evil}))

    out["lightning"] = root / "last.ckpt"
    torch.save({"state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()],
                "global_step": 1, "epoch": 0, "pytorch-lightning_version": "2.6.0",
                "callbacks": {"Evil": evil}}, out["lightning"])

    out["dcp"] = root / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": m.state_dict(), "step": 1}, checkpoint_id=str(out["dcp"]))
    (out["dcp"] / ".metadata").write_bytes(pickle.dumps(evil))

    acc = out["accelerate"] = root / "accelerate"
    acc.mkdir()
    save_file(m.state_dict(), str(acc / "model.safetensors"))
    torch.save(opt.state_dict(), acc / "optimizer.bin")
    torch.save({"step": 1, "random_state": evil}, acc / "random_states_0.pkl")

    hf = out["hf-trainer"] = root / "checkpoint-1"
    hf.mkdir()
    save_file(m.state_dict(), str(hf / "model.safetensors"))
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 1, "epoch": 0.1}))
    torch.save({"state": {}, "param_groups": [{"params": [0, 1]}], "x": evil}, hf / "optimizer.pt")
    torch.save({"python": evil}, hf / "rng_state.pth")
    return out


_CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    events = []

    def hook(event, args):
        if event == "pickle.find_class":
            events.append([event, f"{args[0]}.{args[1]}"])
        elif event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn"):
            events.append([event, str(args)[:200]])

    sys.addaudithook(hook)

    from click.testing import CliRunner
    import ckptkit
    from ckptkit.cli import main
    from ckptkit.verify.describe import describe
    from ckptkit.verify.foreign.adopt import adopt_checkpoint

    results = {}
    for name, path in json.loads(sys.argv[1]).items():
        before = len(events)
        r = {}
        rep = ckptkit.verify(path).reports[0]
        r["verify_ok"] = rep.ok
        r["codes"] = sorted({f.code for f in rep.findings})
        describe(path)
        a = adopt_checkpoint(path)
        r["adopt_refused"] = None if a.refused is None else a.refused.code
        cli = CliRunner()
        r["cli_verify"] = cli.invoke(main, ["verify", path, "--json"]).exit_code
        r["cli_inspect"] = cli.invoke(main, ["inspect", path, "--json"]).exit_code
        res = cli.invoke(main, ["adopt", path, "--json"])
        r["cli_adopt"] = res.exit_code
        r["cli_adopt_json"] = json.loads(res.output) if res.output.strip().startswith("{") else None
        r["events"] = events[before:]
        results[name] = r

    # Control: an unrestricted unpickle is seen by the hook.
    import collections, pickle
    pickle.loads(pickle.dumps(collections.OrderedDict()))
    results["__control__"] = events[-1:]
    print(json.dumps(results))
    """
)


def test_no_unrestricted_unpickle_on_any_foreign_path(tmp_path: Path) -> None:
    marker = tmp_path / "PAYLOAD-RAN"
    paths = _hostile(tmp_path, marker)
    env = {**os.environ, "CKPTKIT_NO_PROGRESS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps({k: str(v) for k, v in paths.items()})],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results.pop("__control__") == [["pickle.find_class", "collections.OrderedDict"]]
    assert not marker.exists(), "a payload ran"
    for name, r in results.items():
        assert r["events"] == [], (name, r["events"])
        # Nothing that needed code was blessed: adopt refuses (library and CLI, exit 2).
        assert r["adopt_refused"] == "CK-F103", (name, r)  # refused: it needs code
        assert r["cli_adopt"] == 2 and r["cli_adopt_json"]["adopted"] is None, (name, r)
        assert r["cli_adopt_json"]["refused"], name
        assert r["cli_inspect"] == 0, name
        assert r["cli_verify"] in (0, 1), name
        assert not any(p.name.endswith("ckptkit-manifest.json") for p in tmp_path.rglob("*"))
    # Where the resume state itself needed code, verify does not pass it either.
    for name in ("torch-save", "legacy", "raw-pickle", "lightning", "dcp"):
        assert results[name]["verify_ok"] is False, (name, results[name])
    assert all("CK-F103" in r["codes"] for r in results.values())
