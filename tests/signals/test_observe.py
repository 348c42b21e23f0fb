"""Step records that fill themselves: what a Recorder bound to a TrainState writes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.signals import observe


def _setup(*, scaler_in_state: bool = True, sampler: Any = None) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=2)
    rec = ckptkit.Recorder(None)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, recorder=rec,
                            scaler=scaler if scaler_in_state else None, sampler=sampler)
    return {"model": model, "opt": opt, "sched": sched, "scaler": scaler, "rec": rec, "ts": ts}


def _step(s: dict[str, Any], x: torch.Tensor, **log: Any) -> dict[str, Any]:
    loss = s["model"](x).pow(2).mean()
    s["opt"].zero_grad()
    s["scaler"].scale(loss).backward()
    s["scaler"].step(s["opt"])
    s["scaler"].update()
    s["sched"].step()
    s["ts"].step += 1
    s["rec"].log(s["ts"].step, loss=float(loss.detach()), **log)
    return dict(s["rec"].records[-1])


def test_a_loss_only_record_gets_every_observable_field() -> None:
    sampler = ckptkit.ResumableSampler(32, seed=1)
    s = _setup(sampler=sampler)
    it = iter(sampler)
    ids = [next(it) for _ in range(4)]
    rec = _step(s, torch.randn(4, 4))
    assert {"rng", "rng_at", "lr", "opt_step", "loss_scale", "scale_growth", "batch_hash",
            "sample_ids", "cursor"} <= rec.keys()
    assert rec["rng_at"] == "data" and rec["sample_ids"] == [[0, i] for i in ids]
    assert rec["lr"] == 1e-2 and rec["opt_step"] == 1  # the LR used, the count after
    assert (rec["loss_scale"], rec["scale_growth"]) == (64.0, 1)
    rec2 = _step(s, torch.randn(4, 4))  # no data event: the forward starts the step
    assert rec2["rng_at"] == "forward" and rec2["lr"] == 5e-3 and "sample_ids" not in rec2
    assert rec2["scale_growth"] == 0 and rec2["loss_scale"] == 128.0  # grew at interval 2


def test_what_the_loop_logs_wins_and_auto_false_turns_it_off() -> None:
    s = _setup()
    rec = _step(s, torch.randn(2, 4), lr=0.5, rng="mine")
    assert rec["lr"] == 0.5 and rec["rng"] == "mine" and "rng_at" not in rec
    off = ckptkit.Recorder(None, auto=False)
    ckptkit.TrainState(model=torch.nn.Linear(1, 1), recorder=off)
    assert off.observer is None


def test_the_batch_hash_covers_training_forwards_only() -> None:
    s = _setup()
    x = torch.randn(2, 4)
    a = _step(s, x)["batch_hash"]
    s["model"].eval()
    with torch.no_grad():
        s["model"](torch.randn(3, 4))  # evaluation between steps
    s["model"].train()
    b = _step(s, x)["batch_hash"]
    assert a == b
    assert _step(s, torch.randn(2, 4))["batch_hash"] != a


def test_sample_ids_carry_the_datasets_content_hash() -> None:
    class DS(torch.utils.data.Dataset[int]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> int:
            return i

        def sample_hash(self, i: int) -> str:
            return f"h{i}"

    sampler = ckptkit.ResumableSampler(DS(), shuffle=False)
    s = _setup(sampler=sampler)
    loader = torch.utils.data.DataLoader(DS(), batch_size=2, sampler=sampler)
    for _ in sampler.batches(loader):
        rec = _step(s, torch.randn(2, 4))
        assert rec["sample_ids"] == [[0, i, f"h{i}"] for i in (0, 1)]
        break


def test_a_scaler_outside_the_trainstate_is_found_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = _setup(scaler_in_state=False)
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        rec = _step(s, torch.randn(2, 4))
    assert rec["loss_scale"] == 64.0 and rec["scale_growth"] == 1
    assert "not in the TrainState" in caplog.text
    assert s["rec"].observer.scaler is s["scaler"]


def test_a_disabled_scaler_is_not_reported() -> None:
    s = _setup(scaler_in_state=False)
    s["scaler"] = torch.amp.GradScaler("cpu", enabled=False)
    rec = _step(s, torch.randn(2, 4))
    assert "loss_scale" not in rec and s["rec"].observer.scaler is None


def test_an_optimizer_rebuilt_over_the_model_is_the_one_recorded() -> None:
    s = _setup()
    _step(s, torch.randn(2, 4))
    s["opt"] = torch.optim.AdamW(s["model"].parameters(), lr=3e-2)  # rebuilt, not in the state
    other = torch.nn.Linear(2, 2)
    foreign = torch.optim.SGD(other.parameters(), lr=9.0)  # another model's optimizer
    other(torch.ones(1, 2)).sum().backward()
    foreign.step()
    rec = _step(s, torch.randn(2, 4))
    assert rec["lr"] == 3e-2 and rec["opt_step"] == 1


def test_gap_patterns_record_draws_between_steps() -> None:
    s = _setup()
    for _ in range(3):
        _step(s, torch.randn(2, 4))  # randn between the record and the next forward
    obs = s["rec"].observer
    (pattern,) = obs.gap_patterns()  # the same draws every step
    assert set(pattern) == {"torch"} and pattern["torch"] >= 8
    obs.close()
    assert observe.scaler_state(None) is None


def test_with_batches_the_rng_is_fingerprinted_before_the_augmentation() -> None:
    from ckptkit.signals import rngtrace

    class Noisy(torch.utils.data.Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.rand(4)  # augmentation on the global torch RNG

    sampler = ckptkit.ResumableSampler(Noisy(), seed=0)
    s = _setup(sampler=sampler)
    loader = torch.utils.data.DataLoader(Noisy(), batch_size=2, sampler=sampler)
    before = rngtrace.fingerprint()
    for x in sampler.batches(loader):
        rec = _step(s, x)
        assert rec["rng_at"] == "data" and rec["rng"] == before
        break


def test_a_copy_of_an_observed_model_carries_no_observer(tmp_path: Path) -> None:
    """Issue 24: ``copy.deepcopy(model)`` (every EMA helper) raised ``TypeError: cannot
    pickle '_io.TextIOWrapper'`` once a file-backed Recorder was bound through TrainState;
    the copy now gets an inert hook, and the original is still observed."""
    import copy
    import pickle

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptkit.Recorder(tmp_path / "metrics.jsonl") as rec:
        ckptkit.TrainState(model=model, optimizer=opt, recorder=rec)
        ema = copy.deepcopy(model)
        pickle.loads(pickle.dumps(model))
        # the copy's forwards are not the training step: its hook is inert
        assert list(ema._forward_pre_hooks.values()) == [observe._no_hook]
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        rec.log(1, loss=0.5)
    assert "batch_hash" in rec.records[-1] and "opt_step" in rec.records[-1]


def test_ema_helpers_copy_the_model_and_optimizer_with_a_recorder_bound(tmp_path: Path) -> None:
    """Issue 24: every object ckptkit hangs state on (model hook, optimizer step hook,
    sampler observer, recorder subscriptions of the watch and the resume guard) copies with
    ``copy.deepcopy`` and pickles while a file-backed Recorder is bound, after a real
    restore; the copies carry no observer, and the original is still observed."""
    import copy
    import pickle

    from torch.optim.swa_utils import AveragedModel

    from ckptkit.signals.stability import StabilityWatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    sampler = ckptkit.ResumableSampler(16, seed=1)
    rec = ckptkit.Recorder(tmp_path / "metrics.jsonl")
    watch = StabilityWatch().attach(rec)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                            sampler=sampler, recorder=rec)
    x = torch.ones(2, 4)

    def step() -> None:
        next(iter(sampler))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        ts.step += 1
        rec.log(ts.step, loss=float(loss.detach()))

    with ckptkit.CheckpointManager(tmp_path / "ckpt", watch=watch) as mgr:
        step()
        mgr.save(ts)
        mgr.restore(ts)  # subscribes the resume guard and makes it an observer listener

    ema = AveragedModel(model)  # deepcopy(model) inside
    opt_copy = copy.deepcopy(opt)
    for obj in (model, opt, sched, scaler, sampler):
        copy.deepcopy(obj)
        pickle.loads(pickle.dumps(obj))
    # The copies run without reporting to the original's records.
    ema.update_parameters(model)
    ema(x)
    opt_copy.step()
    step()
    rec.close()
    last = rec.records[-1]
    assert last["opt_step"] == 2 and "batch_hash" in last and "sample_ids" in last
    assert watch.updates == 2


# --- rows: a hash per batch row -----------------------------------------------------------


def test_a_sample_has_the_same_row_in_any_batch_whatever_its_padding() -> None:
    a = [5, 3, 8]
    wide = torch.tensor([[*a, 0, 0, 0], [7, 1, 2, 9, 4, 6], [4, 0, 0, 0, 0, 0]])
    narrow = torch.tensor([[1, 1, 1, 1], [*a, 0]])  # a batch of two, one row padded
    labels = torch.tensor([[8, -100, -100], [2, 9, 4]])  # labels padded with the ignore index
    alone = torch.tensor([a])
    assert observe.row_hashes(wide)[0] == observe.row_hashes(narrow)[1] == observe.row_hashes(alone)[0]
    assert len(set(observe.row_hashes(wide))) == 3
    # Every tensor with the batch dim counts; one without it (shared positions) does not.
    both = observe.row_hashes({"input_ids": wide[:2, :3], "labels": labels[:, :3],
                       "positions": torch.arange(3)[None]})
    assert both != observe.row_hashes({"input_ids": wide[:2, :3]})
    assert len(both) == 2 and len(both[0]) == 8


def test_rows_are_capped_and_odd_inputs_give_none() -> None:
    assert len(observe.row_hashes(torch.zeros(observe.ROWS_LIMIT + 5, 2))) == observe.ROWS_LIMIT
    assert observe.row_hashes(torch.tensor(1.0)) == [] and observe.row_hashes("text") == []
    assert len(observe.row_hashes(torch.randn(3, 2, dtype=torch.bfloat16))) == 3


def test_the_observer_records_rows_of_every_forward_of_a_step_and_the_loader_workers() -> None:
    import ckptkit
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    data = torch.randn(8, 2)
    sampler = ckptkit.ResumableSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
    rec = ckptkit.Recorder(None)
    ckptkit.TrainState(model=m, optimizer=opt, sampler=sampler, recorder=rec)
    batches = sampler.batches(loader)
    for _ in range(2):  # two micro-batches, one optimizer step
        m(next(batches)).sum().backward()
    opt.step()
    rec.log(1, loss=0.0)
    r = rec.records[-1]
    assert r["rows"] == observe.row_hashes(data[:2]) + observe.row_hashes(data[2:4])
    assert r["num_workers"] == 0
