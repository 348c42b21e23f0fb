"""The drill runner's config loading and process handling (fast: no training runs)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from ckptkit.drill import runner
from ckptkit.drill.config import DrillConfig, load_config
from ckptkit.errors import DrillError
from ckptkit.integrations.drill_env import ENV_VARS

CMD = 'command = ["python", "train.py"]\n'


@pytest.mark.parametrize(
    "body, key",
    [
        ('steps_before = "abc"\n', "steps_before"),
        ("steps_after = 2.5\n", "steps_after"),
        ("repeat = true\n", "repeat"),
        ('threads = "4"\n', "threads"),
        ("[env]\nA = 1\n", "env"),
        ("env = 3\n", "env"),
        ("thresholds = 5\n", "thresholds"),
        ('[thresholds]\nnoise_factor = "big"\n', "thresholds"),
        ('timeout = "10"\n', "timeout"),
        ("device = 0\n", "device"),
        ('isolate = "yes"\n', "isolate"),
    ],
)
def test_config_values_are_type_checked(tmp_path: Path, body: str, key: str) -> None:
    p = tmp_path / "d.toml"
    p.write_text(CMD + body)
    with pytest.raises(DrillError, match=rf": {key} = ") as ei:
        load_config(p)
    assert ei.value.path == p and ei.value.hint and key in ei.value.hint


@pytest.mark.parametrize("command", ["command = 5\n", 'command = ["python", 3]\n', ""])
def test_command_must_be_a_list_of_strings(tmp_path: Path, command: str) -> None:
    p = tmp_path / "d.toml"
    p.write_text(command + "steps_before = 3\n")
    with pytest.raises(DrillError, match="command"):
        load_config(p)


def test_well_typed_config_loads(tmp_path: Path) -> None:
    p = tmp_path / "d.toml"
    p.write_text(
        "[drill]\n" + CMD + "steps_before = 3\ntimeout = 60\n"
        '[drill.env]\nA = "1"\n[drill.thresholds]\nnoise_factor = 8\nloss = 1e-3\n'
    )
    cfg = load_config(p, repeat=2)
    assert (cfg.steps_before, cfg.timeout, cfg.repeat) == (3, 60, 2)
    assert cfg.env == {"A": "1"} and cfg.thresholds == {"noise_factor": 8, "loss": 1e-3}


@pytest.mark.parametrize("launch", ["fork", "spawn"])
def test_contract_variables_of_the_parent_do_not_leak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: str
) -> None:
    for var in ENV_VARS:
        monkeypatch.setenv(var, "leaked")
    script = tmp_path / "env.py"
    script.write_text(
        "import json, os\n"
        f"print(json.dumps({{v: os.environ.get(v) for v in {list(ENV_VARS)!r}}}))\n"
    )
    cfg = DrillConfig(command=[sys.executable, str(script)], timeout=60, launch=launch)  # type: ignore[arg-type]
    run = runner._run_one(cfg, "resumed", 0, {}, tmp_path / "work")
    assert run.method == launch
    assert run.summary is not None
    assert "leaked" not in run.summary.values()  # every variable is the drill's own or unset


@pytest.mark.parametrize("launch", ["fork", "spawn"])
def test_timeout_kills_the_whole_process_group(tmp_path: Path, launch: str) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "spawn.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    cfg = DrillConfig(command=[sys.executable, str(script)], timeout=1.5, launch=launch)  # type: ignore[arg-type]
    t0 = time.monotonic()
    with pytest.raises(DrillError, match="timed out"):
        runner._run_one(cfg, "reference", 0, {}, tmp_path / "work")
    assert time.monotonic() - t0 < 30
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), "the grandchild outlived the timed-out run"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child not yet reaped by its (dead) parent's reaper is a zombie: dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
