"""Write the module map of docs/architecture.md from the code: every module of ckptkit, by
layer (the order tests/test_layering.py enforces), with its line count and the first
paragraph of its docstring.

Run it after adding, moving or growing a module: ``python tools/module_map.py``
(``--check``: change nothing, exit 1 when the map is stale; the layering test runs that).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
START = "## Module map\n"
HEADER = (
    "The responsibility is the first paragraph of each module's docstring; "
    "`python tools/module_map.py` rewrites this section from the code (the layering test "
    "checks it is current).\n"
)


def _layering() -> ModuleType:
    """The layer table lives with the test that enforces it."""
    path = REPO / "tests" / "test_layering.py"
    spec = importlib.util.spec_from_file_location("_layering", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in first.splitlines()).replace("|", "\\|")


def section() -> str:
    """The module map section as it should read now."""
    lay = _layering()
    out = [START, "\n", HEADER]
    for layer, _ in lay.LAYERS:
        rows = []
        for name, path in sorted(lay.MODULES.items(), key=lambda kv: str(kv[1])):
            if lay.layer_of(name) != layer or name.endswith("__main__"):
                continue
            rel = path.relative_to(REPO).as_posix()
            shown = rel.removesuffix("__init__.py") if rel.endswith("__init__.py") else rel
            lines = len(path.read_text().splitlines())
            rows.append(f"| `{shown}` | {lines} | {_summary(path)} |\n")
        out += [f"\n### `{layer}`\n\n", "| module | lines | responsibility |\n", "|---|---:|---|\n", *rows]
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the map is stale")
    args = ap.parse_args()
    text = DOC.read_text()
    head, sep, _ = text.partition(START)
    if not sep:
        print(f"{DOC}: no '{START.strip()}' section", file=sys.stderr)
        return 2
    new = head + section()
    if new == text:
        return 0
    if args.check:
        print(f"{DOC}: the module map is stale: run python tools/module_map.py", file=sys.stderr)
        return 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
