"""No local-vs-remote question above ``ckptkit/storage/``: the storage layer answers it.

Style (``style.md``, v0.2): "a branch per backend above the storage layer" hurt; the
storage layer answers the question once and callers never ask it. Code above storage
calls the operation it needs (:func:`ckptkit.storage.fs.require_local`,
:func:`~ckptkit.storage.fs.local_path`, :func:`~ckptkit.storage.fs.reads_back_cheaply`,
...), so none of these is written outside ``ckptkit/storage/``, read from the source
(``ast``):

* ``Path(str(x))``: a location cast to a local path, which silently turns an
  ``s3://`` URL into a bogus relative path (``s3:/bucket/run``);
* a string test for ``"://"`` (``"://" in text``, ``text.startswith("s3://")``, ...);
* ``is_local``, under any import.

``ckptkit/errors.py`` (a base module, below storage) keeps its own formatting check: it
prints a URL as written.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "ckptkit"
EXEMPT = ("storage/", "errors.py")
"""Where the question may be asked (relative to ``ckptkit/``)."""
STRING_TESTS = frozenset({"startswith", "endswith", "find", "rfind", "index", "count", "split",
                          "partition", "rpartition"})
"""String methods that ask whether a text holds ``://``."""


def _names_url(node: ast.AST) -> bool:
    """``node`` is a string constant holding ``://`` (or a tuple of them)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and "://" in node.value
    return isinstance(node, ast.Tuple) and any(_names_url(e) for e in node.elts)


def _called(node: ast.Call) -> str | None:
    """The name a call calls: ``f`` for ``f(...)`` and ``m.f(...)``."""
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def questions(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every local-vs-remote question ``source`` asks.

    Example:
        >>> questions('p = Path(str(x))\\nok = "://" not in s')
        [(1, 'Path(str(...))'), (2, 'a string test for "://"')]
    """
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _called(node)
            if (
                name == "Path"
                and node.args
                and isinstance(node.args[0], ast.Call)
                and _called(node.args[0]) == "str"
            ):
                out.append((node.lineno, "Path(str(...))"))
            elif name in STRING_TESTS and any(_names_url(a) for a in node.args):
                out.append((node.lineno, 'a string test for "://"'))
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            if any(_names_url(x) for x in (node.left, *node.comparators)):
                out.append((node.lineno, 'a string test for "://"'))
        elif (isinstance(node, ast.Name) and node.id == "is_local") or (
            isinstance(node, ast.Attribute) and node.attr == "is_local"
        ) or (isinstance(node, ast.alias) and node.name == "is_local"):
            out.append((getattr(node, "lineno", 0), "is_local"))
    return sorted(out)


def _above_storage() -> list[Path]:
    return [
        p
        for p in sorted(PKG.rglob("*.py"))
        if not p.relative_to(PKG).as_posix().startswith(EXEMPT)
    ]


def test_no_local_vs_remote_question_above_storage() -> None:
    found = [
        f"ckptkit/{p.relative_to(PKG).as_posix()}:{line}: {what}"
        for p in _above_storage()
        for line, what in questions(p.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "code above ckptkit/storage/ asks whether a location is local; call the storage "
        "operation that does what it needs (fs.require_local: the local Path or an error "
        "naming the remote location; fs.local_path; fs.reads_back_cheaply):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "p = Path(str(loc))",
        "p = pathlib.Path(str(c.path)).parent",
        "f'{Path(str(x)).name}'",
        'remote = "://" in text',
        'local = "://" not in str(root)',
        'u = text.startswith("s3://")',
        'u = text.startswith(("file://", "local://"))',
        'scheme, _, rest = text.partition("://")',
        "from ckptkit.storage.fs import is_local",
        "ok = fs.is_local(p)",
    ],
)
def test_the_scan_finds_each_form(source: str) -> None:
    assert questions(source), source


@pytest.mark.parametrize(
    "source",
    [
        "p = fs.require_local(loc, needs='x')",
        "p = Path(text)",
        "s = str(Path(x))",
        'hint = "use s3://bucket/run"',
        '"""A URL such as ``s3://``."""',
        'ok = "s3" in text',
    ],
)
def test_the_scan_leaves_the_rest(source: str) -> None:
    assert questions(source) == [], source


def test_the_exemptions_exist() -> None:
    assert (PKG / "storage").is_dir() and (PKG / "errors.py").is_file()
