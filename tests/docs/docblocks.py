"""Find every fenced code block of README.md and docs/*.md, with its doc-test marks.

A mark is an HTML comment (invisible on GitHub) on the line(s) right above the fence::

    <!-- doc-test: skip — needs a CUDA GPU -->
    <!-- doc-test: prelude=tiny_loop env=CKPTKIT_DRILL_STOP_AT=4 -->

``skip — REASON`` (or ``skip: REASON``) says the block is not run here and why; every other
mark is a space-separated list of ``key`` or ``key=value`` items:

``prelude=NAME``
    run a Python block after the named prelude (:mod:`preludes`): the tiny model,
    optimizer, dataset, ``loss_fn``, ``tok_hash``... the block assumes;
``continues``
    a Python block that continues the previous Python block of the same file (both run,
    in order, in one namespace);
``isolate``
    run the Python block in a fresh ``python`` process instead of in-process (third-party
    frameworks, signal handlers);
``env=NAME=VALUE``
    set an environment variable for the block (repeatable), e.g. ``CKPTKIT_DRILL_STOP_AT``
    to stop a loop written for 10 000 steps after a few;
``rewrite=OLD->NEW``
    replace a path the block names that cannot exist here (``/scratch/...``) (repeatable);
``add=COMMAND:ARG``
    append ``ARG`` to every ``ckptkit COMMAND`` line (e.g. ``add=watch:--max-idle=0.5`` for a
    live dashboard that would otherwise follow the file forever) (repeatable);
``workspace=foreign``
    shell blocks: also prepare the foreign checkpoints (Trainer, Lightning, Accelerate,
    DCP) written by the real clients;
``slow``
    the block takes long (a drill): marked ``pytest.mark.slow``.

Fences whose info string is not a language we run (``text``, ``toml``, none...) are output
samples or trees and are not run; ``json`` and ``yaml`` blocks are parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell", "console")
PARSED = ("json", "yaml", "yml")
KEYS = ("prelude", "continues", "isolate", "env", "rewrite", "add", "workspace", "slow")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced block of a Markdown file."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    code: str
    marks: dict[str, list[str]] = field(default_factory=dict)
    skip: str | None = None
    """Why the block is not run here (None: it is)."""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def mark(self, key: str) -> str | None:
        values = self.marks.get(key)
        return values[-1] if values else None


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse_marks(body: str) -> tuple[dict[str, list[str]], str | None]:
    """``skip — reason`` or ``key[=value] ...`` -> (marks, skip reason)."""
    m = re.match(r"skip\b\s*[—:-]*\s*(.*)$", body)
    if m:
        if not m.group(1).strip():
            raise ValueError(f"a skip mark needs a reason: {body!r}")
        return {}, m.group(1).strip()
    marks: dict[str, list[str]] = {}
    for item in body.split():
        key, _, value = item.partition("=")
        if key not in KEYS:
            raise ValueError(f"unknown doc-test mark {key!r} in {body!r} (known: {KEYS})")
        marks.setdefault(key, []).append(value)
    return marks, None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        lang = m.group("info").strip().split(" ")[0].lower() if m.group("info").strip() else ""
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        marks: dict[str, list[str]] = {}
        skip = None
        j = start - 1
        while j >= 0 and _MARK.match(lines[j]):
            more, why = parse_marks(_MARK.match(lines[j]).group("body"))  # type: ignore[union-attr]
            for k, v in more.items():
                marks.setdefault(k, []).extend(v)
            skip = skip or why
            j -= 1
        out.append(Block(path, start + 1, lang, "\n".join(body) + "\n", marks, skip))
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for p in doc_files() for b in blocks(p)]
