"""DCP storage: verify and restore refuse the same ``.metadata`` (issue 23, reproduction 4).

Native verify used to unpickle ``dcp/.metadata`` and stop there, while the reader refused
an item past the end of its shard (``CK-F106``), a shard the manifest does not list
(``CK-F021``) or a non-tensor item that needs a global to unpickle (``CK-F023``). With such
a checkpoint as the newest step (its manifest digest recomputed, as an attacker with no key
can), ``ls --verify`` called every step verified, ``prune --keep-last 1`` deleted the older
ones and restore found nothing. Both now ask ``ckptkit.storage.dcp_items.coverage``; each test
runs both on one hostile step and asserts they agree, then restore loads the previous step
bitwise.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from zygote import Result, Zygote, fresh_ckptkit

import ckptkit
from ckptkit.capture.state import RestoreResult
from ckptkit.format import manifest as mf
from ckptkit.storage import digest

pytestmark = pytest.mark.integration

STEPS = (10, 20, 30)
HOSTILE = "step-00000030"
GOOD = 20
METADATA = "dcp/.metadata"

REFUSALS = {
    "offset_past_shard": "CK-F106",
    "unlisted_shard": "CK-F021",
    "byte_io_global": "CK-F023",
}
"""Each way of tampering with the newest step, and the code verify and restore both give."""


class _Payload:
    """Unpickling this runs ``touch MARKER``: it must never happen."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _trainstate(seed: int) -> tuple[ckptkit.TrainState, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = torch.nn.Linear(8, 8)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    ts = ckptkit.TrainState(model=m, optimizer=o, storage="dcp")  # type: ignore[arg-type]
    return ts, m, o


def _snapshot(m: torch.nn.Module, o: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": copy.deepcopy(m.state_dict()), "optim": copy.deepcopy(o.state_dict())}


def _save_run(tmp: Path) -> tuple[Path, dict[int, dict[str, Any]]]:
    """A DCP-storage run with distinct model/optimizer state at each step."""
    run = tmp / "run"
    ts, m, o = _trainstate(0)
    saved: dict[int, dict[str, Any]] = {}
    with ckptkit.CheckpointManager(run, keep_last=5) as mgr:
        for s in STEPS:
            m(torch.randn(4, 8)).square().sum().backward()
            o.step()
            o.zero_grad()
            ts.step = s
            mgr.save(ts)
            saved[s] = _snapshot(m, o)
    return run, saved


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    """:func:`_save_run`, once per module."""
    return _save_run(tmp_path_factory.mktemp("saved"))


@pytest.fixture
def dcp_run(
    saved_run: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path
) -> tuple[Path, dict[int, dict[str, Any]]]:
    """A copy of the saved run (each case tampers with its own) and the states it holds."""
    run, saved = saved_run
    return Path(shutil.copytree(run, tmp_path / "run")), saved


def _metadata(step: Path) -> Any:
    import torch.distributed.checkpoint as dcp_api

    return dcp_api.FileSystemReader(str(step / "dcp")).read_metadata()


def _tamper(step: Path, kind: str, marker: Path) -> None:
    """Rewrite the step's DCP files and re-digest the manifest, as an attacker could."""
    md = _metadata(step)
    obj = json.loads((step / "manifest.json").read_text())
    rewritten = [METADATA]
    if kind == "offset_past_shard":
        idx = next(k for k in md.storage_data if k.fqn.endswith("weight"))
        md.storage_data[idx] = dataclasses.replace(md.storage_data[idx], offset=1 << 20)
    elif kind == "unlisted_shard":
        idx = next(k for k in md.storage_data if k.fqn.endswith("weight"))
        info = md.storage_data[idx]
        shutil.copy(step / "dcp" / info.relative_path, step / "dcp" / "__7_0.distcp")
        md.storage_data[idx] = dataclasses.replace(info, relative_path="__7_0.distcp")
    else:  # a non-tensor item replaced by a torch.save blob that needs a global
        idx = next(k for k in md.storage_data if "param_groups" in k.fqn)
        info = md.storage_data[idx]
        shard = step / "dcp" / info.relative_path
        buf = io.BytesIO()
        torch.save({"lr": _Payload(marker)}, buf)
        data = shard.read_bytes()
        shard.write_bytes(data + buf.getvalue())
        md.storage_data[idx] = dataclasses.replace(
            info, offset=len(data), length=len(buf.getvalue())
        )
        rewritten.append(f"dcp/{info.relative_path}")
    with open(step / METADATA, "wb") as f:
        pickle.dump(md, f)
    for f in obj["files"]:
        if f["path"] in rewritten:
            f["xxh3_128"], f["size"] = digest.hash_file(step / f["path"])
    obj["manifest_digest"] = mf.content_digest(obj)
    (step / "manifest.json").write_text(json.dumps(obj))


def _assert_restored_bitwise(run: Path, want: dict[str, Any]) -> RestoreResult:
    ts, m, o = _trainstate(99)
    res = ckptkit.CheckpointManager(run, readonly=True).restore(ts)
    assert res is not None and res.step == GOOD, res
    got = _snapshot(m, o)
    for k, v in want["model"].items():
        assert torch.equal(got["model"][k], v), k
    for pid, st in want["optim"]["state"].items():
        for k, v in st.items():
            g = got["optim"]["state"][pid][k]
            assert torch.equal(g, v) if isinstance(v, torch.Tensor) else g == v, (pid, k)
    assert got["optim"]["param_groups"] == want["optim"]["param_groups"]
    return res


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_verify_and_restore_refuse_the_same_dcp_metadata(
    tmp_path: Path, kind: str, dcp_run: tuple[Path, dict[int, dict[str, Any]]]
) -> None:
    code = REFUSALS[kind]
    run, saved = dcp_run
    marker = tmp_path / "PWNED"
    _tamper(run / HOSTILE, kind, marker)

    # The reader refuses it (nothing recorded yet: this is its own finding) ...
    res = _assert_restored_bitwise(run, saved[GOOD])
    skipped = [n for n in res.notes if n.startswith(f"skipped {HOSTILE}")]
    assert skipped and code in skipped[0], res.notes
    # ... and verify, from the bytes, with the same code.
    rep = ckptkit.verify(run / HOSTILE)
    assert not rep.ok
    assert code in [f.code for r in rep.reports for f in r.errors], rep.findings
    assert not marker.exists()


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_ls_verify_and_prune_keep_the_restorable_steps(
    tmp_path: Path, kind: str, dcp_run: tuple[Path, dict[int, dict[str, Any]]],
    cli_zygote: Zygote,
) -> None:
    def _cli(*args: str, fresh: bool = False) -> Result:
        """``ckptkit ARGS`` forked from the warmed zygote, or in a new interpreter."""
        launch = fresh_ckptkit if fresh else cli_zygote.ckptkit
        return launch(*args, env={"CKPTKIT_NO_PROGRESS": "1"}, timeout=240)

    run, saved = dcp_run
    marker = tmp_path / "PWNED"
    _tamper(run / HOSTILE, kind, marker)

    # The payload case runs `ls` as typed (the file's one new interpreter); the rest fork.
    ls = _cli("ls", str(run), "--verify", "--json", fresh=kind == "byte_io_global")
    assert ls.returncode == 1, ls.stdout + ls.stderr
    rows = {c["step"]: c for c in json.loads(ls.stdout)["checkpoints"]}
    assert {s: r["status"] for s, r in rows.items()} == {
        10: "verified", 20: "verified", 30: "corrupt"
    }, rows
    assert REFUSALS[kind] in json.dumps(rows[30]), rows[30]

    pr = _cli("prune", str(run), "--keep-last", "1", "--json")
    assert pr.returncode == 0, pr.stdout + pr.stderr
    kept = {d["step"] for d in json.loads(pr.stdout)["decisions"] if d["keep"]}
    assert GOOD in kept, pr.stdout
    assert (run / "step-00000020").is_dir()

    _assert_restored_bitwise(run, saved[GOOD])
    assert not marker.exists()


def test_verify_parses_the_metadata_once_and_restore_once_more(
    dcp_run: tuple[Path, dict[int, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``.metadata`` holds W x T chunks at scale (seconds per parse): a verify parses it once
    for every check that needs it, and a restore parses it once for its checks and once
    for the DCP load."""
    from ckptkit.storage import dcp_meta
    from ckptkit.verify.runner import verify_one

    run, saved = dcp_run
    parses: list[int] = []
    real = dcp_meta.loads_metadata
    monkeypatch.setattr(dcp_meta, "loads_metadata", lambda data: parses.append(len(data)) or real(data))
    assert not verify_one(run / "step-00000030").errors
    assert len(parses) == 1
    parses.clear()
    ts, m, _ = _trainstate(99)
    with ckptkit.CheckpointManager(run, readonly=True) as mgr:
        res = mgr.restore(ts)
    assert res is not None and res.step == 30 and len(parses) == 2
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 saved[30]["model"].values(), strict=True))
