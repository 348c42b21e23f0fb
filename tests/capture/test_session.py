"""TrainingSession: what watches a run, handed to a TrainState (and built by its keywords)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptkit
from ckptkit.capture.session import TrainingSession


def _probe(model: torch.nn.Module) -> torch.Tensor:
    return model(torch.ones(1, 2)).sum()


def test_the_keywords_build_the_session() -> None:
    rec = ckptkit.Recorder(None)
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), recorder=rec, probe=_probe, guard_k=3)
    assert ts.session == TrainingSession(recorder=rec, probe=_probe, guard_k=3)
    assert (ts.recorder, ts.probe, ts.guard_k, ts.guard) == (rec, _probe, 3, None)
    assert rec.observer is not None  # bound to the state, as before


def test_a_session_is_taken_as_given_and_its_recorder_bound() -> None:
    rec = ckptkit.Recorder(None)
    session = TrainingSession(recorder=rec, guard_k=0)
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), session=session)
    assert ts.session is session and ts.recorder is rec and ts.guard_k == 0
    assert rec.observer is not None


def test_defaults_are_those_of_before() -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    assert (ts.recorder, ts.probe, ts.guard_k, ts.guard) == (None, None, 8, None)
    assert ckptkit.TrainState(model=torch.nn.Linear(2, 2), guard_k="2").guard_k == 2


@pytest.mark.parametrize("given", [{"recorder": ckptkit.Recorder(None)}, {"probe": _probe},
                                   {"guard_k": 8}, {"guard_k": 0, "probe": _probe}])
def test_a_session_and_its_keywords_together_are_refused(given: dict[str, object]) -> None:
    with pytest.raises(TypeError, match=r"takes session= or .*not both") as e:
        ckptkit.TrainState(model=torch.nn.Linear(2, 2), session=TrainingSession(), **given)
    for name in given:
        assert f"{name}=" in str(e.value)


def test_the_attributes_write_through_to_the_session() -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    ts.probe = _probe
    ts.guard_k = 2
    assert ts.session.probe is _probe and ts.session.guard_k == 2


def test_a_restore_keeps_its_guard_on_the_session(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    ts = ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), 0.1),
                            step=4)
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(ts)
        result = mgr.restore(ts)
    assert result is not None and result.guard is not None
    assert ts.guard is result.guard and ts.session.guard is result.guard
    result.guard.close()
