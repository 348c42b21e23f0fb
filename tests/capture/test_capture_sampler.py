"""Sampler capture: ResumableSampler, generic stateful objects, and objects without a cursor."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch

from ckptkit.capture import sampler as cap
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.errors import StateError


def test_resumable_round_trip_and_summary() -> None:
    s = ResumableSampler(50, seed=7, world_size=2, rank=1)
    it = iter(s)
    head = [next(it) for _ in range(6)]
    snap = json.loads(json.dumps(cap.capture(s)))  # no tensors: the whole tree is JSON
    s2 = ResumableSampler(50, seed=7, world_size=2, rank=1)
    cap.restore(s2, snap)
    assert head + list(s2) == list(ResumableSampler(50, seed=7, world_size=2, rank=1))
    assert cap.summary(snap) == {
        "kind": "resumable",
        "type": "ResumableSampler",
        "epoch": 0,
        "position": 6,
        "offset": 0,
        "consumed": 12,
        "seed": 7,
        "world_size": 2,
        "rank": 1,
        "num_samples": 25,
        "data_len": 50,
        "shuffle": True,
        "drop_last": False,
    }


class Cursor:
    def __init__(self) -> None:
        self.pos = 0
        self.extra: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos, "extra": self.extra}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos = state["pos"]


def test_generic_stateful() -> None:
    c = Cursor()
    c.pos = 11
    snap = copy.deepcopy(cap.capture(c))
    assert snap["kind"] == "state_dict"
    c2 = Cursor()
    cap.restore(c2, snap)
    assert c2.pos == 11
    c.extra = object()
    with pytest.raises(StateError, match="'extra'"):
        cap.capture(c)


def test_no_cursor_raises_with_hint() -> None:
    dist_like = torch.utils.data.RandomSampler(range(10))
    with pytest.raises(StateError, match="no data cursor") as err:
        cap.capture(dist_like)
    assert "ResumableSampler" in (err.value.hint or "")


def test_kind_mismatch() -> None:
    snap = cap.capture(Cursor())
    with pytest.raises(StateError, match="from a Cursor"):
        cap.restore(ResumableSampler(5), snap)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata on torch 2.13
def test_stateful_dataloader_if_installed() -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    loader = sdl.StatefulDataLoader(list(range(20)), batch_size=2, shuffle=True)
    it = iter(loader)
    next(it)
    snap = cap.capture(loader)
    assert snap["kind"] == "stateful_dataloader"
    expected = [b.tolist() for b in it]
    loader2 = sdl.StatefulDataLoader(list(range(20)), batch_size=2, shuffle=True)
    cap.restore(loader2, snap)
    assert [b.tolist() for b in loader2] == expected
