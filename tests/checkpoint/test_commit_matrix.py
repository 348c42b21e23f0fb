"""Every combination a user can reach commits, verifies and restores bitwise (issue 11).

storage {tensors, dcp} × world {1 without a process group, 1 on gloo, 2 on gloo} ×
{sync, async} on a local disk, the same on S3 (a real endpoint: moto in server mode), and
FSDP2 on a world of one: each saves at step 3 through
``CheckpointManager`` (one commit protocol), is verified from its bytes, and is restored
in a fresh process, which must hold the same parameters and optimizer state and continue
to the same parameters two steps later. The data-loss bug of v0.1 lived in the one
combination nobody tested (DCP storage without a process group).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _launch import launch

import ckptkit
from ckptkit.checkpoint import manifest_io

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

WORLDS = {"solo": (1, False), "gloo1": (1, True), "gloo2": (2, True)}


def _roundtrip(
    tmp_path: Path, world: int, *, run: str | None = None, **spec: Any
) -> tuple[list[Any], list[Any], Any]:
    ck: Any = run if run is not None else tmp_path / "ck"
    codes, saved = launch(world, tmp_path / "o-save", scenario="save", ckpt=str(ck), **spec)
    assert codes == [0] * world, saved
    restore_spec = {k: v for k, v in spec.items() if k != "async"}
    codes, restored = launch(
        world, tmp_path / "o-restore", scenario="restore", step=3, ckpt=str(ck), **restore_spec
    )
    assert codes == [0] * world, restored
    return saved, restored, (f"{ck}/step-00000003" if run is not None else ck / "step-00000003")


def _assert_bitwise(saved: list[Any], restored: list[Any]) -> None:
    for s, r in zip(saved, restored, strict=True):
        assert r["hash_at_restore"] == s["hash_at_save"]
        assert r["opt_at_restore"] == s["opt_at_save"]
        assert r["after"] == s["after"]  # the same samples after the resume
        assert r["hash_after"] == s["hash_after"]  # and the same trajectory
        assert r["rand_after"] == s["rand_after"]  # RNG streams came back
    # Rank 0 verifies, records and points latest (the others list before it may be done).
    assert (3, "verified") in [tuple(x) for x in saved[0]["listed"]]


def _assert_proven(path: Any, storage: str) -> None:
    res = ckptkit.verify(path)
    assert res.ok, [f.to_dict() for f in res.findings]
    comps = res.reports[0].components
    man = manifest_io.read(path)
    for name in ("model", "optimizer"):
        assert comps[name].present, name
        where = comps[name].where
        assert where and not any(w.startswith("manifest:") for w in where), (name, where)
        listed = {f.path for f in man.files}
        assert set(where) <= listed
        if storage == "dcp":
            assert all(w.startswith("dcp/") for w in where)
            assert "dcp/.metadata" in where


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("world_name", list(WORLDS))
@pytest.mark.parametrize("storage", ["tensors", "dcp"])
def test_commit_matrix(tmp_path: Path, storage: str, world_name: str, mode: str) -> None:
    world, pg = WORLDS[world_name]
    saved, restored, path = _roundtrip(
        tmp_path, world, storage=storage, pg=pg, **({"async": True} if mode == "async" else {})
    )
    _assert_bitwise(saved, restored)
    _assert_proven(path, storage)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fsdp2_on_a_world_of_one(tmp_path: Path, mode: str) -> None:
    saved, restored, path = _roundtrip(
        tmp_path, 1, pg=True, fsdp=True, storage="auto",
        **({"async": True} if mode == "async" else {}),
    )
    _assert_bitwise(saved, restored)
    _assert_proven(path, "dcp")


S3_COMBOS = [
    *((s, "gloo2", m) for s in ("tensors", "dcp") for m in ("sync", "async")),
    ("tensors", "solo", "async"),
    ("dcp", "solo", "sync"),
]
"""On S3 every storage × mode at world 2, and a world of one without a process group for
each storage. World 1 on gloo takes the same per-rank path as world 2 (and is covered on a
local disk above); all 12 pass on S3 (measured once), at ~15-60 s each: too slow for every
run."""


@pytest.mark.parametrize(("storage", "world_name", "mode"), S3_COMBOS)
def test_commit_matrix_on_s3(
    tmp_path: Path, s3_run: str, storage: str, world_name: str, mode: str
) -> None:
    """Every rank writes its own objects, rank 0 commits the manifest last, on S3."""
    world, pg = WORLDS[world_name]
    saved, restored, path = _roundtrip(
        tmp_path, world, run=s3_run, storage=storage, pg=pg,
        **({"async": True} if mode == "async" else {}),
    )
    _assert_bitwise(saved, restored)
    _assert_proven(path, storage)
