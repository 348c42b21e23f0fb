"""What a newcomer hit next (issue 22, item 6), one test each.

Checkpoints saved before the watch judges anything are not called healthy, ``ls`` on an
object store shows when each checkpoint was written, mistyped and misplaced paths are
named for what they are, a whole pickled module is one finding, ``drill -w`` is a usage
error, ``drill -q`` is quiet, ``inspect --no-tensors`` is in the help, and the README
warns about a folder named ``ckptkit`` shadowing the package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckptkit.cli import main

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
    from ckptkit.drill.compare import NoiseFloor, continuity, exposure, twin
    from ckptkit.drill.diagnose import Diagnosis
    from ckptkit.drill.runner import DrillReport, RunResult

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
