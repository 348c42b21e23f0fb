"""GradScaler capture."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from ckptkit.capture import scaler as cap
from ckptkit.errors import StateError


def test_round_trip_restores_scale_and_tracker() -> None:
    s = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(4):  # grows the scale once, leaves the tracker at 1
        opt.zero_grad()
        s.scale(p.sum()).backward()
        s.step(opt)
        s.update()
    snap = copy.deepcopy(cap.capture(s))
    fresh = torch.amp.GradScaler("cpu", growth_interval=3)
    cap.restore(fresh, snap)
    assert fresh.get_scale() == s.get_scale() == 2.0**11
    assert fresh.state_dict() == s.state_dict()
    summ = cap.summary(snap)
    json.dumps(summ)
    assert summ == {
        "enabled": True,
        "scale": 2048.0,
        "growth_tracker": 1,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
    }


def test_disabled_scaler_records_enabled_false() -> None:
    snap = cap.capture(torch.amp.GradScaler("cpu", enabled=False))
    assert snap == {"enabled": False, "state_dict": {}}
    assert cap.summary(snap)["enabled"] is False
    cap.restore(torch.amp.GradScaler("cpu", enabled=False), snap)


def test_enabled_mismatch_raises() -> None:
    on = cap.capture(torch.amp.GradScaler("cpu"))
    with pytest.raises(StateError, match="enabled in the saved run") as err:
        cap.restore(torch.amp.GradScaler("cpu", enabled=False), on)
    assert err.value.hint
    off = cap.capture(torch.amp.GradScaler("cpu", enabled=False))
    with pytest.raises(StateError, match="disabled in the saved run"):
        cap.restore(torch.amp.GradScaler("cpu"), off)
