"""Per-rank model state on thread ranks (``ckptkit.capture.perrank``, issue 39 item 6).

The commit protocol with thread collectives: buffers that agree are written once, buffers
that differ are written per rank and come back by the reshard rule (own, else rank 0's),
a layout that differs is refused naming what differs. Real gloo ranks and DDP:
``tests/capture/test_perrank_buffers.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from threadranks import on_ranks

import ckptkit
from ckptkit import codes
from ckptkit.capture import perrank
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.state import manifests_to_read, tree_problems
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.commit import save_state
from ckptkit.errors import StateError
from ckptkit.run.restore import restore_candidate
from ckptkit.storage import fs


def net(width: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width))


def state(model: torch.nn.Module, rank: int, world: int) -> ckptkit.TrainState:
    return ckptkit.TrainState(model=model, parallel=ParallelConfig(world_size=world, rank=rank))


def save(path: Path, *, differ: bool, world: int = 2) -> list[dict[str, torch.Tensor]]:
    """Save ``world`` thread ranks whose BatchNorm statistics differ (or not); each rank's
    state dict at the save."""

    def one(g: Any) -> dict[str, torch.Tensor]:
        m = net()
        with torch.no_grad():
            m[1].running_mean.fill_(float(g.rank + 1) if differ else 1.0)
        save_state(state(m, g.rank, world), path, coll=g, fsync=False)
        return {k: v.clone() for k, v in m.state_dict().items()}

    return on_ranks(world, one)


def test_buffers_that_agree_are_written_once(tmp_path: Path) -> None:
    save(tmp_path / "c", differ=False)
    assert not list((tmp_path / "c").glob("buffers-*"))
    man = manifest_io.read(tmp_path / "c")
    assert "1.running_mean" in man.tree["model"] and "buffers" not in man.tree


def test_a_rank_restores_its_own_buffers_and_a_new_rank_rank_0s(tmp_path: Path) -> None:
    saved = save(tmp_path / "c", differ=True)
    assert sorted(p.name for p in (tmp_path / "c").glob("buffers-*")) == [
        "buffers-rank00000.safetensors",
        "buffers-rank00001.safetensors",
    ]
    loaded = ckptkit.load(tmp_path / "c")
    assert "1.running_mean" not in loaded["model"]
    assert sorted(loaded["buffers"]) == ["rank00000", "rank00001"]

    def restore(g: Any) -> tuple[dict[str, torch.Tensor], list[str]]:
        m = net()
        res = restore_candidate(state(m, g.rank, 3), fs.location(tmp_path / "c"), strict=True, coll=g)
        return m.state_dict(), res.notes

    got = on_ranks(3, restore)
    for rank, (sd, notes) in enumerate(got):
        want = saved[rank] if rank < 2 else saved[0]
        assert all(torch.equal(sd[k], want[k]) for k in want), rank
        assert any("none of rank 2; it takes rank00000's" in n for n in notes) == (rank == 2)


def test_each_restoring_rank_reads_the_manifest_of_the_buffers_it_restores(tmp_path: Path) -> None:
    save(tmp_path / "c", differ=True, world=3)
    root = manifest_io.read(tmp_path / "c", only=lambda _: ())
    assert manifests_to_read(root, 2) == {0, 2}  # rank 0 holds the model; its own buffers and RNG
    assert manifests_to_read(root, 5) == {0}


def test_a_shape_that_differs_is_refused_naming_the_tensor_and_ranks(tmp_path: Path) -> None:
    def one(g: Any) -> None:
        save_state(state(net(4 if g.rank == 0 else 5), g.rank, 2), tmp_path / "c", coll=g, fsync=False)

    with pytest.raises(StateError) as info:
        on_ranks(2, one)
    assert info.value.code == codes.S022
    assert "'model/0.weight' is float32 [4, 4] on rank 0 but float32 [5, 4] on rank 1" in str(info.value)
    assert not (tmp_path / "c").exists()


def test_a_hand_edited_buffers_entry_is_a_tree_problem() -> None:
    tree = {"model": {"w": 1}, "buffers": {"rank00000": {"w": 2}, "x": 3}}
    assert tree_problems(tree) == [
        "buffers: rank00000: 'w' is also in the model state",
        "buffers: 'x' is not a rank's key holding a mapping of buffers",
    ]
    assert perrank.problems({"model": {}}) == []
