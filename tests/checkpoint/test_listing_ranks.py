"""Rank 0's manifest work on a multi-rank checkpoint does not grow with ranks x tensors
(issue 27): a run's listing reads the root alone, and a save reads back, before its
commit, only what rank 0 would read to restore.

``ls``, retention and a restore's choice of candidates list every checkpoint of the run;
each used to read every rank manifest of each. The root records each rank manifest's size
and the sizes of the files it lists (``RankRef.sizes``), so the listing checks the files
are there at their sizes from the root, as it does for data files. Saves here are by four
thread ranks (tests/threadranks.py); the gloo runs are
``tests/checkpoint/test_rank_manifests.py``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from threadranks import ThreadRank, on_ranks

import ckptkit
from ckptkit import codes
from ckptkit.capture.state import manifests_to_read
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import Catalog
from ckptkit.checkpoint.commit import save_state
from ckptkit.errors import ManifestError
from ckptkit.format import manifest as mf
from ckptkit.format.ranks import rank_manifest_path
from ckptkit.storage import fs

WORLD = 4
STEP = "step-00000003"


def save(root: Path) -> list[mf.Manifest | None]:
    """Save a 4-rank checkpoint of one small model at step 3; what each rank returned."""

    def one(rank: ThreadRank) -> mf.Manifest | None:
        torch.manual_seed(0)
        ts = ckptkit.TrainState(
            model=torch.nn.Linear(4, 4),
            step=3,
            parallel=ckptkit.ParallelConfig(world_size=WORLD, rank=rank.rank),
        )
        return save_state(ts, root / STEP, coll=rank, fsync=False)

    return on_ranks(WORLD, one)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run holding one 4-rank checkpoint, recorded verified (a full read of it)."""
    root = tmp_path / "run"
    save(root)
    ckpt = fs.location(root / STEP)
    Catalog(root).record(ckpt, manifest_io.read(ckpt), "verified", why=None)
    return root


def listed(root: Path) -> tuple[ckptkit.CheckpointInfo, list[int]]:
    """The listing of the run's one checkpoint, and the rank manifests it read."""
    manifest_io.rank_reads.clear()
    [info] = Catalog(root).list()
    return info, sorted(manifest_io.rank_reads)


def test_a_listing_reads_the_root_alone(run: Path) -> None:
    info, read = listed(run)
    assert (info.status, info.problem, read) == ("verified", None, [])
    man, _ = Catalog(run).manifest(fs.location(run / STEP))
    full = manifest_io.read(run / STEP)
    assert man.read_ranks == frozenset() and man.digest == full.digest
    assert man.file_sizes() == full.file_sizes()
    assert {f"ranks/rank-{r:05d}.json" for r in range(WORLD)} <= set(man.file_sizes() or {})


@pytest.mark.parametrize("damage", ["rank manifest gone", "rank manifest cut", "rank file cut"])
def test_a_listing_names_a_file_missing_or_resized_since_the_verify(
    run: Path, damage: str
) -> None:
    ckpt = run / STEP
    victim = {
        "rank manifest gone": ckpt / rank_manifest_path(2),
        "rank manifest cut": ckpt / rank_manifest_path(2),
        "rank file cut": ckpt / "rng-rank00002.safetensors",
    }[damage]
    if damage.endswith("gone"):
        victim.unlink()
    else:
        victim.write_bytes(victim.read_bytes()[:-1])
    info, read = listed(run)
    assert info.status == "committed" and read == []
    assert info.problem is not None and victim.name in info.problem, info.problem


def test_a_rank_manifest_changed_at_its_size_is_found_by_the_readers_not_the_listing(
    run: Path,
) -> None:
    # As for a data file: the listing checks presence and size; a restore or a verify
    # reads the bytes and refuses them.
    p = run / STEP / rank_manifest_path(3)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    assert listed(run)[0].status == "verified"
    with pytest.raises(ManifestError) as info:
        manifest_io.read(run / STEP)
    assert info.value.code == codes.M013
    res = ckptkit.verify(run / STEP)
    assert not res.ok and codes.M013 in {f.code for f in res.findings}


def test_a_root_without_its_files_sizes_is_listed_from_a_full_read(run: Path) -> None:
    # A root written before the sizes were recorded: the listing reads every rank manifest.
    ckpt = run / STEP
    full = manifest_io.read(ckpt)
    old = replace(full, ranks=tuple(replace(r, sizes=None) for r in full.ranks))
    (ckpt / mf.MANIFEST_NAME).unlink()
    manifest_io.write(fs.location(ckpt), old)
    info, read = listed(run)
    assert read == list(range(WORLD)) and info.status == "committed"
    man, _ = Catalog(run).manifest(fs.location(ckpt))
    assert man.complete and man.file_sizes() == full.file_sizes()


def test_a_save_reads_back_before_its_commit_what_rank_0_would_restore(tmp_path: Path) -> None:
    manifest_io.rank_reads.clear()
    man = save(tmp_path / "run")[0]
    assert man is not None
    want = manifests_to_read(man, 0)
    assert want is not None and len(want) < WORLD  # some rank manifest is left unread
    assert sorted(manifest_io.rank_reads) == sorted(want) and man.read_ranks == want
    # What was committed is the root, and the checkpoint reads back whole.
    full = manifest_io.read(tmp_path / "run" / STEP)
    assert full.digest == man.digest and len(full.ranks) == WORLD
    assert ckptkit.verify(tmp_path / "run" / STEP).ok
