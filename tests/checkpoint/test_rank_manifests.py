"""Per-rank manifests under a small root (issue 27 item 1), on real gloo ranks.

A multi-rank save writes each rank's file and tensor entries into that rank's own manifest
(``ranks/rank-NNNNN.json``); the root ``manifest.json`` lists them by size and digest and
holds none of the entries. Saved at 4 and at 8 ranks, each checkpoint verifies and
restores bitwise at the other world size (8 -> 4, 4 -> 8); a rank manifest deleted,
damaged, replaced by another rank's, or a root read without its directory is refused
(``CK-M013``), never read as a smaller checkpoint.

A restoring rank reads the root and only the rank manifests it needs (item 3): those
holding shared state and the one holding the RNG state it restores; a damaged rank
manifest only one rank reads makes every rank refuse the checkpoint together.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _launch import launch
from damaged_run import report_json
from threadranks import on_ranks

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint import manifest_io
from ckptkit.errors import ManifestError
from ckptkit.format import manifest as mf
from ckptkit.format.ranks import RANKED_VERSION, rank_manifest_path
from ckptkit.verify.runner import verify

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

STEP = "step-00000003"
LAUNCH_TIMEOUT = 240.0  # eight ranks starting torch on two cores
SAMPLES = 320  # 5 batches of 4 on each of 8 ranks (3 before the save, 2 after)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, list[Any]]]:
    """A run saved at step 3 by 4 ranks and one by 8: the run directory and what each rank
    saw."""
    out: dict[int, tuple[Path, list[Any]]] = {}
    for world in (4, 8):
        root = tmp_path_factory.mktemp(f"w{world}")
        codes_, res = launch(
            world, root / "out", timeout=LAUNCH_TIMEOUT, scenario="save",
            ckpt=str(root / "ck"), pg_timeout=120, samples=SAMPLES,
        )
        assert codes_ == [0] * world, res
        out[world] = (root / "ck", res)
    return out


@pytest.mark.parametrize("world", [4, 8])
def test_the_root_lists_one_manifest_per_rank_and_no_entries(
    saved: dict[int, tuple[Path, list[Any]]], world: int
) -> None:
    ckpt = saved[world][0] / STEP
    root = json.loads((ckpt / mf.MANIFEST_NAME).read_text())
    assert root["schema_version"] == RANKED_VERSION
    assert root["files"] == [] and root["tensors"] == []
    assert [r["rank"] for r in root["ranks"]] == list(range(world))
    for r in root["ranks"]:
        assert (ckpt / r["path"]).stat().st_size == r["size"]
    # Read back: one manifest with every rank's entries, each file listed once.
    man = manifest_io.read(ckpt)
    assert len(man.ranks) == world
    paths = [f.path for f in man.files]
    assert len(paths) == len(set(paths))
    assert {f"rng-rank{r:05d}.safetensors" for r in range(world)} <= set(paths)
    assert {f.rank for f in man.files} <= set(range(world))
    res = ckptkit.verify(ckpt)
    assert res.ok, [f.to_dict() for f in res.findings]


@pytest.mark.parametrize(("saved_at", "restored_at"), [(8, 4), (4, 8)])
def test_restores_bitwise_at_another_world_size(
    saved: dict[int, tuple[Path, list[Any]]], tmp_path: Path, saved_at: int, restored_at: int
) -> None:
    run, before = saved[saved_at]
    ck = tmp_path / "ck"
    shutil.copytree(run, ck)
    codes_, after = launch(
        restored_at, tmp_path / "out", timeout=LAUNCH_TIMEOUT, scenario="restore", step=3,
        ckpt=str(ck), pg_timeout=120, samples=SAMPLES,
    )
    assert codes_ == [0] * restored_at, after
    # DDP: the model and optimizer state are the same on every rank, saved and restored.
    assert len({r["hash_at_save"] for r in before}) == 1
    shared = _shared(ck / STEP)
    assert len(shared) < saved_at  # what follows shows manifests left unread
    for rank, r in enumerate(after):
        assert r is not None
        assert r["hash_at_restore"] == before[0]["hash_at_save"]
        assert r["opt_at_restore"] == before[0]["opt_at_save"]
        assert any("world size" in n for n in r["notes"]), r["notes"]
        # The root, the shared state's manifests and the one of the RNG state it restores
        # (its own, or rank 0's for a rank the save did not have).
        own = rank if rank < saved_at else 0
        assert r["read"] == sorted(shared | {own}), (rank, r["read"])
    # Fewer ranks than saved leave the dropped ranks' own files unread: not "verified".
    assert [r["proven"] for r in after if r] == [restored_at >= saved_at] * restored_at


def _shared(ckpt: Path) -> set[int]:
    """The ranks whose manifests hold state besides their own RNG (as the root records)."""
    root = json.loads((ckpt / mf.MANIFEST_NAME).read_text())
    return {r["rank"] for r in root["ranks"] if set(r["heads"]) - {"rng"}}


def test_a_rank_manifest_only_one_rank_reads_fails_every_rank(
    saved: dict[int, tuple[Path, list[Any]]], tmp_path: Path
) -> None:
    run, _ = saved[4]
    ck = tmp_path / "ck"
    shutil.copytree(run, ck)
    victim = max(set(range(4)) - _shared(ck / STEP))
    p = ck / STEP / rank_manifest_path(victim)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    codes_, after = launch(
        4, tmp_path / "out", timeout=LAUNCH_TIMEOUT, scenario="refused", step=3,
        ckpt=str(ck), pg_timeout=120, samples=SAMPLES,
    )
    assert codes_ == [0] * 4, after
    for rank, r in enumerate(after):
        assert r is not None and r["raised"] is not None, (rank, r)
        # Only the victim read the damaged manifest (rank 0's listing of the run reads
        # roots alone); every rank refuses, with the victim's code.
        assert (victim in r["read"]) is (rank == victim), (rank, r["read"])
        assert codes.M013 in r["raised"] and f"rank {victim}" in r["raised"], r["raised"]


@pytest.mark.parametrize("damage", [None, "shard", "rank manifest"])
def test_one_reader_more_workers_and_ranks_give_the_same_verdict(
    saved: dict[int, tuple[Path, list[Any]]], tmp_path: Path, damage: str | None
) -> None:
    """verify of an 8-rank checkpoint alone, with 3 threads, and shared by 3 ranks (threads
    as ranks: tests/threadranks.py; a real torchrun verify is test_verify_torchrun.py)."""
    ckpt = tmp_path / STEP
    shutil.copytree(saved[8][0] / STEP, ckpt)
    if damage == "shard":
        p = ckpt / "rng-rank00005.safetensors"
        data = bytearray(p.read_bytes())
        data[-5] ^= 0x01
        p.write_bytes(bytes(data))
    elif damage == "rank manifest":
        (ckpt / rank_manifest_path(6)).unlink()
    one = report_json(verify(ckpt, workers=1))
    assert one["ok"] is (damage is None)
    assert report_json(verify(ckpt, workers=3)) == one
    ranked = on_ranks(3, lambda g: verify(ckpt, group=g, workers=1))
    assert report_json(ranked[0]) == one


def _copy(saved: dict[int, tuple[Path, list[Any]]], tmp_path: Path) -> Path:
    dst = tmp_path / STEP
    shutil.copytree(saved[4][0] / STEP, dst)
    return dst


def _refused(ckpt: Path) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        manifest_io.read(ckpt)
    res = ckptkit.verify(ckpt)
    assert not res.ok
    assert info.value.code in {f.code for f in res.findings}
    return info.value


def test_a_missing_rank_manifest_is_refused(
    saved: dict[int, tuple[Path, list[Any]]], tmp_path: Path
) -> None:
    ckpt = _copy(saved, tmp_path)
    (ckpt / rank_manifest_path(2)).unlink()
    e = _refused(ckpt)
    assert e.code == codes.M013 and "rank 2" in str(e) and "missing" in str(e)


def test_a_damaged_or_swapped_rank_manifest_is_refused(
    saved: dict[int, tuple[Path, list[Any]]], tmp_path: Path
) -> None:
    ckpt = _copy(saved, tmp_path)
    p = ckpt / rank_manifest_path(1)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    assert _refused(ckpt).code == codes.M013
    # Rank 0's manifest put in rank 1's place: whole and valid, but not what the root lists.
    shutil.copyfile(ckpt / rank_manifest_path(0), p)
    e = _refused(ckpt)
    assert e.code == codes.M013 and "rank 1" in str(e)


def test_a_root_read_alone_says_where_its_entries_are(
    saved: dict[int, tuple[Path, list[Any]]],
) -> None:
    text = (saved[4][0] / STEP / mf.MANIFEST_NAME).read_bytes()
    with pytest.raises(ManifestError) as info:
        mf.Manifest.from_json(text)
    assert info.value.code == codes.M013
    assert "per-rank manifests" in str(info.value)


@pytest.mark.parametrize("model_only", [True, False], ids=["model", "model+optimizer"])
def test_a_dcp_restore_reads_the_manifests_of_the_files_its_plan_loads(
    tmp_path: Path, model_only: bool
) -> None:
    """FSDP2 (DTensor shards, so DCP storage) saved by 4 ranks: a restoring rank reads the
    root, the manifests of the shared state and of its RNG source, and then the manifests
    of the DCP files its own load plan reads or checks, not every rank's. With the model
    alone (every item a Shard(0) DTensor) at 4 ranks that is rank 0's (``.metadata``) and
    its own; at 2 ranks, those of the shards it reshards from and of the files it is to
    check (each file is checked by its writer's rank modulo 2). DCP spreads the replicated
    items of the optimizer (each parameter's ``step``) over every rank's file, so with it
    each rank's plan reads every file, and every manifest. Bitwise at each size restored."""
    ck = tmp_path / "ck"
    spec = {"storage": "dcp", "fsdp": True, "model_only": model_only, "pg_timeout": 120,
            "samples": SAMPLES, "ckpt": str(ck)}
    codes_, before = launch(4, tmp_path / "o-save", timeout=LAUNCH_TIMEOUT, scenario="save", **spec)
    assert codes_ == [0] * 4, before
    root = json.loads((ck / STEP / mf.MANIFEST_NAME).read_text())
    writer = {p: r["rank"] for r in root["ranks"] for p in r["files"]}
    assert writer["dcp/.metadata"] == 0
    assert [writer[f"dcp/__{r}_0.distcp"] for r in range(4)] == [0, 1, 2, 3]
    # With the optimizer, 4 ranks show it: the 4 -> 2 reshard reads no fewer files.
    for world in (4, 2) if model_only else (4,):
        codes_, after = launch(
            world, tmp_path / f"o-{world}", timeout=LAUNCH_TIMEOUT, scenario="restore", step=3,
            **spec,
        )
        assert codes_ == [0] * world, after
        for rank, r in enumerate(after):
            assert r is not None and r["hash_at_restore"] == before[0]["hash_at_save"]
            if world == 4 and not model_only:
                assert r["opt_at_restore"] == before[rank]["opt_at_save"]
            if not model_only:
                assert r["read"] == [0, 1, 2, 3], (rank, r["read"])
            elif world == 4:
                assert r["read"] == sorted({0, rank}), (rank, r["read"])
        if model_only and world == 2:
            # Rank 0 reads the shards of ranks 0 and 1 and checks rank 2's file (2 % 2 == 0);
            # rank 1 reads those of ranks 2 and 3, its own RNG state and rank 0's metadata.
            assert [r["read"] for r in after] == [[0, 1, 2], [0, 1, 2, 3]]
        # Every file is read or checked by some rank: every manifest is read by one.
        assert set().union(*(r["read"] for r in after)) == {0, 1, 2, 3}
        # At 2 ranks the RNG files of ranks 2 and 3 are nobody's to read: not "verified".
        assert [r["proven"] for r in after] == [world == 4] * world
