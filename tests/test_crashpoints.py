"""The crash points: armed only by the environment, exact about which pass stops, documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptkit import crashpoints

DOC = Path(__file__).resolve().parents[1] / "docs" / "testing.md"


class Stopped(Exception):
    pass


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """``os._exit`` raises instead of ending pytest; the hit counts start afresh."""

    def stop(code: int) -> None:
        raise Stopped(code)

    monkeypatch.setattr(crashpoints.os, "_exit", stop)
    monkeypatch.setattr(crashpoints, "_hits", {})
    return monkeypatch


def test_unarmed_points_do_nothing_even_unknown_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(crashpoints.ENV, raising=False)
    monkeypatch.delenv(crashpoints.TRACE_ENV, raising=False)
    crashpoints.reached("commit.done")
    crashpoints.reached("no.such.point")


def test_an_unknown_point_is_an_error_once_armed(armed: pytest.MonkeyPatch) -> None:
    """A typo at a call site would make a crash test pass without stopping anywhere."""
    armed.setenv(crashpoints.ENV, "commit.done")
    with pytest.raises(KeyError, match=r"commit\.nowhere"):
        crashpoints.reached("commit.nowhere")


def test_stops_at_the_named_pass_with_its_exit_code(armed: pytest.MonkeyPatch) -> None:
    armed.setenv(crashpoints.ENV, "commit.file_written@3")
    crashpoints.reached("commit.file_written")
    crashpoints.reached("commit.done")
    crashpoints.reached("commit.file_written")
    with pytest.raises(Stopped) as e:
        crashpoints.reached("commit.file_written")
    assert e.value.args == (crashpoints.EXIT_CODE,)


def test_the_trace_lists_points_in_order_with_times(
    armed: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    armed.setenv(crashpoints.TRACE_ENV, str(trace))
    for name in ("commit.tmp_created", "commit.done", "settle.done"):
        crashpoints.reached(name)
    lines = [line.split() for line in trace.read_text().splitlines()]
    assert [n for n, _ in lines] == ["commit.tmp_created", "commit.done", "settle.done"]
    times = [float(t) for _, t in lines]
    assert times == sorted(times)


def test_every_point_is_documented_and_nothing_else() -> None:
    section = DOC.read_text().split("## Crash points", 1)[1]
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M))
    assert documented == set(crashpoints.POINTS)


def test_every_point_has_a_call_site() -> None:
    """A point nobody reaches would be parametrized over and stop nothing."""
    # framework.files is reached inside the frameworks' own writes: the crash-matrix scripts
    # wrap torch.save / safetensors to call it (ckptkit has no code there).
    root = DOC.parents[1]
    files = [*(root / "ckptkit").rglob("*.py"), *(root / "tests" / "crash_scripts").rglob("*.py")]
    src = "\n".join(p.read_text() for p in files)
    for name in crashpoints.POINTS:
        assert f'crashpoints.reached("{name}")' in src, name
