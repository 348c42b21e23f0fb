"""Multi-rank save/restore on real gloo process groups (2-4 CPU processes), spec §7."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _launch import TIMEOUT, launch

import ckptkit
from ckptkit import crashpoints
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.checkpoint import manifest_io
from ckptkit.format import manifest as mf
from ckptkit.format.ranks import RANKS_DIR
from ckptkit.storage.atomic import is_committed
from ckptkit.verify.runner import verify_one

pytestmark = [pytest.mark.integration, pytest.mark.distributed]


def epoch_order() -> list[int]:
    return list(ResumableSampler(96, seed=1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A world-size-2 DDP run saved at step 3 and continued to step 5."""
    root = tmp_path_factory.mktemp("dist")
    codes, res = launch(2, root / "o-save", scenario="save", ckpt=str(root / "ckpt"))
    assert codes == [0, 0]
    return {"root": root, "ckpt": root / "ckpt", "res": res}


def test_save_writes_per_rank_files_and_one_manifest(saved: dict[str, Any]) -> None:
    path = saved["ckpt"] / "step-00000003"
    man = manifest_io.read(path)
    ranks = {f.path: f.rank for f in man.files}
    assert ranks["rng-rank00000.safetensors"] == 0
    assert ranks["rng-rank00001.safetensors"] == 1
    assert man.components["rng"].summary["ranks"] == [0, 1]
    assert sorted(man.tree["sampler"]["ranks"]) == ["rank00000", "rank00001"]
    assert man.components["parallel"].summary["world_size"] == 2
    rep = verify_one(path)
    assert not rep.errors and not [f for f in rep.findings if f.code in ("CK-S006", "CK-C003")]
    assert (saved["ckpt"] / "latest").read_text().strip() == "step-00000003"


def test_restore_same_world_size_is_bitwise_exact(saved: dict[str, Any]) -> None:
    codes, res = launch(
        2, saved["root"] / "o-r2", scenario="restore", step=3, ckpt=str(saved["ckpt"])
    )
    assert codes == [0, 0]
    for ref, got in zip(saved["res"], res, strict=True):
        assert got is not None
        assert got["after"] == ref["after"]  # same samples per rank
        assert got["hash_after"] == ref["hash_after"]  # same weights after 2 more steps
        assert got["rand_after"] == ref["rand_after"]  # same RNG stream per rank
        assert not any("world size" in n for n in got["notes"])


@pytest.mark.parametrize("world", [1, 4])
def test_restore_other_world_size_continues_without_replay(
    saved: dict[str, Any], world: int
) -> None:
    codes, res = launch(
        world, saved["root"] / f"o-r{world}", scenario="restore", step=3, ckpt=str(saved["ckpt"])
    )
    assert codes == [0] * world
    before = [i for r in saved["res"] for i in r["before"]]
    after = [i for r in res for i in r["after"]]
    order = epoch_order()
    assert not set(after) & set(before)  # nothing replayed
    assert sorted(after) == sorted(order[len(before) : len(before) + len(after)])  # none skipped
    assert all(r["hash_at_restore"] == saved["res"][0]["hash_at_save"] for r in res)
    notes = " ".join(res[0]["notes"])
    assert "world size 2 -> " + str(world) in notes
    assert "re-split" in notes
    if world == 4:
        assert "rng:fresh" in res[3]["restored"] and "rng:fresh" not in res[1]["restored"]


KILLS = [
    (1, "commit.file_written"),  # mid-write on a non-zero rank
    (1, "commit.files_written"),  # its files whole, before the ranks' results meet
    (0, "commit.tmp_created"),  # rank 0, before anything is written
    (0, "commit.manifest_written"),  # rank 0, manifest written, not renamed
    (0, "commit.renamed"),  # rank 0, committed, before the outcome reaches rank 1
    (0, "settle.latest"),  # rank 0, committed and verified, before rotation
]


@pytest.mark.parametrize(("victim", "point"), KILLS, ids=[f"rank{v}-{p}" for v, p in KILLS])
def test_a_rank_dies_at_a_named_point_of_a_save(tmp_path: Path, victim: int, point: str) -> None:
    """One rank of two stops dead at a crash point of the step-2 save; the other never
    hangs, nothing half-written looks committed, and a fresh world of two restores the
    newest committed step."""
    ck = tmp_path / "ck"
    codes, res = launch(
        2, tmp_path / "o", scenario="kill", victim=victim, point=point, ckpt=str(ck),
        pg_timeout=20,
    )
    survivor = 1 - victim
    assert codes[victim] == crashpoints.EXIT_CODE and res[victim] is None, codes
    assert codes[survivor] == 0 and res[survivor] is not None, codes
    raised = res[survivor]["raised"]
    committed = victim == 0 and point in ("commit.renamed", "settle.latest")
    if not committed:
        assert raised and "DistributedError" in raised, raised
    assert raised is None or "DistributedError" in raised, raised
    steps = sorted(int(p.name.split("-")[1]) for p in ck.glob("step-*") if is_committed(p))
    assert steps == ([1, 2] if committed else [1]), steps
    for s in steps:
        assert ckptkit.verify(ck / f"step-{s:08d}").ok, s
    assert (ck / "latest").read_text().strip() in {f"step-{s:08d}" for s in steps}
    codes, res = launch(2, tmp_path / "o-restore", scenario="restore", step=steps[-1], ckpt=str(ck))
    assert codes == [0, 0], res
    mgr = ckptkit.CheckpointManager(ck)
    mgr.run.writer()  # the next writer removes what the dead one left
    assert not mgr.leftovers()
    mgr.close()


def test_failure_on_one_rank_raises_everywhere(tmp_path: Path) -> None:
    codes, res = launch(2, tmp_path / "o", scenario="fail", victim=1, ckpt=str(tmp_path / "ck"))
    assert codes == [0, 0]
    for r in res:
        assert r is not None and r["raised"] and r["steps"] == []
    assert "rank(s) 1" in res[0]["raised"]
    assert not list((tmp_path / "ck").glob("step-*"))


@pytest.mark.parametrize("fsdp", [False, True], ids=["dcp-replicated", "fsdp2"])
def test_dcp_storage_reshards_to_other_world_sizes(tmp_path: Path, fsdp: bool) -> None:
    ck = tmp_path / "ck"
    codes, ref = launch(
        2, tmp_path / "o-save", scenario="save", ckpt=str(ck), storage="dcp", fsdp=fsdp
    )
    assert codes == [0, 0]
    man = manifest_io.read(ck / "step-00000003")
    dcp_files = [f.path for f in man.files if f.component == "dcp"]
    assert "dcp/.metadata" in dcp_files and any(p.endswith(".distcp") for p in dcp_files)
    assert not verify_one(ck / "step-00000003").errors
    assert man.components["model"].where and man.components["model"].where[0].startswith("dcp/")
    # Same world size (bitwise) and 2 -> 1 run with FSDP2; the replicated case goes 2 -> 4.
    for world in (1, 2) if fsdp else (4,):
        codes, res = launch(
            world,
            tmp_path / f"o-{world}",
            scenario="restore",
            step=3,
            ckpt=str(ck),
            storage="dcp",
            fsdp=fsdp,
        )
        assert codes == [0] * world, world
        assert all(r["hash_at_restore"] == ref[0]["hash_at_save"] for r in res)
        if world == 2:
            for a, b in zip(ref, res, strict=True):
                assert (a["after"], a["hash_after"]) == (b["after"], b["hash_after"])
        else:
            before = [i for r in ref for i in r["before"]]
            after = [i for r in res for i in r["after"]]
            assert not set(after) & set(before)
            assert sorted(after) == sorted(epoch_order()[24 : 24 + len(after)])


# --- verify on multi-rank manifests: one seeded defect each ----------------------------------


def _copy(saved: dict[str, Any], tmp_path: Path) -> Path:
    dst = tmp_path / "step-00000003"
    shutil.copytree(saved["ckpt"] / "step-00000003", dst)
    return dst


def _rewrite(path: Path, edit: Any) -> None:
    """Edit the checkpoint's manifest, rewritten as one manifest of every rank's entries
    (schema_version 1, which readers still read: the edit sees every entry in one place)."""
    d = replace(manifest_io.read(path), ranks=(), schema_version=mf.SCHEMA_VERSION).to_dict()
    d.pop("manifest_digest")
    edit(d)
    (path / mf.MANIFEST_NAME).unlink()
    shutil.rmtree(path / RANKS_DIR, ignore_errors=True)
    manifest_io.write(path, mf.Manifest.from_dict(d))


def _codes(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in verify_one(path).findings:
        out.setdefault(f.code, []).append(f"{f.path} {f.message}")
    return out


def test_verify_missing_rank_file_names_the_rank(saved: dict[str, Any], tmp_path: Path) -> None:
    p = _copy(saved, tmp_path)
    (p / "rng-rank00001.safetensors").unlink()
    found = _codes(p)
    assert any("rank 1" in m and "rng-rank00001" in m for m in found["CK-F001"])


def test_verify_rng_for_fewer_ranks_than_world(saved: dict[str, Any], tmp_path: Path) -> None:
    p = _copy(saved, tmp_path)
    (p / "rng-rank00001.safetensors").unlink()

    def drop_rank1(d: dict[str, Any]) -> None:
        d["files"] = [f for f in d["files"] if f["path"] != "rng-rank00001.safetensors"]
        d["tensors"] = [t for t in d["tensors"] if t["file"] != "rng-rank00001.safetensors"]
        del d["tree"]["rng"]["rank00001"]
        summ = d["components"]["rng"]["summary"]
        summ["ranks"] = [0]
        del summ["fingerprints"]["rank00001"]
        d["components"]["rng"]["where"] = ["rng-rank00000.safetensors"]

    _rewrite(p, drop_rank1)
    found = _codes(p)
    assert any("1 of 2" in m for m in found["CK-C003"])
    assert "CK-F001" not in found


def test_verify_duplicated_rng_states(saved: dict[str, Any], tmp_path: Path) -> None:
    p = _copy(saved, tmp_path)

    def dup(d: dict[str, Any]) -> None:
        fps = d["components"]["rng"]["summary"]["fingerprints"]
        fps["rank00001"] = fps["rank00000"]

    _rewrite(p, dup)
    assert "rank00000" in _codes(p)["CK-S006"][0]


def test_verify_degrees_not_multiplying_to_world(saved: dict[str, Any], tmp_path: Path) -> None:
    p = _copy(saved, tmp_path)

    def bad_degrees(d: dict[str, Any]) -> None:
        par = {k: v for k, v in d["tree"]["parallel"].items()}
        par.update(dp=3, tp=1)
        d["tree"]["parallel"] = par
        cfg = ckptkit.ParallelConfig.from_dict(par)
        d["components"]["parallel"]["summary"] = {**par, "problems": cfg.validate()}

    _rewrite(p, bad_degrees)
    assert any("world_size 2" in m for m in _codes(p)["CK-S007"])


def test_drill_under_torchrun(tmp_path: Path) -> None:
    """The bundled tiny LM as a 2-rank DDP job passes a drill (twin + per-rank exposure)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to the interpreter")
    env = {**os.environ, "CKPTKIT_NO_PROGRESS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "ckptkit",
        "drill",
        "-W",
        "4",
        "-N",
        "4",
        "--workdir",
        str(tmp_path / "drill"),
        "--",
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "ckptkit.examples.tiny_lm",
        "--steps",
        "16",
        "--num-seqs",
        "120",
        "--dim",
        "32",
        "--layers",
        "1",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "exposure       pass" in proc.stdout or "exposure" in proc.stdout
