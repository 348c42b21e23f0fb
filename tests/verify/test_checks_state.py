"""Completeness, consistency and compat checks: each code fires on the defect it names.

Every test builds a real checkpoint (a tiny model trained a few steps with AdamW, a
scheduler, a CPU GradScaler and a ResumableSampler), then introduces one defect, either by
building the TrainState wrongly or by editing the manifest (and re-digesting it, so the
integrity family stays quiet).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.commit import save_state
from ckptkit.format import manifest as mf
from ckptkit.verify.findings import Finding, Severity
from ckptkit.verify.runner import verify_one

GBS = 4


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.unused = torch.nn.Linear(2, 2)  # never in forward: no grad, no Adam state
        self.register_buffer("mask", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def build(
    *,
    steps: int = 3,
    step: int | None = None,
    scheduler: bool = True,
    scaler: bool = True,
    sampler: bool = True,
    draw: bool = True,
    sched_extra: int = 0,
    parallel: ParallelConfig | None = None,
    use_unused: bool = False,
    **kw: Any,
) -> ckptkit.TrainState:
    """A consistent training state after ``steps`` steps (unless told otherwise)."""
    torch.manual_seed(0)
    model = Net()
    params = (
        list(model.parameters())
        if use_unused
        else [p for n, p in model.named_parameters() if not n.startswith("unused")]
    )
    if not use_unused:
        model.unused.requires_grad_(False)
    opt = torch.optim.AdamW(params, lr=1e-2)
    sch = torch.optim.lr_scheduler.LinearLR(opt, total_iters=100) if scheduler else None
    sc = torch.amp.GradScaler("cpu") if scaler else None
    samp = ResumableSampler(64, seed=1) if sampler else None
    it = iter(samp) if samp is not None else None
    for _ in range(steps):
        if it is not None and draw:
            _ = [next(it) for _ in range(GBS)]
        loss = model(torch.randn(GBS, 4)).pow(2).mean()
        if sc is not None:
            sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad()
        if sch is not None:
            sch.step()
    for _ in range(sched_extra):
        assert sch is not None
        sch.step()
    return ckptkit.TrainState(
        model=model,
        optimizer=opt,
        scheduler=sch,
        scaler=sc,
        sampler=samp,
        step=steps if step is None else step,
        parallel=parallel or ParallelConfig(global_batch_size=GBS),
        data={"snapshot": "snap-1", "tokenizer": "tok-v2"},
        **kw,
    )


def write(ts: ckptkit.TrainState, path: Path) -> Path:
    """Write a TrainState without the manager's verify-after-save (which refuses errors)."""
    save_state(ts, path, fsync=False)
    return path


def edit(path: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    obj = json.loads((path / "manifest.json").read_text())
    fn(obj)
    obj["manifest_digest"] = mf.content_digest(obj)
    (path / "manifest.json").write_text(json.dumps(obj))


def codes(path: Path, **kw: Any) -> list[str]:
    return [f.code for f in ckptkit.verify(path, **kw).findings]


def only(path: Path, code: str, **opts: Any) -> list[Finding]:
    rep = verify_one(path, families=_FAMILY[code[3]], options=opts, progress=False)
    return [f for f in rep.findings if f.code == code]


_FAMILY = {"C": ("completeness",), "S": ("consistency",), "R": ("compat",)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run")
    with ckptkit.CheckpointManager(root) as mgr:  # close: joins the background read-back verify
        return mgr.save(build())


# --- clean checkpoints -----------------------------------------------------------------------


def test_clean_trainstate_has_no_findings(clean: Path) -> None:
    assert ckptkit.verify(clean).findings == []
    assert ckptkit.verify(clean, against_env=True).findings == []


def test_clean_plain_save_has_no_findings(tmp_path: Path) -> None:
    model = Net()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    d = tmp_path / "plain"
    ckptkit.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": 7,
            "rng": torch.get_rng_state(),
            "misc": {"a": [1, 2.5]},
        },
        d,
    )
    assert ckptkit.verify(d, against_env=True).findings == []
    ckptkit.save({"anything": torch.ones(2), "n": float("inf")}, tmp_path / "odd")
    assert ckptkit.verify(tmp_path / "odd", against_env=True).findings == []


def test_scaler_skipped_steps_are_legit(tmp_path: Path) -> None:
    # Three optimizer steps, but ten loop iterations counted: an fp16 scaler skips steps.
    d = write(build(step=10, sched_extra=7, parallel=ParallelConfig()), tmp_path / "c")
    assert codes(d) == []


# --- completeness ----------------------------------------------------------------------------


def test_c001_required_component_missing(tmp_path: Path) -> None:
    d = write(build(), tmp_path / "c")

    def drop(obj: dict[str, Any]) -> None:
        del obj["tree"]["scaler"]
        obj["components"]["scaler"].update(present=False, where=[])

    edit(d, drop)
    [f] = only(d, "CK-C001")
    assert f.severity is Severity.ERROR and f.component == "scaler"
    assert "an enabled GradScaler was passed" in f.message
    assert codes(d) == ["CK-C001"]


def test_c001_marked_present_but_not_in_tree(tmp_path: Path) -> None:
    d = write(build(), tmp_path / "c")
    edit(d, lambda o: o["tree"].pop("scheduler"))
    assert "CK-C001" in codes(d)


def test_c002_no_sampler_cursor(tmp_path: Path) -> None:
    d = write(build(sampler=False), tmp_path / "c")
    assert codes(d) == ["CK-C002"]
    assert ckptkit.verify(d).ok and not ckptkit.verify(d, strict=True).ok


def test_c003_rng_missing_for_ranks(tmp_path: Path) -> None:
    d = write(build(parallel=ParallelConfig(world_size=4, global_batch_size=GBS)), tmp_path / "c")
    [f] = only(d, "CK-C003")
    assert "3 of 4 rank(s)" in f.message and "1, 2, 3" in f.message


# --- consistency -----------------------------------------------------------------------------


def test_s001_moments_missing(tmp_path: Path) -> None:
    # The optimizer never stepped, but the global step says 500.
    d = write(
        build(
            steps=0, step=500, scheduler=False, scaler=False, draw=False, parallel=ParallelConfig()
        ),
        tmp_path / "c",
    )
    [f] = only(d, "CK-S001")
    assert f.severity is Severity.ERROR and "global step is 500" in f.message
    assert codes(d) == ["CK-S001"]


def test_s001_some_parameters_without_state_is_a_warning(tmp_path: Path) -> None:
    # 'unused' is optimized but never gets a gradient: no state (legit, hence a warning).
    d = write(build(use_unused=True), tmp_path / "c")
    [f] = only(d, "CK-S001")
    assert f.severity is Severity.WARNING and "unused.weight" in f.message


def test_s002_moment_shape_mismatch(tmp_path: Path) -> None:
    d = write(build(), tmp_path / "c")

    def wrong(obj: dict[str, Any]) -> None:
        obj["tree"]["optimizer"]["param_shapes"][0][0] = [8, 5]

    edit(d, wrong)
    [f] = only(d, "CK-S002")
    assert "'exp_avg' of 'fc1.weight' is [8, 4], the parameter [8, 5]" in f.message
    assert "in the model" in f.message


def test_s003_optimizer_vs_global_step(tmp_path: Path) -> None:
    d = write(
        build(step=12000, scheduler=False, scaler=False, draw=False, parallel=ParallelConfig()),
        tmp_path / "c",
    )
    [f] = only(d, "CK-S003")
    assert "optimizer step is 3 but the global step is 12000" in f.message
    assert codes(d) == ["CK-S003"]


def test_s004_scheduler_vs_global_step(tmp_path: Path) -> None:
    d = write(build(sched_extra=20), tmp_path / "c")
    [f] = only(d, "CK-S004")
    assert "last_epoch 23" in f.message and "global step is 3" in f.message
    assert codes(d) == ["CK-S004"]


def test_s005_sampler_vs_global_step(tmp_path: Path) -> None:
    # The sampler cursor never advanced: a resume replays the 12 samples trained on.
    d = write(build(draw=False), tmp_path / "c")
    [f] = only(d, "CK-S005")
    assert "behind step 3 × global batch 4 = 12" in f.message
    assert codes(d) == ["CK-S005"]


def test_s005_progress_consumed_samples(tmp_path: Path) -> None:
    ts = build()
    ts.progress.consumed_samples = 999
    d = write(ts, tmp_path / "c")
    assert [f.component for f in only(d, "CK-S005")] == ["progress"]


def test_s006_duplicated_rng_states(tmp_path: Path) -> None:
    d = write(build(), tmp_path / "c")

    def dup(obj: dict[str, Any]) -> None:
        summ = obj["components"]["rng"]["summary"]
        fp = summ["fingerprints"]["rank00000"]
        summ["fingerprints"]["rank00001"] = fp

    edit(d, dup)
    [f] = only(d, "CK-S006")
    assert "2 ranks hold the same RNG state" in f.message


def test_s007_parallel_degrees(tmp_path: Path) -> None:
    d = write(
        build(parallel=ParallelConfig(world_size=1, dp=2, tp=2, global_batch_size=GBS)),
        tmp_path / "c",
    )
    [f] = only(d, "CK-S007")
    assert "!= world_size 1" in f.message and f.severity is Severity.ERROR


@pytest.mark.parametrize(
    ("scale", "severity"),
    [
        ("nan", Severity.ERROR),
        (0.0, Severity.ERROR),
        ("inf", Severity.ERROR),
        (-1.0, Severity.ERROR),
        (2.0**-20, Severity.WARNING),
    ],
)
def test_s008_loss_scale(tmp_path: Path, scale: float | str, severity: Severity) -> None:
    ts = build()
    if isinstance(scale, float):
        ts.scaler.update(scale)
        d = write(ts, tmp_path / "c")
    else:
        # A non-finite scale cannot be written into the summary's strict JSON: put it in
        # the state tree, where non-finite floats are tagged.
        d = write(ts, tmp_path / "c")

        def poison(obj: dict[str, Any]) -> None:
            obj["tree"]["scaler"]["state_dict"]["scale"] = {"$t": "float", "v": scale}
            obj["components"]["scaler"]["summary"]["scale"] = None

        edit(d, poison)
    [f] = only(d, "CK-S008")
    assert f.severity is severity
    assert codes(d) == ["CK-S008"]


def test_s009_fp8_state(tmp_path: Path) -> None:
    fp8 = {"fc1.scale": torch.tensor([1.0, float("inf")]), "fc1.amax_history": torch.zeros(16, 1)}
    d = write(build(fp8=fp8), tmp_path / "c")
    found = only(d, "CK-S009")
    assert [(f.severity, "non-finite scale" in f.message) for f in found] == [
        (Severity.ERROR, True),
        (Severity.WARNING, False),
    ]
    empty = {"fc1.scale": torch.ones(1), "fc1.amax_history": torch.zeros(0, 1)}
    d2 = write(build(fp8=empty), tmp_path / "c2")
    assert ["amax history is empty" in f.message for f in only(d2, "CK-S009")] == [True]
    good = {"fc1.scale": torch.ones(1), "fc1.amax_history": torch.rand(16, 1) + 0.1}
    assert codes(write(build(fp8=good), tmp_path / "c3")) == []


def test_s010_nan_in_model(tmp_path: Path) -> None:
    ts = build()
    with torch.no_grad():
        ts.model.fc2.weight[0, 0] = float("nan")
        ts.model.fc1.bias[1] = float("inf")
    d = write(ts, tmp_path / "c")
    [f] = only(d, "CK-S010")
    assert f.severity is Severity.ERROR
    assert "'model/fc2.weight' (1 NaN)" in f.message and "'model/fc1.bias' (1 +Inf)" in f.message
    assert codes(d) == ["CK-S010"]


def test_s010_inf_in_buffer_is_info(tmp_path: Path) -> None:
    ts = build()
    ts.model.mask.fill_(float("-inf"))
    d = write(ts, tmp_path / "c")
    [f] = only(d, "CK-S010")
    assert f.severity is Severity.INFO and "model/mask" in f.message
    assert ckptkit.verify(d, strict=True).ok


def test_s010_plain_save(tmp_path: Path) -> None:
    ckptkit.save({"model": {"w": torch.tensor([1.0, float("nan")])}}, tmp_path / "p")
    assert codes(tmp_path / "p") == ["CK-S010"]
    assert only(tmp_path / "p", "CK-S010", scan_values=False) == []


def test_s011_nan_in_optimizer(tmp_path: Path) -> None:
    ts = build()
    st = ts.optimizer.state[ts.model.fc1.weight]
    st["exp_avg_sq"][0, 0] = float("nan")
    d = write(ts, tmp_path / "c")
    [f] = only(d, "CK-S011")
    assert "optimizer/state_dict/state/0/exp_avg_sq" in f.message
    assert codes(d) == ["CK-S011"]


def test_damaged_file_skips_value_scan(tmp_path: Path) -> None:
    ts = build()
    with torch.no_grad():
        ts.model.fc2.weight[0, 0] = float("nan")
    d = write(ts, tmp_path / "c")
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF
    f.write_bytes(bytes(raw))
    # Integrity says it, the component table names the consequence (the model is no longer
    # proven by its bytes), and the NaN scan stays quiet.
    assert codes(d) == ["CK-F003", "CK-C010"]


# --- compat ----------------------------------------------------------------------------------


def test_r001_env_changed(clean: Path) -> None:
    env = dict(manifest_io.read(clean).env)
    env.update(torch="9.9.9", cuda="99.0")
    [f] = only(clean, "CK-R001", current_env=env)
    assert f.severity is Severity.WARNING
    assert "torch changed since the save" in f.message and "bitwise" in f.message
    assert only(clean, "CK-R001") == []  # against this very process: nothing changed


def test_r002_layout_changed(clean: Path) -> None:
    found = only(
        clean, "CK-R002", current_parallel=ParallelConfig(world_size=2, global_batch_size=GBS)
    )
    msgs = " | ".join(f.message for f in found)
    assert "world_size changed since the save: 1 -> 2" in msgs and "RNG streams" in msgs
    assert "dp changed" in msgs


def test_r002_from_environment(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    [f] = only(clean, "CK-R002")
    assert "1 -> 8" in f.message
    assert "CK-R002" in codes(clean, against_env=True)


def test_r003_data_changed(clean: Path) -> None:
    [f] = only(clean, "CK-R003", current_data={"snapshot": "snap-2", "tokenizer": "tok-v2"})
    assert "'snapshot' changed" in f.message and "other samples" in f.message
    [t] = only(clean, "CK-R003", current_data={"tokenizer": "tok-v3"})
    assert "token ids" in t.message


def test_nan_found_in_aligned_and_misaligned_tensors_in_one_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The value scan rides the digest pass; a tensor at an odd offset gets a second look."""
    import ckptkit
    from ckptkit.storage import digest

    calls = []
    real = digest.hash_fd

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(a[0])
        return real(*a, **k)

    bad = torch.ones(4, 4)
    bad[1, 2] = float("nan")
    odd = torch.ones(5)
    odd[0] = float("inf")
    state = {"model": {"a_mask": torch.tensor([True, False, True]), "b": bad, "c": odd}}
    ckptkit.save(state, tmp_path / "c")
    digest.hash_fd = spy
    try:
        res = ckptkit.verify(tmp_path / "c")
    finally:
        digest.hash_fd = real
    msgs = " ".join(f.message for f in res.findings if f.code == "CK-S010")
    assert "model/b" in msgs and "model/c" in msgs
    assert len(calls) == 1  # the file was hashed (and scanned) once
