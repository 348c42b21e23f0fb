"""tools/codes_to_constants.py: the codemod that turns code literals into constants.

Run as the merger runs it (a subprocess, ``--root`` pointing at a package) on a small
package written to ``tmp_path``: it must rewrite values in every position, leave prose
and types alone, never shadow a local name, add the import once, and change nothing on
a second run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "codes_to_constants.py"

REGISTRY = '''\
"""A registry."""

from __future__ import annotations

from typing import Final

UNREADABLE = "CK-F025"


def register_code(code: str, **kw: object) -> str:
    return code


# --- the codes ---
register_code("CK-F003", title="digest mismatch")
register_code(UNREADABLE, title="unreadable")
'''

MODULE = '''\
"""Names CK-F003 in prose."""

from __future__ import annotations

import os
from typing import Literal

DAMAGE = frozenset({"CK-F003", "CK-F025"})
TABLE = {"CK-F003": 1}
Only = Literal["CK-F003"]


def check(code: str = "CK-F025") -> object:
    """CK-F003"""
    # a comment naming "CK-F003"
    if code == "CK-F003" or code in ("CK-F025",):
        return error("CK-F003", f"CK-F003 {code}", "see CK-F003", os.sep)
    return "CK-F003" "!"


def shadow(codes: list[str]) -> bool:
    return "CK-F003" in codes


def error(*args: object) -> object:
    return args
'''


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), "--root", str(root), "--no-ruff", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "ckptkit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "codes.py").write_text(REGISTRY)
    (pkg / "mod.py").write_text(MODULE)
    return tmp_path


def test_rewrites_values_and_leaves_prose_types_and_shadowed_names(tmp_path: Path) -> None:
    root = _package(tmp_path)
    done = _run(root)
    assert done.returncode == 1, done.stdout + done.stderr  # three literals left: see below
    out = (root / "ckptkit" / "mod.py").read_text()
    assert 'DAMAGE = frozenset({codes.F003, codes.F025})' in out
    assert "TABLE = {codes.F003: 1}" in out
    assert "def check(code: str = codes.F025)" in out
    assert "if code == codes.F003 or code in (codes.F025,):" in out
    assert 'return error(codes.F003, f"CK-F003 {code}", "see CK-F003", os.sep)' in out
    # prose, types and what cannot be rewritten stay as they were
    assert '"""Names CK-F003 in prose."""' in out and '    """CK-F003"""' in out
    assert '# a comment naming "CK-F003"' in out
    assert 'Only = Literal["CK-F003"]' in out
    assert 'return "CK-F003" "!"' in out
    assert 'return "CK-F003" in codes' in out  # ``codes`` is the argument there
    assert "mod.py:10:" in done.stdout and "Literal" in done.stdout
    assert "mod.py:18:" in done.stdout and "implicit string concatenation" in done.stdout
    assert "mod.py:22:" in done.stdout and "'codes' is a local name in shadow" in done.stdout
    # the import is added once, below the others, and the module still compiles
    assert out.count("from ckptkit import codes\n") == 1
    assert out.index("from typing import Literal") < out.index("from ckptkit import codes")
    compile(out, "mod.py", "exec")
    # the registry got its constants, above the first registration, and nothing else
    reg = (root / "ckptkit" / "codes.py").read_text()
    assert 'F003: Final = "CK-F003"\nF025: Final = "CK-F025"\n' in reg
    assert reg.index("F003: Final") < reg.index("# --- the codes ---")
    assert reg.replace(reg[reg.index("# --- constants") : reg.index("# --- the codes ---")], "") == REGISTRY


def test_a_second_run_changes_nothing(tmp_path: Path) -> None:
    root = _package(tmp_path)
    _run(root)
    first = {p.name: p.read_text() for p in (root / "ckptkit").iterdir()}
    again = _run(root)
    assert "0 literal(s) in 0 file(s) changed" in again.stdout, again.stdout
    assert {p.name: p.read_text() for p in (root / "ckptkit").iterdir()} == first


def test_uses_the_alias_the_module_already_has_and_picks_up_new_codes(tmp_path: Path) -> None:
    root = _package(tmp_path)
    mod = root / "ckptkit" / "mod.py"
    mod.write_text('from ckptkit import codes as ck\n\nX = ck.F003\nY = "CK-F777"\n')
    assert "is not a registered code" in _run(root).stdout
    # another branch registers CK-F777: the next run writes its constant and uses it
    reg = root / "ckptkit" / "codes.py"
    reg.write_text(reg.read_text() + 'register_code("CK-F777", title="new")\n')
    done = _run(root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mod.read_text() == "from ckptkit import codes as ck\n\nX = ck.F003\nY = ck.F777\n"
    assert 'F777: Final = "CK-F777"' in reg.read_text()


def test_check_reports_and_changes_nothing(tmp_path: Path) -> None:
    root = _package(tmp_path)
    before = (root / "ckptkit" / "mod.py").read_text()
    done = _run(root, "--check")
    assert done.returncode == 1
    assert "mod.py: 7 literal(s) to rewrite, import added" in done.stdout, done.stdout
    assert (root / "ckptkit" / "mod.py").read_text() == before
    assert "Final = " not in (root / "ckptkit" / "codes.py").read_text()


def test_the_package_needs_no_rewrite() -> None:
    # This checkout: every literal rewritten, nothing left, the generated block as written.
    done = subprocess.run(
        [sys.executable, str(TOOL), "--check", "--no-ruff"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
