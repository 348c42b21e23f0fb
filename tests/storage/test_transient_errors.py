"""A read that fails for a reason that is not damage never marks a checkpoint corrupt
(issue 23, reproduction 5).

The issue: every ``OSError`` opening a shard became ``CK-F004``; restore recorded the
checkpoint corrupt in the run index, later restores skipped it unread, and ``prune
--delete-corrupt`` deleted it after the permission was fixed. Editing ``"ok": false`` into
the (unsigned) run index did the same.

A permission error is made with ``chmod 000`` when we are not root (root ignores
permissions); it is also simulated, always, by replacing ``os.open`` for that one file, in
this process and in the CLI's (through a small driver), so the tests run as root too.

The CLI runs in processes of its own: forks of a warmed zygote (tests/zygote.py), and once a
new ``python -m ckptkit``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from zygote import Result, Zygote, fresh_ckptkit

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint.catalog import INDEX, Catalog, step_dir_name
from ckptkit.format import signing
from ckptkit.storage import digest, tensors
from ckptkit.verify.runner import verify_one

pytestmark = pytest.mark.integration

STEPS = (10, 20, 30)
NEWEST = step_dir_name(STEPS[-1])
KEY = "transient-test-key-0123456789abcdef"
ROOT = os.geteuid() == 0

_DRIVER = """
import errno, os, sys
target = os.environ["CKPTKIT_TEST_UNREADABLE"]
real = os.open
def fake(path, *args, **kwargs):
    if os.fspath(path) == target:
        raise PermissionError(errno.EACCES, "Permission denied", target)
    return real(path, *args, **kwargs)
os.open = fake
from ckptkit.cli import main
main(sys.argv[1:], prog_name="ckptkit")
"""
"""Runs the CLI with ``os.open`` of one file failing with EACCES (as after ``chmod 000``)."""


def _state(seed: int = 0) -> ckptkit.TrainState:
    torch.manual_seed(seed)
    return ckptkit.TrainState(model=torch.nn.Linear(4, 4))


def _run(tmp: Path, *, key: str | None = None) -> Path:
    run = tmp / "run"
    ts = _state()
    with ckptkit.CheckpointManager(run, keep_last=10, key=key) as mgr:
        for s in STEPS:
            ts.step = s
            with torch.no_grad():
                ts.model.weight.add_(1.0)  # type: ignore[union-attr]
            mgr.save(ts)
    return run


def _shard(run: Path, name: str = NEWEST) -> Path:
    return run / name / "model.safetensors"


def _restore(run: Path, *, key: str | None = None) -> str:
    with ckptkit.CheckpointManager(run, keep_last=10, key=key) as mgr:
        res = mgr.restore(_state(1))
    assert res is not None
    return Path(str(res.path)).name


def _status(run: Path, *, key: str | None = None) -> dict[str, str]:
    cat = Catalog(run, key=signing.resolve_key(key) if key is not None else None)
    return {c.path.name: c.status for c in cat.list()}


def _record(run: Path, name: str = NEWEST) -> dict[str, object]:
    rec = json.loads((run / INDEX).read_text())["verified"][name]
    assert isinstance(rec, dict)
    return rec


def _cli(z: Zygote, *args: str, unreadable: Path | None = None) -> Result:
    """Run ``ckptkit ARGS`` in a fresh process (a fork of ``z``); with ``unreadable``, that
    file's open fails with EACCES there (the simulation of ``chmod 000`` that also holds for
    root)."""
    if unreadable is not None:
        env = {"CKPTKIT_TEST_UNREADABLE": str(unreadable)}
        return z.run(_DRIVER, *args, env=env, timeout=300)
    return z.ckptkit(*args, timeout=300)


@contextlib.contextmanager
def _failing_open(
    monkeypatch: pytest.MonkeyPatch, target: Path, err: int = errno.EACCES
) -> Iterator[None]:
    """``os.open`` of ``target`` fails with ``err`` in this process (every other open works)."""
    real = os.open

    def fake(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.fspath(path) == str(target):
            raise OSError(err, os.strerror(err), str(target))
        return real(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "open", fake)
        yield


@contextlib.contextmanager
def _unreadable(mode: str, monkeypatch: pytest.MonkeyPatch, target: Path) -> Iterator[None]:
    """``target`` cannot be read: by ``chmod 000`` or by a failing ``os.open``."""
    if mode == "simulated":
        with _failing_open(monkeypatch, target):
            yield
        return
    target.chmod(0)
    try:
        yield
    finally:
        target.chmod(0o644)


# --- (a) a permission error --------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "chmod", marks=pytest.mark.skipif(ROOT, reason="root ignores file permissions")
        ),
        "simulated",
    ],
)
def test_permission_error_is_unreadable_not_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, cli_zygote: Zygote
) -> None:
    run = _run(tmp_path)
    shard = _shard(run)
    with _unreadable(mode, monkeypatch, shard):
        assert _restore(run) == step_dir_name(20)  # falls back ...
        assert _status(run)[NEWEST] == "unreadable"  # ... and does not call it corrupt
        assert _record(run)["outcome"] == "unreadable" and _record(run)["ok"] is False
        # prune --delete-corrupt while it still cannot be read: kept (never deleted)
        proc = _cli(
            cli_zygote, "prune", str(run), "--keep-last", "1", "--delete-corrupt",
            unreadable=shard if mode == "simulated" else None,
        )
        assert proc.returncode == 0, proc.stderr
        assert shard.exists() and "unreadable now" in proc.stdout
        # a second restore tries it again (it is not skipped unread)
        assert _restore(run) == step_dir_name(20)
    # The permission is fixed: the next restore uses the newest, and records it verified.
    assert _restore(run) == NEWEST
    assert _status(run)[NEWEST] == "verified"
    proc = _cli(cli_zygote, "prune", str(run), "--keep-last", "1", "--delete-corrupt")
    assert proc.returncode == 0, proc.stderr
    assert shard.exists()


def test_unreadable_before_the_fix_is_not_deleted_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_zygote: Zygote
) -> None:
    """The reproduction's order: the failure is recorded, the permission fixed, then a
    ``prune --delete-corrupt`` runs (a fresh process) before any restore."""
    run = _run(tmp_path)
    with _failing_open(monkeypatch, _shard(run)):
        assert _restore(run) == step_dir_name(20)
    proc = _cli(cli_zygote, "prune", str(run), "--keep-last", "3", "--delete-corrupt")
    assert proc.returncode == 0, proc.stderr
    assert _shard(run).exists()
    assert _restore(run) == NEWEST


# --- (b) EIO ------------------------------------------------------------------------------


def test_eio_opening_a_shard_is_unreadable_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path)
    with _failing_open(monkeypatch, _shard(run), errno.EIO):
        rep = verify_one(run / NEWEST, progress=False)
        assert [f.code for f in rep.errors] == [codes.UNREADABLE]
        assert "now" in rep.errors[0].message
        assert _restore(run) == step_dir_name(20)
    assert _status(run)[NEWEST] == "unreadable"


def test_eio_in_the_middle_of_a_read_is_unreadable_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path)

    def eio(*args: object, **kwargs: object) -> object:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(digest, "hash_fd", eio)  # verify's digest pass
        rep = verify_one(run / NEWEST, progress=False)
        assert {f.code for f in rep.errors} == {codes.UNREADABLE}
    with monkeypatch.context() as m:
        m.setattr(tensors, "_read_plain", eio)  # restore's streaming read
        with ckptkit.CheckpointManager(run) as mgr, pytest.raises(
            ckptkit.IncompleteCheckpointError, match="CK-F025"
        ):
            mgr.restore(_state(1))  # every step fails the same way: none can be read now
    assert set(_status(run).values()) == {"unreadable"}
    assert _restore(run) == NEWEST  # the disk answers again: nothing was lost


def test_unreadable_manifest_is_unreadable_not_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path)
    with _failing_open(monkeypatch, run / NEWEST / "manifest.json"):
        assert _status(run)[NEWEST] == "unreadable"
        rep = verify_one(run / NEWEST, progress=False)
        assert [f.code for f in rep.errors] == [codes.UNREADABLE]
        with ckptkit.CheckpointManager(run) as mgr:
            mgr.prune(keep_last=1, delete_corrupt=True)
        assert (run / NEWEST).exists()


# --- (c) a forged verdict in the run index -----------------------------------------------


def _forge(run: Path, name: str = NEWEST, **fields: object) -> None:
    idx = json.loads((run / INDEX).read_text())
    idx["verified"][name].update(fields)
    (run / INDEX).write_text(json.dumps(idx))


def test_forged_corrupt_record_is_rechecked_by_restore(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _forge(run, ok=False, outcome="corrupt", problem="forged")
    assert _status(run)[NEWEST] == "corrupt"  # what the index claims, until re-checked
    assert _restore(run) == NEWEST  # re-read from its bytes: it verifies, so it is used
    assert _status(run)[NEWEST] == "verified"


def test_forged_corrupt_record_written_before_outcomes_had_names(
    tmp_path: Path, cli_zygote: Zygote
) -> None:
    run = _run(tmp_path)
    idx = json.loads((run / INDEX).read_text())
    rec = idx["verified"][NEWEST]
    idx["verified"][NEWEST] = {"digest": rec["digest"], "ok": False, "at": rec["at"],
                               "problem": "forged"}
    (run / INDEX).write_text(json.dumps(idx))
    assert _status(run)[NEWEST] == "corrupt"
    proc = _cli(cli_zygote, "prune", str(run), "--keep-last", "1", "--delete-corrupt")
    assert proc.returncode == 0, proc.stderr
    assert (run / NEWEST).exists() and "verified from its bytes" in proc.stdout
    assert _status(run)[NEWEST] == "verified"


def test_forged_corrupt_record_does_not_make_prune_delete(
    tmp_path: Path, cli_zygote: Zygote
) -> None:
    run = _run(tmp_path)
    _forge(run, ok=False, outcome="corrupt", problem="forged")
    proc = _cli(cli_zygote, "prune", str(run), "--keep-last", "1", "--delete-corrupt")
    assert proc.returncode == 0, proc.stderr
    assert (run / NEWEST).exists()
    assert not (run / step_dir_name(10)).exists()  # the policy still applies to the rest


def test_with_a_key_forged_records_count_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, key=KEY)
    assert isinstance(_record(run)["mac"], str)
    assert set(_status(run, key=KEY).values()) == {"verified"}  # its own records check
    # An unsigned "corrupt": not corrupt, and not verified either.
    _forge(run, ok=False, outcome="corrupt", problem="forged", mac=None)
    cat = Catalog(run, key=signing.resolve_key(KEY))
    info = {c.path.name: c for c in cat.list()}[NEWEST]
    assert info.status == "committed" and "does not count" in (info.problem or "")
    monkeypatch.setenv(signing.ENV_KEY, KEY)
    # A new interpreter (not a fork), the key in its environment from the start.
    proc = fresh_ckptkit("prune", run, "--keep-last", "1", "--delete-corrupt", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (run / NEWEST).exists()
    # A forged "verified" for a damaged checkpoint: not verified.
    shard = _shard(run, step_dir_name(20))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(data)
    rec = _record(run, step_dir_name(20))
    _forge(run, step_dir_name(20), ok=True, outcome="verified", mac=str(rec["mac"])[::-1])
    assert _status(run, key=KEY)[step_dir_name(20)] == "committed"
    # Without the key, the same index reads as it is written (records are advisory).
    assert _status(run)[step_dir_name(20)] == "verified"


# --- (d) real damage is still corrupt, and still deleted --------------------------------


def test_real_damage_is_still_corrupt_and_deleted(tmp_path: Path, cli_zygote: Zygote) -> None:
    run = _run(tmp_path)
    shard = _shard(run)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # a bit flip in the last tensor's bytes: same size, wrong digest
    shard.write_bytes(data)
    assert _restore(run) == step_dir_name(20)
    assert _status(run)[NEWEST] == "corrupt"
    assert _record(run)["outcome"] == "corrupt"
    proc = _cli(cli_zygote, "prune", str(run), "--keep-last", "3", "--delete-corrupt")
    assert proc.returncode == 0, proc.stderr
    assert not (run / NEWEST).exists()


def test_truncated_or_missing_shards_are_still_corrupt(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _shard(run).write_bytes(_shard(run).read_bytes()[:-4])
    _shard(run, step_dir_name(20)).unlink()
    assert _restore(run) == step_dir_name(10)
    st = _status(run)
    assert st[NEWEST] == "corrupt" and st[step_dir_name(20)] == "corrupt"
