"""Move ckptkit's modules into the folders of their layers, and every reference with them.

A re-runnable codemod (issue 36): run it once more after a branch written against the old
paths merges, and it rewrites that branch's references too. :data:`MOVES` is the one table
of old and new module paths; ``ckptkit/_moved.py`` imports it at run time so that the old
paths keep working for one release (a :class:`DeprecationWarning` says where each went).

What it does, from the repository root:

1. ``git mv`` every file of a moved module (a package moves with its files) that is still
   at its old place;
2. rewrites ``from A import b`` statements in Python files where ``A.b`` is a moved module
   (``from ckptkit import manifest as mf`` becomes ``from ckptkit.format import manifest as
   mf``), through the syntax tree, so a statement importing several names is split only
   where it must be;
3. rewrites every other mention, in Python, Markdown, TOML, YAML and the Makefile, of a
   dotted module path (``ckptkit.manager.CheckpointManager``, a ``monkeypatch`` target, a
   ``:mod:`` role) or a file path (``ckptkit/manager.py``) whose longest moved prefix is in
   the table, segment by segment (``ckptkit.storage.dcp_engine`` is not a mention of
   ``ckptkit.storage.dcp``);
4. sorts the imports of the Python files it changed (``ruff check --fix --select I``).

It is idempotent: a second run changes nothing. ``--check`` changes nothing and exits 1
when a run would.

Usage::

    python tools/move_modules.py            # move and rewrite
    python tools/move_modules.py --check    # report only
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _table() -> tuple[dict[str, str], frozenset[tuple[str, str]], frozenset[str]]:
    """:data:`ckptkit._moved.MOVES`, ``ATTRIBUTES`` and ``STABLE``, read without importing
    ckptkit (whose imports are what this tool rewrites)."""
    spec = importlib.util.spec_from_file_location("_moved", REPO / "ckptkit" / "_moved.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.MOVES), frozenset(mod.ATTRIBUTES), frozenset(mod.STABLE)


MOVES, ATTRIBUTES, STABLE = _table()

SCOPES = ("ckptkit", "tests", "tools", "benchmarks", "drills", "docs", "schemas", ".ci")
TOP_FILES = ("README.md", "Makefile", "pyproject.toml", "CONTRIBUTING.md", "CHANGELOG.md")
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".ini", ""}
SKIP = {REPO / "ckptkit" / "_moved.py", REPO / "tests" / "test_old_module_paths.py",
        Path(__file__).resolve()}

DOTTED = re.compile(r"(?<![\w.])ckptkit(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])ckptkit(?:/[A-Za-z_]\w*)+(?:\.py)?/?")


def new_name(dotted: str) -> str:
    """``dotted`` with its longest moved prefix (by whole segments) replaced."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        head = ".".join(parts[:n])
        if head in MOVES:
            return ".".join([MOVES[head], *parts[n:]])
    return dotted


def _is_package(module: str) -> bool:
    return (REPO / Path(*module.split("."))).is_dir()


def _file_of(module: str) -> Path:
    base = REPO / Path(*module.split("."))
    return base if base.is_dir() else base.with_suffix(".py")


# --- 1. the files -----------------------------------------------------------------------


def move_files(check: bool) -> list[str]:
    """``git mv`` every moved module still at its old place, in three passes: modules that
    leave their package (deepest first), then packages (their files move with them), then
    modules renamed inside a package that moved."""
    leaving, packages, renamed = [], [], []
    for old, new in MOVES.items():
        parent = old.rsplit(".", 1)[0]
        if _file_of(old).is_dir() or (not _file_of(old).exists() and _is_package(new)):
            packages.append((old, new))
        elif new_name(parent) != parent and new.rsplit(".", 1)[0] == new_name(parent):
            renamed.append((old, new))
        else:
            leaving.append((old, new))
    done = []
    for old, new in [*sorted(leaving, key=lambda kv: -kv[0].count(".")), *packages, *renamed]:
        src = _file_of(old)
        if (old, new) in renamed:
            src = _file_of(new_name(old.rsplit(".", 1)[0]) + "." + old.rsplit(".", 1)[1])
        dst = REPO / Path(*new.split("."))
        dst = dst if src.is_dir() else dst.with_suffix(".py")
        if not src.exists() or dst.exists():
            continue
        done.append(f"{src.relative_to(REPO)} -> {dst.relative_to(REPO)}")
        if check:
            continue
        init = dst.parent / "__init__.py"
        if not init.exists() and dst.parent != REPO / "ckptkit":
            raise SystemExit(f"{init.relative_to(REPO)} is missing: write the new package's "
                             "__init__.py (its docstring says what the layer is) first")
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=REPO, check=True)
    return done


# --- 2. from-imports --------------------------------------------------------------------


def _import_line(module: str, names: list[tuple[str, str | None]], indent: str) -> str:
    shown = ", ".join(n if a is None or a == n else f"{n} as {a}" for n, a in names)
    return f"{indent}from {module} import {shown}"


def rewrite_from_imports(text: str) -> str:
    """Split ``from A import b`` where ``A.b`` moved into ``from NEW_PARENT import leaf as b``."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not (node.module == "ckptkit" or node.module.startswith("ckptkit.")):
            continue
        kept: list[tuple[str, str | None]] = []
        moved: dict[str, list[tuple[str, str | None]]] = {}
        for a in node.names:
            full = f"{node.module}.{a.name}"
            target = new_name(full)
            if target != full and (node.module, a.name) not in ATTRIBUTES:
                parent, leaf = target.rsplit(".", 1)
                moved.setdefault(parent, []).append((leaf, a.asname or (a.name if leaf != a.name else None)))
            else:
                kept.append((a.name, a.asname))
        if not moved:
            continue
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)  # type: ignore[union-attr]
        out = []
        if kept:
            out.append(_import_line(new_name(node.module), kept, indent))
        out += [_import_line(p, names, indent) for p, names in moved.items()]
        end = node.end_lineno or node.lineno
        tail = lines[end - 1][node.end_col_offset or 0:]  # a comment (noqa) and the newline
        comment = tail.rstrip("\n")
        out = [f"{line}{comment}" for line in out]
        edits.append((node.lineno - 1, end, "\n".join(out) + (tail[len(comment):] or "\n")))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = [new]
    return "".join(lines)


# --- 3. every other mention ---------------------------------------------------------------


def _path_sub(m: re.Match[str]) -> str:
    s = m.group(0)
    trail = "/" if s.endswith("/") else ""
    s = s.rstrip("/")
    suffix = ".py" if s.endswith(".py") else ""
    dotted = s[: -len(suffix)] if suffix else s
    new = new_name(dotted.replace("/", "."))
    if new == dotted.replace("/", "."):
        return m.group(0)
    if suffix and _is_package(new):
        raise SystemExit(f"{m.group(0)} became a package: rewrite it by hand")
    return new.replace(".", "/") + suffix + trail


IMPORT_LINE = re.compile(r"^\s*(?:from|import)\s+ckptkit")


def _public(dotted: str) -> bool:
    """A stable public path (``ckptkit.dcp``): what users write, so prose keeps it."""
    return any(dotted == s or dotted.startswith(s + ".") for s in STABLE)


def rewrite_mentions(text: str) -> str:
    """Rewrite dotted and file-path mentions; a stable public path only where it is
    imported (the package's own code imports the module where it lives), never in prose,
    messages or docs."""
    out = []
    for line in text.splitlines(keepends=True):
        keep_public = IMPORT_LINE.match(line) is None
        line = DOTTED.sub(lambda m, keep=keep_public: m.group(0) if keep and _public(m.group(0))
                          else new_name(m.group(0)), line)
        out.append(PATH.sub(_path_sub, line))
    return "".join(out)


def files() -> list[Path]:
    out = [REPO / f for f in TOP_FILES if (REPO / f).exists()]
    for scope in SCOPES:
        root = REPO / scope
        if root.exists():
            out += [p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                    and ".venv" not in p.parts and "__pycache__" not in p.parts]
    return [p for p in out if p.resolve() not in SKIP]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report only; exit 1 if a run would change")
    args = ap.parse_args(argv)
    for old, new in MOVES.items():
        clash = new_name(new)
        if clash != new:
            raise SystemExit(f"{new} (the new path of {old}) is itself rewritten to {clash}")
    moves = move_files(args.check)
    changed = []
    for p in files():
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_from_imports(text) if p.suffix == ".py" else text
        new = rewrite_mentions(new)
        if new != text:
            changed.append(p)
            if not args.check:
                p.write_text(new)
    for m in moves:
        print(f"move {m}")
    for p in changed:
        print(f"rewrite {p.relative_to(REPO)}")
    py = [str(p) for p in changed if p.suffix == ".py"]
    if py and not args.check:
        subprocess.run([sys.executable, "-m", "ruff", "check", "--fix", "--select", "I", "-q", *py],
                       cwd=REPO, check=False)
    if args.check:
        return 1 if moves or changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
