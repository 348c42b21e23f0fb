"""Layouts never hide each other (issue 23, reproduction 9 and the step-name parts of 12).

A run directory that holds a native run is the native run, whatever stray framework entry
lies beside it: a ``checkpoint-3/``, an empty ``checkpoints/checkpoint_0/``, a
``trainer_state.json`` at the top. Step names are ASCII digits only, the manifest's step
must be the directory's step, and a second directory for one step is a finding, not a
crash. Every run-level command runs in a process of its own (with a timeout): a fork of a
warmed zygote (tests/zygote.py), and once as a new ``python -m ckptkit``; strays and
duplicates are never deleted, and restore picks the right step. Each run is built once per
module and copied per case.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from zygote import Result, Zygote, fresh_ckptkit

import ckptkit
from ckptkit.checkpoint import catalog
from ckptkit.checkpoint.catalog import step_dir_name, step_of
from ckptkit.errors import CkptkitError
from ckptkit.run import directory as runs
from ckptkit.run.layouts import hf, lightning

TIMEOUT = 180


def _state(step: int = 0) -> ckptkit.TrainState:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              step=step)


def _native_run(root: Path, steps: tuple[int, ...]) -> None:
    mgr = ckptkit.CheckpointManager(root, keep_last=len(steps) + 5)
    for s in steps:
        mgr.save(_state(s))
    mgr.wait()
    mgr.close()


NativeRun = Callable[[Path, tuple[int, ...]], Path]


@pytest.fixture(scope="module")
def native_run(tmp_path_factory: pytest.TempPathFactory) -> NativeRun:
    """``native_run(root, steps)``: a copy at ``root`` of a native run of ``steps``, saved
    once per module (cases damage or add to their copy, never to the original)."""
    saved: dict[tuple[int, ...], Path] = {}

    def copy(root: Path, steps: tuple[int, ...]) -> Path:
        if steps not in saved:
            saved[steps] = tmp_path_factory.mktemp("native") / "run"
            _native_run(saved[steps], steps)
        shutil.copytree(saved[steps], root)
        return root

    return copy


def _ckptkit(z: Zygote, *args: str | Path) -> Result:
    return z.ckptkit(*args, timeout=TIMEOUT)


def _rot(ckpt: Path) -> None:
    """Flip the last byte of the checkpoint's largest file (its size stays: only a read finds it)."""
    big = max((p for p in ckpt.rglob("*") if p.is_file() and p.name != "manifest.json"),
              key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    data[-1] ^= 0xFF
    big.write_bytes(bytes(data))


def _restored(root: Path, **kw: object) -> tuple[int, str]:
    mgr = ckptkit.CheckpointManager(root, readonly=True)
    try:
        res = mgr.restore(_state(), **kw)  # type: ignore[arg-type]
    finally:
        mgr.close()
    assert res is not None and res.path is not None
    return res.step, Path(str(res.path)).name


def _ls(z: Zygote, root: Path) -> dict:  # type: ignore[type-arg]
    r = _ckptkit(z, "ls", root, "--json")
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


# --- reproduction 9: a stray framework entry in a native run ----------------------------------


def _stray_checkpoint_3(root: Path) -> Path:
    p = root / "checkpoint-3"
    p.mkdir()
    (p / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": []}))
    return p


def _stray_accelerate(root: Path) -> Path:
    p = root / "checkpoints" / "checkpoint_0"
    p.mkdir(parents=True)
    return p


def _stray_trainer_state(root: Path) -> Path:
    p = root / "trainer_state.json"
    p.write_text(json.dumps({"global_step": 30, "log_history": []}))
    return p


STRAYS = {
    "checkpoint-3": _stray_checkpoint_3,
    "checkpoints/checkpoint_0": _stray_accelerate,
    "trainer_state.json": _stray_trainer_state,
}


@pytest.fixture(params=sorted(STRAYS))
def run_with_stray(
    request: pytest.FixtureRequest, tmp_path: Path, native_run: NativeRun
) -> tuple[Path, Path]:
    """A native run (steps 10, 20, 30; step 30 rotted, same size) and one stray entry."""
    root = native_run(tmp_path / "run", (10, 20, 30))
    _rot(root / step_dir_name(30))
    return root, STRAYS[request.param](root)


def test_open_run_is_native_whatever_lies_beside(run_with_stray: tuple[Path, Path]) -> None:
    root, stray = run_with_stray
    run = runs.open_run(root)
    try:
        assert run.layout == "ckptkit"
        assert [c.step for c in runs.listing(run)] == [10, 20, 30]
        named = [Path(str(i.path)) for i in runs.ignored(run)]
    finally:
        run.close()
    assert stray in named or (stray.name == "trainer_state.json" and root in named), named
    assert runs.framework_checkpoints(root) is None
    # The library verify checks the native steps, never the stray.
    result = ckptkit.verify(root)
    assert [Path(str(r.path)).name for r in result.reports] == [
        step_dir_name(s) for s in (10, 20, 30)
    ]
    assert not result.ok


def test_verify_run_checks_the_native_steps_and_names_the_stray(
    run_with_stray: tuple[Path, Path], cli_zygote: Zygote
) -> None:
    root, stray = run_with_stray
    r = _ckptkit(cli_zygote, "verify", root)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stdout + r.stderr  # the rotted newest native step
    assert step_dir_name(30) in r.stdout and step_dir_name(10) in r.stdout
    assert "warning:" in r.stderr and stray.name in r.stderr and "ignored" in r.stderr


def test_ls_lists_the_native_steps_only(
    run_with_stray: tuple[Path, Path], cli_zygote: Zygote
) -> None:
    root, stray = run_with_stray
    out = _ls(cli_zygote, root)
    assert out["layout"] == "ckptkit"
    assert [c["step"] for c in out["checkpoints"]] == [10, 20, 30]
    assert all(Path(c["path"]).parent == root for c in out["checkpoints"])
    ignored = [Path(i["path"]) for i in out["ignored"]]
    assert stray in ignored or (stray.name == "trainer_state.json" and root in ignored)


def test_rollback_picks_a_native_step(
    run_with_stray: tuple[Path, Path], cli_zygote: Zygote
) -> None:
    root, _stray = run_with_stray
    r = _ckptkit(cli_zygote, "rollback", root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"roll back to: {root / step_dir_name(30)}" in r.stdout
    assert "no healthy checkpoint" not in r.stdout


def test_prune_keeps_the_newest_good_native_step_and_never_the_stray(
    run_with_stray: tuple[Path, Path], cli_zygote: Zygote
) -> None:
    root, stray = run_with_stray
    r = _ckptkit(cli_zygote, "prune", root, "--keep-last", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning:" in r.stderr and stray.name in r.stderr
    assert stray.exists()  # never deleted, whatever it is
    assert (root / step_dir_name(20)).is_dir()  # the newest that verifies from its bytes
    assert (root / step_dir_name(30)).is_dir()  # corrupt: kept without --delete-corrupt
    assert not (root / step_dir_name(10)).exists()
    assert _restored(root) == (20, step_dir_name(20))


def test_a_framework_run_without_a_native_run_is_still_its_layout(tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    _stray_checkpoint_3(root)
    (root / ".ckptkit-index.json").write_text("{}")  # framework runs keep an index too
    run = runs.open_run(root)
    try:
        assert run.layout == "hf-trainer"
    finally:
        run.close()
    assert catalog.native_evidence(root) is None


# --- step names: ASCII digits only, anchored ---------------------------------------------------


@pytest.mark.parametrize(
    "name", ["step-\u0669", "step-0000000\u0669", "step-00000009\n", "step-" + "9" * 5000, "step-", "step-+9"]
)
def test_step_names_are_ascii_digits_only(name: str) -> None:
    assert step_of(name) is None
    assert catalog.misplaced(name, 9) is None
    assert hf.TRAINER_RE.match(name.replace("step-", "checkpoint-")) is None
    assert hf.ACCELERATE_RE.match(name.replace("step-", "checkpoint_")) is None
    if "\n" not in name:  # a Lightning step sits inside the name: only digits end it
        assert lightning.step_in_name(name.replace("step-", "epoch=0-step=") + ".ckpt") is None
    assert not lightning.is_last("last.ckpt\n")


def test_step_names_that_are_steps() -> None:
    assert step_of("step-00000009") == 9 and step_of("step-9") == 9
    assert hf.TRAINER_RE.match("checkpoint-9") and hf.ACCELERATE_RE.match("checkpoint_9")
    assert lightning.step_in_name("epoch=0-step=9.ckpt") == 9


def test_a_non_ascii_or_newline_step_name_is_not_a_step_of_the_run(
    tmp_path: Path, native_run: NativeRun, cli_zygote: Zygote
) -> None:
    root = native_run(tmp_path / "run", (10, 20))
    odd = [root / "step-\u0669", root / "step-00000099\n"]
    for p in odd:
        shutil.copytree(root / step_dir_name(20), p)
    assert [c["step"] for c in _ls(cli_zygote, root)["checkpoints"]] == [10, 20]
    r = _ckptkit(cli_zygote, "prune", root, "--keep-last", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / step_dir_name(20)).is_dir() and not (root / step_dir_name(10)).exists()
    assert all(p.is_dir() for p in odd)
    assert _restored(root) == (20, step_dir_name(20))


# --- the manifest's step is the directory's step -----------------------------------------------


@pytest.fixture
def mislabelled(tmp_path: Path, native_run: NativeRun) -> Path:
    """Steps 10..40, and a copy of step 40's checkpoint named as step 50."""
    root = native_run(tmp_path / "run", (10, 20, 30, 40))
    shutil.copytree(root / step_dir_name(40), root / step_dir_name(50))
    return root


def test_a_mislabelled_copy_is_unsound_in_ls_and_verify(
    mislabelled: Path, cli_zygote: Zygote
) -> None:
    root = mislabelled
    by_step = {c["step"]: c for c in _ls(cli_zygote, root)["checkpoints"]}
    assert by_step[50]["status"] == "unsound" and "CK-S020" in by_step[50]["problem"]
    assert by_step[40]["status"] == "verified"
    r = _ckptkit(cli_zygote, "verify", root / step_dir_name(50))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CK-S020" in r.stdout and "step 40" in r.stdout and "step 50" in r.stdout
    r = _ckptkit(cli_zygote, "verify", root)
    assert r.returncode == 1 and "CK-S020" in r.stdout


def test_prune_keeps_the_real_newest_not_the_copy(mislabelled: Path, cli_zygote: Zygote) -> None:
    root = mislabelled
    r = _ckptkit(cli_zygote, "prune", root, "--keep-last", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (root / step_dir_name(40)).is_dir()
    assert (root / step_dir_name(50)).is_dir()  # corrupt, kept without --delete-corrupt
    assert not (root / step_dir_name(30)).exists()
    r = _ckptkit(cli_zygote, "rollback", root)
    assert r.returncode == 0 and f"roll back to: {root / step_dir_name(40)}" in r.stdout


def test_restore_never_picks_the_mislabelled_copy(mislabelled: Path) -> None:
    assert _restored(mislabelled) == (40, step_dir_name(40))
    with pytest.raises(CkptkitError, match="CK-S020"):
        _restored(mislabelled, step=50)


# --- two directories for one step ---------------------------------------------------------------


@pytest.fixture
def duplicated(tmp_path: Path, native_run: NativeRun) -> Path:
    """Steps 1..3, and ``step-3``: a hand copy of ``step-00000003``."""
    root = native_run(tmp_path / "run", (1, 2, 3))
    shutil.copytree(root / step_dir_name(3), root / "step-3")
    return root


def test_ls_lists_a_duplicated_step_once_and_names_the_copy(
    duplicated: Path, cli_zygote: Zygote
) -> None:
    out = _ls(cli_zygote, duplicated)
    assert [(c["step"], Path(c["path"]).name) for c in out["checkpoints"]] == [
        (1, step_dir_name(1)), (2, step_dir_name(2)), (3, step_dir_name(3)),
    ]
    assert [Path(i["path"]).name for i in out["ignored"]] == ["step-3"]
    assert "CK-S021" in out["ignored"][0]["why"]


def test_verify_warns_about_the_duplicate(duplicated: Path) -> None:
    """Run as typed (a new interpreter), not forked: the file's one such run."""
    r = fresh_ckptkit("verify", duplicated, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr  # a warning: nothing is damaged
    assert "CK-S021" in r.stdout and "step-3" in r.stderr


def test_prune_does_not_crash_on_a_duplicate_and_keeps_it(
    duplicated: Path, cli_zygote: Zygote
) -> None:
    r = _ckptkit(cli_zygote, "prune", duplicated, "--keep-last", "1")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step-3" in r.stderr
    assert (duplicated / "step-3").is_dir() and (duplicated / step_dir_name(3)).is_dir()
    assert not (duplicated / step_dir_name(1)).exists()


def test_background_rotation_does_not_crash_on_a_duplicate(duplicated: Path) -> None:
    mgr = ckptkit.CheckpointManager(duplicated, keep_last=1)
    try:
        mgr.save(_state(4))
        mgr.wait()
    finally:
        mgr.close()
    # Rotation deleted step-00000003 by keep_last=1, never the copy it did not list.
    assert (duplicated / "step-3").is_dir()
    assert not (duplicated / step_dir_name(3)).exists()
    assert not (duplicated / step_dir_name(1)).exists()


def test_rollback_picks_the_canonical_directory_and_names_the_copy(
    duplicated: Path, cli_zygote: Zygote
) -> None:
    r = _ckptkit(cli_zygote, "rollback", duplicated)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"roll back to: {duplicated / step_dir_name(3)}" in r.stdout
    assert "step-3" in r.stderr


def test_restore_picks_the_canonical_directory(duplicated: Path) -> None:
    assert _restored(duplicated) == (3, step_dir_name(3))
    assert _restored(duplicated, step=3) == (3, step_dir_name(3))
