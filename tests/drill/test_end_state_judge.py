"""The drill's end-state check on real files: what it may call equal, and how sure the
diagnosis may be when part of the final state could not be compared.

Checkpoints are ``torch.save`` files and Trainer-shaped folders in tmp_path, compared by
:func:`ckptkit.drill.endstate.end_state` itself (no drill run: the integration tests drill
whole scripts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ckptkit.drill.diagnose import _from_end_state
from ckptkit.drill.endstate import end_state


class Blob:
    """State a weights-only load refuses (it needs this class): never read, never equal."""


def pt(path: Path, obj: Any) -> Path:
    torch.save(obj, path)
    return path


def trainer_folder(path: Path, bias: float) -> Path:
    """A Trainer-shaped ``checkpoint-N`` folder whose optimizer file needs code to load,
    as does its ``training_args.bin`` (which no resume loads)."""
    path.mkdir()
    (path / "trainer_state.json").write_text('{"global_step": 8}')
    save_file({"w": torch.ones(3), "b": torch.full((2,), bias)}, str(path / "model.safetensors"))
    torch.save({"state": Blob()}, path / "optimizer.pt")
    torch.save(Blob(), path / "training_args.bin")
    return path


def test_reference_runs_that_differ_only_in_signed_zeros_leave_no_tolerance(tmp_path: Path) -> None:
    # The reference runs' copies of w differ in the sign bit of a zero only: no numeric
    # difference, so the resumed run may differ by nothing more (not by anything at all).
    ref0 = pt(tmp_path / "r0.pt", {"model": {"w": torch.tensor([0.0, 1.0])}})
    ref1 = pt(tmp_path / "r1.pt", {"model": {"w": torch.tensor([-0.0, 1.0])}})
    moved = pt(tmp_path / "moved.pt", {"model": {"w": torch.tensor([0.0, 1.5])}})
    es = end_state([ref0, ref1], moved)
    assert not es.ok and list(es.detail["different"]) == ["model"], es.detail
    assert es.detail["noise"]["tensors"] == 1 and es.detail["noise"]["unbounded"] == []
    # a resumed copy differing from reference 0 in the same bits only is within the noise
    same_bits = pt(tmp_path / "same.pt", {"model": {"w": torch.tensor([-0.0, 1.0])}})
    assert end_state([ref0, ref1], same_bits).ok


def test_nothing_of_the_state_compared_is_skipped_never_passed(tmp_path: Path) -> None:
    ref = pt(tmp_path / "ref.pt", {"model": Blob()})
    res = pt(tmp_path / "res.pt", {"model": Blob()})
    es = end_state([ref], res)
    assert es.skipped and es.informational and es.statistic is None
    assert es.detail["compared"] == [] and "no component" in es.detail["reason"]
    assert "CK-F103" in es.detail["reason"]


def test_an_uncompared_optimizer_is_said_and_keeps_the_diagnosis_below_high(tmp_path: Path) -> None:
    ref = trainer_folder(tmp_path / "ref", 0.5)
    same = trainer_folder(tmp_path / "same", 0.5)
    es = end_state([ref], same)
    assert es.ok and not es.skipped and "model" in es.detail["compared"]
    assert {"optimizer", "training_args"} <= set(es.detail["not_compared"])
    # the Trainer never loads training_args.bin on resume: it cannot be the resume's fault
    assert es.detail["not_compared_state"] == ["optimizer"]
    assert "optimizer not compared" in es.detail["summary"]
    moved = trainer_folder(tmp_path / "moved", 0.75)
    es = end_state([ref], moved)
    assert not es.ok and list(es.detail["different"]) == ["model"]
    assert "optimizer not compared" in es.detail["summary"]
    d = _from_end_state(es)
    # The model differs, but the optimizer was not ruled out (it was never read).
    assert (d.component, d.confidence, d.candidates) == ("model", "medium", ["model", "optimizer"])


def test_lightning_loop_event_counters_are_not_state_but_completed_counters_are() -> None:
    """A Lightning resume from an end-of-epoch checkpoint leaves ``epoch_progress``'s
    ready/started one behind the uninterrupted run's (fresh-clone CI: a clean drill failed)."""
    from ckptkit.drill.endstate import EVENT_COUNTERS

    assert EVENT_COUNTERS.match("loops/fit_loop/epoch_progress/total/ready")
    assert EVENT_COUNTERS.match("loops/fit_loop/epoch_loop.batch_progress/current/started")
    assert not EVENT_COUNTERS.match("loops/fit_loop/epoch_progress/total/completed")
    assert not EVENT_COUNTERS.match("model/loops/x_progress/total/ready")
