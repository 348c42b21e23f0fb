"""Starting drill runs: a fork of this warmed interpreter behaves like a fresh process."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from ckptkit.drill import launch


def _launch(tmp_path: Path, body: str, *args: str, env: dict[str, str] | None = None,
            threads: int = 1) -> launch.Launch:
    script = tmp_path / "s.py"
    script.write_text(body)
    return launch.Launch([sys.executable, str(script), *args],
                         {**os.environ, **(env or {})}, tmp_path, tmp_path / "out.txt",
                         tmp_path / "err.txt", threads=threads)


def test_a_forked_run_gets_its_own_argv_env_cwd_streams_and_exit_code(tmp_path: Path) -> None:
    spec = _launch(
        tmp_path,
        "import atexit, os, sys, warnings\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "warnings.warn('old', DeprecationWarning)  # a fresh interpreter ignores it\n"
        "print(sys.argv[1:], os.environ['ONLY_HERE'], os.getcwd() == sys.argv[2])\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n",
        "a", str(tmp_path),
        env={"ONLY_HERE": "yes"},
    )
    proc = launch.start(spec, method="fork")
    assert proc.method == "fork"
    assert proc.wait(60) == 3
    out = spec.stdout.read_text().splitlines()
    assert out == [f"['a', '{tmp_path}'] yes True", "atexit ran"]
    assert spec.stderr.read_text() == "to stderr\n"
    assert "ONLY_HERE" not in os.environ  # the parent's environment is untouched


def test_an_exception_in_a_forked_run_is_a_traceback_and_status_1(tmp_path: Path) -> None:
    spec = _launch(tmp_path, "raise KeyError('boom')\n")
    assert launch.start(spec, method="fork").wait(60) == 1
    assert "KeyError: 'boom'" in spec.stderr.read_text()


def test_what_cannot_be_forked_is_spawned(tmp_path: Path) -> None:
    assert launch.fork_target(["bash", "-c", "true"]) is None
    assert launch.fork_target([sys.executable, "-c", "print(1)"]) is None
    assert not launch.can_fork(_launch(tmp_path, "print(1)\n", threads=2))
    spec = _launch(tmp_path, "print(1)\n", threads=2)
    proc = launch.start(spec)
    assert proc.method == "spawn" and proc.wait(60) == 0
    with pytest.raises(ValueError, match="launch='fork'"):
        launch.start(spec, method="fork")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_kill_reaches_a_worker_the_run_started_in_a_session_of_its_own(
    tmp_path: Path, method: str
) -> None:
    # torchrun starts its ranks with start_new_session=True: killing the run's process group
    # alone left them running (orphans holding a port and a CPU) after a drill's timeout.
    pid_file = tmp_path / "worker.pid"
    spec = _launch(
        tmp_path,
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                     start_new_session=True)\n"
        f"open({str(pid_file)!r} + '.tmp', 'w').write(str(w.pid))\n"
        f"__import__('os').replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
        "time.sleep(600)\n",
    )
    proc = launch.start(spec, method=method)  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the run never started its worker"
        assert proc.poll() is None, spec.stderr.read_text()
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    proc.kill()
    assert proc.returncode == -9
    deadline = time.monotonic() + 60
    while _alive(worker):
        assert time.monotonic() < deadline, f"worker {worker} outlived the killed run"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("asked", [False, True])
def test_a_forked_run_has_a_fault_handler_only_when_asked_writing_to_its_own_stderr(
    tmp_path: Path, asked: bool
) -> None:
    env = {"PYTHONFAULTHANDLER": "1"} if asked else {}
    spec = _launch(tmp_path, "import os\nos.abort()\n", env=env)
    if not asked:
        spec.env.pop("PYTHONFAULTHANDLER", None)
    assert launch.start(spec, method="fork").wait(60) == -6
    assert ("Fatal Python error: Aborted" in spec.stderr.read_text()) is asked
