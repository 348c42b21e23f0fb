"""Issue 23 item 12: ``verify RUN`` while a live run rotates reports no false errors.

A checkpoint that rotation deletes between verify's listing and its reading (or while it is
read: on an object store the manifest goes first, then the other objects one by one) was
reported as damage (CK-M001, CK-F001 ...). It is gone, not damaged: ``CK-F020`` (info), and
the run verifies. Real damage (a file missing under a manifest that is still there) stays an
error.

The deletion happens at a named point through a hook on verify's own functions (no timing),
as rotation deletes: locally ``Catalog.remove`` (rename away, then remove); on the moto S3
endpoint the manifest, then the other objects, through a filesystem object of its own, as
the rotating process would (so verify's cached listings do not learn of it).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
import pytest
import torch

import ckptkit
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import Catalog, step_dir_name
from ckptkit.format import manifest as mf
from ckptkit.storage import atomic, fs
from ckptkit.storage.fs import Location
from ckptkit.verify import runner

pytestmark = pytest.mark.integration

WHERE = ["local", pytest.param("s3", marks=pytest.mark.s3)]


def _save_run(url: str) -> None:
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4), step=0)
    with ckptkit.CheckpointManager(url, keep_last=10) as mgr:
        for s in (1, 2, 3):
            ts.step = s
            mgr.save(ts)


@pytest.fixture(scope="module")
def saved_runs() -> dict[str, str]:
    """The run each case copies, by place: saved at its first use, once per module (ckptkit's
    own writes through moto take seconds a run; server-side copies a fraction of that)."""
    return {}


@pytest.fixture(params=WHERE)
def run(
    request: pytest.FixtureRequest,
    tmp_path: Any,
    tmp_path_factory: pytest.TempPathFactory,
    saved_runs: dict[str, str],
) -> Location:
    """A run with steps 1, 2, 3 (local, or on the S3 endpoint): a copy of one saved once."""
    where = request.param
    url = request.getfixturevalue("s3_run") if where == "s3" else str(tmp_path / "run")
    s3 = fsspec.filesystem("s3") if where == "s3" else None
    if where not in saved_runs:
        if s3 is None:
            saved_runs[where] = str(tmp_path_factory.mktemp("saved") / "run")
        else:
            bucket = f"saved-rotation-{uuid.uuid4().hex[:8]}"
            s3.mkdir(bucket)
            saved_runs[where] = f"s3://{bucket}/run"
        _save_run(saved_runs[where])
    if s3 is None:
        shutil.copytree(saved_runs[where], url)
    else:
        src, dst = saved_runs[where].removeprefix("s3://"), url.removeprefix("s3://")
        for key in s3.find(src):  # server-side copies, object by object
            s3.copy(key, dst + key.removeprefix(src))
        s3.invalidate_cache()
    return fs.location(url)


def _other_process_s3() -> Any:
    """The rotating process's own S3 filesystem (not this process's cached instance)."""
    return fsspec.filesystem("s3", skip_instance_cache=True)


def _rotate(run: Location, step: int) -> None:
    """What rotation of the live run does to ``step`` (``Catalog.remove``'s order)."""
    ck = run / step_dir_name(step)
    if fs.is_local(run):
        assert Catalog(run).remove(ck)
        return
    s3 = _other_process_s3()
    s3.rm_file(f"{ck.path}/{atomic.MANIFEST_NAME}")
    s3.rm(ck.path, recursive=True)


def _half_rotate(run: Location, step: int) -> None:
    """Rotation caught mid-delete: the manifest (the commit marker) is gone, and so is one
    other file, but the rest is still there (an object store deletes object by object)."""
    ck = run / step_dir_name(step)
    if fs.is_local(run):
        _rotate(run, step)  # a local delete renames the directory away first: all or nothing
        return
    s3 = _other_process_s3()
    s3.rm_file(f"{ck.path}/{atomic.MANIFEST_NAME}")
    s3.rm_file(f"{ck.path}/model.safetensors")
    assert s3.find(ck.path)  # other objects remain under the prefix


def _verdicts(res: Any) -> dict[str, list[str]]:
    return {str(r.path).rstrip("/").rsplit("/", 1)[-1]: [f.code for f in r.findings]
            for r in res.reports}


def _after(monkeypatch: pytest.MonkeyPatch, where: str, target: str,
           act: Callable[[], None]) -> None:
    """Run ``act`` once, at verify's ``where``: after it listed the run, just before it
    checks ``target`` ("listing"), or right after it read ``target``'s manifest."""
    done: list[bool] = []
    if where == "listing":
        real_one = runner.verify_one

        def one(path: Location, **kw: Any) -> Any:
            if not done and str(path).rstrip("/").endswith(target):
                done.append(True)
                act()
            return real_one(path, **kw)

        monkeypatch.setattr(runner, "verify_one", one)
        return
    real_read = manifest_io.read

    def read(ckpt: Any, **kw: Any) -> mf.Manifest:
        m = real_read(ckpt, **kw)
        if not done and str(ckpt).rstrip("/").endswith(target):
            done.append(True)
            act()
        return m

    monkeypatch.setattr(manifest_io, "read", read)


def test_deleted_between_listing_and_reading_is_gone_not_damage(
    run: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    _after(monkeypatch, "listing", step_dir_name(1), lambda: _rotate(run, 1))
    res = ckptkit.verify(run)
    v = _verdicts(res)
    assert v[step_dir_name(1)] == ["CK-F020"], v
    assert v[step_dir_name(2)] == [] and v[step_dir_name(3)] == []
    assert res.ok


@pytest.mark.parametrize("how", ["whole", "half"])
def test_deleted_while_being_read_is_gone_not_damage(
    run: Location, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    delete = _rotate if how == "whole" else _half_rotate
    _after(monkeypatch, "manifest", step_dir_name(1), lambda: delete(run, 1))
    res = ckptkit.verify(run)
    v = _verdicts(res)
    assert v[step_dir_name(1)] == ["CK-F020"], v
    assert [r.gone for r in res.reports] == [True, False, False]
    assert res.ok


def test_a_missing_file_under_a_manifest_that_is_still_there_is_damage(run: Location) -> None:
    fs.remove_file(run / step_dir_name(1) / "model.safetensors")
    v = _verdicts(ckptkit.verify(run))
    assert "CK-F001" in v[step_dir_name(1)] and "CK-F020" not in v[step_dir_name(1)]
