"""Shared factories: tiny models, training states and saved checkpoints, all built in code."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from small_model import TinyLM, trained_state

import ckptkit

os.environ.setdefault("CKPTKIT_NO_PROGRESS", "1")

# Property tests judge inputs, never speed: a loaded CI machine must not fail them.
settings.register_profile(
    "ckptkit", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("ckptkit")

pytest_plugins = ["framework_checkpoints"]
"""The foreign checkpoints (Trainer, Accelerate, Lightning, DCP) written once per session."""

sys.path[:0] = [str(Path(__file__).parent / "ranks"), str(Path(__file__).parent / "scripts")]
"""The gloo workers and their launcher (tests/ranks/) and the training scripts (tests/scripts/),
imported by name by the tests of every layer (``from _launch import launch``,
``from preempt_script import digest``)."""

collect_ignore_glob = ["scripts/*.py", "crash_scripts/*.py", "ranks/*.py"]
"""Training scripts the tests run as ``python SCRIPT`` (drills, Trainer, Accelerate,
Lightning, the crash matrix's) and the gloo workers torchrun starts: some train at import,
so ``--doctest-modules`` must not import them (it trained a model into the working directory
at collection, and two pytest workers raced for its lock)."""

SMOKE = (
    "tests/checkpoint/test_commit_matrix.py::test_commit_matrix[tensors-gloo2-sync]",
    "tests/checkpoint/test_crash_points.py::test_stop_at_a_named_point[local-sync-commit.renamed]",
    "tests/drill/test_drill.py::test_clean_tiny_lm_drill_passes_bitwise",
    "tests/storage/test_object_store.py::test_round_trip_bitwise_in_a_fresh_process",
    "tests/integrations/test_lightning.py::"
    "test_a_clean_drill_passes_bitwise_across_an_epoch_boundary[trainer]",
    "tests/integrations/test_hf_drill.py::test_clean_drills_pass_bitwise[trainer-mid-epoch]",
)
"""One case of each heavy area, for the fast lane (``make check`` runs ``-m smoke`` after the
in-process tests): a gloo world-2 commit, a crash point, a drill, an S3 round trip and a
framework drill of each family. The whole suite (``make test``) runs them all."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    smoke = set(SMOKE)
    for item in items:
        if item.nodeid in smoke:
            item.add_marker(pytest.mark.smoke)
    _heaviest_files_first(items)
    if config.getoption("markexpr") == "smoke":  # the fast lane: a renamed case must not vanish
        ids = {item.nodeid for item in items}
        files = {i.split("::")[0] for i in ids}
        gone = [
            m for m in SMOKE
            if not (config.rootpath / m.split("::")[0]).exists()
            or (m.split("::")[0] in files and m not in ids)
        ]
        if gone:
            raise pytest.UsageError(f"tests/conftest.py SMOKE names tests that do not exist: {gone}")


def _heaviest_files_first(items: list[pytest.Item]) -> None:
    """Order the files by weight, heaviest first: those holding a ``slow`` test, then those
    marked ``integration``, then the in-process ones, each group in collection order.

    ``make test`` hands whole files to two workers in this order (``--dist loadfile``), and a
    heavy file handed out last kept one core busy for minutes after the other had finished.
    """
    rank: dict[str, int] = {}
    for item in items:
        where = item.nodeid.split("::")[0]
        weight = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("integration") else 2
        rank[where] = min(rank.get(where, 2), weight)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: in-file order kept


@pytest.fixture(scope="session", autouse=True)
def temp_files_under_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temporary directory the tests and the processes they start make (a failed drill
    keeps its runs for the user to read) goes under pytest's basetemp, which pytest prunes
    (the last three sessions stay), instead of piling up in /tmp."""
    tmp = tmp_path_factory.mktemp("tmpdir", numbered=False)
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    yield tmp
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture
def tiny_model() -> Callable[..., TinyLM]:
    def make(seed: int = 0, **kw: Any) -> TinyLM:
        torch.manual_seed(seed)
        return TinyLM(**kw)

    return make


@pytest.fixture
def train_state() -> Callable[..., dict[str, Any]]:
    return trained_state


@pytest.fixture
def saved_ckpt(tmp_path: Path) -> Callable[..., Path]:
    """Save a small training state under tmp_path and return the checkpoint directory."""

    def make(name: str = "ckpt", step: int = 3, **kw: Any) -> Path:
        d = tmp_path / name
        ckptkit.save(trained_state(), d, step=step, **kw)
        return d

    return make


# --- a real S3 endpoint ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real S3 HTTP endpoint: ``moto`` in server mode on a free local port.

    Started once per session as a subprocess (never a mock object in this process), with
    credentials and the endpoint given the standard way (``AWS_*`` environment variables,
    which boto, s3fs and subprocesses of the tests all read).
    """
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    # A filesystem object cached before the endpoint existed (no credentials, another
    # endpoint) must not be reused: fsspec caches S3FileSystem instances per arguments.
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield url
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def s3_run(s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    """A fresh ``s3://`` run URL in a fresh bucket on the session's S3 endpoint."""
    import re
    import uuid

    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    bucket = "t-" + re.sub(r"[^a-z0-9]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{bucket}-{uuid.uuid4().hex[:6]}"
    fs.mkdir(bucket)
    fsspec.filesystem("s3").invalidate_cache()
    return f"s3://{bucket}/run"


# --- warmed processes ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A warmed process forking a fresh process per case (``tests/zygote.py``), per module."""
    from zygote import Zygote

    z = Zygote(tmp_path_factory.mktemp("zygote"))
    try:
        yield z
    finally:
        z.close()


@pytest.fixture(scope="session")
def cli_zygote(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A warmed process for CLI runs (``cli_zygote.ckptkit(*args)``), one per test process.

    Session-scoped, unlike ``zygote``: a CLI run leaves nothing in the zygote (each run is a
    fork of it), so every module of a pytest worker shares it and pays its start (importing
    torch and ckptkit, then warming: ~5 s) once.
    """
    from zygote import Zygote

    z = Zygote(tmp_path_factory.mktemp("cli-zygote"))
    try:
        yield z
    finally:
        z.close()
