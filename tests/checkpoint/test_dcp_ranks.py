"""``ckptkit.dcp`` on two gloo ranks: plain ``dcp.save``/``async_save``/``load`` calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _launch import launch

import ckptkit.checkpoint.dcp
from ckptkit import codes
from ckptkit.storage import digest

pytestmark = [pytest.mark.integration, pytest.mark.distributed]


def test_two_ranks_save_sync_and_async_load_and_refuse_a_flipped_shard(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    worker = Path(__file__).parents[1] / "ranks" / "_dcp_worker.py"
    rcs, res = launch(2, tmp_path / "out", worker=worker, ckpt=str(ckpt))
    assert rcs == [0, 0], res
    for r in res:
        assert r is not None
        assert r["sync_equal"] and r["async_equal"] and r["async_step"] == 2
        # Rank 0 flipped a byte of rank 1's shard: every rank refuses, naming it.
        assert r["damaged"] == {"code": codes.F003, "path": "__1_0.distcp"}

    # The manifest of the async save lists both ranks' shards with the digests of the
    # bytes on disk (hashed as written, by the rank that wrote them).
    man = ckptkit.dcp.read_manifest(ckpt / "step-2")
    listed = {f["path"]: f for f in man.user["adopted"]["files"]}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(listed)
    for name, f in listed.items():
        assert digest.hash_file(ckpt / "step-2" / name) == (f["xxh3_128"], f["size"])
    assert json.loads((ckpt / "step-2" / ckptkit.dcp.MANIFEST_NAME).read_text())["step"] == 2
