"""Issues 23 and 39: every "good" verdict is one a restore can use, with a key and without.

For every hostile newest checkpoint of the suite (tests/hostile.py), in a run saved without a
key and in one signed with ``hostile.KEY`` (every reader given the key), the readers must agree:
``ckptkit.verify`` passes it exactly when ``CheckpointManager.restore`` restores it; ``ls
--verify`` calls it verified exactly then; ``verify RUN`` exits 0 exactly then; ``prune
--keep-last 1`` never leaves a run that restore cannot use; no command lets a non-ckptkit
exception out, blocks, or runs pickled code.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from deadline import within
from hostile import CASES, KEY, MARKER, STEPS, make_run, train_state
from threadranks import on_ranks

import ckptkit
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.cli import main

pytestmark = pytest.mark.integration

NEWEST = step_dir_name(STEPS[-1])
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    base = tmp_path_factory.mktemp("audit-templates")
    return {
        (s, keyed): make_run(base / f"{s}-{keyed}", storage=s, key=KEY if keyed else None)
        for s in ("tensors", "dcp")
        for keyed in (False, True)
    }


def _bounded(what: str, fn: Callable[[], Any], fifos: list[Path]) -> Any:
    """``fn()`` by the deadline: a ckptkit error is returned (a clean refusal); anything
    else fails the test."""
    try:
        return within(DEADLINE_S, fn, *fifos)
    except ckptkit.CkptkitError as e:
        return e
    except Exception as e:  # what this audit exists to find
        raise AssertionError(f"{what} let a non-ckptkit exception escape") from e


def _cli(args: list[str], fifos: list[Path]) -> Result:
    res: Result = _bounded(
        f"ckptkit {' '.join(args)}",
        lambda: CliRunner().invoke(main, args, catch_exceptions=True),
        fifos,
    )
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(
            f"ckptkit {' '.join(args)} raised (a traceback for the user):\n{res.output}"
        ) from res.exception
    assert "Traceback" not in res.output, res.output
    return res


def _untimed(result: Any) -> list[dict[str, Any]]:
    """A verify result's reports as JSON, without their timings."""
    return [{k: v for k, v in r.to_dict().items() if k != "seconds"} for r in result.reports]


def _restored_dir(run: Path, storage: str, fifos: list[Path], key: bytes | None) -> str | None:
    """Which checkpoint directory a training job resuming from ``run`` restores."""

    def restore() -> str | None:
        with ckptkit.CheckpointManager(run, key=key) as mgr:
            r = mgr.restore(train_state(seed=5, storage=storage))
        return None if r is None or r.path is None else Path(str(r.path)).name

    got = _bounded("CheckpointManager.restore", restore, fifos)
    assert not isinstance(got, ckptkit.CkptkitError), (
        f"restore found nothing to use although {step_dir_name(STEPS[0])} is good: {got}"
    )
    return got  # type: ignore[no-any-return]


@pytest.mark.parametrize("keyed", [False, True], ids=["no-key", "key"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_restore_ls_and_prune_agree(
    templates: dict[tuple[str, bool], Path], tmp_path: Path, name: str, keyed: bool
) -> None:
    case = CASES[name]
    key = KEY if keyed else None
    run = tmp_path / "run"
    shutil.copytree(templates[(case.storage, keyed)], run, symlinks=True)
    newest = run / NEWEST
    fifos = case.damage(newest, run)
    key_args: list[str] = []
    if key is not None:
        (tmp_path / "hmac.key").write_bytes(key)
        key_args = ["--key-file", str(tmp_path / "hmac.key")]
    expected = case.good(key)

    verdict = _bounded("ckptkit.verify", lambda: ckptkit.verify(newest, key=key), fifos)
    good = not isinstance(verdict, ckptkit.CkptkitError) and verdict.ok
    assert good == expected, (
        f"{name}: verify says {'good' if good else 'bad'} about a checkpoint the catalogue "
        f"marks {'restorable' if expected else 'hostile'}: {verdict}"
    )

    if not isinstance(verdict, ckptkit.CkptkitError):
        # Shared reading (two ranks, three scan threads each) reaches the same report.
        ranked = _bounded(
            "a rank-parallel verify",
            lambda: on_ranks(2, lambda g: ckptkit.verify(newest, group=g, workers=3, key=key))[0],
            fifos,
        )
        assert _untimed(ranked) == _untimed(verdict), f"{name}: the ranks disagree"

    run_verify = _cli(["verify", *key_args, str(run)], fifos)
    assert (run_verify.exit_code == 0) == good, run_verify.output

    listed = _cli(["ls", "--verify", "--json", *key_args, str(run)], fifos)
    rows = {Path(r["path"]).name: r for r in json.loads(listed.stdout)["checkpoints"]}
    assert (rows.get(NEWEST, {}).get("status") == "verified") == good, listed.output

    picked = _restored_dir(run, case.storage, fifos, key)
    assert (picked == NEWEST) == good, f"verify said {good}, restore used {picked}"

    for delete in ([], ["--delete-corrupt"]):
        _cli(["prune", "--keep-last", "1", *delete, *key_args, str(run)], fifos)
        assert _restored_dir(run, case.storage, fifos, key) == picked, (
            f"prune {' '.join(delete)} removed what restore used"
        )
    assert not (run.parent / MARKER).exists(), "pickled code ran"
