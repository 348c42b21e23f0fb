"""The drill env-var contract: parsing and the save/stop predicates."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptkit.errors import DrillError
from ckptkit.integrations.drill_env import ENV_VARS, DrillEnv


def test_unset_is_inactive() -> None:
    env = DrillEnv.from_env({"CKPTKIT_DRILL_SAVE_AT": "", "UNRELATED": "1"})
    assert env == DrillEnv()
    assert not env.active
    assert not env.should_save(0) and not env.should_stop(10**9)
    assert env.total_steps(200) == 200


def test_all_variables() -> None:
    env = DrillEnv.from_env(
        {
            "CKPTKIT_DRILL_SAVE_AT": "15",
            "CKPTKIT_DRILL_STOP_AT": " 30 ",
            "CKPTKIT_DRILL_RESUME_FROM": "runs/a/step-00000015",
            "CKPTKIT_METRICS": "m.jsonl",
        }
    )
    assert env == DrillEnv(15, 30, Path("runs/a/step-00000015"), Path("m.jsonl"))
    assert env.active
    assert [s for s in range(40) if env.should_save(s)] == [15]
    assert [s for s in range(40) if env.should_stop(s)] == list(range(30, 40))
    assert env.total_steps(200) == 30
    assert set(ENV_VARS) == {
        "CKPTKIT_DRILL_SAVE_AT",
        "CKPTKIT_DRILL_STOP_AT",
        "CKPTKIT_DRILL_SAVE_FINAL",
        "CKPTKIT_DRILL_RESUME_FROM",
        "CKPTKIT_METRICS",
        "CKPTKIT_CKPT_DIR",
        "CKPTKIT_DEVICE",
        "CKPTKIT_THREADS",
        "CKPTKIT_DRILL_ROLE",
    }


def test_save_final_asks_for_a_checkpoint_at_the_stop_step_too() -> None:
    env = DrillEnv.from_env({"CKPTKIT_DRILL_SAVE_AT": "4", "CKPTKIT_DRILL_STOP_AT": "8",
                             "CKPTKIT_DRILL_SAVE_FINAL": "1"})
    assert env.save_final
    assert [s for s in range(12) if env.should_save(s)] == [4, 8]
    off = DrillEnv.from_env({"CKPTKIT_DRILL_STOP_AT": "8", "CKPTKIT_DRILL_SAVE_FINAL": "0"})
    assert not off.save_final and not off.should_save(8)


def test_drill_run_settings() -> None:
    env = DrillEnv.from_env(
        {"CKPTKIT_CKPT_DIR": "/w/ref/ckpt", "CKPTKIT_DEVICE": "cuda", "CKPTKIT_THREADS": "2",
         "CKPTKIT_DRILL_ROLE": "resumed"}
    )
    assert env.ckpt_dir == Path("/w/ref/ckpt") and env.device == "cuda"
    assert env.threads == 2 and env.role == "resumed"
    assert not env.active  # none of the save/stop/resume variables is set


@pytest.mark.parametrize("raw", ["-1", "1.5", "ten"])
def test_bad_step_is_a_drill_error(raw: str) -> None:
    with pytest.raises(DrillError, match="CKPTKIT_DRILL_STOP_AT"):
        DrillEnv.from_env({"CKPTKIT_DRILL_STOP_AT": raw})


def test_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTKIT_DRILL_SAVE_AT", "7")
    assert DrillEnv.from_env().save_at == 7


@pytest.mark.parametrize("point_at", ["step", "run"])
def test_restore_from_opens_the_source_run_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point_at: str
) -> None:
    import torch

    import ckptkit
    from ckptkit.run import manager as manager_mod

    src = tmp_path / "src"
    with ckptkit.CheckpointManager(src) as m:  # closing joins the background verify
        m.save(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=4))
    opened: list[bool] = []
    real_init = manager_mod.CheckpointManager.__init__

    def spy(self, root, **kw):  # type: ignore[no-untyped-def]
        opened.append(bool(kw.get("readonly")))
        real_init(self, root, **kw)

    monkeypatch.setattr(manager_mod.CheckpointManager, "__init__", spy)
    before = sorted((p.relative_to(src), p.stat().st_mtime_ns) for p in src.rglob("*"))
    target = src / "step-00000004" if point_at == "step" else src
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=0)
    own = tmp_path / "own"
    res = DrillEnv(resume_from=target).restore(ts, ckptkit.CheckpointManager(own))
    assert res is not None and ts.step == 4
    assert opened == [False, True]  # the script's own manager, then the --from one
    assert sorted((p.relative_to(src), p.stat().st_mtime_ns) for p in src.rglob("*")) == before
