"""Pre-emption with real processes and real signals (issue 16, item 4).

A training script (``preempt_script.py``) runs under a ``PreemptionGuard``; the test sends
SIGTERM or SIGUSR1 at a chosen moment (mid-step, mid-save, while an async save writes,
during the guard's own save, during a step that never ends) and checks what a scheduler
and the requeued job see: the exit status, and a committed, verified checkpoint of the
step the job stopped at, whose weights are the ones the job had.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from preempt_script import digest

import ckptkit
from ckptkit.checkpoint.catalog import Catalog

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[1] / "scripts" / "preempt_script.py"
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120.0


_JOBS: list[Job] = []


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test() -> Any:
    """A test that fails half-way leaves no live job (or open pipe) to later tests."""
    yield
    while _JOBS:
        job = _JOBS.pop()
        if job.p.poll() is None:
            job.p.kill()
            job.p.wait()
            job._close()


class Job:
    """The script as a child process; its stdout lines arrive in a queue."""

    def __init__(self, run: Path, *args: str, env: dict[str, str] | None = None) -> None:
        full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
        self.p = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--run", str(run), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full,
        )
        _JOBS.append(self)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.err = ""
        self._outt = threading.Thread(target=self._pump, daemon=True)
        self._outt.start()
        self._errt = threading.Thread(target=self._pump_err, daemon=True)
        self._errt.start()

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("<eof>")

    def _pump_err(self) -> None:
        assert self.p.stderr is not None
        self.err = self.p.stderr.read()

    def until(self, pattern: str) -> re.Match[str]:
        """Wait for a stdout line matching ``pattern``."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            self.seen.append(line)
            m = re.fullmatch(pattern, line)
            if m:
                return m
            if line == "<eof>":
                break
        raise AssertionError(f"no line {pattern!r}; got {self.seen[-5:]}; stderr:\n{self.err}")

    def send(self, sig: int) -> None:
        self.p.send_signal(sig)

    def wait(self) -> int:
        try:
            code = self.p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            # Every thread's stack to stderr (faulthandler in the script), then a clean kill:
            # a hang is diagnosed, and no live process or open pipe leaks into later tests.
            self.p.send_signal(signal.SIGUSR2)
            time.sleep(2)
            self.p.kill()
            self.p.wait()
            self._close()
            raise AssertionError(
                f"the job did not exit within {TIMEOUT} s; seen {self.seen[-5:]}; "
                f"stderr with its threads' stacks:\n{self.err}"
            ) from None
        self._close()
        return code

    def _close(self) -> None:
        self._outt.join(timeout=10)
        while True:  # drain the rest of stdout
            try:
                line = self.lines.get(timeout=5.0)
            except queue.Empty:
                break
            if line == "<eof>":
                break
            self.seen.append(line)
        self._errt.join(timeout=10)
        for stream in (self.p.stdout, self.p.stderr):
            if stream is not None:
                stream.close()

    def digests(self) -> dict[int, str]:
        out = {}
        for line in self.seen:
            m = re.fullmatch(r"step (\d+) (\w+)", line)
            if m:
                out[int(m.group(1))] = m.group(2)
        return out


def _newest(run: Path) -> ckptkit.checkpoint.catalog.CheckpointInfo:
    infos = Catalog(run).list()
    assert infos, "no checkpoint"
    assert all(c.status != "corrupt" for c in infos), [(c.step, c.status, c.problem) for c in infos]
    good = [c for c in infos if c.status == "verified"]
    assert good, [(c.step, c.status) for c in infos]
    return good[-1]


def _restored_digest(run: Path, width: int = 64) -> tuple[int, str]:
    """Resume in a fresh process, as the requeued job would, and report its weights."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--run", str(run), "--steps", "0", "--width", str(width)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    m = re.search(r"^resumed (\d+) (\w+)$", out.stdout, flags=re.M)
    assert m, out.stdout
    return int(m.group(1)), m.group(2)


def _restored_here(run: Path, width: int = 64) -> tuple[int, str]:
    """Resume in this process (the script's model and optimizer), report the weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width)
    )
    ts = ckptkit.TrainState(model=model, optimizer=torch.optim.AdamW(model.parameters()))
    res = ckptkit.CheckpointManager(run, readonly=True).restore(ts)
    assert res is not None
    return res.step, digest(model)


def _check_resumable(
    run: Path, job: Job, step: int, width: int = 64, *, fresh: bool = False
) -> None:
    newest = _newest(run)
    assert newest.step == step
    assert ckptkit.verify(newest.path).ok
    assert not Catalog(run).leftovers()
    got = _restored_digest(run, width) if fresh else _restored_here(run, width)
    assert got == (step, job.digests()[step])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigterm_mid_step_saves_that_step_and_exits_143(tmp_path: Path, mode: str) -> None:
    run = tmp_path / "run"
    job = Job(run, "--mode", mode, "--save-every", "5")
    job.until(r"step 7 \w+")
    job.send(signal.SIGTERM)
    stop = int(job.until(r"stopping (\d+)").group(1))
    assert job.wait() == 128 + signal.SIGTERM, job.err
    assert stop >= 7
    _check_resumable(run, job, stop, fresh=mode == "sync")
    assert "pre-empted by SIGTERM" in job.err and "exiting with 143" in job.err


def test_sigusr1_during_a_sync_save_does_not_save_twice(tmp_path: Path) -> None:
    """SLURM's --signal=USR1@T while the main thread is inside save(): it completes, the
    boundary right after it finds the step saved, and the job exits 138."""
    run = tmp_path / "run"
    job = Job(run, "--mode", "sync", "--save-every", "4", "--width", "1024")
    saving = int(job.until(r"saving (\d+)").group(1))
    job.send(signal.SIGUSR1)
    assert int(job.until(r"stopping (\d+)").group(1)) == saving
    assert job.wait() == 128 + signal.SIGUSR1, job.err
    assert [c.step for c in Catalog(run).list()] == [saving]
    _check_resumable(run, job, saving, width=1024)
    assert f"step {saving} is saved already" in job.err


def test_sigterm_while_an_async_save_writes(tmp_path: Path) -> None:
    """The async save in flight finishes and verifies; the stop step is saved after it."""
    run = tmp_path / "run"
    job = Job(run, "--mode", "async", "--save-every", "3", "--width", "1024", "--step-sleep", "0")
    inflight = int(job.until(r"saved (\d+)").group(1))  # save() returned: the write runs on
    job.send(signal.SIGTERM)
    stop = int(job.until(r"stopping (\d+)").group(1))
    assert job.wait() == 128 + signal.SIGTERM, job.err
    infos = {c.step: c.status for c in Catalog(run).list()}
    assert infos.get(inflight) == "verified", infos
    _check_resumable(run, job, stop, width=1024)


def test_second_signal_during_the_guards_save_changes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = Job(run, "--save-every", "1000", "--width", "1024")
    job.until(r"step 3 \w+")
    job.send(signal.SIGTERM)
    stop = int(job.until(r"stopping (\d+)").group(1))
    job.send(signal.SIGTERM)  # an impatient operator, or a second notice
    job.send(signal.SIGUSR1)
    assert job.wait() == 128 + signal.SIGTERM, job.err
    _check_resumable(run, job, stop, width=1024)


def test_a_second_sigterm_while_the_process_exits_still_ends_143(tmp_path: Path) -> None:
    """Issue 23 item 12: the guard saved and raised SystemExit(143); a second SIGTERM that
    lands during interpreter teardown (threads joined, loggers flushed) must not end the
    process by the signal: the scheduler reads 143 and requeues."""
    run = tmp_path / "run"
    hold = tmp_path / "let-it-exit"
    job = Job(run, "--save-every", "1000", "--hold-exit", str(hold))
    job.until(r"step 3 \w+")
    job.send(signal.SIGTERM)
    stop = int(job.until(r"stopping (\d+)").group(1))
    job.until("exiting")  # the save is verified; the process is on its way out
    job.send(signal.SIGTERM)
    hold.touch()
    assert job.wait() == 128 + signal.SIGTERM, job.err
    _check_resumable(run, job, stop)


def test_sigterm_after_restoring_an_older_step_saves_the_new_trajectory(tmp_path: Path) -> None:
    """Issue 23 repro 10: a job restores step 20 of a run holding 20, 30, 40 and trains on
    another data order; SIGTERM at step 30 must save its step 30 (a step-30 directory of
    the abandoned trajectory exists), and the requeued job resumes that, never step 40."""
    run = tmp_path / "run"
    first = Job(run, "--steps", "40", "--save-every", "10", "--step-sleep", "0")
    assert first.wait() == 0, first.err
    assert [c.step for c in Catalog(run).list()] == [20, 30, 40]  # keep_last=3
    job = Job(run, "--restore-step", "20", "--data-seed", "1000", "--save-every", "1000",
              "--signal-at", "30")
    assert job.until(r"resumed (\d+) (\w+)").groups() == ("20", first.digests()[20])
    job.until(r"waiting 30")
    job.send(signal.SIGTERM)
    assert int(job.until(r"stopping (\d+)").group(1)) == 30
    assert job.wait() == 128 + signal.SIGTERM, job.err
    assert "saved and verified step-00000030" in job.err
    assert job.digests()[30] != first.digests()[30]  # another trajectory indeed
    assert _restored_digest(run) == (30, job.digests()[30])
    assert [c.step for c in Catalog(run).list()] == [20, 30]
    # The abandoned steps are set aside whole (kept for a post-mortem, never resumed).
    aside = run / ".ckptkit-abandoned" / "branch-001-from-step-00000020"
    assert sorted(p.name for p in aside.iterdir()) == ["step-00000030", "step-00000040"]
    for p in aside.iterdir():
        assert ckptkit.verify(p).ok


def test_sigkill_during_the_guards_save_leaves_a_clean_run(tmp_path: Path) -> None:
    """The scheduler's hard kill lands while the guard saves: nothing is damaged; the
    run resumes from a verified checkpoint (the new one or the previous)."""
    run = tmp_path / "run"
    job = Job(run, "--save-every", "4", "--width", "1024")
    job.until(r"saved 4")
    job.send(signal.SIGTERM)
    job.until(r"stopping (\d+)")
    time.sleep(0.05)
    job.send(signal.SIGKILL)
    assert job.wait() == -signal.SIGKILL
    with ckptkit.CheckpointManager(run) as mgr:  # a writer: cleans the interrupted save
        assert all(c.status in ("verified", "committed") for c in mgr.list())
        assert not mgr.leftovers()
    step, got = _restored_here(run, 1024)
    assert step >= 4 and got == job.digests()[step]
    assert ckptkit.verify(run).ok


def test_deadline_exits_when_the_step_never_ends(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = Job(run, "--save-every", "5", "--stall-at", "7", "--deadline", "1.5")
    job.until(r"stalling 7")
    t0 = time.monotonic()
    job.send(signal.SIGTERM)
    assert job.wait() == 128 + signal.SIGTERM, job.err
    took = time.monotonic() - t0
    assert 1.0 < took < 30, took
    assert "no step boundary within the 1.5s deadline" in job.err
    _check_resumable(run, job, 5)  # the last periodic save; step 7 was never finished


def test_deadline_too_short_for_a_save_skips_it(tmp_path: Path) -> None:
    """A save that would not end before the deadline is not started: the job exits at
    once and resumes from the newest verified checkpoint."""
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=4)
    mgr = ckptkit.CheckpointManager(tmp_path)
    mgr.save(ts)
    mgr.wait()
    mgr.last_save.total = 30.0  # as if saves of this run took 30 s
    ts.step = 5
    with ckptkit.PreemptionGuard(mgr, ts, deadline=10.0) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop()
        out = guard.checkpoint()
    assert not out.saved and out.step == 4 and out.exit_code == 143
    assert "no time to save step 5" in out.reason and "the last save took 30.0s" in out.reason
    assert [c.step for c in mgr.list()] == [4]
    mgr.close()


def test_requeue_calls_scontrol(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "scontrol.log"
    fake = bindir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    job = Job(tmp_path / "run", "--requeue", env=env)
    job.until(r"step 3 \w+")
    job.send(signal.SIGUSR1)
    assert job.wait() == 128 + signal.SIGUSR1, job.err
    assert log.read_text().split() == ["requeue", "4242"]
    assert "requeued SLURM job 4242" in job.err


def test_no_signal_no_change(tmp_path: Path) -> None:
    job = Job(tmp_path / "run", "--steps", "6", "--save-every", "3")
    assert job.wait() == 0, job.err
    assert job.seen[-1] == "finished"
    assert _newest(tmp_path / "run").step == 6


@pytest.mark.slow
@pytest.mark.distributed
def test_a_signal_to_one_rank_stops_every_rank_at_one_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    jobs = [
        Job(run, "--world", "2", "--rank", str(r), "--port", port, "--save-every", "1000")
        for r in range(2)
    ]
    jobs[1].until(r"step 4 \w+")
    jobs[1].send(signal.SIGTERM)  # only rank 1 is told
    stops = [int(j.until(r"stopping (\d+)").group(1)) for j in jobs]
    codes = [j.wait() for j in jobs]
    assert codes == [143, 143], [j.err for j in jobs]
    assert stops[0] == stops[1]
    newest = _newest(run)
    assert newest.step == stops[0] and ckptkit.verify(newest.path).ok
    assert jobs[0].digests()[stops[0]] == jobs[1].digests()[stops[0]]


def test_guard_api_in_process(tmp_path: Path) -> None:
    """Handlers come and go with the guard; a stop saves, verifies and exits."""
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=3)
    mgr = ckptkit.CheckpointManager(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    with ckptkit.PreemptionGuard(mgr, ts) as guard:
        assert signal.getsignal(signal.SIGTERM) is not before
        assert not guard.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested and guard.should_stop() and guard.exit_code == 143
        with pytest.raises(SystemExit) as ei:
            guard.stop()
    assert ei.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before
    newest = _newest(tmp_path)
    assert newest.step == 3


def test_guard_outside_the_main_thread_is_refused(tmp_path: Path) -> None:
    mgr = ckptkit.CheckpointManager(tmp_path)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            ckptkit.PreemptionGuard(mgr, None).install()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])
