"""The lease's takeover rules, job identities and waiting, without an object store server
(memory://: the generation-check path of the conditional writes). The S3 behaviour across
real processes is in tests/storage/test_lease_requeue.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
import uuid

import pytest

from ckptkit.errors import LockHeldError
from ckptkit.storage import fs, proc
from ckptkit.storage.fs import location
from ckptkit.storage.lease import (
    LOCK_NAME,
    Job,
    Lease,
    LeaseLock,
    current_job,
    read_lease,
    why_take_over,
)

ME = proc.this_process()
NOW = time.time()


def _lease(**kw: object) -> Lease:
    base = dict(holder="h", pid=ME.pid, host=ME.host, fence=3, acquired=NOW, expires=NOW + 60)
    return Lease(**{**base, **kw})  # type: ignore[arg-type]


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped (as a SIGKILLed holder's is)."""
    p = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(p.stdout)


def _take(held: Lease, job: Job | None) -> str | None:
    return why_take_over(held, me=ME, job=job, now=NOW, grace=5)


SLURM = Job("slurm:42", 1, "SLURM_JOB_ID")


def test_expired_lease_is_taken_over_by_anyone() -> None:
    held = _lease(host="gpu-node-9", expires=NOW - 30)
    assert "stopped renewing its lease" in (_take(held, None) or "")


def test_earlier_attempt_of_the_same_job_is_taken_over_anywhere() -> None:
    held = _lease(host="gpu-node-9", pid=7, job="slurm:42", attempt=0)
    assert "the job was requeued" in (_take(held, SLURM) or "")


def test_same_attempt_of_the_same_job_on_another_host_waits() -> None:
    # Another node of the same allocation (or torchelastic round): not a previous incarnation.
    held = _lease(host="gpu-node-9", pid=7, job="slurm:42", attempt=1)
    assert _take(held, SLURM) is None
    assert _take(dataclasses.replace(held, attempt=2), SLURM) is None


def test_same_job_without_attempt_numbers_is_taken_over() -> None:
    held = _lease(host="gpu-node-9", pid=7, job="train-7")
    assert "which this process restarts" in (
        _take(held, Job("train-7", None, "CKPTKIT_JOB_ID")) or ""
    )


def test_another_job_on_another_host_waits_for_expiry() -> None:
    held = _lease(host="gpu-node-9", pid=7, job="slurm:41", attempt=0)
    assert _take(held, SLURM) is None
    assert _take(held, None) is None


def test_a_live_holder_on_this_host_is_never_taken_even_by_its_own_job() -> None:
    held = _lease(job="slurm:42", attempt=0, boot=ME.boot, pidns=ME.pidns, started=ME.started)
    assert _take(held, SLURM) is None  # this very process: a second writer in it
    assert _take(held, None) is None


def test_a_dead_holder_on_this_host_is_taken_over_whatever_its_job() -> None:
    pid = _dead_pid()
    held = _lease(pid=pid, job="slurm:41", attempt=0, boot=ME.boot, pidns=ME.pidns)
    assert _take(held, SLURM) == f"its process (pid {pid} on this host) no longer exists"


@pytest.mark.skipif(ME.started is None, reason="needs /proc to read process start times")
def test_a_reused_pid_does_not_keep_a_dead_holder_alive() -> None:
    held = _lease(started=ME.started + 1, boot=ME.boot, pidns=ME.pidns)  # type: ignore[operator]
    assert "now this process" in (_take(held, None) or "")


@pytest.mark.skipif(ME.boot is None, reason="needs a kernel boot id")
def test_a_rebooted_host_proves_its_holder_dead() -> None:
    held = _lease(boot=str(uuid.uuid4()))
    assert "rebooted" in (_take(held, None) or "")


@pytest.mark.skipif(ME.pidns is None, reason="needs /proc/self/ns/pid")
def test_a_holder_in_another_pid_namespace_cannot_be_proven_dead() -> None:
    held = _lease(pid=_dead_pid(), pidns="pid:[1]", boot=ME.boot)  # another container here
    assert _take(held, None) is None


@pytest.mark.parametrize(
    ("env", "job"),
    [
        ({"CKPTKIT_JOB_ID": "run-7", "SLURM_JOB_ID": "1"}, Job("run-7", None, "CKPTKIT_JOB_ID")),
        ({"SLURM_JOB_ID": "9"}, Job("slurm:9", 0, "SLURM_JOB_ID")),
        (
            {
                "SLURM_JOB_ID": "9",
                "SLURM_ARRAY_JOB_ID": "8",
                "SLURM_ARRAY_TASK_ID": "3",
                "SLURM_RESTART_COUNT": "2",
            },
            Job("slurm:8_3", 2, "SLURM_ARRAY_JOB_ID"),
        ),
        ({"TORCHELASTIC_RUN_ID": "none"}, None),  # torchrun's default id names no job
        (
            {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "1"},
            Job("torchelastic:r1", 1, "TORCHELASTIC_RUN_ID"),
        ),
        (
            {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-x7k2p"},
            Job("k8s-pod:train-x7k2p", None, "HOSTNAME (Kubernetes pod)"),
        ),
        ({"HOSTNAME": "laptop"}, None),
    ],
)
def test_job_identity_from_the_environment(env: dict[str, str], job: Job | None) -> None:
    assert current_job(env) == job


def test_an_explicit_job_wins() -> None:
    assert current_job({"SLURM_JOB_ID": "9"}, explicit="mine") == Job("mine", None, "argument")


def test_a_lease_written_before_issue_24_still_reads() -> None:
    root = location(f"memory://lease-{uuid.uuid4().hex[:8]}/run")
    old = {"holder": "h", "pid": 5, "host": "n1", "fence": 2, "acquired": NOW, "expires": NOW + 9}
    fs.replace_bytes(root / LOCK_NAME, json.dumps(old).encode())
    held = read_lease(root)
    assert held is not None and (held.job, held.started, held.fence) == (None, None, 2)


def test_the_lease_records_job_and_process() -> None:
    root = location(f"memory://lease-{uuid.uuid4().hex[:8]}/run")
    with LeaseLock(root, job="run-7"):
        stored = json.loads(fs.read_small(root / LOCK_NAME, 1 << 16))
    assert (stored["job"], stored["pid"], stored["host"], stored["started"]) == (
        "run-7",
        ME.pid,
        ME.host,
        ME.started,
    )
    assert read_lease(root) is None  # released: deleted


def test_waiting_names_the_holder_and_the_time_left(caplog: pytest.LogCaptureFixture) -> None:
    root = location(f"memory://lease-{uuid.uuid4().hex[:8]}/run")
    with LeaseLock(root, job="job-a"):
        waiter = LeaseLock(root, timeout=0.3, poll=0.05, progress_every=0.1, job="job-b")
        with caplog.at_level(logging.WARNING, logger="ckptkit"), pytest.raises(LockHeldError) as ei:
            waiter.acquire()
    notes = [r.getMessage() for r in caplog.records if "waiting for the run lock" in r.getMessage()]
    assert notes, "a wait must be logged"
    assert f"held by pid {ME.pid} on host {ME.host} (job job-a)" in notes[0]
    assert "giving up in" in notes[0] and "lock_timeout 0.3 s" in notes[0]
    assert "after waiting 0.3 s" in str(ei.value) and "lease expires in" in str(ei.value)


def test_release_keeps_a_lease_someone_else_took_over() -> None:
    root = location(f"memory://lease-{uuid.uuid4().hex[:8]}/run")
    lock = LeaseLock(root)
    mine = lock.acquire()
    other = dataclasses.replace(mine, holder="other", fence=mine.fence + 1)
    fs.replace_bytes(root / LOCK_NAME, json.dumps(dataclasses.asdict(other)).encode())
    assert not lock.renew()  # the conditional renew sees another version: the lock is lost
    with pytest.raises(LockHeldError, match="lock was lost"):
        lock.check()
    lock.release()
    held = read_lease(root)
    assert held is not None and held.holder == "other"


def test_a_lost_create_race_reads_the_lease_again_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer created the lease between our read and our create, then released it:
    the next read judges what is there now (free: taken), with no wait logged for "an
    object that is not a lease" and no refusal at ``timeout=0``."""
    root = location(f"memory://lease-{uuid.uuid4().hex[:8]}/run")
    real = fs.put_if_absent
    lost: list[str] = []

    def racing(path: object, data: bytes) -> bool:
        if not lost:
            lost.append(str(path))  # the other writer won this create, and has released since
            return False
        return real(path, data)  # type: ignore[arg-type]

    notes: list[str] = []
    monkeypatch.setattr(fs, "put_if_absent", racing)
    monkeypatch.setattr(proc, "note_waiting", lambda url, who, **kw: notes.append(who))
    for timeout in (0.0, 5.0):
        lost.clear()
        lock = LeaseLock(root, timeout=timeout, poll=0.05)
        assert lock.acquire() is not None, timeout
        lock.release()
        assert lost and notes == [], (timeout, notes)
