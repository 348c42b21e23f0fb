"""The drill's settings: the DrillConfig dataclass and the drill TOML file that fills it.

:class:`DrillConfig` is what :func:`ckptkit.drill.runner.run_drill` runs; :func:`load_config`
reads one from a drill file (e.g. ``drills/tiny_lm.toml``), checking its keys and types.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptkit.drill import launch
from ckptkit.errors import DrillError


@dataclass
class DrillConfig:
    """What to drill and how.

    Example:
        >>> cfg = DrillConfig(command=["python", "train.py"], steps_before=5, steps_after=5)
        >>> cfg.repeat, cfg.threads
        (1, 1)
    """

    command: Sequence[str]
    """The training command (argv list)."""
    steps_before: int = 10
    """``W``: steps from the start (or from ``from_ckpt``) to the save."""
    steps_after: int = 10
    """``N``: steps after the save, run by both the reference and the resumed run."""
    from_ckpt: Path | str | None = None
    """Start the reference from this checkpoint instead of from scratch."""
    repeat: int = 1
    """Fresh reference runs; with 2 or more the drill also reports whether the script
    reproduces itself from scratch (and names a generator it does not seed). The drill
    also runs ``max(1, repeat)`` control restores of the step-``W`` checkpoint: the noise
    the resumed run is held to is measured from there, never from the fresh starts."""
    threads: int = 1
    """Intra-op threads, pinned identically in every run."""
    device: str = "cpu"
    """Passed to the script as ``CKPTKIT_DEVICE``."""
    pass_device: bool = False
    """Also append ``--device DEVICE`` to the command."""
    workdir: Path | None = None
    """Where the runs write (default: a temporary directory)."""
    keep: bool = False
    """Keep the workdir even when the drill passes (it is always kept on failure)."""
    isolate: bool = False
    """Run each process in its own directory (for scripts that write relative paths)."""
    timeout: float | None = None
    """Seconds each process may run."""
    thresholds: Mapping[str, float] = field(default_factory=dict)
    """Overrides: ``noise_factor``, per-field absolute tolerances, window thresholds."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for every run."""
    launch: launch.Method = "auto"
    """``fork`` this interpreter for each run where possible (``auto``), or ``spawn``."""


CONFIG_KEYS = frozenset(
    {
        "command",
        "steps_before",
        "steps_after",
        "device",
        "threads",
        "repeat",
        "thresholds",
        "pass_device",
        "isolate",
        "timeout",
        "env",
        "from_ckpt",
        "launch",
    }
)
"""Keys a drill TOML file may set (at top level or under ``[drill]``)."""


def load_config(path: str | Path, **overrides: Any) -> DrillConfig:
    """Read a drill TOML file (e.g. ``drills/tiny_lm.toml``); non-None overrides win.

    Raises:
        DrillError: the file is not valid TOML, has unknown keys, no command, or a value
            of the wrong type (integers for steps/repeat/threads, a number for
            ``timeout``, tables of strings for ``env`` and of numbers for ``thresholds``).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "d.toml"
        >>> _ = p.write_text('command = ["python", "train.py"]\\nsteps_before = 4\\n')
        >>> cfg = load_config(p, steps_after=3)
        >>> cfg.command, cfg.steps_before, cfg.steps_after
        (['python', 'train.py'], 4, 3)
    """
    import tomllib

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise DrillError(f"not valid TOML: {e}", path=path, hint="fix the drill file") from None
    if isinstance(data.get("drill"), dict):
        data = data["drill"]
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise DrillError(
            f"unknown keys {unknown}", path=path, hint=f"use only {sorted(CONFIG_KEYS)}"
        )
    values: dict[str, Any] = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    command = values.get("command")
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    if (
        not command
        or not isinstance(command, list | tuple)
        or not all(isinstance(a, str) for a in command)
    ):
        raise DrillError(
            "no command (a list of strings) given",
            path=path,
            hint='command = ["python", "-m", "my.train"]',
        )
    values["command"] = command
    _check_types(values, path)
    if values.get("from_ckpt") is not None:
        values["from_ckpt"] = Path(values["from_ckpt"])
    try:
        return DrillConfig(**values)
    except TypeError as e:
        raise DrillError(str(e), path=path, hint="check the drill file's keys") from None


_INT_KEYS = {"steps_before": 10, "steps_after": 10, "repeat": 2, "threads": 1}
"""Integer keys of a drill file, with an example value for the hint."""


def _check_types(values: Mapping[str, Any], path: Path) -> None:
    """Raise a DrillError naming the key when a drill file value has the wrong type."""

    def bad(key: str, want: str, example: str) -> DrillError:
        got = values[key]
        return DrillError(
            f"{key} = {got!r} ({type(got).__name__}) must be {want}",
            path=path,
            hint=f"write it as {example}",
        )

    for key, example in _INT_KEYS.items():
        v = values.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad(key, "an integer", f"{key} = {example}")
    for key in ("device", "from_ckpt"):
        v = values.get(key)
        if v is not None and not isinstance(v, str | os.PathLike):
            raise bad(
                key, "a string", f'{key} = "{"cpu" if key == "device" else "ckpt/step-00000010"}"'
            )
    if values.get("launch") is not None and values["launch"] not in ("auto", "fork", "spawn"):
        raise bad("launch", "one of auto, fork, spawn", 'launch = "auto"')
    for key in ("pass_device", "isolate"):
        v = values.get(key)
        if v is not None and not isinstance(v, bool):
            raise bad(key, "true or false", f"{key} = true")
    timeout = values.get("timeout")
    if timeout is not None and not _is_number(timeout):
        raise bad("timeout", "a number of seconds", "timeout = 600")
    if not _table_of(values.get("env"), lambda v: isinstance(v, str)):
        raise bad("env", "a table of string values", '[env] (or [drill.env]) NAME = "1"')
    if not _table_of(values.get("thresholds"), _is_number):
        raise bad(
            "thresholds",
            "a table of numbers",
            "[thresholds] (or [drill.thresholds]) noise_factor = 4.0",
        )


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _table_of(table: Any, ok: Callable[[Any], bool]) -> bool:
    """Whether ``table`` is absent, or a mapping of string keys to values ``ok`` accepts."""
    if table is None:
        return True
    if not isinstance(table, Mapping):
        return False
    return all(isinstance(k, str) and ok(v) for k, v in table.items())


__all__ = ["CONFIG_KEYS", "DrillConfig", "load_config"]
