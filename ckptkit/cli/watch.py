"""Out-of-process stability watching: follow a Recorder JSONL file, classify, alert.

``ckptkit watch METRICS.jsonl`` runs this next to a training job. It only reads the file
the job's :class:`~ckptkit.Recorder` appends to (polling: no inotify, works on network
filesystems), so it never slows the training process. Each complete new line is fed to a
:class:`~ckptkit.signals.stability.StabilityWatch`; a partial last line (a write in progress, or
a killed writer) is kept until its newline arrives; a damaged line is skipped and counted
(the policy of :func:`ckptkit.signals.recorder.parse_line`, shared with ``read_jsonl``). A file that
shrinks (truncated) or is replaced (another inode at the path, whatever its size) is read
again from the start with fresh windows.

On a level change to ``warn`` or ``critical`` an alert file can be written (JSON, atomic
replace) for a scheduler to act on, and the follower can stop with a non-zero exit once
the run reaches a chosen level.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from ckptkit.cli.render.text import PipeConsole
from ckptkit.errors import CkptkitError
from ckptkit.signals.recorder import parse_line
from ckptkit.signals.stability import StabilityWatch, not_judging
from ckptkit.signals.verdicts import RANK, Level, Verdict, worse


class JsonlFollower:
    """Yield the complete new records of a growing JSONL file, one poll at a time.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> _ = p.write_text('{"step":1,"loss":2.0}\\n{"step":2,"lo')
        >>> f = JsonlFollower(p)
        >>> [r["step"] for r in f.poll()]
        [1]
        >>> with open(p, "a") as fh:
        ...     _ = fh.write('ss":"nan"}\\n')
        >>> f.poll()
        [{'step': 2, 'loss': nan}]
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.buffer = b""
        self.line_no = 0
        self.restarted = 0
        """How many times the file shrank or was replaced and was read again from the start."""
        self.bad_lines = 0
        """Damaged lines skipped (not a JSON object), over all restarts."""
        self._ident: tuple[int, int] | None = None
        """``(st_dev, st_ino)`` of the file being followed."""

    def poll(self) -> list[dict[str, Any]]:
        """Read what was appended since the last poll; return the complete records.

        Raises:
            FileNotFoundError: the file does not exist (yet).
        """
        st = self.path.stat()
        size, ident = st.st_size, (st.st_dev, st.st_ino)
        replaced = self._ident is not None and ident != self._ident
        if replaced or size < self.offset:
            self.offset, self.buffer, self.line_no = 0, b"", 0
            self.restarted += 1
        self._ident = ident
        if size == self.offset:
            return []
        with open(self.path, "rb") as fh:
            now = os.fstat(fh.fileno())
            if (now.st_dev, now.st_ino) != ident:
                return []  # replaced between stat and open: the next poll restarts
            fh.seek(self.offset)
            data = fh.read(size - self.offset)
        self.offset += len(data)
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        out: list[dict[str, Any]] = []
        for raw in lines:
            self.line_no += 1
            if not raw.strip():
                continue
            rec = parse_line(raw)
            if rec is None:
                self.bad_lines += 1  # a damaged line mid-file: skip it, keep following
                continue
            out.append(rec)
        return out


@dataclass
class WatchState:
    """What the follower has seen so far (what the dashboard renders)."""

    path: Path
    """The metrics file."""
    watch: StabilityWatch
    """The watch fed with every record."""
    records: int = 0
    """Records read."""
    verdict: Verdict | None = None
    """The newest verdict."""
    worst: Level = "ok"
    """The worst level seen."""
    worst_step: int | None = None
    """The first step at the worst level."""
    events: list[str] = field(default_factory=list)
    """Level changes, newest last (``step N: ok -> warn: ...``)."""
    last_seen: float = field(default_factory=time.time)
    """When the last record arrived."""
    alerted: Level = "ok"
    """The level of the last alert written."""
    bad_lines: int = 0
    """Damaged lines skipped (not a JSON object)."""
    restarts: int = 0
    """How many times the file was truncated or replaced and read again from the start."""

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able state (what the alert file holds)."""
        v = self.verdict
        return {
            "metrics_file": str(self.path),
            "records": self.records,
            "bad_lines": self.bad_lines,
            "restarts": self.restarts,
            "level": v.level if v else "ok",
            "judging": not_judging(self.watch) is None,
            "not_judging": not_judging(self.watch),
            "step": v.step if v else None,
            "worst": self.worst,
            "worst_step": self.worst_step,
            "summary": v.summary() if v else None,
            "events": self.events[-20:],
            "health": self.watch.snapshot(),
            "time": time.time(),
        }


ExitOn = Literal["warn", "critical", "never"]


def follow(
    path: str | os.PathLike[str],
    *,
    watch: StabilityWatch | None = None,
    interval: float = 1.0,
    once: bool = False,
    alert_file: str | os.PathLike[str] | None = None,
    exit_on: ExitOn = "never",
    max_idle: float | None = None,
    wait_for_file: float = 0.0,
    on_poll: Callable[[WatchState], None] | None = None,
) -> tuple[WatchState, int]:
    """Follow a Recorder JSONL file with a :class:`StabilityWatch` until told to stop.

    Args:
        path: the metrics file a training job appends to.
        watch: the watch to feed (default: ``StabilityWatch()`` with default thresholds).
        interval: seconds between polls.
        once: read what is there now, classify it, and return (no following).
        alert_file: write the state here as JSON (atomic replace) on every level change
            to ``warn`` or ``critical``.
        exit_on: stop once the run reaches this level (``never``: keep following).
        max_idle: stop after this many seconds without a new record.
        wait_for_file: seconds to wait for the file to appear before failing.
        on_poll: called with the state after every poll (the live dashboard).

    Returns:
        ``(state, exit_code)``: 1 when ``exit_on`` was reached, else 0.

    Raises:
        CkptkitError: the file does not appear within ``wait_for_file`` seconds.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> _ = p.write_text('{"step":1,"loss":"nan"}\\n')
        >>> state, code = follow(p, once=True, exit_on="critical")
        >>> state.worst, code
        ('critical', 1)
    """
    watch = watch or StabilityWatch()
    state = WatchState(Path(path), watch)
    follower = JsonlFollower(path)
    deadline = time.monotonic() + wait_for_file
    while not state.path.exists():
        if time.monotonic() >= deadline:
            raise CkptkitError(
                "metrics file not found",
                path=state.path,
                hint="start the job with a Recorder writing here, or pass --wait SECONDS",
            )
        time.sleep(min(interval, 0.5))
    restarts = 0
    for records in _polls(follower, interval, once):
        if follower.restarted != restarts:  # truncated or replaced: a new run, fresh windows
            restarts = follower.restarted
            watch.reset()
            state.events.append(
                f"{state.path.name} was truncated or replaced: reading it again from the start"
            )
        state.restarts = follower.restarted
        state.bad_lines = follower.bad_lines
        for rec in records:
            step = rec.get("step")
            if not isinstance(step, int):
                continue
            metrics = {k: v for k, v in rec.items() if k not in ("step", "time")}
            v = watch.update(step, **metrics)
            _note(state, v, alert_file)
            state.records += 1
        if records:
            state.last_seen = time.time()
        if on_poll is not None:
            on_poll(state)
        if exit_on != "never" and RANK[state.worst] >= RANK[exit_on]:
            return state, 1
        if max_idle is not None and time.time() - state.last_seen > max_idle:
            break
    return state, 1 if exit_on != "never" and RANK[state.worst] >= RANK[exit_on] else 0


def _polls(f: JsonlFollower, interval: float, once: bool) -> Iterator[list[dict[str, Any]]]:
    yield f.poll()
    while not once:
        time.sleep(interval)
        yield f.poll()


def _note(state: WatchState, v: Verdict, alert_file: str | os.PathLike[str] | None) -> None:
    prev = state.verdict.level if state.verdict else "ok"
    state.verdict = v
    if RANK[v.level] > RANK[state.worst]:
        state.worst, state.worst_step = v.level, v.step
    state.worst = worse(state.worst, v.level)
    if v.level != prev:
        state.events.append(f"{prev} -> {v.summary()}")
    if alert_file is not None and v.level != "ok" and v.level != state.alerted:
        write_alert(alert_file, state)
        state.alerted = v.level
    elif v.level == "ok":
        state.alerted = "ok"


def write_alert(path: str | os.PathLike[str], state: WatchState) -> None:
    """Write the state as JSON to ``path`` atomically (a reader never sees half a file)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.to_dict(), indent=1, allow_nan=False, default=str))
    os.replace(tmp, target)


# --- rendering ----------------------------------------------------------------------------------

_STYLE = {"ok": "green", "warn": "yellow", "critical": "bold red"}


def dashboard(state: WatchState) -> Any:
    """Build the rich renderable of the state: one row per signal, then the events.

    Example:
        >>> import tempfile
        >>> st = WatchState(Path("m.jsonl"), StabilityWatch())
        >>> type(dashboard(st)).__name__
        'Group'
    """
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    v = state.verdict
    level = v.level if v else "ok"
    waiting = not_judging(state.watch) if level == "ok" else None
    head = Text.assemble(
        ("ckptkit watch ", "bold"),
        (str(state.path), "cyan"),
        f"  records {state.records}  step {v.step if v else '-'}  level ",
        (level, _STYLE[level]) if waiting is None else ("not judged yet: " + waiting, "cyan"),
        f"  (worst {state.worst}" + (f" at step {state.worst_step})" if state.worst_step else ")"),
        (f"  damaged lines skipped {state.bad_lines}" if state.bad_lines else "", "yellow"),
    )
    tab = Table(box=None, pad_edge=False)
    for col in ("signal", "last", "baseline", "recent", "z", "std ratio", "level"):
        tab.add_column(col, justify="left" if col in ("signal", "level") else "right")
    fired = {s.name.split(".")[0]: s for s in (v.signals if v else [])}
    snap = state.watch.snapshot()["window"]
    for name, st in snap.items():
        if name == "nonfinite_counts":
            continue
        sig = fired.get(name)
        lvl = sig.level if sig else "ok" if waiting is None and st.get("z") is not None else "-"
        tab.add_row(
            name,
            _f(st.get("last")),
            _f(st.get("baseline_median")),
            _f(st.get("recent_median")),
            _f(st.get("z"), "+.1f"),
            _f(st.get("std_ratio"), ".2f"),
            Text(lvl, _STYLE.get(lvl, "dim")),
        )
    parts: list[Any] = [head, tab]
    if v is not None and v.signals:
        parts.append(
            Text(
                "signals: " + "; ".join(f"{s.name} ({s.detail})" for s in v.signals),
                style=_STYLE[v.level],
            )
        )
    for e in state.events[-5:]:
        parts.append(Text(e, style="dim"))
    return Group(*parts)


def _f(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return format(x, fmt)


def render(state: WatchState, out: IO[str]) -> None:
    """Print the dashboard once (no live refresh) to ``out``."""
    PipeConsole(file=out, width=120).print(dashboard(state))


__all__ = [
    "JsonlFollower", "WatchState", "dashboard", "follow", "not_judging", "render", "write_alert",
]
