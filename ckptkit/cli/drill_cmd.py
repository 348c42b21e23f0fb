"""The ``drill`` command: its options become one DrillConfig, which is run and reported.

The options are the drill TOML file's keys (``--config`` reads one; an option given wins)
plus where the reports go; :func:`drill_config` builds the config the same way for both.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ckptkit.cli.shared import F, Where, edge, out_file
from ckptkit.errors import CkptkitError

if TYPE_CHECKING:
    from ckptkit.drill.config import DrillConfig
    from ckptkit.drill.report import DrillReport


def _count(*decls: str, help: str) -> Callable[[F], F]:
    """A positive count option; not given (None), the drill file's value or the default
    applies (:func:`drill_config`)."""
    return click.option(*decls, type=click.IntRange(1), default=None, help=help)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Drill TOML file (e.g. drills/tiny_lm.toml); options given here win.",
)
@_count("--steps-before", "-W", help="Steps before the save (default 10).")
@_count("--steps-after", "-N", help="Steps after the save, compared (default 10).")
@click.option(
    "--from",
    "from_ckpt",
    type=Where(),
    help="Start the reference from this checkpoint (a path or URL) instead of from scratch.",
)
@_count(
    "--repeat",
    help="Fresh reference runs, and control restores of the save (default 1); 2+ also "
    "reports whether the script reproduces itself from scratch.",
)
@_count("--threads", help="Threads pinned in every run (default 1).")
@click.option("--device", default=None, help="Device for the script ($CKPTKIT_DEVICE).")
@click.option(
    "--pass-device",
    is_flag=True,
    default=None,
    help="Also append '--device DEVICE' to the command.",
)
@click.option(
    "--isolate",
    is_flag=True,
    default=None,
    help="Run each process in its own directory (scripts writing relative paths).",
)
@click.option(
    "--workdir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Keep the runs here (default: a temporary directory, kept on failure).",
)
@click.option("--keep", is_flag=True, help="Keep the temporary runs even when the drill passes.")
@click.option("--timeout", type=float, default=None, help="Seconds each run may take.")
@click.option(
    "--noise-factor",
    type=float,
    default=None,
    help="Tolerance = this x measured noise where runs are not bitwise (default 4).",
)
@click.option("--json", "json_file", help="Write the JSON report here ('-': stdout).")
@click.option(
    "--junit",
    "junit_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write JUnit XML here (one testcase per check).",
)
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a loss/grad-norm PNG here (needs matplotlib).",
)
@click.option(
    "--launch",
    type=click.Choice(["auto", "fork", "spawn"]),
    default=None,
    help="Start runs as forks of this interpreter (auto: when the command allows) or as "
    "new processes (spawn).",
)
@click.option("--quiet", "-q", is_flag=True,
              help="Print only the verdict (and, when it failed, the failed checks and the "
              "diagnosis): no progress lines, no table.")
@edge
def drill(
    command: tuple[str, ...],
    config_file: Path | None,
    steps_before: int | None,
    steps_after: int | None,
    from_ckpt: Path | None,
    repeat: int | None,
    threads: int | None,
    device: str | None,
    pass_device: bool | None,
    isolate: bool | None,
    workdir: Path | None,
    keep: bool,
    timeout: float | None,
    noise_factor: float | None,
    json_file: str | None,
    junit_file: Path | None,
    plot_file: Path | None,
    launch: str | None,
    quiet: bool,
) -> None:
    """Run a resume drill on your training command: reference vs resumed, compared.

    Runs CMD from scratch (or --from CKPT) with a save after W steps and on to W+N, then
    in a new process restores the step-W checkpoint and runs to W+N; checks twin,
    exposure, continuity (and the informational window), then names the broken component.
    The script is driven through environment variables (docs/drills.md).

    Exit 0 when every check passes, 1 when one fails (a resume ckptkit refused at restore
    included), 2 when the drill could not run. The --json and --junit reports are written
    on every exit, with the reason.

    \b
    Example:
        ckptkit drill -W 10 -N 10 -- python -m ckptkit.examples.tiny_lm --steps 40
        ckptkit drill --config drills/tiny_lm.toml --json drill.json --junit drill.xml
    """
    from ckptkit.drill.report import DrillReport

    reports = _Reports(json_file=json_file, junit_file=junit_file, plot_file=plot_file,
                       quiet=quiet)
    try:
        _no_option_as_command(command)
        config = drill_config(
            config_file,
            noise_factor=noise_factor,
            command=list(command) or None,
            steps_before=steps_before,
            steps_after=steps_after,
            from_ckpt=from_ckpt,
            repeat=repeat,
            threads=threads,
            device=device,
            pass_device=pass_device,
            isolate=isolate,
            timeout=timeout,
            launch=launch,
            workdir=workdir,
            keep=keep,
        )
        _drill(config, reports)
    except (CkptkitError, click.UsageError) as e:
        report = getattr(e, "report", None)
        if report is None:
            msg = e.format_message() if isinstance(e, click.UsageError) else e
            report = DrillReport.failure(
                e if isinstance(e, CkptkitError) else str(msg), command=list(command),
                stage="config",
            )
        reports.write(report)
        raise


def drill_config(
    config_file: Path | None, *, noise_factor: float | None = None, **given: Any
) -> DrillConfig:
    """The drill the options describe, as the one :class:`~ckptkit.drill.config.DrillConfig`
    the TOML file and the Python API use.

    ``given``: :class:`~ckptkit.drill.config.DrillConfig` fields; None means not given.
    With ``config_file`` (``--config``), the file's values under the ones given
    (:func:`~ckptkit.drill.config.load_config`), else the ones given over the defaults;
    ``noise_factor`` (``--noise-factor``) goes over the file's ``thresholds``.

    Raises:
        click.UsageError: no ``config_file`` and no ``command``.
        DrillError: the file cannot be read as a drill (see ``load_config``).

    Example:
        >>> cfg = drill_config(None, command=["python", "train.py"], steps_before=5,
        ...                    repeat=None, noise_factor=3.0)
        >>> cfg.steps_before, cfg.repeat, dict(cfg.thresholds)
        (5, 1, {'noise_factor': 3.0})
    """
    from ckptkit.drill.config import DrillConfig, load_config

    thresholds = {"noise_factor": noise_factor} if noise_factor is not None else None
    if config_file is not None:
        config = load_config(config_file, **given)
        if thresholds:
            config.thresholds = {**config.thresholds, **thresholds}
        return config
    if not given.get("command"):
        raise click.UsageError("give the training command after '--' (or --config FILE)")
    return DrillConfig(
        **{k: v for k, v in given.items() if v is not None}, thresholds=thresholds or {}
    )


@dataclass(frozen=True)
class _Reports:
    """Where a drill's outcome goes besides its exit status: the terminal and the files."""

    json_file: str | None
    """``--json``: the JSON report's path ('-': stdout, in place of the text summary)."""
    junit_file: Path | None
    """``--junit``: the JUnit XML report's path."""
    plot_file: Path | None
    """``--plot``: the loss/grad-norm PNG's path."""
    quiet: bool
    """``--quiet``: only the verdict on the terminal, no progress lines."""

    def write(self, report: DrillReport) -> None:
        """Write the --json and --junit reports (on every exit, a failed start included)."""
        from ckptkit.cli.render.drill import render_json, render_junit

        if self.json_file == "-":
            render_json(report, sys.stdout)
        elif self.json_file:
            with open(out_file(self.json_file), "w", encoding="utf-8") as fh:
                render_json(report, fh)
        if self.junit_file is not None:
            with open(out_file(self.junit_file), "w", encoding="utf-8") as fh:
                render_junit(report, fh)


def _drill(config: DrillConfig, reports: _Reports) -> None:
    """Run the drill ``config`` describes, report it, and exit with its status."""
    from ckptkit.cli.render.drill import render_plot, render_text
    from ckptkit.drill.runner import cleanup, run_drill

    def say(msg: str) -> None:
        if not reports.quiet:
            click.echo(f"ckptkit drill: {msg}", err=True)

    report = run_drill(config, on_event=say)
    try:
        if reports.plot_file is not None:
            why = render_plot(report, out_file(reports.plot_file))
            if why:
                click.echo(f"ckptkit drill: {why}", err=True)
            else:
                report.plot = reports.plot_file
        if reports.json_file != "-":
            render_text(report, sys.stdout, quiet=reports.quiet)
        reports.write(report)
    finally:
        cleanup(report)
    sys.exit(report.exit_code)


def _no_option_as_command(command: tuple[str, ...]) -> None:
    """Refuse a training command that starts with '-': a mistyped drill option.

    Options the drill does not know end its options (so a command needs no '--'); a
    typo such as ``-w`` for ``-W`` would otherwise be run as the training command.

    Raises:
        click.NoSuchOption: naming the option meant, when one is close (case included).
    """
    if not command or not command[0].startswith("-") or command[0] == "-":
        return
    ctx = click.get_current_context()
    name = command[0].split("=", 1)[0]
    spelled = {o: p for p in ctx.command.params for o in (*p.opts, *p.secondary_opts)
               if o.startswith("-")}
    close = [o for o in spelled if o.lower() == name.lower()] or difflib.get_close_matches(
        name, list(spelled), n=2
    )
    meant = sorted({" / ".join(sorted(spelled[o].opts, key=len)) for o in close})
    hint = f" Did you mean {' or '.join(meant)}?" if meant else ""
    raise click.NoSuchOption(
        name,
        message=f"No such option: {name}.{hint} Options are case-sensitive, and the "
        "training command goes after '--'.",
        ctx=ctx,
    )
