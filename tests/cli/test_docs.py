"""Every CLI command is documented in docs/cli.md with at least one example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptkit.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_command_documented_with_an_example(name: str) -> None:
    text = DOC.read_text()
    section = re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert section, f"docs/cli.md has no '## {name}' section"
    assert f"ckptkit {name} " in section.group(1), f"no example of 'ckptkit {name}'"


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_command_help_has_an_example(name: str) -> None:
    assert "Example" in (main.commands[name].help or "")
