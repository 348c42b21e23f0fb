"""Forged and rotting checkpoints: nothing executes, nothing unverified is parsed, restore
falls back (issues 11 and 17).

The forgery of issue 17: copy a good step of a run that never used DCP, make its manifest
claim DCP storage, drop a pickle with a malicious ``__reduce__`` at ``dcp/.metadata`` and
recompute the (unkeyed) manifest digest. Every public path runs in a fresh process with an
audit hook that fails on any unrestricted unpickle (``pickle.find_class`` is audited by the
standard unpickler; ckptkit's allow-list unpickler and torch's ``weights_only`` one never
reach it), and the payload would create a marker file.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hostile import MARKER, Payload, forge_dcp, rewrite

import ckptkit
from ckptkit.storage import digest

pytestmark = pytest.mark.integration


def _trainstate(storage: str = "tensors", seed: int = 0) -> ckptkit.TrainState:
    torch.manual_seed(seed)
    m = torch.nn.Linear(8, 8)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(2, 8)).sum().backward()
    o.step()
    return ckptkit.TrainState(model=m, optimizer=o, step=1, storage=storage)  # type: ignore[arg-type]


def _run(tmp: Path, storage: str = "tensors") -> Path:
    run = tmp / "run"
    ts = _trainstate(storage)
    with ckptkit.CheckpointManager(run, keep_last=5) as mgr:
        for s in (10, 20):
            ts.step = s
            mgr.save(ts)
    return run


_AUDITED = textwrap.dedent(
    """
    import sys, json
    events = []
    def hook(event, args):
        if event == "pickle.find_class":
            events.append(args)
            raise RuntimeError(f"unrestricted unpickle of {args}")
    sys.addaudithook(hook)
    import torch, ckptkit
    from ckptkit.verify.describe import describe
    run, step, storage = sys.argv[1], sys.argv[2], sys.argv[3]
    out = {}
    def attempt(name, fn):
        try:
            out[name] = ["ok", repr(fn())[:300]]
        except ckptkit.CkptkitError as e:
            out[name] = ["ckptkit", f"{e.code}: {e.what}"[:400]]
        except BaseException as e:
            out[name] = ["ESCAPED", f"{type(e).__name__}: {e}"[:400]]
    attempt("verify", lambda: [f.code for f in ckptkit.verify(step).findings])
    attempt("inspect", lambda: describe(step)["components"]["model"])
    attempt("load", lambda: sorted(ckptkit.load(step)))
    def restore():
        torch.manual_seed(5)
        m = torch.nn.Linear(8, 8)
        o = torch.optim.AdamW(m.parameters(), lr=1e-2)
        ts = ckptkit.TrainState(model=m, optimizer=o, storage=storage)
        mgr = ckptkit.CheckpointManager(run, readonly=True)
        r = mgr.restore(ts)
        return [r.step, r.notes[:1]]
    attempt("restore", restore)
    out["audit"] = [list(map(str, e)) for e in events]
    print(json.dumps(out))
    """
)


def _audited(run: Path, step: Path, storage: str) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run(
        [sys.executable, "-c", _AUDITED, str(run), str(step), storage],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "CKPTKIT_NO_PROGRESS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("list_metadata", [False, True], ids=["unlisted", "listed"])
@pytest.mark.parametrize("storage", ["tensors", "dcp"])
def test_forged_dcp_metadata_executes_nothing(
    tmp_path: Path, storage: str, list_metadata: bool
) -> None:
    run = _run(tmp_path)
    marker = tmp_path / MARKER
    step = run / "step-00000020"
    forge_dcp(step, marker, list_metadata=list_metadata)
    out = _audited(run, step, storage)
    assert not marker.exists(), out
    assert out["audit"] == [], out
    assert all(v[0] != "ESCAPED" for k, v in out.items() if k != "audit"), out
    # verify refuses it: the table claims DCP state its bytes do not prove
    assert out["verify"][0] == "ok" and "CK-C010" in out["verify"][1], out
    # restore skips it and falls back to the good step 10
    assert out["restore"][0] == "ok" and out["restore"][1].startswith("[10,"), out
    assert "skipped step-00000020" in out["restore"][1]
    # refused before any DCP byte is parsed: the table is unproven (C010), the run does not
    # use DCP (R011), the metadata is unlisted (F021) or names a forbidden global (F023)
    assert any(c in out["restore"][1] for c in ("CK-C010", "CK-R011", "CK-F021", "CK-F023"))


def test_forged_byte_io_item_is_never_unpickled(tmp_path: Path) -> None:
    """A DCP shard whose non-tensor item is a pickle with a payload: refused, not run.

    DCP's default planner loads non-tensor items with ``torch.load(weights_only=False)``;
    ckptkit's planner uses ``weights_only=True``. The attacker rewrites the shard and
    recomputes both digests, so only the parser stands in the way.
    """
    run = _run(tmp_path, storage="dcp")
    step = run / "step-00000020"
    marker = tmp_path / MARKER
    import torch.distributed.checkpoint as dcp_api

    md = dcp_api.FileSystemReader(str(step / "dcp")).read_metadata()
    byte_items = [
        (k, v) for k, v in md.storage_data.items() if "param_groups" in k.fqn
    ]
    assert byte_items, "expected non-tensor optimizer items in the DCP shard"
    _, info = byte_items[0]
    shard = step / "dcp" / info.relative_path
    data = bytearray(shard.read_bytes())
    evil = pickle.dumps(Payload(marker), protocol=2)
    assert len(evil) <= info.length, "payload must fit the item's slot"
    data[info.offset : info.offset + len(evil)] = evil
    shard.write_bytes(bytes(data))
    obj = json.loads((step / "manifest.json").read_text())
    for f in obj["files"]:
        if f["path"] == f"dcp/{info.relative_path}":
            f["xxh3_128"], f["size"] = digest.hash_file(shard)
    rewrite(step, obj)
    out = _audited(run, step, "dcp")
    assert not marker.exists(), out
    assert out["audit"] == [], out
    assert out["restore"][0] == "ok" and out["restore"][1].startswith("[10,"), out


def test_dcp_shard_damage_falls_back_without_base_exception(tmp_path: Path) -> None:
    """A flipped byte in a .distcp shard is caught by the one-pass reader; DCP's
    CheckpointException (a BaseException) never leaves ckptkit; restore falls back."""
    run = _run(tmp_path, storage="dcp")
    shard = next((run / "step-00000020" / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    ts = _trainstate("dcp", seed=9)
    mgr = ckptkit.CheckpointManager(run)
    res = mgr.restore(ts)
    assert res is not None and res.step == 10
    assert any("CK-F003" in n and "step-00000020" in n for n in res.notes), res.notes
    assert {c.step: c.status for c in mgr.list()}[20] == "corrupt"
    assert mgr.latest().step == 10  # type: ignore[union-attr]
    mgr.close()


@pytest.mark.parametrize("damage", ["missing", "truncated", "fifo"])
def test_dcp_shard_missing_truncated_or_fifo(tmp_path: Path, damage: str) -> None:
    run = _run(tmp_path, storage="dcp")
    shard = next((run / "step-00000020" / "dcp").glob("*.distcp"))
    if damage == "missing":
        shard.unlink()
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-7])
    else:
        shard.unlink()
        os.mkfifo(shard)
    res = ckptkit.CheckpointManager(run, readonly=True).restore(_trainstate("dcp", seed=3))
    assert res is not None and res.step == 10
    # Refused before DCP opens anything: the manifest-level check names the file and why.
    code, why = {
        "missing": ("CK-F001", "is missing"),
        "truncated": ("CK-F002", "wrong size"),
        "fifo": ("CK-F022", "not a regular file"),
    }[damage]
    assert any(code in n or ("CK-C010" in n and why in n) for n in res.notes), res.notes


def test_restore_of_a_dcp_checkpoint_by_a_non_dcp_run_is_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    with ckptkit.CheckpointManager(run) as mgr:
        mgr.save(_trainstate("dcp"))
    with pytest.raises(ckptkit.IncompleteCheckpointError, match=r"CK-R011.*storage='dcp'"):
        ckptkit.CheckpointManager(run, readonly=True).restore(_trainstate("tensors"))


def test_plain_save_in_a_run_directory_is_skipped(tmp_path: Path) -> None:
    """A ckptkit.save directory sitting in a run (KeyError 'type' in v0.1): skipped, named."""
    run = _run(tmp_path)
    shutil.rmtree(run / "step-00000020")
    ckptkit.save({"weights": {"w": torch.ones(2)}}, run / "step-00000030", step=30)
    res = ckptkit.CheckpointManager(run, readonly=True).restore(_trainstate(seed=4))
    assert res is not None and res.step == 10
    assert any("step-00000030" in n and "CK-R011" in n for n in res.notes), res.notes
