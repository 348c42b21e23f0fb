"""The ``ckptkit`` command: parse, call one library function, render, exit.

Exit codes: 0 clean, 1 error findings (or a failed drill), 2 unreadable input or
usage error (any :class:`~ckptkit.errors.CkptkitError` is converted here, at the edge).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ckptkit._version import __version__
from ckptkit.errors import CkptkitError

F = TypeVar("F", bound=Callable[..., Any])


def _edge(fn: F) -> F:
    """Turn a CkptkitError into a one-paragraph message and exit 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CkptkitError as e:
            click.echo(f"ckptkit: {e}", err=True)
            sys.exit(2)
        except OSError as e:
            where = f" {e.filename}" if e.filename else ""
            click.echo(f"ckptkit:{where}: {e.strerror or e}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckptkit")
def main() -> None:
    """Trustworthy PyTorch training checkpoints: verify, inspect, drill, rotate."""


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="JSON output (schemas/verify-report.schema.json).")
@click.option("--junit", "junit_file", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@click.option("--strict", is_flag=True, help="Treat warnings as failures.")
@click.option("--against-env", is_flag=True, help="Also check resume compatibility with this machine.")
@click.option("--no-progress", is_flag=True, help="Never show a progress bar.")
@_edge
def verify(path: Path, as_json: bool, junit_file: Path | None, strict: bool, against_env: bool,
           no_progress: bool) -> None:
    """Check a checkpoint (or every checkpoint under a run directory).

    Exit 0 when no error findings, 1 when any, 2 when PATH cannot be read.

    \b
    Example:
        ckptkit verify runs/exp1/ckpt/step-00001000
        ckptkit verify runs/exp1/ckpt --json > report.json
    """
    from ckptkit.render import RENDERERS
    from ckptkit.verify import verify as run_verify

    result = run_verify(path, strict=strict, against_env=against_env,
                        progress=False if no_progress or as_json else None)
    RENDERERS["json" if as_json else "text"](result, sys.stdout)
    if junit_file is not None:
        with open(junit_file, "w") as fh:
            RENDERERS["junit"](result, fh)
    sys.exit(0 if result.ok else 1)


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--no-tensors", is_flag=True, help="Do not list tensors.")
@_edge
def inspect(path: Path, as_json: bool, no_tensors: bool) -> None:
    """Show what a checkpoint holds: step, components, files, tensors (dtype, shape, size).

    \b
    Example:
        ckptkit inspect runs/exp1/ckpt/step-00001000 --no-tensors
    """
    from ckptkit.describe import describe
    from ckptkit.render.text import render_inspect

    info = describe(path)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        render_inspect(info, sys.stdout, tensors=not no_tensors)
