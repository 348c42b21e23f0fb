"""The run lease on a real S3 endpoint (moto server) across a requeue (issue 24, item 3).

Reproduction: a SLURM or Kubernetes requeue restarts a SIGKILLed writer within the lease's
ttl. The restart restored, trained, and crashed at its first save with ``LockHeldError …
lease expires in 54 s``, and a fast requeue crash-looped until the lease expired. Now a
restart of the same job, or of a holder proven dead, takes over at open; any other live
writer is refused at open, before any training; a renew never overwrites a new holder.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import pytest
import torch

import ckptkit
from ckptkit.storage import fs as fsmod
from ckptkit.storage.fs import location
from ckptkit.storage.lease import LOCK_NAME, LeaseLock, read_lease

pytestmark = [pytest.mark.integration, pytest.mark.s3]

# Environment variables that give a process a job identity (ckptkit.storage.lease.current_job):
# each test sets exactly the ones it means, whatever the machine running the tests has.
JOB_VARS = (
    "CKPTKIT_JOB_ID",
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "KUBERNETES_SERVICE_HOST",
)

# Saves step 1, says so, then "trains" (holds the lease, renewing it) until killed.
HOLDER = textwrap.dedent(
    """
    import sys, torch, ckptkit
    mgr = ckptkit.CheckpointManager(sys.argv[1], lease_ttl=60)
    mgr.save(ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=1))
    mgr.wait()
    print("saved", flush=True)
    sys.stdin.read()
    """
)

# The restart: opens the run (lock_timeout 0: it must not need to wait), resumes, saves.
RESTART = textwrap.dedent(
    """
    import sys, torch, ckptkit
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=0)
    mgr = ckptkit.CheckpointManager(sys.argv[1], lease_ttl=60)
    res = mgr.restore(ts)
    print("resumed", res.step, flush=True)
    ts.step = res.step + 1
    mgr.save(ts)
    mgr.close()
    print("saved", ts.step, flush=True)
    """
)


def _env(**job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    return {**env, **job, "CKPTKIT_NO_PROGRESS": "1"}


@pytest.fixture
def no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in JOB_VARS:
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def holders() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start writers that hold a run's lease (``HOLDER``); every one is killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(url: str, **job: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(**job),
        )
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "saved"
        return p

    yield start
    for p in started:
        p.kill()
        p.wait(timeout=30)
        for f in (p.stdin, p.stdout):
            if f is not None:
                f.close()


def _kill(p: subprocess.Popen[str]) -> None:
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)


def _lease_json(url: str) -> dict[str, Any]:
    s3 = fsspec.filesystem("s3", skip_instance_cache=True)
    return dict(json.loads(s3.cat_file(f"{url.removeprefix('s3://')}/{LOCK_NAME}")))


def _restart(url: str, **job: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RESTART, url],
        capture_output=True,
        text=True,
        env=_env(**job),
        timeout=180,
    )


def test_requeued_job_takes_over_at_once(s3_run: str, holders: Any) -> None:
    first = holders(s3_run, SLURM_JOB_ID="4242")
    _kill(first)  # the requeue: SIGKILL, well inside the 60 s lease
    # The killed incarnation ran on another node: its pid cannot be checked from here, only
    # the job identity says the restart may take its lease.
    lease = _lease_json(s3_run)
    recorded = (lease["pid"], lease.get("job"), lease.get("attempt"))
    lease.update(host="gpu-node-a", boot=None, pidns=None, started=None)
    fsspec.filesystem("s3", skip_instance_cache=True).pipe_file(
        f"{s3_run.removeprefix('s3://')}/{LOCK_NAME}", json.dumps(lease).encode()
    )
    res = _restart(s3_run, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:2] == ["resumed 1", "saved 2"]
    assert (
        f"took over the run lock of pid {first.pid} on host gpu-node-a (job slurm:4242, "
        "attempt 0)" in res.stderr
    )
    assert "the job was requeued" in res.stderr
    assert [c.step for c in ckptkit.CheckpointManager(s3_run, readonly=True).list()] == [1, 2]
    assert recorded == (first.pid, "slurm:4242", 0)  # the lease names the holder's job


def test_a_proven_dead_holder_on_this_host_is_taken_over(
    s3_run: str, holders: Any, no_job: None, caplog: pytest.LogCaptureFixture
) -> None:
    first = holders(s3_run)  # no scheduler, no job identity
    _kill(first)
    with caplog.at_level(logging.WARNING, logger="ckptkit"):
        mgr = ckptkit.CheckpointManager(s3_run, lease_ttl=60)  # lock_timeout 0: no waiting
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=0)
    res = mgr.restore(ts)
    assert res is not None and res.step == 1
    ts.step = 2
    mgr.save(ts)
    mgr.close()
    assert f"took over the run lock of pid {first.pid}" in caplog.text
    assert f"its process (pid {first.pid} on this host) no longer exists" in caplog.text


def test_another_live_writer_is_refused_at_open(
    s3_run: str, holders: Any, monkeypatch: pytest.MonkeyPatch, no_job: None
) -> None:
    first = holders(s3_run, CKPTKIT_JOB_ID="job-a")
    monkeypatch.setenv("CKPTKIT_JOB_ID", "job-b")
    with pytest.raises(ckptkit.LockHeldError) as ei:
        ckptkit.CheckpointManager(s3_run)  # refused here, before any training
    msg = str(ei.value)
    assert f"run is locked by pid {first.pid}" in msg and "(job job-a)" in msg
    assert "lease expires in" in msg and "this process is job job-b" in msg
    # The same job identity does not take a holder that is provably alive (a second
    # writer of one job on this host): refused too, saying why.
    monkeypatch.setenv("CKPTKIT_JOB_ID", "job-a")
    with pytest.raises(ckptkit.LockHeldError, match="belongs to this job"):
        ckptkit.CheckpointManager(s3_run)
    # Readers are never refused.
    assert [c.step for c in ckptkit.CheckpointManager(s3_run, readonly=True).list()] == [1]
    assert _lease_json(s3_run)["pid"] == first.pid


@pytest.mark.parametrize("store", ["s3", "memory"])
def test_a_renew_never_overwrites_a_new_holder(
    s3_run: str, store: str, monkeypatch: pytest.MonkeyPatch, no_job: None
) -> None:
    """A renew that races a takeover (the new holder's lease lands between the old holder's
    last look and its write) must fail, and the old holder's fence check must raise."""
    url = s3_run if store == "s3" else f"memory://renew-{os.getpid()}/{s3_run.rsplit('/', 2)[-2]}"
    root = location(url)
    old = LeaseLock(root, ttl=0.6)  # renews every 0.2 s
    mine = old.acquire()
    real_bytes = fsmod.replace_bytes
    real_if_match = getattr(fsmod, "replace_if_match", None)  # absent before issue 24
    new_holder = json.dumps(
        {
            "holder": "new-holder",
            "pid": 1,
            "host": "gpu-node-b",
            "fence": mine.fence + 1,
            "acquired": 0.0,
            "expires": 4e9,
        }
    ).encode()
    taken, written = threading.Event(), threading.Event()

    def racing(real: Callable[..., Any]) -> Callable[..., Any]:
        def write(target: fsmod.Location, data: bytes, *rest: Any) -> Any:
            if str(target).endswith(LOCK_NAME) and not taken.is_set():
                real_bytes(target, new_holder)  # the takeover lands first
                taken.set()
                try:
                    return real(target, data, *rest)  # then the old holder's renew
                finally:
                    written.set()
            return real(target, data, *rest)

        return write

    monkeypatch.setattr(fsmod, "replace_bytes", racing(real_bytes))
    if real_if_match is not None:
        monkeypatch.setattr(fsmod, "replace_if_match", racing(real_if_match))
    try:
        assert written.wait(60), "the holder never renewed its lease"
        stored = read_lease(root)
        assert stored is not None and stored.holder == "new-holder"
        with pytest.raises(ckptkit.LockHeldError, match="lock was lost: now held by pid 1"):
            old.check()
    finally:
        monkeypatch.undo()
        old.release()
    stored = read_lease(root)  # release deletes only its own lease
    assert stored is not None and stored.holder == "new-holder"
