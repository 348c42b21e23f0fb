"""``ckptkit drill``: options, outputs (text, JSON, JUnit, plot) and exit codes."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ckptkit.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "drill_script.py"


def invoke(*args: str) -> object:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_failing_drill_exits_1_and_writes_every_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = invoke(
        "drill",
        "-W",
        "4",
        "-N",
        "4",
        "-q",
        "--workdir",
        str(tmp_path / "runs"),
        "--json",
        str(out / "r.json"),
        "--junit",
        str(tmp_path / "r.xml"),
        "--plot",
        str(out / "p.png"),
        "--",
        sys.executable,
        str(SCRIPT),
        "--fault",
        "lr-changed",
    )
    assert res.exit_code == 1, res.output  # type: ignore[attr-defined]
    assert "FAILED" in res.output and "hyperparameters" in res.output  # type: ignore[attr-defined]
    report = json.loads((out / "r.json").read_text())
    schema = json.loads((ROOT / "schemas" / "drill-report.schema.json").read_text())
    jsonschema.validate(report, schema)
    assert report["ok"] is False
    assert report["diagnosis"]["component"] == "hyperparameters"
    assert report["config"]["save_step"] == 4 and report["config"]["stop_step"] == 8
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None
    names = [c.get("name") for c in suite.iter("testcase")]
    assert names[:3] == ["twin", "exposure", "continuity"]
    assert int(suite.get("failures", "0")) >= 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in res.output  # type: ignore[attr-defined]
    else:
        png = (out / "p.png").read_bytes()
        assert png[:4] == b"\x89PNG"
        # Three panels (loss, grad norm, resumed - reference): 800 px high at 100 dpi.
        assert int.from_bytes(png[20:24], "big") == 800
        assert report["plot"] == str(out / "p.png")


def _schema() -> dict[str, object]:
    return json.loads((ROOT / "schemas" / "drill-report.schema.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("fault", "stage", "reason"),
    [("no-save", "reference", "no checkpoint for step 3"),
     ("crash", "resumed", "the resumed run exited with status 3")],
)
def test_a_drill_that_cannot_run_exits_2_and_still_writes_its_reports(
    tmp_path: Path, fault: str, stage: str, reason: str
) -> None:
    res = CliRunner().invoke(
        main,
        ["drill", "-W", "3", "-N", "3", "-q", "--json", str(tmp_path / "r.json"),
         "--junit", str(tmp_path / "r.xml"), "--", sys.executable, str(SCRIPT),
         "--fault", fault],
        catch_exceptions=False,
    )
    assert res.exit_code == 2
    assert reason in res.output
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, _schema())
    assert report["exit_code"] == 2 and report["ok"] is False
    assert report["error"]["stage"] == stage and reason in report["error"]["reason"]
    assert report["error"]["hint"]
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1"
    err = suite.find("testcase/error")
    assert err is not None and reason in (err.get("message") or "")


def test_a_config_error_writes_its_report_too(tmp_path: Path) -> None:
    cfg = tmp_path / "d.toml"
    cfg.write_text("command = [\n")
    res = invoke("drill", "--config", str(cfg), "--json", str(tmp_path / "r.json"))
    assert res.exit_code == 2  # type: ignore[attr-defined]
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, _schema())
    assert report["error"]["stage"] == "config" and "TOML" in report["error"]["reason"]


def test_a_resume_refused_at_restore_is_a_finding_exit_1(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["drill", "-W", "3", "-N", "3", "-q", "--json", str(tmp_path / "r.json"), "--",
         sys.executable, str(SCRIPT), "--fault", "refuse"],
        catch_exceptions=False,
    )
    assert res.exit_code == 1, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, _schema())
    restore = report["checks"][0]
    assert restore["name"] == "restore" and not restore["ok"]
    assert restore["detail"]["error"] == "StateError"
    assert "no scaler state" in restore["detail"]["message"]
    assert report["diagnosis"]["component"] == "scaler"
    assert "refused the resume" in report["diagnosis"]["evidence"][0]


def test_no_command_is_a_usage_error() -> None:
    res = invoke("drill", "-W", "3")
    assert res.exit_code == 2  # type: ignore[attr-defined]
    assert "training command" in res.output  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", ['command = "x"\nbogus = 1\n', "command = [\n"])
def test_bad_config_exits_2(tmp_path: Path, body: str) -> None:
    cfg = tmp_path / "d.toml"
    cfg.write_text(body)
    res = invoke("drill", "--config", str(cfg))
    assert res.exit_code == 2  # type: ignore[attr-defined]
    assert str(cfg) in res.output  # type: ignore[attr-defined]


@pytest.mark.slow
def test_config_file_drill_passes_with_json_on_stdout(tmp_path: Path) -> None:
    cfg = tmp_path / "d.toml"
    cfg.write_text(
        "[drill]\n"
        f"command = {json.dumps([sys.executable, str(SCRIPT)])}\n"
        "steps_before = 3\nsteps_after = 3\nthreads = 1\n"
        "[drill.thresholds]\nnoise_factor = 4.0\n"
    )
    res = invoke("drill", "--config", str(cfg), "-q", "--json", "-")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    report = json.loads(res.output)  # type: ignore[attr-defined]
    assert report["ok"] and report["diagnosis"]["component"] == "none"
    assert report["workdir"] is None  # a passing drill cleans up its temporary runs


def _passing_report(tmp_path: Path) -> object:
    """A passed drill's report built from synthetic records (no training runs)."""
    from ckptkit.drill.compare import NoiseFloor, twin
    from ckptkit.drill.continuity import continuity
    from ckptkit.drill.diagnose import Diagnosis
    from ckptkit.drill.exposure import exposure
    from ckptkit.drill.report import DrillReport, RunResult

    recs = [{"step": s, "loss": 1.0 / s, "time": float(s)} for s in range(1, 5)]

    def rr(role: str, records: list[dict[str, object]]) -> RunResult:
        return RunResult(
            role=role,  # type: ignore[arg-type]
            index=0,
            argv=["python", "train.py"],
            returncode=0,
            wall_s=1.0,
            records=records,  # type: ignore[arg-type]
            run_dir=tmp_path,
            ckpt_dir=tmp_path,
            metrics_path=tmp_path / "m.jsonl",
            stdout_tail=[],
            stderr_tail=[],
            launched_at=0.0,
            ended_at=5.0,
        )

    checks = [
        twin(recs, recs[2:], start=2, stop=4),
        exposure(recs, recs[2:], start=2, stop=4),
        continuity({"step": 2}, recs[2:], reference=recs, save_step=2),
    ]
    assert all(c.ok for c in checks)
    return DrillReport(
        ok=True,
        command=["python", "train.py"],
        config={"save_step": 2, "stop_step": 4, "repeat": 1, "threads": 1, "device": "cpu"},
        checks=checks,
        diagnosis=Diagnosis("none", "high"),
        runs=[rr("reference", recs), rr("resumed", recs[2:])],
        overhead={
            k: 0.0
            for k in (
                "total_s", "training_s", "overhead_s", "overhead_fraction",
                "process_start_s", "save_s", "restore_s", "statistics_s",
            )
        },
        noise=NoiseFloor(runs=1),
        checkpoint=tmp_path,
        workdir=tmp_path,
    )


def test_passed_drill_writes_reports_into_missing_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptkit.drill import runner

    report = _passing_report(tmp_path)
    monkeypatch.setattr(runner, "run_drill", lambda cfg, on_event=None: report)
    out = tmp_path / "not" / "yet"
    res = invoke(
        "drill", "-q", "--json", str(out / "r.json"), "--junit", str(out / "x" / "r.xml"),
        "--", "python", "train.py",
    )
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert json.loads((out / "r.json").read_text())["ok"] is True
    assert ET.parse(out / "x" / "r.xml").getroot().find("testsuite") is not None
