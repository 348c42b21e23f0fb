"""Progress counters, parallel layout and environment capture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptkit._version import __version__
from ckptkit.capture import env, parallel, progress
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.progress import Progress
from ckptkit.errors import StateError


def test_progress_round_trip() -> None:
    p = Progress(
        step=100,
        epoch=2,
        consumed_samples=6400,
        consumed_tokens=10**12,
        micro_step=3,
        accum_steps=4,
    )
    state = json.loads(json.dumps(progress.capture(p)))
    q = Progress()
    progress.restore(q, state)
    assert q == p
    assert progress.summary(state)["consumed_tokens"] == 10**12


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"step": -1}, "non-negative int"),
        ({"step": 1.5}, "non-negative int"),
        ({"micro_step": 4, "accum_steps": 4}, "micro_step 4 is not below"),
        ({"extra": 1}, "unknown keys \\['extra'\\]"),
    ],
)
def test_progress_rejects_bad_state(change: dict[str, object], match: str) -> None:
    state = {**progress.capture(Progress()), **change}
    with pytest.raises(StateError, match=match):
        progress.restore(Progress(), state)


def test_parallel_defaults_and_validate() -> None:
    assert ParallelConfig().dp == 1
    cfg = ParallelConfig(
        world_size=16, tp=2, pp=2, ep=2, rank=5, global_batch_size=64, micro_batch_size=4
    )
    assert cfg.dp == 4 and cfg.validate() == []
    assert ParallelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert ParallelConfig(world_size=6, tp=4).validate() == [
        "world_size 6 is not divisible by tp*pp*cp = 4"
    ]
    problems = ParallelConfig(world_size=8, dp=2, tp=2, rank=8, zero_stage=5, ep=3).validate()
    assert any("!= world_size 8" in p for p in problems)
    assert any("rank 8" in p for p in problems)
    assert any("zero_stage 5" in p for p in problems)
    assert any("ep 3" in p for p in problems)
    bad_batch = ParallelConfig(world_size=4, global_batch_size=10, micro_batch_size=2).validate()
    assert bad_batch == ["global_batch_size 10 is not a multiple of micro_batch_size*dp = 8"]
    with pytest.raises(StateError, match="unknown keys"):
        ParallelConfig.from_dict({"world_size": 1, "dpp": 2})


def test_parallel_from_env_and_restore() -> None:
    cfg = ParallelConfig.from_env(tp=1, zero_stage=1)
    assert (cfg.world_size, cfg.rank, cfg.zero_stage) == (1, 0, 1)
    saved = parallel.capture(ParallelConfig(world_size=2, rank=0))
    parallel.restore(ParallelConfig(world_size=2, rank=1), saved)  # rank is per process
    with pytest.raises(StateError, match="world_size: 2 -> 4") as err:
        parallel.restore(ParallelConfig(world_size=4), saved)
    assert "allow_change" in (err.value.hint or "")
    parallel.restore(ParallelConfig(world_size=4), saved, allow_change=True)
    assert parallel.summary(saved)["problems"] == []


def test_env_capture_is_cheap_and_complete(tmp_path: Path) -> None:
    # tmp_path is outside any checkout: git is absent from the record, not an error.
    state = env.capture(cwd=tmp_path)
    json.dumps(state)
    assert state["ckptkit"] == __version__
    assert state["git"] is None
    for key in (
        "torch",
        "cuda",
        "cudnn",
        "nccl",
        "python",
        "numpy",
        "hostname",
        "platform",
        "num_threads",
    ):
        assert key in state
    assert env.summary(state) == state


def test_env_git_lookup_is_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[list[str]] = []

    class Done:
        def __init__(self, out: str) -> None:
            self.returncode = 0
            self.stdout = out

    def fake_run(cmd: list[str], **kwargs: object) -> Done:
        calls.append(cmd)
        return Done("abc123\n" if "rev-parse" in cmd else " M file.py\n")

    monkeypatch.setattr(env.subprocess, "run", fake_run)
    env.git_revision.cache_clear()
    try:
        first = env.capture(cwd=tmp_path)["git"]
        second = env.capture(cwd=tmp_path)["git"]
    finally:
        env.git_revision.cache_clear()
    assert first == second == {"revision": "abc123", "dirty": True}
    assert len(calls) == 2  # one rev-parse, one status: the second capture hit the cache
