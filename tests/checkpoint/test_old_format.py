"""A checkpoint of the previous format still loads (issue 27 item 1).

``tests/data/v1-two-ranks`` was written by ckptkit 0.2 (``schema_version`` 1: one
``manifest.json`` holding both ranks' entries) with this directory's ``_worker.py``
(scenario ``save``, 2 gloo ranks); ``expected.json`` holds what each rank saw at the save.
Today's reader verifies it and restores it bitwise, at 2 ranks and in one process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _launch import launch

import ckptkit
from ckptkit.checkpoint import manifest_io
from ckptkit.format import manifest as mf

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

FIXTURE = Path(__file__).parents[1] / "data" / "v1-two-ranks"


def _run(tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(FIXTURE / "step-00000003", ck / "step-00000003")
    return ck


def test_a_version_1_checkpoint_verifies(tmp_path: Path) -> None:
    ckpt = _run(tmp_path) / "step-00000003"
    man = manifest_io.read(ckpt)
    assert man.schema_version == mf.SCHEMA_VERSION and man.ranks == ()
    assert {f.rank for f in man.files if f.rank is not None} == {0, 1}
    res = ckptkit.verify(ckpt)
    assert res.ok, [f.to_dict() for f in res.findings]


@pytest.mark.parametrize("world", [2, 1])
def test_a_version_1_checkpoint_restores_bitwise(tmp_path: Path, world: int) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())["ranks"]
    ck = _run(tmp_path)
    codes, res = launch(world, tmp_path / "out", scenario="restore", step=3, ckpt=str(ck))
    assert codes == [0] * world, res
    for rank, r in enumerate(res):
        assert r is not None
        saved = expected[str(rank)]
        assert r["hash_at_restore"] == saved["hash_at_save"]
        assert r["opt_at_restore"] == saved["opt_at_save"]
        if world == 2:  # the same world size: the same samples and RNG streams after it
            assert r["after"] == saved["after"]
            assert r["rand_after"] == saved["rand_after"]
    # The weights two steps later are not compared with the saving machine's: float
    # kernels differ between CPUs (an AVX-512 host computes other low bits than the one
    # that wrote the fixture, from the same restored bytes). The replicas must agree.
    assert len({r["hash_after"] for r in res if r is not None}) == 1
