"""The package's shape: layers that import only downward, no import cycles, a readable manager.

Style (``style.md``): data flows one way; a cycle means a concept sits on the wrong floor,
so it is moved down, never hidden behind a function-local import. The layers, and what
each one is for, are written down in ``docs/architecture.md``; :data:`LAYERS` here is the
same table, and a test holds the two together.

The import graph is read from the source (``ast``), and it sees what ``python -c 'import
ckptkit'`` would hide behind its import order:

* every import, at module level, inside a function, or under ``TYPE_CHECKING`` (a type is
  a dependency too; only the cycle check leaves type-only imports out, since they never run);
* a package's ``__init__``: importing ``ckptkit.verify.findings`` runs
  ``ckptkit/verify/__init__.py`` first, and whatever *it* imports;
* imports by name: a string naming a ckptkit module, in a module that calls
  ``importlib.import_module`` or ``__import__``.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "ckptkit"
DOC = PKG.parent / "docs" / "architecture.md"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "ckptkit._version",
            "ckptkit._repr",
            "ckptkit._jsonval",
            "ckptkit._progress",
            "ckptkit.errors",
            "ckptkit.codes",
            "ckptkit.crashpoints",
            "ckptkit.collective",
        ),
    ),
    ("format", ("ckptkit.format", "ckptkit.format.*")),
    ("storage", ("ckptkit.storage", "ckptkit.storage.*")),
    ("capture", ("ckptkit.capture", "ckptkit.capture.*")),
    ("checkpoint", ("ckptkit.checkpoint", "ckptkit.checkpoint.*")),
    ("verify", ("ckptkit.verify", "ckptkit.verify.*")),
    ("signals", ("ckptkit.signals", "ckptkit.signals.*")),
    ("run", ("ckptkit.run", "ckptkit.run.*")),
    ("integrations", ("ckptkit.integrations", "ckptkit.integrations.*")),
    ("drill", ("ckptkit.drill", "ckptkit.drill.*")),
    ("cli", ("ckptkit.cli", "ckptkit.cli.*", "ckptkit.__main__")),
    ("api", ("ckptkit", "ckptkit._moved")),
    ("examples", ("ckptkit.examples", "ckptkit.examples.*")),
)
"""Layers, lowest first: one folder each (``pkg.*``: every module below ``pkg``), apart from
the base modules at the top level and the package's own ``__init__`` (the api). A module
may import from its own layer and the layers below."""

ALLOWED_UP: dict[tuple[str, str], str] = {}
"""Known upward imports (importer, imported) left in files other issue-24 work is rewriting,
each with why it is there and what removes it. Nothing may be added here to pass a test."""

IGNORED_FOR_CYCLES: dict[tuple[str, str], str] = {}
"""Edges the cycle check leaves out (still checked for direction), each with its reason."""

IS_LOCAL_LEFT: dict[str, str] = {}
"""Modules outside storage that still ask ``fs.is_local``, and why (the goal is none)."""

LAZY_OK = {
    # The CLI imports each command's machinery when the command runs (startup time).
    "ckptkit.cli",
    "ckptkit.cli.shared",
    "ckptkit.cli.checkpoint_cmds",
    "ckptkit.cli.run_cmds",
    "ckptkit.cli.drill_cmd",
    "ckptkit.cli.watch_cmd",
    # The drill imports scipy (through its statistics) while the training runs it forked
    # are busy, instead of before them.
    "ckptkit.drill.runner",
    # ckptkit.dcp imports torch.distributed.checkpoint (over a second); diff needs it only
    # for a DCP directory, and the drill imports statediff in every run.
    "ckptkit.verify.statediff",
}
"""Modules allowed function-local imports of ckptkit modules (never to dodge a cycle)."""


def _modname(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_modname(p): p for p in PKG.rglob("*.py")}


def layer_of(name: str) -> str | None:
    """The layer of module ``name`` by the most specific pattern of :data:`LAYERS`."""
    best: tuple[int, str] | None = None
    for layer, patterns in LAYERS:
        for pat in patterns:
            hit = name.startswith(pat[:-1]) if pat.endswith(".*") else name == pat
            if hit and (best is None or len(pat) > best[0]):
                best = (len(pat), layer)
    return None if best is None else best[1]


RANK = {layer: i for i, (layer, _) in enumerate(LAYERS)}


def _targets(node: ast.Import | ast.ImportFrom, here: str) -> list[str]:
    out = []
    if isinstance(node, ast.Import):
        out = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative import: resolve against this module's package
            parts = here.split(".")
            is_pkg = MODULES[here].name == "__init__.py"
            pkg = parts[: len(parts) - node.level + (1 if is_pkg else 0)]
            base = ".".join([*pkg, base]) if base else ".".join(pkg)
        # ``from pkg import sub`` depends on the submodule (and on pkg's __init__, which
        # runs first: added by _with_packages); ``from pkg import name`` on pkg itself
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        out = subs if len(subs) == len(node.names) else [base, *subs]
    return [t for t in out if t == "ckptkit" or t.startswith("ckptkit.")]


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _calls_import_by_name(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                return True
    return False


@functools.cache
def imports(name: str) -> dict[str, set[str]]:
    """The ckptkit modules ``name`` imports, by kind: ``top`` (module level), ``local`` (in
    a function), ``typing`` (under ``TYPE_CHECKING``), ``by_name`` (importlib strings)."""
    tree = ast.parse(MODULES[name].read_text())
    found: dict[str, set[str]] = {"top": set(), "local": set(), "typing": set(), "by_name": set()}

    def visit(nodes: list[ast.stmt], kind: str) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found[kind].update(_targets(node, name))
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.body, "typing")
                visit(node.orelse, kind)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, "typing" if kind == "typing" else "local")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, kind)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []) or [], kind)

    visit(tree.body, "top")
    if _calls_import_by_name(tree):
        for node in ast.walk(tree):
            # (not the bare "ckptkit": that string is the logger's name)
            v = node.value if isinstance(node, ast.Constant) else None
            if isinstance(v, str) and v.startswith("ckptkit.") and v in MODULES:
                found["by_name"].add(v)
    return found


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _with_packages(targets: Iterable[str], importer: str) -> set[str]:
    """``targets`` and every package ``__init__`` that importing them runs.

    Left out: the root (the public facade, imported before anything inside it can be), the
    importer's own packages (already running when it is imported), and an ``__init__``
    that imports no ckptkit module (running it runs nothing else)."""
    out: set[str] = set()
    for t in targets:
        out.add(t)
        for pkg in _ancestors(t) - _ancestors(importer) - {"ckptkit"}:
            if pkg in MODULES and any(imports(pkg).values()):
                out.add(pkg)
    return {t for t in out if t in MODULES}


def graph(*, kinds: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules it imports (the given kinds, package ``__init__``s included)."""
    g: dict[str, set[str]] = {}
    for name in MODULES:
        found = imports(name)
        g[name] = _with_packages((t for k in kinds for t in found[k]), name) - {name}
    return g


ALL_KINDS = ("top", "local", "typing", "by_name")
RUNTIME_KINDS = ("top", "local", "by_name")


def strongly_connected(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``g`` with more than one module (or a
    module importing itself): each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            connect(v)
    return out


def _one_cycle(g: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest cycle through the first module of ``comp`` (for the message)."""
    start = comp[0]
    members = set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def _cycle_graph() -> dict[str, set[str]]:
    g = graph(kinds=RUNTIME_KINDS)
    for (a, b) in IGNORED_FOR_CYCLES:
        g.get(a, set()).discard(b)
    return g


def test_every_module_has_a_layer() -> None:
    missing = sorted(n for n in MODULES if layer_of(n) is None)
    assert not missing, f"give these modules a layer in LAYERS and docs/architecture.md: {missing}"


def test_no_import_cycles() -> None:
    g = _cycle_graph()
    cycles = [" -> ".join(_one_cycle(g, comp)) for comp in strongly_connected(g)]
    assert not cycles, "import cycles (move the shared concept down a layer):\n" + "\n".join(cycles)


def test_imports_go_down_the_layers() -> None:
    g = graph(kinds=ALL_KINDS)
    bad = []
    for a in sorted(g):
        for b in sorted(g[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is None or lb is None or RANK[lb] <= RANK[la] or (a, b) in ALLOWED_UP:
                continue
            bad.append(f"{a} ({la}) imports {b} ({lb})")
    assert not bad, "imports against the layer order (docs/architecture.md):\n" + "\n".join(bad)


def test_allow_lists_name_real_edges() -> None:
    g = graph(kinds=ALL_KINDS)
    stale = [e for e in (*ALLOWED_UP, *IGNORED_FOR_CYCLES) if e[1] not in g.get(e[0], set())]
    assert not stale, f"these allow-list entries no longer exist; remove them: {stale}"
    still_down = [e for e in ALLOWED_UP if RANK[layer_of(e[1]) or ""] <= RANK[layer_of(e[0]) or ""]]
    assert not still_down, f"these edges go down now; remove them from ALLOWED_UP: {still_down}"


def test_the_graph_sees_package_inits_and_names() -> None:
    """The edges a plain import-order check misses are in the graph (self-test)."""
    g = graph(kinds=RUNTIME_KINDS)
    # importing a submodule runs its package's __init__ first
    assert "ckptkit.verify" in g["ckptkit.signals.guard"]
    # runs imports the built-in layouts by name (importlib)
    assert {"ckptkit.run.layouts.hf", "ckptkit.run.layouts.lightning"} <= g["ckptkit.run.directory"]


def test_the_checker_finds_a_cycle_through_a_package_init() -> None:
    """The shape of the cycle issue 24 found (a reader imports a verify submodule, the verify
    package's __init__ imports the runner, the runner imports the reader): caught."""
    g = {
        "p.reader": {"p.verify", "p.verify.findings"},
        "p.verify": {"p.verify.runner"},
        "p.verify.findings": set(),
        "p.verify.runner": {"p.reader"},
    }
    comps = strongly_connected(g)
    assert comps == [["p.reader", "p.verify", "p.verify.runner"]]
    assert _one_cycle(g, comps[0]) == ["p.reader", "p.verify", "p.verify.runner", "p.reader"]


@pytest.mark.parametrize(
    "name", ["ckptkit.format.manifest", "ckptkit.format.ranks", "ckptkit.format.validation"]
)
def test_the_manifest_is_pure_format(name: str) -> None:
    """The manifest format (the manifest, the checks of its documents, the multi-rank merge)
    opens no file and imports nothing above the format layer."""
    found = imports(name)
    deps = _with_packages((t for k in ALL_KINDS for t in found[k]), name)
    above = {t for t in deps if RANK[layer_of(t) or "api"] > RANK["format"]}
    assert not above, f"{name} imports {sorted(above)}"
    src = MODULES[name].read_text()
    assert not re.search(r"\bopen\(|os\.(open|read|write|fstat)\b|\bPath\(", src), name


def test_storage_does_not_import_manifest_io() -> None:
    g = graph(kinds=ALL_KINDS)
    back = sorted(
        (a, b) for a in g if layer_of(a) == "storage" for b in g[a] if b.startswith("ckptkit.checkpoint")
    )
    assert not back, f"storage imports the checkpoint reader back: {back}"


def _is_local_lines() -> dict[str, list[int]]:
    return {
        name: hits
        for name, path in sorted(MODULES.items())
        if (hits := [i for i, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bis_local\b", line)])
    }


def test_is_local_only_in_storage() -> None:
    """One filesystem interface: local-versus-remote is decided inside storage/ only."""
    found = _is_local_lines()
    hits = [
        f"{name}:{i}"
        for name, lines in found.items()
        if layer_of(name) != "storage" and name not in IS_LOCAL_LEFT
        for i in lines
    ]
    assert not hits, (
        "decide local-versus-remote inside ckptkit/storage/ (behind a function named for "
        "what it does), not at: " + ", ".join(hits)
    )
    stale = sorted(set(IS_LOCAL_LEFT) - set(found))
    assert not stale, f"no is_local left in {stale}: remove them from IS_LOCAL_LEFT"


def _module_aliases(name: str) -> dict[str, str]:
    """Local names bound to ckptkit modules in ``name`` (``from ckptkit.storage import
    tensors as st`` binds ``st``)."""
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptkit"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in MODULES:
                    out[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in MODULES:
                    out[a.asname] = a.name
    return out


def _package_internal(used: str, user: str) -> bool:
    pkg, _, leaf = used.rpartition(".")
    return leaf.startswith("_") and user.startswith(pkg + ".")


def test_no_module_uses_another_modules_private_names() -> None:
    """What two packages share is a public, documented interface (``storage/remote.py`` once
    called five private functions of ``storage/tensors.py``; now they are its documented
    transport interface). A private module (``foreign/_load.py``) is its package's shared
    internals: its siblings may use its private names."""
    bad = []
    for name in sorted(MODULES):
        aliases = _module_aliases(name)
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not _package_internal(aliases[node.value.id], name)
            ):
                bad.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not bad, "make these public (named, documented) or move them:\n" + "\n".join(bad)


def test_architecture_doc_lists_every_layer_and_module() -> None:
    text = DOC.read_text()
    for layer, _ in LAYERS:
        assert f"`{layer}`" in text, f"docs/architecture.md does not describe layer {layer!r}"
    for name in MODULES:
        if name.endswith("__main__"):
            continue
        rel = MODULES[name].relative_to(PKG.parent).as_posix()
        shown = rel.removesuffix("/__init__.py") + "/" if rel.endswith("__init__.py") else rel
        assert shown in text, f"docs/architecture.md's module map does not list {shown}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n not in LAZY_OK))
def test_no_function_local_imports_of_ckptkit(name: str) -> None:
    local = imports(name)["local"]
    assert not local, (
        f"{name} imports {sorted(local)} inside a function; import at module level (if that "
        "makes a cycle, move the concept down a floor)"
    )


def test_manager_reads_in_one_sitting() -> None:
    # Issue 24: the save pipeline and its settle hook (saving.py), restore's walk
    # (restore.restore_run), the emergency checkpoint (recovery.py) and the run's own steps
    # (lock, index, latest, retention, settle, housekeeping: ckptkit/run/) moved out; what
    # is left is the public front that wires them together.
    lines = len((PKG / "run" / "manager.py").read_text().splitlines())
    assert lines <= 500, f"manager.py has {lines} lines: move a step into its own module"


def test_the_module_map_is_current() -> None:
    """docs/architecture.md's module map (line counts, responsibilities) is the code's."""
    tool = PKG.parent / "tools" / "module_map.py"
    r = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr

