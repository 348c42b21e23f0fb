"""The ``watch`` command: follow a running job's metrics file and show or alert on its stability.

The following and classifying is :mod:`ckptkit.cli.watch`, imported when the command runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ckptkit.cli.shared import edge


@click.command()
@click.argument("metrics", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--once", is_flag=True, help="Classify what the file holds now, print, exit.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between polls of the file.",
)
@click.option(
    "--alert-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the state as JSON here on every change to warn or critical.",
)
@click.option(
    "--exit-on",
    type=click.Choice(["warn", "critical", "never"]),
    default="never",
    show_default=True,
    help="Exit 1 once the run reaches this level.",
)
@click.option("--max-idle", type=float, help="Stop after this many seconds without a new record.")
@click.option("--wait", "wait_s", type=float, default=0.0, help="Seconds to wait for the file.")
@click.option("--json", "as_json", is_flag=True, help="Print the final state as JSON.")
@edge
def watch(
    metrics: Path,
    once: bool,
    interval: float,
    alert_file: Path | None,
    exit_on: str,
    max_idle: float | None,
    wait_s: float,
    as_json: bool,
) -> None:
    """Follow a running job's metrics JSONL (its Recorder file) and classify its stability.

    Shows a live dashboard of the signals (loss, grad norm, loss scale, max logit, ...)
    and the level (ok / warn / critical). Only reads the file: the job is never slowed.
    Exit 1 when --exit-on LEVEL was reached, 0 otherwise, 2 when the file cannot be read.

    \b
    Example:
        ckptkit watch runs/exp1/metrics.jsonl --alert-file runs/exp1/ALERT --exit-on critical
        ckptkit watch runs/exp1/metrics.jsonl --once --json
    """
    from ckptkit.cli.watch import dashboard, follow, render

    live_on = not once and not as_json and sys.stdout.isatty()
    if live_on:
        from rich.live import Live

        with Live(refresh_per_second=4) as live:
            state, code = follow(
                metrics,
                interval=interval,
                alert_file=alert_file,
                exit_on=exit_on,  # type: ignore[arg-type]
                max_idle=max_idle,
                wait_for_file=wait_s,  # type: ignore[arg-type]
                on_poll=lambda st: live.update(dashboard(st)),
            )
    else:
        state, code = follow(
            metrics,
            interval=interval,
            once=once,
            alert_file=alert_file,
            exit_on=exit_on,  # type: ignore[arg-type]
            max_idle=max_idle,
            wait_for_file=wait_s,
        )  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps(state.to_dict(), indent=2, default=str))
    elif not live_on:
        render(state, sys.stdout)
    sys.exit(code)
