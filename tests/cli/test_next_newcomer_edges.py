"""What a newcomer hit next (issue 22, item 6), one test each.

Checkpoints saved before the watch judges anything are not called healthy, ``ls`` on an
object store shows when each checkpoint was written, mistyped and misplaced paths are
named for what they are, a whole pickled module is one finding, ``drill -w`` is a usage
error, ``drill -q`` is quiet, ``inspect --no-tensors`` is in the help, and the README
warns about a folder named ``ckptkit`` shadowing the package.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.cli import main
from ckptkit.errors import IncompleteCheckpointError
from ckptkit.signals.stability import StabilityWatch

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


# --- help and README ------------------------------------------------------------------------


def test_inspect_help_lists_no_tensors() -> None:
    code, out, _ = _run("inspect", "--help")
    assert code == 0 and "--no-tensors" in out


def test_readme_warns_about_a_folder_named_ckptkit() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "no folder named `ckptkit`" in text and "instead of the installed package" in text


# --- drill options ----------------------------------------------------------------------------


def test_drill_lower_case_w_is_a_usage_error_naming_the_option_meant(tmp_path: Path) -> None:
    code, out, err = _run("drill", "-w", "5", "--json", str(tmp_path / "r.json"), "--",
                          "python", "train.py")
    assert code == 2 and out == ""
    assert "No such option: -w. Did you mean -W / --steps-before?" in err
    assert "goes after '--'" in err
    assert "python" not in err  # nothing was taken as (or run as) the command


def _report(tmp_path: Path, *, ok: bool) -> object:
    """A drill report from synthetic records (no training runs): resumed equal or not."""
    from ckptkit.drill.compare import NoiseFloor, twin
    from ckptkit.drill.continuity import continuity
    from ckptkit.drill.diagnose import Diagnosis
    from ckptkit.drill.exposure import exposure
    from ckptkit.drill.report import DrillReport, RunResult

    ref = [{"step": s, "loss": 1.0 / s, "time": float(s)} for s in range(1, 5)]
    res = [dict(r, loss=r["loss"] * (1 if ok else 2)) for r in ref[2:]]

    def rr(role: str, records: list[dict[str, float]]) -> RunResult:
        return RunResult(
            role=role, index=0, argv=["python", "train.py"], returncode=0,  # type: ignore[arg-type]
            wall_s=1.0, records=records, run_dir=tmp_path, ckpt_dir=tmp_path,  # type: ignore[arg-type]
            metrics_path=tmp_path / "m.jsonl", stdout_tail=[], stderr_tail=[],
            launched_at=0.0, ended_at=5.0,
        )

    checks = [
        twin(ref, res, start=2, stop=4),
        exposure(ref, res, start=2, stop=4),
        continuity({"step": 2}, res, reference=ref, save_step=2),
    ]
    assert all(c.ok for c in checks) is ok
    overhead = ("total_s", "training_s", "overhead_s", "overhead_fraction", "process_start_s",
                "save_s", "restore_s", "statistics_s")
    return DrillReport(
        ok=ok, command=["python", "train.py"],
        config={"save_step": 2, "stop_step": 4, "repeat": 1, "threads": 1, "device": "cpu"},
        checks=checks, diagnosis=Diagnosis("none" if ok else "unknown", "low"),
        runs=[rr("reference", ref), rr("resumed", res)], overhead=dict.fromkeys(overhead, 0.0),
        noise=NoiseFloor(runs=1), checkpoint=tmp_path, workdir=tmp_path,
    )


@pytest.mark.parametrize("ok", [True, False], ids=["passed", "failed"])
def test_drill_quiet_prints_the_verdict_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ok: bool
) -> None:
    from ckptkit.drill import runner

    report = _report(tmp_path, ok=ok)

    def fake(cfg: object, on_event: Callable[[str], None] | None = None) -> object:
        assert on_event is not None
        on_event("reference run 1 of 1")  # a progress line: -q drops it
        return report

    monkeypatch.setattr(runner, "run_drill", fake)
    monkeypatch.setattr(runner, "cleanup", lambda r: None)
    argv = ("drill", "-W", "2", "-N", "2", "--", "python", "train.py")
    code, loud, loud_err = _run(*argv)
    assert code == (0 if ok else 1)
    assert "reference run 1 of 1" in loud_err and "check" in loud and "time:" in loud
    code, out, err = _run(*argv[:1], "-q", *argv[1:])
    assert code == (0 if ok else 1) and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("PASSED resume drill" if ok else "FAILED resume drill")
    if ok:
        assert lines == lines[:1]
    else:
        assert lines[1:] == ["failed: twin; diagnosis: unknown (low confidence)"], out


# --- health before the watch judges -----------------------------------------------------------


def _watched_run(root: Path, saves: tuple[int, ...]) -> Path:
    """A run whose watch judges from step 25 on (warm-up to 8, a baseline of 16 by 24)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ts = ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    watch = StabilityWatch(window=32, recent=8, min_history=16, warmup=8)
    with ckptkit.CheckpointManager(root, keep_last=10, watch=watch) as mgr:
        for step in range(1, max(saves) + 1):
            watch.update(step, loss=2.0 + 0.01 * (step % 5), grad_norm=1.0 + 0.01 * (step % 3))
            if step in saves:
                ts.step = step
                mgr.save(ts)
    return root


def test_a_save_during_warm_up_is_not_judged_and_never_the_rollback_target(
    tmp_path: Path,
) -> None:
    run = _watched_run(tmp_path / "run", (5, 20, 40))
    health = {c.step: c.health for c in ckptkit.CheckpointManager(run, readonly=True).list()}
    assert health == {5: "not judged", 20: "not judged", 40: "ok"}
    man = json.loads((run / "step-00000005" / "manifest.json").read_text())
    assert man["health"]["level"] == "not judged"
    assert man["health"]["not_judging"].startswith("warming up: 5 of 8 steps")
    assert json.loads((run / "step-00000020" / "manifest.json").read_text())["health"][
        "not_judging"].startswith("collecting a baseline")
    assert json.loads((run / "step-00000040" / "manifest.json").read_text())["health"][
        "not_judging"] is None
    code, out, _ = _run("ls", str(run))
    assert code == 0 and out.count("not judged") == 2, out


def test_rollback_and_restore_healthy_pass_over_not_judged(tmp_path: Path) -> None:
    run = _watched_run(tmp_path / "run", (5, 20))
    code, out, _ = _run("rollback", str(run))
    assert code == 1 and "no healthy checkpoint" in out
    assert "step-00000020: skipped, health not judged (collecting a baseline" in out
    assert "step-00000005: skipped, health not judged (warming up: 5 of 8 steps" in out
    model = torch.nn.Linear(4, 1)
    ts = ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(IncompleteCheckpointError, match="no checkpoint with health ok"):
        ckptkit.CheckpointManager(run, readonly=True).restore(ts, healthy=True)
    # Once a judged one exists, both take it and say why the newer ones were passed over.
    run = _watched_run(tmp_path / "run2", (30, 40))
    with ckptkit.CheckpointManager(run, keep_last=10) as mgr:  # a save after a restart:
        mgr.watch = StabilityWatch()  # a fresh watch warms up again
        ts.step = 50
        mgr.save(ts)
    code, out, _ = _run("rollback", str(run))
    assert code == 0 and out.splitlines()[0].endswith("step-00000040"), out
    assert "step-00000050: skipped, health not judged (warming up: 0 of 500 steps" in out
    res = ckptkit.CheckpointManager(run, readonly=True).restore(ts, healthy=True)
    assert res is not None and res.step == 40


def test_a_multi_rank_save_is_not_judged_while_any_rank_is() -> None:
    worst = StabilityWatch.worst
    assert worst([{"level": "ok"}, {"level": "not judged"}])["level"] == "not judged"
    assert worst([{"level": "not judged"}, {"level": "warn"}])["level"] == "warn"
    assert worst([{"level": "ok"}, {"level": "ok"}])["level"] == "ok"


# --- paths: typos, a parent of runs, a manifest.json ---------------------------------------------


def _native_run(root: Path, steps: tuple[int, ...] = (10, 20)) -> Path:
    torch.manual_seed(0)
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    with ckptkit.CheckpointManager(root, keep_last=len(steps)) as mgr:
        for s in steps:
            ts.step = s
            mgr.save(ts)
    return root


RUN_COMMANDS = [("ls",), ("prune", "--keep-last", "1", "--dry-run"), ("rollback",), ("verify",)]


@pytest.mark.parametrize("cmd", RUN_COMMANDS, ids=lambda c: c[0])
def test_a_mistyped_path_names_the_closest_matches(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    run = _native_run(tmp_path / "exp1" / "ckpt")
    code, out, err = _run(cmd[0], str(tmp_path / "exp1" / "ckp"), *cmd[1:])
    assert code == 2 and out == ""
    assert err.strip() == (
        f"ckptkit: {tmp_path / 'exp1' / 'ckp'}: no such file or directory. "
        f"Fix: did you mean {run}?"
    )
    # One mechanism: the words inspect and ckptkit.load already use.
    _, _, inspect_err = _run("inspect", str(tmp_path / "exp1" / "ckp"))
    assert inspect_err == err


def test_verify_library_names_the_closest_matches_too(tmp_path: Path) -> None:
    run = _native_run(tmp_path / "run")
    with pytest.raises(IncompleteCheckpointError, match=r"did you mean .*step-00000010"):
        ckptkit.verify(run / "step-0000010")


@pytest.mark.parametrize("cmd", RUN_COMMANDS, ids=lambda c: c[0])
def test_the_parent_of_runs_names_the_runs_under_it(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    _native_run(tmp_path / "runs" / "exp1" / "ckpt")
    _native_run(tmp_path / "runs" / "exp2" / "ckpt")
    hf = tmp_path / "runs" / "hf-out" / "checkpoint-5"  # a Trainer output_dir: a run too
    hf.mkdir(parents=True)
    (hf / "trainer_state.json").write_text("{}")
    code, out, err = _run(cmd[0], str(tmp_path / "runs"), *cmd[1:])
    assert code == 2 and out == ""
    assert "a directory of 3 run directories (exp1/ckpt, exp2/ckpt, hf-out), not a" in err
    assert f"e.g. {tmp_path / 'runs' / 'exp1' / 'ckpt'}" in err
    code, _, err = _run(cmd[0], str(tmp_path / "runs" / "exp1"), *cmd[1:])
    assert code == 2 and "a directory of 1 run directory (ckpt)" in err
    assert not (tmp_path / "runs" / "exp1" / ".ckptkit.lock").exists()  # nothing written there
    assert sorted(p.name for p in (tmp_path / "runs" / "exp1").iterdir()) == ["ckpt"]


@pytest.mark.parametrize("cmd", RUN_COMMANDS, ids=lambda c: c[0])
def test_a_run_still_reads_as_a_run(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    run = _native_run(tmp_path / "run")
    code, out, _ = _run(cmd[0], str(run), *cmd[1:])
    assert code == 0, out
    empty = tmp_path / "empty"
    empty.mkdir()  # a run with no checkpoint yet: not an error for ls
    code, out, _ = _run("ls", str(empty))
    assert code == 0 and "0 checkpoints" in out


def test_a_manifest_json_stands_for_its_checkpoint(tmp_path: Path) -> None:
    run = _native_run(tmp_path / "run")
    man = run / "step-00000010" / "manifest.json"
    code, out, _ = _run("verify", str(man))
    assert code == 0 and out.startswith(f"OK {run / 'step-00000010'} step 10")
    code, out, _ = _run("inspect", str(man))
    assert code == 0 and "step=10" in out
    for cmd in RUN_COMMANDS[:3]:  # one checkpoint: the run commands name its run
        code, out, err = _run(cmd[0], str(man), *cmd[1:])
        assert code == 2 and out == ""
        assert f"{run / 'step-00000010'}: one checkpoint, not a run directory" in err
        assert f"pass the run directory that holds it ({run})" in err


# --- a whole pickled module -------------------------------------------------------------------


def test_verify_of_torch_save_model_reports_the_one_real_cause(tmp_path: Path) -> None:
    f = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(2, 2), f)
    code, out, _ = _run("verify", str(f))
    assert code == 1
    findings = [ln for ln in out.splitlines() if ln.startswith("  ") and "CK-" in ln]
    assert len(findings) == 1, out
    assert "error   CK-F103" in findings[0] and "torch.nn.modules.linear.Linear" in findings[0]
    assert "torch.save(model)" in findings[0]
    assert "MISSING" not in out and "CK-C001" not in out and "Fix: save state dicts" in out
    doc = json.loads(_run("verify", str(f), "--json")[1])
    (rep,) = doc["reports"]
    assert [(x["code"], x["severity"]) for x in rep["findings"]] == [("CK-F103", "error")]
    # Even when told what it must be: the cause is the pickle, not each component.
    code, out, _ = _run("verify", str(f), "--expect", "training")
    assert code == 1 and "CK-C001" not in out
    # A state dict saved the same way still verifies as before.
    torch.save({"model": torch.nn.Linear(2, 2).state_dict()}, f)
    code, out, _ = _run("verify", str(f))
    assert code == 0 and "CK-F103" not in out


# --- ls on an object store --------------------------------------------------------------------


@pytest.mark.s3
def test_ls_on_s3_shows_when_each_checkpoint_was_written(s3_run: str) -> None:
    import time

    import fsspec

    before = time.time()
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    with ckptkit.CheckpointManager(s3_run, keep_last=5) as mgr:
        for s in (1, 2):
            ts.step = s
            mgr.save(ts)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    base = s3_run.removeprefix("s3://")
    fs.pipe(f"{base}/step-00000003/manifest.json", b"{}")  # corrupt: the store's time
    fs.pipe(f"{base}/step-00000004/model.safetensors", b"x")  # incomplete: no time known
    code, out, _ = _run("ls", s3_run, "--json")
    assert code == 1  # a corrupt and an incomplete one
    got = {c["step"]: c for c in json.loads(out)["checkpoints"]}
    recorded = {s: datetime.fromisoformat(json.loads(fs.cat(
        f"{base}/step-{s:08d}/manifest.json"))["created_at"]).timestamp() for s in (1, 2)}
    assert got[1]["time"] == recorded[1] and got[2]["time"] == recorded[2]  # the manifest's
    assert before - 120 < got[3]["time"] < time.time() + 120  # the object's LastModified
    assert got[4]["time"] == 0.0
    code, out, _ = _run("ls", s3_run)
    table = out.split("checkpoints,")[0].splitlines()[:-1]  # the rows, not the summary line
    rows = {ln.split()[0]: ln for ln in table if ln.split() and ln.split()[0].isdigit()}
    for s in ("1", "2", "3"):
        assert datetime.fromtimestamp(got[int(s)]["time"]).strftime("%Y-%m-%d %H:%M") in rows[s]
        assert "1970" not in rows[s]
    assert rows["4"].split()[1] == "-"  # unknown, said so (not 1970-01-01)
