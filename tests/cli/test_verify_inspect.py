"""`ckptkit verify` and `ckptkit inspect` through click, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from ckptkit.cli import main
from ckptkit.format import manifest as mf
from ckptkit.format import validation


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_verify_clean_exit_0(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    code, out, _ = _run("verify", str(d))
    assert code == 0 and "OK" in out and "model" in out


def test_verify_json_conforms_to_schema(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "model.safetensors").write_bytes(b"garbage")
    code, out, _ = _run("verify", str(d), "--json")
    assert code == 1
    report = json.loads(out)
    jsonschema.Draft202012Validator(validation.schema("verify-report.schema.json")).validate(report)
    rep = report["reports"][0]
    assert not report["ok"] and rep["findings"][0]["code"] == "CK-F002"
    assert set(rep["components"]) == set(mf.COMPONENTS)
    # The table reports what the bytes prove: the model's only file is garbage.
    assert rep["components"]["model"] == {"present": False, "required": False,
                                          "where": ["model.safetensors"]}
    assert "CK-C010" in [f["code"] for f in rep["findings"]]
    f = rep["findings"][0]
    assert f["path"] == "model.safetensors" and f["hint"] and f["severity"] == "error"


def test_verify_run_dir_checks_each(saved_ckpt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    saved_ckpt("step-00000001", step=1)
    bad = saved_ckpt("step-00000002", step=2)
    (bad / "manifest.json").unlink()
    code, out, _ = _run("verify", str(tmp_path), "--json")
    report = json.loads(out)
    assert code == 1 and len(report["reports"]) == 2
    by = {Path(r["path"]).name: r for r in report["reports"]}
    assert by["step-00000001"]["ok"] and not by["step-00000002"]["ok"]
    assert by["step-00000002"]["findings"][0]["code"] == "CK-M001"


def test_verify_strict_fails_on_warning(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "stray.bin").write_bytes(b"x")
    assert _run("verify", str(d))[0] == 0
    assert _run("verify", str(d), "--strict")[0] == 1


def test_verify_junit(saved_ckpt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import xml.etree.ElementTree as ET

    d = saved_ckpt()
    (d / "optimizer.safetensors").unlink()
    code, _, _ = _run("verify", str(d), "--junit", str(tmp_path / "v.xml"))
    assert code == 1
    root = ET.parse(tmp_path / "v.xml").getroot()
    fails = root.findall(".//failure")
    assert fails and fails[0].get("type") == "CK-F001"


def test_verify_missing_path_exit_2_no_traceback(tmp_path: Path) -> None:
    code, _, err = _run("verify", str(tmp_path / "nope"))
    assert code == 2 and "Traceback" not in err and "no such file" in err


def test_verify_hostile_manifest_exit_1_names_code(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    obj = json.loads((d / "manifest.json").read_text())
    obj["files"][0]["path"] = "../../etc/passwd"
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))
    code, out, _ = _run("verify", str(d), "--json")
    assert code == 1 and json.loads(out)["reports"][0]["findings"][0]["code"] == "CK-M005"


def test_inspect_lists_tensors_and_components(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    code, out, _ = _run("inspect", str(d), "--verbose")
    assert code == 0 and "model/emb.weight" in out and "step=3" in out
    code, out, _ = _run("inspect", str(d), "--json")
    info = json.loads(out)
    assert info["step"] == 3
    t = next(t for t in info["tensors"] if t["key"] == "model/emb.weight")
    assert t["shape"] == [32, 16] and t["dtype"] == "F32" and t["nbytes"] == 32 * 16 * 4


def test_inspect_incomplete_exit_2(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    (d / "manifest.json").unlink()
    code, _, err = _run("inspect", str(d))
    assert code == 2 and "CK-M001" in err and "Fix:" in err


def test_markup_in_names_is_printed_not_interpreted(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    obj = json.loads((d / "manifest.json").read_text())
    obj["files"][0]["path"] = "../[/b]"  # rich raises MarkupError on an unmatched closing tag
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))
    code, out, _ = _run("verify", str(d))
    assert code == 1 and "CK-M005" in out and "[/b]" in out


def test_verify_junit_into_a_missing_directory(saved_ckpt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    target = tmp_path / "reports" / "ci" / "v.xml"
    code, _, _ = _run("verify", str(d), "--junit", str(target))
    assert code == 0 and target.is_file()


def test_verify_strict_junit_counts_warnings_as_failures(saved_ckpt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import xml.etree.ElementTree as ET

    d = saved_ckpt()
    (d / "stray.bin").write_bytes(b"x")  # a warning finding
    for args, code_want, fails_want in (([], 0, 0), (["--strict"], 1, 1)):
        code, _, _ = _run("verify", str(d), "--junit", str(tmp_path / "v.xml"), *args)
        suite = ET.parse(tmp_path / "v.xml").getroot().find("testsuite")
        assert suite is not None
        failures = int(suite.get("failures", "-1"))
        assert code == code_want
        assert (failures > 0) == (code_want == 1) and failures == fails_want
        assert len(suite.findall(".//failure")) == fails_want
