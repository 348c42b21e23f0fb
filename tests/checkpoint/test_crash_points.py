"""A writer stopped dead at every named point of a save, on every store and in both modes.

Each case is a real process (forked from a warmed zygote) that opens a run holding steps 1
and 2 (``keep_last=2``; copied from a template saved once per store) and saves step 3 with
``CKPTKIT_CRASH_AT`` naming one point of :mod:`ckptkit.crashpoints`: the process ends there with ``os._exit`` (what a SIGKILL or a
power loss leaves: no ``finally``, no flush). Its exit status proves the point was reached,
so no case passes vacuously. Then, from this process and from a fresh one:

* every checkpoint that looks committed verifies from its bytes;
* step 3 is committed exactly when the stop came after its commit point (the rename on a
  local disk, the manifest's upload on an object store), and nothing committed before was
  lost: the run is exactly as before, or holds the ``keep_last`` newest;
* ``latest``, where it exists, names a committed checkpoint;
* a restore in a fresh process picks the newest committed checkpoint and brings back its
  weights bitwise; on a local disk that process then saves step 4 (the dead writer's lock
  and leftovers are taken over).

The order in which a save passes the points is not assumed: a traced save of step 3 with
no stop (``CKPTKIT_CRASH_TRACE``) records it per store and mode, and every point this test
parametrizes over must appear in it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from ckptkit import crashpoints
from ckptkit.checkpoint.catalog import LATEST, STEP_RE
from ckptkit.storage import atomic, fs
from ckptkit.verify.runner import verify_one

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEEP_LAST = 2

_MODEL = """
import json, os, sys
import torch
import ckptkit
import ckptkit.storage.upload

# 5 MiB parts (S3's smallest): the 12 MiB model file goes up in three, so a stop
# between parts is a case like any other.
ckptkit.storage.upload.PART_SIZE = 5 << 20

def model_at(step):
    torch.manual_seed(step)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1536, bias=False) for _ in range(2)])
"""

WRITER = _MODEL + """
root, mode, steps = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
arm = dict(a.split("=", 1) for a in sys.argv[4:])  # set only for the last save
mgr = ckptkit.CheckpointManager(root, keep_last=2)
for step in steps:
    if step == steps[-1]:
        os.environ.update(arm)
    mgr.save(ckptkit.TrainState(model=model_at(step), step=step), async_=mode == "async")
    mgr.wait()
mgr.close()
"""

RESTARTER = _MODEL + """
root, save_next = sys.argv[1], sys.argv[2] == "1"
model = model_at(0)
mgr = ckptkit.CheckpointManager(root, keep_last=2)
res = mgr.restore(ckptkit.TrainState(model=model))
want = model_at(res.step).state_dict() if res is not None else {}
bitwise = all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
if save_next:
    mgr.save(ckptkit.TrainState(model=model_at(4), step=4))
mgr.close()
print(json.dumps({"step": res.step if res is not None else None, "bitwise": bitwise}))
"""

FRAMEWORK_ONLY = ("framework.files",)
"""Points only a framework's save passes (tests/integrations/test_crash_matrix.py stops there;
native saves pass settle.begin and settle.adopted too, in Run.settle)."""
LOCAL_POINTS = [p for p in crashpoints.POINTS if p not in ("upload.part", *FRAMEWORK_ONLY)]
S3_POINTS = [
    p for p in crashpoints.POINTS if p not in ("commit.renamed", "index.tmp_written", *FRAMEWORK_ONLY)
]
COMMIT_POINT = {"local": "commit.renamed", "s3": "commit.manifest_written"}
"""The first point at which step 3 is committed: after the rename locally, after the
manifest (written last, in place) on an object store."""


def _cases() -> Iterator[object]:
    for store, points in (("local", LOCAL_POINTS), ("s3", S3_POINTS)):
        for mode in ("sync", "async"):
            for point in points:
                yield pytest.param(store, mode, point, id=f"{store}-{mode}-{point}")


@pytest.fixture(scope="module")
def runs(zygote) -> Iterator[dict[object, object]]:
    """Per module: the template run of each store, and the order of points per store and mode."""
    yield {}


def _root(store: str, tmp_path: Path, request: pytest.FixtureRequest, name: str) -> str:
    if store == "local":
        return str(tmp_path / name)
    return f"{request.getfixturevalue('s3_run')}-{name}"


def _run_with_two_steps(zygote, runs, store: str, tmp_path: Path, request, name: str) -> str:
    """A run holding steps 1 and 2, verified and recorded, as a writer left it."""
    if store not in runs:
        template = _root(store, tmp_path, request, "template")
        r = zygote.run(WRITER, template, "sync", "1,2")
        assert r.returncode == 0, r.stderr
        runs[store] = template
    root = _root(store, tmp_path, request, name)
    if store == "local":
        shutil.copytree(runs[store], root)
    else:
        s3 = fsspec.filesystem("s3")
        s3.copy(runs[store].removeprefix("s3://"), root.removeprefix("s3://"), recursive=True)
        s3.invalidate_cache()
    return root


def _committed(root: str) -> set[int]:
    loc = fs.location(root)
    if fs.kind(loc) != "dir":
        return set()
    return {
        int(m.group(1))
        for p in loc.iterdir()
        if (m := STEP_RE.match(p.name)) and atomic.is_committed(p)
    }


def _order(zygote, runs, store: str, mode: str, tmp_path: Path, request) -> list[str]:
    """The points a save of step 3 passes, in order (a traced save that does not stop)."""
    if (store, mode) not in runs:
        root = _run_with_two_steps(zygote, runs, store, tmp_path, request, f"trace-{mode}")
        log = tmp_path / "trace.log"
        r = zygote.run(WRITER, root, mode, "3", f"{crashpoints.TRACE_ENV}={log}")
        assert r.returncode == 0, r.stderr
        runs[store, mode] = [line.split()[0] for line in log.read_text().splitlines()]
    return runs[store, mode]  # type: ignore[return-value]


@pytest.mark.parametrize(("store", "mode", "point"), list(_cases()))
def test_stop_at_a_named_point(
    store: str, mode: str, point: str, zygote, runs, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    order = _order(zygote, runs, store, mode, tmp_path, request)
    assert point in order, f"a {store} {mode} save never reaches {point}: {order}"
    commits = order.index(point) >= order.index(COMMIT_POINT[store])

    root = _run_with_two_steps(zygote, runs, store, tmp_path, request, "run")
    r = zygote.run(WRITER, root, mode, "3", f"{crashpoints.ENV}={point}")
    assert r.returncode == crashpoints.EXIT_CODE, f"did not stop at {point}:\n{r.stderr}"

    after = _committed(root)
    for s in after:
        rep = verify_one(fs.location(root) / f"step-{s:08d}", progress=False)
        assert rep.ok, f"step {s} looks committed but fails verify: {rep.errors}"
    if commits:
        assert 3 in after, f"stopped at {point}, after the commit, yet step 3 is not committed"
        assert {2, 3} <= after <= {1, 2, 3}, f"lost committed checkpoints: {after}"
    else:
        assert after == {1, 2}, f"stopped at {point}, before the commit, yet the run is {after}"
    latest = fs.location(root) / LATEST
    if fs.kind(latest) == "file":
        name = fs.read_small(latest, 4096).decode().strip()
        assert int(name.split("-")[1]) in after, f"latest names {name}, not committed"

    # A restart: a fresh process restores the newest committed step, bitwise, and (on a
    # local disk) goes on saving.
    save_next = store == "local"
    r = zygote.run(RESTARTER, root, "1" if save_next else "0")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"step": max(after), "bitwise": True}, (point, got, r.stderr)
    if save_next:
        assert 4 in _committed(root)
        assert not [p for p in Path(root).iterdir() if atomic.is_temporary(p)]


def test_the_kth_time_a_point_is_reached(zygote, tmp_path: Path) -> None:
    """``NAME@K`` stops at the K-th pass: the second file's write of a two-file save."""
    src = """
    import os, torch, ckptkit
    state = {"a": torch.zeros(4), "b": {"c": torch.ones(4)}}
    ckptkit.save(state, "one", step=1, shard_bytes=16)
    """
    env = {crashpoints.ENV: "commit.file_written@2", crashpoints.TRACE_ENV: str(tmp_path / "t")}
    r = zygote.run(src, env=env, cwd=tmp_path)
    assert r.returncode == crashpoints.EXIT_CODE, r.stderr
    reached = [line.split()[0] for line in (tmp_path / "t").read_text().splitlines()]
    assert reached.count("commit.file_written") == 2
    assert not (tmp_path / "one").exists()
