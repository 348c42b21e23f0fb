"""The storage layer's answers to "is this on a local disk?": the local Path or an error
naming the remote location, and whether a save reads its files back."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptkit.errors import CkptkitError
from ckptkit.storage import fs


@pytest.mark.parametrize("given", ["/tmp/run", Path("/tmp/run"), "file:///tmp/run", "local:///tmp/run"])
def test_require_local_returns_the_local_path(given: str | fs.Location) -> None:
    assert fs.require_local(given, needs="x") == Path("/tmp/run")


def test_require_local_keeps_a_relative_path() -> None:
    assert fs.require_local("runs/a", needs="x") == Path("runs/a")


@pytest.mark.parametrize("given", ["memory://bucket/run", fs.location("memory://bucket/run")])
def test_require_local_names_the_remote_location_and_the_fix(given: str | fs.Location) -> None:
    with pytest.raises(CkptkitError) as e:
        fs.require_local(given, needs="adopting a foreign checkpoint")
    assert e.value.path == "memory://bucket/run"  # the URL as given, not a folded Path
    assert "adopting a foreign checkpoint works on a local filesystem only" in e.value.what
    assert e.value.hint is not None and "memory://bucket/run" in e.value.hint
    assert "Fix:" in str(e.value)


def test_require_local_refuses_an_unknown_protocol() -> None:
    with pytest.raises(CkptkitError, match="unknown storage protocol"):
        fs.require_local("nosuch://bucket/run", needs="x")


def test_reads_back_cheaply_on_a_local_disk_only(tmp_path: Path) -> None:
    assert fs.reads_back_cheaply(tmp_path)
    assert fs.reads_back_cheaply(fs.location(f"file://{tmp_path}"))
    assert not fs.reads_back_cheaply(fs.location("memory://bucket/run"))
