"""Exact resume in a fresh process, and one test per dropped component proving it matters.

The training script is the bundled tiny LM (``python -m ckptkit.examples.tiny_lm``): dropout,
AdamW, warmup + cosine LambdaLR, shuffled variable-length data, gradient clipping. The
reference trains W steps, saves at W and continues to W+N in one process; a resumed run
restores the step-W checkpoint in a new process and trains to W+N. On CPU with one thread the
two are bitwise equal, record by record. Each fault (``--fault``) is the classic bug of
leaving one component out; its test names the signal that exposes it.

Every run is a fresh process; all but one are forks of two warmed zygotes (tests/zygote.py: a
new interpreter costs ~4 s of imports per run), started together the first time the module's
fixture is used, and each test waits for its own.
"""

from __future__ import annotations

import json
import os
import queue
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from zygote import Zygote

from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.examples.tiny_lm import FAULTS as ALL_FAULTS

pytestmark = pytest.mark.integration

W, N = 15, 15
"""Save after step W, compare steps W+1..W+N."""

ARGS = (
    f"--steps {W + N} --warmup 5 --batch-size 8 --num-seqs 100 --dim 32 --max-len 32 "
    "--threads 1 --save-every 0"
).split()
# fp16: a short growth interval makes the scale grow and back off within W steps, so a
# fresh GradScaler (scale 2**16, tracker 0) differs from the saved one.
FP16 = ["--amp", "fp16", "--growth-interval", "4"]

FAULTS = tuple(f for f in ALL_FAULTS if f != "none")
"""Every fault of ``tiny_lm --fault`` but ``none``."""

ENV_KEYS = (
    "CKPTKIT_DRILL_SAVE_AT",
    "CKPTKIT_DRILL_STOP_AT",
    "CKPTKIT_DRILL_RESUME_FROM",
    "CKPTKIT_METRICS",
)


@dataclass
class Run:
    """One finished tiny_lm run: its step records and final summary."""

    records: list[dict[str, Any]]
    summary: dict[str, Any]
    ckpt_dir: Path

    def first_diff(self, other: Run, key: str) -> int | None:
        """The first step label (of ``self``, 1-based within the compared window) where
        ``key`` differs between the two runs' aligned records, or None."""
        for i, (a, b) in enumerate(zip(self.records, other.records, strict=False)):
            if _bits(a.get(key)) != _bits(b.get(key)):
                return i + 1
        return None


def _bits(v: Any) -> Any:
    """Floats as their IEEE bytes, so equality is bitwise (and -0.0 != 0.0)."""
    if isinstance(v, float):
        return struct.pack("<d", v)
    if isinstance(v, list):
        return [_bits(x) for x in v]
    return v


def tiny_lm(
    args: list[str], *, ckpt_dir: Path, metrics: Path, zygote: Any = None, **env: str
) -> Run:
    """Run the tiny LM in a fresh process with the drill env vars given: a fork of a warmed
    ``zygote`` (tests/zygote.py) when one is given, else a new interpreter."""
    argv = [*ARGS, *args, "--ckpt-dir", str(ckpt_dir), "--metrics", str(metrics)]
    full_env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    full_env.update(env)
    if zygote is not None:
        unset: dict[str, str | None] = {k: None for k in ENV_KEYS if k not in env}
        res = zygote.run_module("ckptkit.examples.tiny_lm", *argv, env={**unset, **env})
        rc, out, err = res.returncode, res.stdout, res.stderr
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "ckptkit.examples.tiny_lm", *argv],
            env=full_env, capture_output=True, text=True, timeout=300, check=False,
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    assert rc == 0, f"tiny_lm {args} failed:\n{err[-4000:]}"
    summary = json.loads(out.strip().splitlines()[-1])
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return Run(records=records, summary=summary, ckpt_dir=ckpt_dir)


class Runs:
    """Futures of every run this module needs, started together on two warmed zygotes.

    Every run is a fresh process: a fork of a zygote that has torch and ckptkit imported
    (tests/zygote.py), except the plain fresh-process resume, which starts a new interpreter
    so that one resume in this module is proved without any warm start at all.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.zygotes: queue.Queue[Zygote] = queue.Queue()
        for i in range(2):
            self.zygotes.put(Zygote(root / f"zygote-{i}"))
        self.pool = ThreadPoolExecutor(max_workers=3)
        self.futures: dict[str, Future[Run]] = {}
        self.reference("fp32", [])
        self.reference("fp16", FP16)
        self._submit("restart", self._restart)
        self.resume("none", spawn=True)
        self.resume("none", amp=True)
        self.resume("no-scaler", amp=True)
        for fault in FAULTS:
            self.resume(fault)

    def _submit(self, key: str, fn: Callable[[], Run]) -> Future[Run]:
        if key not in self.futures:
            self.futures[key] = self.pool.submit(fn)
        return self.futures[key]

    def _run(self, args: list[str], *, spawn: bool = False, **kw: Any) -> Run:
        if spawn:
            return tiny_lm(args, **kw)
        z = self.zygotes.get()
        try:
            return tiny_lm(args, zygote=z, **kw)
        finally:
            self.zygotes.put(z)

    def get(self, key: str) -> Run:
        return self.futures[key].result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        while not self.zygotes.empty():
            self.zygotes.get().close()

    def reference(self, name: str, extra: list[str]) -> Future[Run]:
        def go() -> Run:
            d = self.root / f"ref-{name}"
            return self._run(
                extra,
                ckpt_dir=d / "ckpt",
                metrics=d / "metrics.jsonl",
                CKPTKIT_DRILL_SAVE_AT=str(W),
                CKPTKIT_DRILL_STOP_AT=str(W + N),
            )

        return self._submit(f"ref-{name}", go)

    def resume(self, fault: str, *, amp: bool = False, spawn: bool = False) -> Future[Run]:
        name = "fp16" if amp else "fp32"

        def go() -> Run:
            ref = self.futures[f"ref-{name}"].result()
            d = self.root / f"resume-{name}-{fault}"
            return self._run(
                [*(FP16 if amp else []), "--fault", fault],
                spawn=spawn,
                ckpt_dir=d / "ckpt",
                metrics=d / "metrics.jsonl",
                CKPTKIT_DRILL_RESUME_FROM=str(ref.ckpt_dir / step_dir_name(W)),
                CKPTKIT_DRILL_STOP_AT=str(W + N),
            )

        return self._submit(f"resume-{name}-{fault}", go)

    def _restart(self) -> Run:
        """The everyday path: stop after W, run the same command again (newest checkpoint)."""
        d = self.root / "restart"
        self._run(
            [],
            ckpt_dir=d / "ckpt",
            metrics=d / "first.jsonl",
            CKPTKIT_DRILL_SAVE_AT=str(W),
            CKPTKIT_DRILL_STOP_AT=str(W),
        )
        return self._run([], ckpt_dir=d / "ckpt", metrics=d / "second.jsonl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    r = Runs(tmp_path_factory.mktemp("tiny_lm"))
    yield r
    r.close()


def after_save(run: Run) -> list[dict[str, Any]]:
    """The reference's records for steps W+1..W+N."""
    return [r for r in run.records if r["step"] > W]


def assert_twins(ref: Run, resumed: Run) -> None:
    want = after_save(ref)
    assert [r["step"] for r in resumed.records] == list(range(W + 1, W + N + 1))
    for a, b in zip(want, resumed.records, strict=True):
        for key in a.keys() - {"time"}:
            assert _bits(a[key]) == _bits(b.get(key)), f"step {a['step']}: {key} differs"
        assert b.keys() == a.keys()
    assert resumed.summary["final_step"] == ref.summary["final_step"] == W + N
    assert _bits(resumed.summary["final_loss"]) == _bits(ref.summary["final_loss"])
    assert resumed.summary["param_hash"] == ref.summary["param_hash"]


def test_fresh_process_resume_is_bitwise_exact(runs: Runs) -> None:
    ref = runs.get("ref-fp32")
    resumed = runs.get("resume-fp32-none")
    assert resumed.summary["resumed_from"] == W
    losses = [r["loss"] for r in ref.records]
    assert losses[-1] < losses[0] - 0.2, "the tiny LM should be learning"
    assert len({r["epoch"] for r in ref.records}) > 1, "the window should cross an epoch"
    assert_twins(ref, resumed)


def test_restart_from_newest_checkpoint_is_bitwise_exact(runs: Runs) -> None:
    """Stop after W, then the same command again: ``mgr.restore`` picks step W."""
    assert_twins(runs.get("ref-fp32"), runs.get("restart"))


def test_fp16_resume_with_scaler_is_bitwise_exact(runs: Runs) -> None:
    ref = runs.get("ref-fp16")
    scales = [r["loss_scale"] for r in ref.records[:W]]
    assert len(set(scales)) > 1, "the scale should have moved before the save"
    assert_twins(ref, runs.get("resume-fp16-none"))


def test_lookahead_in_manifest_matches_the_resumed_first_step(runs: Runs) -> None:
    """The checkpoint says what step W+1 will do; the resumed run does exactly that."""
    ref = runs.get("ref-fp16")
    first = runs.get("resume-fp16-none").records[0]
    look = manifest_io.read(ref.ckpt_dir / step_dir_name(W)).lookahead
    assert look is not None
    assert look["next_step"] == first["step"] == W + 1
    for key in ("lr", "loss_scale", "rng", "sample_ids", "epoch"):
        assert _bits(look[key]) == _bits(first[key]), key
    assert look["opt_step"] + 1 == first["opt_step"]


# --- each component matters --------------------------------------------------------------
# Expected first differing resumed step (1 = step W+1) per signal, and signals that must stay
# equal over the whole window: they tell *which* component broke.
EXPECT: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    # RNG re-seeded: dropout masks differ at once, data and LR do not.
    "no-rng": ({"rng": 1, "loss": 1}, ("sample_ids", "lr", "batch_hash")),
    # Sampler restarts its epoch: other samples from the first resumed step.
    "no-sampler": ({"sample_ids": 1, "batch_hash": 1, "loss": 1}, ("lr",)),
    # Cursor right, permutation wrong: other samples, same epoch.
    "sampler-reshuffle": ({"sample_ids": 1, "loss": 1}, ("lr", "epoch")),
    # Fresh scheduler: the optimizer still carries the saved LR for one step, then the
    # schedule restarts from warmup.
    "no-scheduler": ({"lr": 2, "loss": 3}, ("sample_ids", "opt_step")),
    "sched-off-by-one": ({"lr": 2, "loss": 3}, ("sample_ids", "opt_step")),
    # Moments dropped: same weights, data and RNG, so step W+1's loss is equal; the update
    # differs, so from W+2 the loss does; AdamW's step count restarts.
    "no-moments": ({"opt_step": 1, "loss": 2}, ("sample_ids", "lr", "rng")),
    # Progress lost: every step is mislabelled (and the run trains W+N more steps).
    "step-reset": ({"step": 1}, ("loss", "sample_ids", "lr")),
    # Same sample ids, other content.
    "data-version": ({"batch_hash": 1, "loss": 1}, ("sample_ids", "lr")),
    # Hyper-parameter changed on resume.
    "lr-changed": ({"lr": 1, "loss": 2}, ("sample_ids",)),
}


@pytest.mark.parametrize("fault", sorted(EXPECT))
def test_dropping_a_component_breaks_the_resume(runs: Runs, fault: str) -> None:
    ref = runs.get("ref-fp32")
    bad = runs.get(f"resume-fp32-{fault}")
    want = Run(after_save(ref), ref.summary, ref.ckpt_dir)
    differs, equal = EXPECT[fault]
    for key, step in differs.items():
        assert want.first_diff(bad, key) == step, f"{fault}: {key}"
    for key in equal:
        assert want.first_diff(bad, key) is None, f"{fault}: {key} should be unaffected"
    assert bad.summary["param_hash"] != ref.summary["param_hash"]
    if fault == "step-reset":
        assert [r["step"] for r in bad.records] == list(range(1, W + N + 1))


def test_fresh_grad_scaler_breaks_an_fp16_resume(runs: Runs) -> None:
    ref = runs.get("ref-fp16")
    bad = runs.get("resume-fp16-no-scaler")
    want = Run(after_save(ref), ref.summary, ref.ckpt_dir)
    assert bad.records[0]["loss_scale"] == 2.0**16  # a fresh scaler's default
    assert want.first_diff(bad, "loss_scale") == 1
    assert want.first_diff(bad, "sample_ids") is None
    assert bad.summary["param_hash"] != ref.summary["param_hash"]


def test_no_scaler_is_harmless_without_amp(runs: Runs) -> None:
    """Without fp16 there is no scaler state, so leaving it out changes nothing."""
    assert_twins(runs.get("ref-fp32"), runs.get("resume-fp32-no-scaler"))


GUARD_ARGS = ("--steps", "20", "--save-every", "0")


@pytest.fixture(scope="module")
def guard_ckpt(zygote: Zygote, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LM checkpoint at step 6, for real resumes of every fault."""
    d = tmp_path_factory.mktemp("guard")
    res = zygote.run_module(
        "ckptkit.examples.tiny_lm", *GUARD_ARGS, "--ckpt-dir", str(d),
        env={"CKPTKIT_DRILL_SAVE_AT": "6", "CKPTKIT_DRILL_STOP_AT": "6",
             "CKPTKIT_DRILL_RESUME_FROM": None},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return d / "step-00000006"


@pytest.mark.parametrize(
    ("fault", "code"),
    [("none", None), ("no-sampler", "CK-D002"), ("no-scheduler", "CK-D003"),
     ("no-moments", "CK-D005"), ("step-reset", "CK-D001"), ("lr-changed", "CK-D003")],
)
def test_resume_guard_flags_real_resumes_without_a_reference(
    zygote: Zygote, guard_ckpt: Path, tmp_path: Path, fault: str, code: str | None
) -> None:
    """Every real resume is checked against the checkpoint's look-ahead (no drill needed)."""
    res = zygote.run_module(
        "ckptkit.examples.tiny_lm", *GUARD_ARGS, "--ckpt-dir", str(tmp_path / "b"),
        "--fault", fault,
        env={"CKPTKIT_DRILL_RESUME_FROM": str(guard_ckpt), "CKPTKIT_DRILL_STOP_AT": "9",
             "CKPTKIT_DRILL_SAVE_AT": None},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    found = set(re.findall(r"resume guard: (CK-D\d{3})", res.stderr))
    if code is None:
        assert found == set(), res.stderr[-2000:]
    else:
        assert code in found, res.stderr[-2000:]
