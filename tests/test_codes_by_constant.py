"""Finding codes are referenced by constant (``codes.F003``), never by literal (``"CK-F003"``).

The registry (``ckptkit/codes.py``) is the one place a code is spelled out. These tests
hold the three pieces together: every registered code has its constant, written out in
``codes.py`` (so mypy and IDEs see it), and no module of the package spells a code as a
string literal. Docstrings and comments may name codes (they are prose), and so may
messages that mention a code inside a longer text. ``python tools/codes_to_constants.py``
fixes what the last two tests report.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from ckptkit import codes

PACKAGE = Path(codes.__file__).resolve().parent
REGISTRY = PACKAGE / "codes.py"
CODE = re.compile(r"CK-[A-Z][0-9]{3}")
NAME = re.compile(r"[A-Z][0-9]{3}")
FIX = "run: python tools/codes_to_constants.py"


def _code_literals(source: str) -> list[tuple[int, str]]:
    """(line, token) of each string token whose value is exactly a code, docstrings aside.

    A docstring (any bare string statement) is the only token on its logical line; a
    literal used as a value never is. f-strings and bytes are never a code's value.
    """
    toks = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.COMMENT, tokenize.NL)
    ]
    out = []
    for i, tok in enumerate(toks):
        if tok.type != tokenize.STRING:
            continue
        prefix = re.match(r"[A-Za-z]*", tok.string)
        if prefix is None or set(prefix.group().lower()) & {"f", "b"}:
            continue
        if not CODE.fullmatch(ast.literal_eval(tok.string)):
            continue
        before = toks[i - 1].type if i else tokenize.NEWLINE
        after = toks[i + 1].type if i + 1 < len(toks) else tokenize.NEWLINE
        starts = before in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)
        if starts and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
            continue  # a bare string statement: prose
        out.append((tok.start[0], tok.string))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != REGISTRY)


def test_no_code_literal_outside_the_registry() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
        for path in _modules()
        for line, text in _code_literals(path.read_text())
    ]
    assert not found, (
        "finding codes spelled as string literals outside ckptkit/codes.py (use the "
        f"constant, e.g. codes.F003; {FIX}):\n" + "\n".join(found)
    )


def test_the_literal_scan_sees_values_and_skips_prose() -> None:
    # The scan the test above relies on: values in every position are seen; a docstring,
    # a comment, an f-string and a longer message are not code literals.
    source = '''"""Module docstring naming CK-F003."""
X = {"CK-F003", 'CK-F002'}  # a comment naming "CK-F001"
def f(c="CK-M001"):
    """CK-F003"""
    if c == "CK-S010" or c in ("CK-C001",):
        return {"CK-R010": 1}[c], f"CK-F003 {c}", "see CK-F003 for why"
'''
    lines = [line for line, _ in _code_literals(source)]
    assert lines == [2, 2, 3, 5, 5, 6]


@pytest.mark.parametrize("code", sorted(codes.CODES))
def test_every_registered_code_has_its_constant(code: str) -> None:
    name = code.removeprefix("CK-")
    assert getattr(codes, name, None) == code, f"codes.{name} is missing; {FIX}"
    assert type(getattr(codes, name)) is str  # equal to the code read from a manifest


def test_every_constant_names_a_registered_code() -> None:
    stale = {n for n in vars(codes) if NAME.fullmatch(n)} - {
        c.removeprefix("CK-") for c in codes.CODES
    }
    assert not stale, f"constants without a registered code: {sorted(stale)}; {FIX}"


def test_constants_are_written_out_in_the_registry() -> None:
    # Written as ``F003: Final = "CK-F003"`` so that mypy and IDEs see each one (a loop
    # over the registry filling globals() would pass the two tests above, not this one).
    written = {}
    for node in ast.parse(REGISTRY.read_text()).body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and NAME.fullmatch(node.target.id)
            and isinstance(node.value, ast.Constant)
        ):
            assert ast.unparse(node.annotation) == "Final", node.target.id
            written[node.target.id] = node.value.value
    assert written == {c.removeprefix("CK-"): c for c in codes.CODES}, FIX
