"""``ckptkit adopt`` and the CLI (verify/inspect --format, unknown layouts) on real checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckptkit.cli import main
from ckptkit.format import manifest as mf
from ckptkit.verify.foreign.adopt import adopt, adopted_path
from ckptkit.verify.foreign.report import verify_foreign

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


def _codes(rep: object) -> list[str]:
    return [f.code for f in rep.findings]  # type: ignore[attr-defined]


def test_adopt_then_detect_low_bit_flip_and_drift(
    copy_ckpt: Callable[[Path], Path], hf_ckpt: Path
) -> None:
    d = copy_ckpt(hf_ckpt)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    out = adopt(d)
    assert out == d / "ckptkit-manifest.json"
    assert {p.name: p.read_bytes() for p in d.iterdir() if p != out} == before  # untouched
    m = mf.Manifest.from_json(out.read_bytes())
    assert m.user["adopted"]["format"] == "hf-trainer" and m.step == 2
    assert {f["path"] for f in m.user["adopted"]["files"]} == set(before)
    assert not (d / "manifest.json").exists()
    rep = verify_foreign(d)
    assert rep.ok and "CK-F107" not in _codes(rep)
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-4] ^= 0x01  # invisible to structure checks, caught by the digest
    w.write_bytes(bytes(data))
    (d / "notes.txt").write_text("added later")
    rep = verify_foreign(d)
    assert not rep.ok and "CK-F003" in _codes(rep) and "CK-F006" in _codes(rep)
    (d / "scheduler.pt").unlink()
    assert "CK-F001" in _codes(verify_foreign(d))


def test_adopt_refuses_damaged_and_handles_single_files(
    copy_ckpt: Callable[[Path], Path], lightning_ckpts: dict[str, Path]
) -> None:
    ck = copy_ckpt(lightning_ckpts["full"])
    out = adopt(ck)
    assert out == adopted_path(ck) and out.name.endswith(".ckpt.ckptkit-manifest.json")
    assert verify_foreign(ck).ok
    ck.write_bytes(ck.read_bytes()[:-50])
    from ckptkit.errors import IntegrityError

    with pytest.raises(IntegrityError, match="refusing to adopt"):
        adopt(ck)
    assert adopt(ck, force=True) == out


def test_cli_verify_inspect_adopt(
    copy_ckpt: Callable[[Path], Path], accelerate_ckpt: Path, dcp_ckpt: Path
) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["verify", str(accelerate_ckpt), "--json"], catch_exceptions=False)
    assert r.exit_code == 0
    rep = json.loads(r.output)["reports"][0]
    assert rep["format"] == "accelerate" and rep["components"]["sampler"]["present"] is False
    r = runner.invoke(main, ["inspect", str(dcp_ckpt), "--json"], catch_exceptions=False)
    info = json.loads(r.output)
    assert r.exit_code == 0 and info["format"] == "dcp" and info["components"]["model"]["present"]
    r = runner.invoke(main, ["inspect", str(dcp_ckpt)], catch_exceptions=False)
    assert r.exit_code == 0 and "dcp (foreign)" in r.output
    # --format overrides detection: read the DCP dir as an Accelerate folder.
    r = runner.invoke(
        main, ["verify", str(dcp_ckpt), "--format", "accelerate", "--json"], catch_exceptions=False
    )
    assert r.exit_code == 1 and json.loads(r.output)["reports"][0]["format"] == "accelerate"
    d = copy_ckpt(accelerate_ckpt)
    r = runner.invoke(main, ["adopt", str(d)], catch_exceptions=False)
    assert r.exit_code == 0 and (d / "ckptkit-manifest.json").exists()


def test_cli_unknown_layout(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    r = CliRunner().invoke(main, ["verify", str(p)], catch_exceptions=False)
    assert r.exit_code == 2 and "not a recognised foreign layout" in r.output
    assert "hf-trainer" in r.output and "--format" in r.output


# --- adopt says what verify says (issue 16 item 6, issue 17 item 6) --------------------------------


class _System:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("true",))


def test_adopt_refuses_a_pickle_that_needs_code(tmp_path: Path) -> None:
    import torch

    p = tmp_path / "ck.pt"
    torch.save({"model": {"w": torch.ones(2)}, "step": 1, "hook": _System()}, p)
    runner = CliRunner()
    r = runner.invoke(main, ["adopt", str(p)], catch_exceptions=False)
    assert r.exit_code == 2 and "posix.system" in r.output and "refusing to adopt" in r.output
    assert not adopted_path(p).exists()
    r = runner.invoke(main, ["adopt", str(p), "--json"], catch_exceptions=False)
    out = json.loads(r.output)
    assert r.exit_code == 2 and out["adopted"] is None and "CK-F103" in out["refused"]
    assert out["unverifiable"] == ["ck.pt"] and not adopted_path(p).exists()
    # --force records it, says it is unverified, and exits 1: it does not verify.
    r = runner.invoke(main, ["adopt", str(p), "--force"], catch_exceptions=False)
    assert r.exit_code == 1 and "not verified" in r.output and adopted_path(p).exists()
    m = mf.Manifest.from_json(adopted_path(p).read_bytes())
    assert m.user["adopted"]["unverifiable"] == ["ck.pt"]


def test_adopt_json_reports_what_verify_would_say(lightning_ckpts: dict[str, Path], tmp_path: Path,
                                                  copy_ckpt: Callable[[Path], Path]) -> None:
    ck = copy_ckpt(lightning_ckpts["weights"])
    runner = CliRunner()
    verified = json.loads(
        runner.invoke(main, ["verify", str(ck), "--json"], catch_exceptions=False).output
    )["reports"][0]
    r = runner.invoke(main, ["adopt", str(ck), "--json"], catch_exceptions=False)
    out = json.loads(r.output)
    # Adopted (digests recorded), but it is not a resume point: exit 1, and it says why.
    assert r.exit_code == 1 and out["adopted"] == str(adopted_path(ck)) and out["ok"] is False
    assert out["missing"] == ["optimizer"]
    assert out["report"]["components"] == verified["components"]
    assert [f["code"] for f in out["report"]["findings"]] == [f["code"] for f in verified["findings"]]
    r = runner.invoke(main, ["adopt", str(ck)], catch_exceptions=False)
    assert r.exit_code == 1 and "missing: optimizer" in r.output and "CK-C001" in r.output
    # Told it is a weights checkpoint, it adopts cleanly, and later verifies remember.
    r = runner.invoke(main, ["adopt", str(ck), "--expect", "weights", "--json"],
                      catch_exceptions=False)
    assert r.exit_code == 0 and json.loads(r.output)["ok"] is True
    assert verify_foreign(ck).ok and verify_foreign(ck).expect == "weights"
