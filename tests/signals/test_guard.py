"""The resume guard: a restored run is compared with the look-ahead its checkpoint recorded."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.format import manifest as mf
from ckptkit.signals import guard


def _setup(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    sampler = ckptkit.ResumableSampler(64, seed=3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                            scaler=scaler)
    return {"model": model, "opt": opt, "sched": sched, "sampler": sampler, "scaler": scaler,
            "ts": ts}


def _train(s: dict[str, Any], steps: int) -> None:
    it = iter(s["sampler"])
    for _ in range(steps):
        [next(it) for _ in range(4)]
        loss = s["model"](torch.randn(4, 4)).pow(2).mean()
        s["scaler"].scale(loss).backward()
        s["scaler"].step(s["opt"])
        s["scaler"].update()
        s["opt"].zero_grad()
        s["sched"].step()
        s["ts"].step += 1


X = torch.linspace(-1, 1, 16).reshape(4, 4)


def probe(model: torch.nn.Module) -> torch.Tensor:
    return model(X).pow(2).mean()


def test_clean_restore_passes_every_check() -> None:
    a = _setup()
    _train(a, 6)
    tree, _ = a["ts"].capture()
    saved = guard.compute(a["ts"], probe=probe)
    b = _setup(seed=9)
    b["ts"].restore_tree(tree)
    g = guard.ResumeGuard(saved, probe=probe)
    assert g.check_restored(b["ts"]) == []
    assert saved["next_step"] == 7 and len(saved["sample_ids"]) == guard.DEFAULT_K


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("no-scheduler", "CK-D003"),
        ("no-sampler", "CK-D002"),
        ("no-moments", "CK-D005"),
        ("no-scaler", "CK-D004"),
        ("step-reset", "CK-D001"),
        ("reseed", "CK-D006"),
        ("weights", "CK-D007"),
    ],
)
def test_each_broken_component_is_named(fault: str, code: str) -> None:
    a = _setup()
    _train(a, 6)
    tree, _ = a["ts"].capture()
    saved = guard.compute(a["ts"], probe=probe)
    b = _setup(seed=9)
    b["ts"].restore_tree(tree, strict=False)
    if fault == "no-scheduler":
        b["sched"].__init__(b["opt"], lambda s: min(1.0, (s + 1) / 5))  # type: ignore[misc]
    elif fault == "no-sampler":
        b["ts"].sampler = ckptkit.ResumableSampler(64, seed=3)  # rebuilt: epoch restarts
    elif fault == "no-moments":
        b["opt"].state.clear()
    elif fault == "no-scaler":
        b["ts"].scaler = torch.amp.GradScaler("cpu")  # a fresh one: scale 65536
    elif fault == "step-reset":
        b["ts"].step = 0
    elif fault == "reseed":
        torch.manual_seed(0)
        random.seed(0)
    elif fault == "weights":
        with torch.no_grad():
            b["model"][0].weight.add_(1e-3)
    got = [f.code for f in guard.ResumeGuard(saved, probe=probe).check_restored(b["ts"])]
    assert code in got, got


def test_first_steps_are_checked_through_the_recorder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    saved = {"k": 4, "next_step": 11, "lr": [0.5], "sample_ids": [5, 6, 7, 8]}
    g = guard.ResumeGuard(saved)
    rec = ckptkit.Recorder(tmp_path / "m.jsonl")
    guard.attach(rec, g)
    rec.log(11, loss=1.0, lr=0.5, sample_ids=[5, 6])
    assert g.findings == []
    rec.log(12, loss=1.0, lr=0.5, sample_ids=[1, 2])  # replay: 7, 8 expected
    assert [f.code for f in g.findings] == ["CK-D002"]
    rec.close()

    g2 = guard.ResumeGuard(saved)
    g2.observe(1, {"lr": 0.25, "sample_ids": [[0, 5, "h"], [0, 6, "h"]]})
    assert [f.code for f in g2.findings] == ["CK-D001", "CK-D003"]


def test_attaching_twice_does_not_stack(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ckptkit.signals.recorder import read_jsonl

    rec = ckptkit.Recorder(tmp_path / "m.jsonl")
    for _ in range(3):
        guard.attach(rec, guard.ResumeGuard({"k": 2, "next_step": 1}))
    rec.log(1, loss=1.0)
    rec.close()
    assert len(read_jsonl(tmp_path / "m.jsonl")) == 1


def test_detaching_the_stability_watch_keeps_the_guard(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 24: the watch and the guard both replaced ``recorder.log``; detaching the watch
    (attached after the restore) put the class method back and silently dropped the
    guard's wrapper, so the guard stopped seeing the resumed steps."""
    from ckptkit.signals.stability import StabilityWatch

    saved = {"k": 4, "next_step": 11, "sample_ids": [5, 6, 7, 8]}
    g = guard.ResumeGuard(saved)
    rec = ckptkit.Recorder(tmp_path / "m.jsonl")
    guard.attach(rec, g)
    w = StabilityWatch().attach(rec)
    rec.log(11, loss=1.0, sample_ids=[5, 6])
    StabilityWatch.detach(rec)
    rec.log(12, loss=1.0, sample_ids=[1, 2])  # replay: 7, 8 expected
    rec.close()
    assert w.updates == 1  # the watch heard only the step before its detach
    # Step 12's replay is a finding: the guard heard the step logged after the detach.
    assert [f.code for f in g.findings] == ["CK-D002"]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11
def test_stateful_loader_sharing_its_sampler_generator_is_named() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler

    data = list(range(8))
    shared = StatefulDataLoader(data, batch_size=2, shuffle=True, generator=torch.Generator())
    apart = StatefulDataLoader(data, batch_size=2, generator=torch.Generator(),
                               sampler=RandomSampler(data, generator=torch.Generator()))
    assert guard.shared_loader_generator(shared)
    assert not guard.shared_loader_generator(apart)
    for loader, want in ((shared, ["CK-D009"]), (apart, [])):
        next(iter(loader))
        ts = ckptkit.TrainState(model=torch.nn.Linear(1, 1), sampler=loader)
        saved = guard.compute(ts)
        got = [f.code for f in guard.ResumeGuard(saved).check_restored(ts)]
        assert got == want


# --- the first resumed step (a Recorder bound to the TrainState) ---------------------------


def _loop_state(tmp_path, *, data: dict[str, str] | None = None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    sampler = ckptkit.ResumableSampler(len(ds), seed=2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=32.0, growth_interval=50)
    rec = ckptkit.Recorder(None)
    ts = ckptkit.TrainState(model=model, optimizer=opt, sampler=sampler, scaler=scaler,
                            recorder=rec, data=data)
    return {"ds": ds, "sampler": sampler, "model": model, "opt": opt, "scaler": scaler,
            "rec": rec, "ts": ts, "mgr": ckptkit.CheckpointManager(tmp_path / "ckpt")}


def _train_loop(s: dict[str, Any], batches: Any, steps: int, *, between: Any = None) -> None:
    it = iter(batches)
    for _ in range(steps):
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(s["model"](x), y)
        s["opt"].zero_grad()
        s["scaler"].scale(loss).backward()
        s["scaler"].step(s["opt"])
        s["scaler"].update()
        s["ts"].step += 1
        s["rec"].log(s["ts"].step, loss=float(loss.detach()))
        if between is not None:
            between()


def _codes(s: dict[str, Any]) -> list[str]:
    return [g["code"] for r in s["rec"].records for g in r.get("guard", [])]


def _saved_at_4(tmp_path, **kw: Any) -> None:  # type: ignore[no-untyped-def]
    a = _loop_state(tmp_path, data=kw.pop("data", None))
    loader = torch.utils.data.DataLoader(a["ds"], batch_size=4, sampler=a["sampler"],
                                         generator=torch.Generator())
    _train_loop(a, loader, 4, **kw)
    a["mgr"].save(a["ts"])
    a["mgr"].close()


def test_an_iterator_created_after_restore_gets_its_base_seed_draw_put_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path)
    b = _loop_state(tmp_path)
    saved = b["mgr"].restore(b["ts"]).guard.saved
    plain = torch.utils.data.DataLoader(b["ds"], batch_size=4, sampler=b["sampler"])
    _train_loop(b, plain, 1)  # iter() without generator= draws the base seed from the global RNG
    assert _codes(b) == []
    assert b["rec"].records[0]["rng"] == saved["rng"]  # the first step starts where the save stood


def test_a_two_word_draw_that_is_not_the_loaders_is_reported_with_the_call(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path)
    b = _loop_state(tmp_path)
    b["mgr"].restore(b["ts"])
    torch.empty((), dtype=torch.int64).random_()  # one 64-bit draw, by the script itself
    loader = torch.utils.data.DataLoader(b["ds"], batch_size=4, sampler=b["sampler"],
                                         generator=torch.Generator())
    _train_loop(b, loader, 1)
    assert _codes(b) == ["CK-D008"]
    msg = b["rec"].records[0]["guard"][0]["message"]
    assert "2 words" in msg and "iter(DataLoader)" in msg


def test_an_exact_resume_gets_no_finding_even_when_the_loop_draws_between_steps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path, between=lambda: torch.rand(3))
    b = _loop_state(tmp_path)
    b["mgr"].restore(b["ts"])
    torch.rand(3)  # the same draw the saved run made after each step
    loader = torch.utils.data.DataLoader(b["ds"], batch_size=4, sampler=b["sampler"],
                                         generator=torch.Generator())
    _train_loop(b, loader, 2)
    assert _codes(b) == []
    b["mgr"].close()  # a writer holds the run lock from open: one at a time
    c = _loop_state(tmp_path)
    c["mgr"].restore(c["ts"])
    torch.rand(5)  # two words more than the saved run
    _train_loop(c, torch.utils.data.DataLoader(c["ds"], batch_size=4, sampler=c["sampler"],
                                          generator=torch.Generator()), 1)
    assert _codes(c) == ["CK-D008"]


def test_a_reseed_after_restore_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path)
    b = _loop_state(tmp_path)
    b["mgr"].restore(b["ts"])
    torch.manual_seed(0)
    _train_loop(b, b["sampler"].batches(torch.utils.data.DataLoader(
        b["ds"], batch_size=4, sampler=b["sampler"])), 1)
    assert _codes(b) == ["CK-D008"]
    assert "torch.manual_seed(0)" in b["rec"].records[0]["guard"][0]["message"]


def test_a_fresh_scaler_whose_scale_has_not_moved_is_caught(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path)  # growth interval 50: the saved scale is still the initial one
    b = _loop_state(tmp_path)
    b["mgr"].restore(b["ts"])
    b["scaler"] = torch.amp.GradScaler("cpu", init_scale=32.0, growth_interval=50)
    _train_loop(b, b["sampler"].batches(torch.utils.data.DataLoader(
        b["ds"], batch_size=4, sampler=b["sampler"])), 1)
    assert _codes(b) == ["CK-D004"]
    assert "growth tracker 0" in b["rec"].records[0]["guard"][0]["message"]


def test_a_fresh_scaler_in_the_state_is_caught_at_restore() -> None:
    a = _setup()
    _train(a, 3)
    saved = guard.compute(a["ts"])
    tree, _ = a["ts"].capture()
    b = _setup(seed=9)
    b["ts"].restore_tree(tree)
    b["ts"].scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)  # same scale, tracker 0
    assert saved["scale_growth"] == 3
    assert [f.code for f in guard.ResumeGuard(saved).check_restored(b["ts"])] == ["CK-D004"]


def test_a_rebuilt_optimizer_is_caught_at_its_first_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path)
    b = _loop_state(tmp_path)
    b["mgr"].restore(b["ts"])
    b["opt"] = torch.optim.AdamW(b["model"].parameters(), lr=1e-2)
    _train_loop(b, b["sampler"].batches(torch.utils.data.DataLoader(
        b["ds"], batch_size=4, sampler=b["sampler"])), 1)
    assert "CK-D005" in _codes(b)


def test_changed_data_identity_is_reported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _saved_at_4(tmp_path, data={"snapshot": "v1"})
    b = _loop_state(tmp_path, data={"snapshot": "v2"})
    result = b["mgr"].restore(b["ts"])
    assert "CK-R003" in [f.code for f in result.guard.findings]


# --- issue 23 repro 8: a hostile value never raises out of restore() ---------------------


def _hostile_run(tmp_path: Path) -> tuple[Path, dict[int, torch.Tensor]]:
    """A run with steps 1 and 2 (a StepLR at last_epoch 1 and 2); the weights of each."""
    s = _setup()
    weights = {}
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        for step in (1, 2):
            _train(s, 1)
            weights[step] = s["model"][0].weight.detach().clone()
            mgr.save(s["ts"])
    return tmp_path, weights


def _rewrite(d: Path, where: str, value: Any) -> None:
    """Put ``value`` at the ``/``-separated path of the manifest; recompute its digest."""
    obj = json.loads((d / "manifest.json").read_text())
    *parents, last = where.split("/")
    node = obj
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))


HOSTILE = [
    ("tree/scheduler/state_dict/last_epoch", "three"),
    ("tree/optimizer/state_dict/param_groups/0/lr", "fast"),
    ("lookahead/guard/k", "three"),
    ("lookahead/guard/k", 10**12),
    ("lookahead/guard/lr", ["x"]),
    ("lookahead/guard/probe_loss", [1]),
    ("lookahead/guard/sample_ids", 5),
    ("lookahead/guard/opt_step", "many"),
    ("lookahead/guard", [1, 2]),
]


@pytest.mark.parametrize(("where", "value"), HOSTILE, ids=[f"{w}={v!r}"[:60] for w, v in HOSTILE])
def test_a_malformed_value_the_guard_reads_is_a_finding_and_restore_falls_back(
    tmp_path: Path, where: str, value: Any
) -> None:
    run, weights = _hostile_run(tmp_path)
    newest = run / "step-00000002"
    _rewrite(newest, where, value)
    rep = ckptkit.verify(newest)
    assert not rep.ok and "CK-S012" in [f.code for f in rep.findings], rep.findings
    s = _setup(seed=1)
    s["ts"].probe = probe  # the probe's recorded loss is read too
    res = ckptkit.CheckpointManager(run).restore(s["ts"])
    assert res is not None and res.step == 1
    assert any("step-00000002" in n and "CK-S012" in n for n in res.notes), res.notes
    assert torch.equal(s["model"][0].weight, weights[1])
    assert s["sched"].last_epoch == 1


def test_a_malformed_value_with_nothing_to_fall_back_to_leaves_the_live_state_alone(
    tmp_path: Path,
) -> None:
    run, _ = _hostile_run(tmp_path)
    shutil.rmtree(run / "step-00000001")
    _rewrite(run / "step-00000002", "tree/scheduler/state_dict/last_epoch", "three")
    s = _setup(seed=1)
    before = s["model"][0].weight.detach().clone()
    with pytest.raises(ckptkit.CkptkitError) as ei:
        ckptkit.CheckpointManager(run).restore(s["ts"])
    assert "CK-S012" in str(ei.value)
    # Refused before anything was restored: the live objects are as they were.
    assert torch.equal(s["model"][0].weight, before)
    assert s["sched"].last_epoch == 0


def test_verify_cli_reports_the_malformed_value_without_a_traceback(tmp_path: Path) -> None:
    run, _ = _hostile_run(tmp_path)
    _rewrite(run / "step-00000002", "lookahead/guard/lr", ["x"])
    out = subprocess.run(
        [sys.executable, "-m", "ckptkit", "verify", str(run / "step-00000002")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert "CK-S012" in out.stdout and "Traceback" not in out.stderr


def test_a_restored_object_the_guard_cannot_read_makes_restore_fall_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The net behind CK-S012: whatever the guard fails to read after a restore skips that
    checkpoint (the older one is restored over it), never raises out of restore()."""
    run, weights = _hostile_run(tmp_path)
    real = guard.ResumeGuard.check_restored
    calls: list[int] = []

    def unreadable_once(self: guard.ResumeGuard, ts: ckptkit.TrainState) -> Any:
        calls.append(ts.step)
        if len(calls) == 1:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")
        return real(self, ts)

    monkeypatch.setattr(guard.ResumeGuard, "check_restored", unreadable_once)
    s = _setup(seed=1)
    res = ckptkit.CheckpointManager(run).restore(s["ts"])
    assert res is not None and res.step == 1 and calls == [2, 1]
    assert any("CK-S012" in n and "cannot read the restored state" in n for n in res.notes)
    assert torch.equal(s["model"][0].weight, weights[1])


def test_problems_accepts_what_compute_writes() -> None:
    s = _setup()
    _train(s, 2)
    saved = guard.compute(s["ts"], probe=probe)
    assert guard.problems(saved, {"scheduler": {"state_dict": s["sched"].state_dict()}}) == []


class _Peek:
    """A sampler that names these next ids (and nothing else of a sampler)."""

    epoch = 0

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def next_indices(self, k: int) -> list[int]:
        return self.ids[:k]


@pytest.mark.parametrize(
    ("saved_ids", "now_ids", "codes", "unknown"),
    [
        ([15, 11, 17, 2], [15, 11, 17, 2], [], False),
        # The restored sampler names none (a look-ahead that cannot see): unknown, the first
        # step records decide. Before, "next sample ids []… differ from [15, 11, 17, 2]".
        ([15, 11, 17, 2], [], [], True),
        ([15, 11, 17, 2], [15, 11], [], True),
        ([], [15, 11, 17, 2], [], True),  # a checkpoint that recorded none
        ([15, 11, 17, 2], [0, 1, 2, 3], ["CK-D002"], False),  # replayed: still reported
        ([15, 11, 17, 2], [15, 3], ["CK-D002"], False),
    ],
)
def test_next_ids_the_guard_cannot_see_are_unknown_not_a_mismatch(
    saved_ids: list[int], now_ids: list[int], codes: list[str], unknown: bool
) -> None:
    a = _setup()
    saved = {**guard.compute(a["ts"]), "sample_ids": saved_ids}
    a["ts"].sampler = _Peek(now_ids)
    g = guard.ResumeGuard(saved)
    assert [f.code for f in g.check_restored(a["ts"])] == codes
    assert bool(g.unknown) is unknown, g.unknown


def test_unknown_next_ids_at_restore_are_checked_against_the_first_records() -> None:
    a = _setup()
    saved = {**guard.compute(a["ts"]), "sample_ids": [15, 11, 17, 2]}
    a["ts"].sampler = _Peek([])
    g = guard.ResumeGuard(saved)
    assert g.check_restored(a["ts"]) == []
    g.observe(saved["next_step"], {"sample_ids": [0, 1]})  # the steps got others: replay
    assert [f.code for f in g.findings] == ["CK-D002"]


def test_another_models_training_after_a_restore_is_not_taken_for_a_rebuilt_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Restore to inspect, then train something else in the same process (a notebook's next
    # experiment): no finding, and the first-step watch lets go after FOREIGN_STEPS steps.
    _saved_at_4(tmp_path)
    b = _loop_state(tmp_path)
    g = b["mgr"].restore(b["ts"]).guard
    other = torch.nn.Linear(3, 5)
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    for _ in range(guard.FOREIGN_STEPS):
        other(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert g.findings == [] and not g.armed
    assert "did not step" in g.unknown[-1]


def _first_resumed_step(tmp_path: Path, after_restore: Any = None) -> dict[str, Any]:
    _saved_at_4(tmp_path)
    b = _loop_state(tmp_path)
    b["mgr"].restore(b["ts"])
    if after_restore is not None:
        after_restore(b["model"])
    _train_loop(b, b["sampler"].batches(torch.utils.data.DataLoader(
        b["ds"], batch_size=4, sampler=b["sampler"])), 1)
    return b


def test_weights_loaded_after_the_restore_are_named_at_the_first_step(tmp_path: Path) -> None:
    """The fine-tuning habit: pretrained weights loaded over the resumed ones. The guard
    compares each parameter with the digest it took at the restore (CK-D092)."""
    pretrained = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                     torch.nn.Linear(8, 1))
    b = _first_resumed_step(
        tmp_path, lambda m: m[0].load_state_dict(pretrained[0].state_dict()))
    found = [g for r in b["rec"].records for g in r.get("guard", [])]
    assert [g["code"] for g in found] == ["CK-D092"]
    assert "2 of 4 model parameters" in found[0]["message"]
    assert "(0.weight, 0.bias)" in found[0]["message"]


def test_a_cast_after_the_restore_is_named_and_an_exact_resume_is_not(tmp_path: Path) -> None:
    def through_bf16(m: torch.nn.Module) -> None:
        with torch.no_grad():
            m[2].weight.copy_(m[2].weight.to(torch.bfloat16).float())

    cast = _first_resumed_step(tmp_path / "cast", through_bf16)
    assert _codes(cast) == ["CK-D092"]
    exact = _first_resumed_step(tmp_path / "exact")
    assert _codes(exact) == []


def test_a_forward_and_backward_before_the_first_step_change_no_weight(tmp_path: Path) -> None:
    """Gradient accumulation: several forwards and backwards before the first optimizer
    step; a BatchNorm's running statistics (buffers) move, the parameters do not."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ts = ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    g = guard.ResumeGuard(guard.compute(ts))
    g.check_restored(ts)
    g.watch(ts)
    restored = guard.weights_fingerprint(model)
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
    ts.optimizer.step()
    g.close()
    assert [f.code for f in g.findings] == []
    assert guard.weights_fingerprint(model) != restored  # the step itself moved them
