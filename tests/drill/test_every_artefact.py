"""The drill's ``artefacts`` check: a script's own files (an EMA export, a final
``torch.save``, intermediate checkpoints) are compared between the reference and the resumed
run, so an EMA that is never saved fails the drill, named ``ema`` (issue 37 item 3).

``ema_export_script.py`` keeps its EMA as a second module and exports it at the end; with
``--fault ema-unsaved`` the EMA stays outside the ``TrainState`` and restarts from the
current weights after a resume: every step record and the final checkpoint agree.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import jsonschema
import pytest

from ckptkit.cli.render import drill as render
from ckptkit.drill.config import DrillConfig
from ckptkit.drill.report import DrillReport
from ckptkit.drill.runner import run_drill

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "ema_export_script.py"
SCHEMA = json.loads(
    (Path(__file__).parents[2] / "schemas" / "drill-report.schema.json").read_text())
CHECK = jsonschema.Draft202012Validator({**SCHEMA["$defs"]["check"], "$defs": SCHEMA["$defs"]})


def drill(fault: str, tmp_path: Path) -> DrillReport:
    cmd = [sys.executable, str(SCRIPT), "--fault", fault]
    return run_drill(DrillConfig(command=cmd, steps_before=4, steps_after=4,
                                 workdir=tmp_path / "drill", timeout=240))


@pytest.mark.parametrize("fault", ["none", "ema-unsaved"])
def test_every_artefact_is_compared(fault: str, tmp_path: Path) -> None:
    rep = drill(fault, tmp_path)
    by = {c.name: c for c in rep.checks}
    CHECK.validate(by["artefacts"].to_dict())  # the whole report: test_drill.py
    assert by["twin"].ok and by["end_state"].ok, (by["twin"].detail, by["end_state"].detail)
    art = by["artefacts"]
    assert not art.skipped and not art.informational, art.detail
    files = art.detail["files"]
    # the export and the intermediate checkpoint after the save; the step-4 checkpoint only
    # the reference wrote (the resumed run's input) and the final checkpoint are not here
    assert set(files) == {"export/ema.safetensors", "export/final.pt", "step-00000006"}, files
    if fault == "none":
        assert rep.ok and art.ok, art.detail
        assert {f["status"] for f in files.values()} == {"equal"}
        return
    assert rep.exit_code == 1 and not art.ok
    assert {r for r, f in files.items() if f["status"] == "different"} == {
        "export/ema.safetensors", "export/final.pt"}
    assert list(art.detail["different"]) == ["ema"], art.detail["different"]
    assert art.detail["different"]["ema"]["tensors"]  # the tensors that differ, named
    assert (rep.diagnosis.component, rep.diagnosis.confidence) == ("ema", "high"), rep.diagnosis
    d = rep.to_dict()
    assert d["diagnosis"]["component"] == "ema"
    for write in (render.render_junit, render.render_text):
        out = io.StringIO()
        write(rep, out)
        assert "export/ema.safetensors" in out.getvalue(), write
