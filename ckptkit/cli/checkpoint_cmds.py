"""The commands that read one checkpoint or compare two: ``verify``, ``inspect``, ``diff``.

``verify`` also takes a run directory (every checkpoint in it), and runs as one rank of
``torchrun`` when asked.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from ckptkit.checkpoint.detect import FORMATS
from ckptkit.cli.shared import (
    Where,
    edge,
    expect_option,
    key_option,
    must_be_a_run,
    out_file,
    signing_key,
    warn_ignored,
)
from ckptkit.storage import fs
from ckptkit.storage.atomic import MANIFEST_NAME


class _Workers(click.ParamType):
    """``--workers``: a count of at least 1, or ``auto`` (or 0): one per CPU."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            n = value
        elif str(value).strip().lower() == "auto":
            n = 0
        else:
            try:
                n = int(value)
            except ValueError:
                self.fail(f"{value!r} is not a number of workers: give N >= 1 or 'auto'", param, ctx)
        if n < 0:
            self.fail(f"{n} workers: give N >= 1 or 'auto'", param, ctx)
        return n or os.cpu_count() or 1


@click.command()
@click.argument("path", type=Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output (schemas/verify-report.schema.json).")
@click.option("--junit", "junit_file", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@click.option("--strict", is_flag=True, help="Treat warnings as failures.")
@click.option("--against-env", is_flag=True, help="Also check resume compatibility with this machine.")
@click.option("--no-progress", is_flag=True, help="Never show a progress bar.")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default=None,
              help="Read PATH as this foreign format (default: detected).")
@click.option("--verbose", "-v", is_flag=True,
              help="Show every checkpoint's component table and the fix of every finding.")
@click.option("--workers", type=_Workers(), default=None,
              help="Read and hash this many files at once (threads; 'auto': one per CPU; "
              "default 2). The report is the same whatever the number.")
@click.option("--torchrun", is_flag=True,
              help="Run as one rank of 'torchrun --nproc-per-node K -m ckptkit verify PATH "
              "--torchrun': each rank reads its share of the files, rank 0 reports, every "
              "rank exits with rank 0's status.")
@key_option
@expect_option
@edge
def verify(path: Path, as_json: bool, junit_file: Path | None, strict: bool, against_env: bool,
           no_progress: bool, fmt: str | None, verbose: bool, key_file: Path | None,
           expect: str | None, workers: int | None, torchrun: bool) -> None:
    """Check a checkpoint (or every checkpoint under a run directory).

    Prints a verdict line per checkpoint and one line per finding (errors with their
    fix). Exit 0 when no error findings, 1 when any, 2 when PATH cannot be read.

    \b
    Example:
        ckptkit verify runs/exp1/ckpt/step-00001000
        ckptkit verify runs/exp1/ckpt --json > report.json
        ckptkit verify out/checkpoint-500            # HF Trainer, detected
        ckptkit verify last.ckpt --format lightning
        ckptkit verify runs/exp1/ckpt --key-file ~/.ckptkit/hmac.key   # signatures required
        ckptkit verify model.safetensors             # weights only: --expect weights, inferred
        ckptkit verify ckpt.pt --expect training     # fail unless it can resume training
        ckptkit verify runs/exp1/ckpt --workers 8    # read 8 files at once
        torchrun --nproc-per-node 8 -m ckptkit verify runs/exp1/ckpt --torchrun
    """
    from ckptkit.cli.render import RENDERERS
    from ckptkit.collective import leave
    from ckptkit.run.directory import framework_checkpoints, ignored_at
    from ckptkit.verify.ranked import agree, join_torchrun
    from ckptkit.verify.runner import verify as run_verify

    must_be_a_run(path, checkpoint_ok=True)
    group = join_torchrun() if torchrun else None
    lead = group is None or group.rank == 0
    opts: dict[str, Any] = dict(
        strict=strict, against_env=against_env,
        progress=False if no_progress or as_json or group is not None else None, format=fmt,
        key=signing_key(key_file), expect=expect, workers=workers, group=group,
    )
    targets = framework_checkpoints(path) if fmt is None else None
    if lead and fmt is None and targets is None and fs.kind(path) == "dir" and (
        fs.kind(path / MANIFEST_NAME) is None
    ):
        warn_ignored(ignored_at(path))  # a native run: what lies in it is not all its own
    result = run_verify(targets[0] if targets else path, **opts)
    if targets:  # a framework run (an Accelerate project_dir...): each of its checkpoints
        result.path = fs.location(path)
        for t in targets[1:]:
            result.reports.extend(run_verify(t, **opts).reports)
    if lead:  # under torchrun rank 0 reports, the others only read
        if as_json:
            RENDERERS["json"](result, sys.stdout)
        else:
            RENDERERS["text"](result, sys.stdout, verbose=verbose)
        if junit_file is not None:
            with open(out_file(junit_file), "w", encoding="utf-8") as fh:
                RENDERERS["junit"](result, fh)
    code = 0 if result.ok else 1
    if group is not None:
        # After the report is out: torchrun stops the other ranks as soon as one exits
        # non-zero, and rank 0 must not be stopped before it has printed.
        sys.stdout.flush()
        leave(agree(group, code))
    sys.exit(code)


@click.command()
@click.argument("path", type=Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--verbose", "-v", is_flag=True,
              help="List every tensor (key, dtype, shape, size, file).")
@click.option("--no-tensors", is_flag=True,
              help="Do not list tensors, even with --verbose (the default without it).")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default=None,
              help="Read PATH as this foreign format (default: detected).")
@key_option
@edge
def inspect(path: Path, as_json: bool, verbose: bool, no_tensors: bool, fmt: str | None,
            key_file: Path | None) -> None:
    """Show what a checkpoint holds: step, components, files, and a tensor summary.

    PATH is one checkpoint (a step directory, or a foreign checkpoint); for a run
    directory, 'ckptkit ls RUN_DIR' lists its checkpoints.

    \b
    Example:
        ckptkit inspect runs/exp1/ckpt/step-00001000
        ckptkit inspect runs/exp1/ckpt/step-00001000 --verbose   # every tensor
        ckptkit inspect runs/exp1/ckpt/step-00001000 --json | jq .manifest_digest
    """
    from ckptkit.cli.render.text import render_inspect
    from ckptkit.verify.describe import describe

    info = describe(path, format=fmt, key=signing_key(key_file))
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        render_inspect(info, sys.stdout, tensors=verbose and not no_tensors)


@click.command(name="diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help="JSON output (schemas/diff-report.schema.json).")
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True,
              help="How many of the tensors that moved most to list.")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0,
              help="Absolute tolerance (default 0: bitwise).")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0,
              help="Relative tolerance, against A's values (default 0: bitwise).")
@click.option("--component", "components", multiple=True, metavar="NAME",
              help="Compare only this component (repeatable): model, optimizer, ema ...")
@key_option
@edge
def diff_cmd(a: Path, b: Path, as_json: bool, top: int, atol: float, rtol: float,
             components: tuple[str, ...], key_file: Path | None) -> None:
    """Compare the state of two checkpoints: per component, per tensor.

    A and B are checkpoints of any kind ckptkit reads: native step directories, adopted
    or plain foreign ones (Trainer folders, Lightning .ckpt, torch.save files). Each is
    verified as it is read. For every component (model, optimizer, scheduler, an EMA ...)
    it says equal or not, and for every tensor that differs its largest absolute and its
    relative L2 change; then the tensors that moved most. Exit 0 when equal (within
    --atol/--rtol), 1 when they differ, 2 when they cannot be compared (a file that fails
    its verify, a path that is no checkpoint, a component that cannot be read).

    \b
    Example:
        ckptkit diff runs/exp1/ckpt/step-00001000 runs/exp1/ckpt/step-00001100
        ckptkit diff good/step-00000900 bad/step-00001000 --component model --top 5
        ckptkit diff out/checkpoint-500 out/checkpoint-600 --json > diff.json
        ckptkit diff ref.ckpt resumed.ckpt --atol 1e-6
    """
    from ckptkit.cli.render.diff import render_json, render_text
    from ckptkit.verify.statediff import Tolerance, diff

    sd = diff(a, b, key=signing_key(key_file), tolerance=Tolerance(atol=atol, rtol=rtol), top=top)
    if components:
        sd = sd.only(components)
    if as_json:
        render_json(sd, sys.stdout)
    else:
        render_text(sd, sys.stdout, top=top)
    sys.exit(1 if sd.different else 0 if sd.equal else 2)
