"""The ``ckptkit`` command: parse, call one library function, render, exit.

Exit codes: 0 clean, 1 error findings (or a failed drill), 2 unreadable input or
usage error (any :class:`~ckptkit.errors.CkptkitError` is converted here, at the edge).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from ckptkit._version import __version__
from ckptkit.checkpoint.detect import FORMATS
from ckptkit.errors import CkptkitError
from ckptkit.format.signing import resolve_key
from ckptkit.storage import fs
from ckptkit.storage.atomic import MANIFEST_NAME

F = TypeVar("F", bound=Callable[..., Any])


def _edge(fn: F) -> F:
    """Turn a CkptkitError into a one-paragraph message and exit 2 (no traceback).

    A reader that goes away (``ckptkit verify RUN | head``) ends the command the way it
    ends ``cat`` or ``grep``: silently, with the status of a SIGPIPE death (141).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return fn(*args, **kwargs)
            finally:
                # Flush here, inside the edge: a closed pipe then raises where it is
                # handled below instead of at interpreter exit.
                sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()
        except CkptkitError as e:
            click.echo(f"ckptkit: {e}", err=True)
            sys.exit(2)
        except OSError as e:
            where = f" {e.filename}:" if e.filename else ""
            click.echo(f"ckptkit:{where} {e.strerror or e}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def _key_option(fn: F) -> F:
    """``--key-file``: the HMAC key to check (and require) manifest signatures with.

    The one key option of every command that reads manifests or verdicts (``verify``,
    ``inspect``, ``ls``, ``prune``, ``rollback``); the command passes ``_key(key_file)``
    to the library.
    """
    return click.option(
        "--key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="HMAC key file: manifests must be signed with this key; a checkpoint that is "
        "not counts as corrupt (default: $CKPTKIT_HMAC_KEY or $CKPTKIT_HMAC_KEY_FILE; see "
        "docs/security.md).",
    )(fn)


def _key(key_file: Path | None) -> bytes | None:
    """The key a command checks with: ``--key-file``, else the environment's (an empty
    variable or file is an error, exit 2), through :func:`ckptkit.format.signing.resolve_key`."""
    return resolve_key(key_file=key_file)


def _expect_option(fn: F) -> F:
    """``--expect weights|training``: what the checkpoint must be (default: inferred)."""
    return click.option(
        "--expect",
        type=click.Choice(["weights", "training"]),
        default=None,
        help="What PATH must be: 'weights' (only the model is required: inference or "
        "fine-tuning) or 'training' (a resume point). Default: as a native run recorded; "
        "for other formats inferred (weights when it holds model tensors only).",
    )(fn)
SIGPIPE_EXIT = 128 + 13
"""Exit status after the reader of stdout went away: what a shell reports for ``cat``
killed by SIGPIPE (``ckptkit verify RUN | head`` under ``set -o pipefail``)."""


def _reader_gone() -> NoReturn:
    """Exit quietly after EPIPE on stdout: no message, no traceback, no second EPIPE.

    Python ignores SIGPIPE (sockets need EPIPE as an error, and object-store transfers
    use sockets), so the default action cannot end the process as it ends ``cat``; stdout
    is pointed at /dev/null so the interpreter's final flush does not fail again.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(SIGPIPE_EXIT)


def _out_file(path: str | Path) -> Path:
    """Return ``path`` after creating its parent directories (for report files)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


class _Where(click.ParamType):
    """A local path or an fsspec URL (``s3://bucket/run``), as ckptkit reads it.

    A checkpoint's ``manifest.json`` stands for its directory, which every command reads.
    What the path holds is judged by the command (:func:`_must_be_a_run`, or the library
    call), so a wrong path gets the same words everywhere.
    """

    name = "path_or_url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            loc = fs.location(value)
        except CkptkitError as e:
            self.fail(str(e), param, ctx)
        if loc.name == MANIFEST_NAME and fs.kind(loc) == "file":
            return loc.parent
        return loc


def _must_be_a_run(path: Path, *, checkpoint_ok: bool = False) -> None:
    """Raise what ``path`` is when a run-level command cannot read it (exit 2 at the edge):
    a typo with the closest names, a file or one checkpoint with the run that holds it, a
    directory above runs with the runs under it (:func:`ckptkit.run.directory.not_a_run`).
    ``checkpoint_ok``: one checkpoint is fine too (``verify``)."""
    from ckptkit.run.directory import not_a_run

    wrong = not_a_run(path, checkpoint_ok=checkpoint_ok)
    if wrong is not None:
        raise wrong


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckptkit")
def main() -> None:
    """Trustworthy PyTorch training checkpoints: verify, inspect, drill, rotate."""


@main.command()
@click.argument("path", type=_Where())
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
@_key_option
@_expect_option
@_edge
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

    _must_be_a_run(path, checkpoint_ok=True)
    group = join_torchrun() if torchrun else None
    lead = group is None or group.rank == 0
    opts: dict[str, Any] = dict(
        strict=strict, against_env=against_env,
        progress=False if no_progress or as_json or group is not None else None, format=fmt,
        key=_key(key_file), expect=expect, workers=workers, group=group,
    )
    targets = framework_checkpoints(path) if fmt is None else None
    if lead and fmt is None and targets is None and fs.kind(path) == "dir" and (
        fs.kind(path / MANIFEST_NAME) is None
    ):
        _warn_ignored(ignored_at(path))  # a native run: what lies in it is not all its own
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
            with open(_out_file(junit_file), "w", encoding="utf-8") as fh:
                RENDERERS["junit"](result, fh)
    code = 0 if result.ok else 1
    if group is not None:
        # After the report is out: torchrun stops the other ranks as soon as one exits
        # non-zero, and rank 0 must not be stopped before it has printed.
        sys.stdout.flush()
        leave(agree(group, code))
    sys.exit(code)


@main.command()
@click.argument("path", type=_Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--verbose", "-v", is_flag=True,
              help="List every tensor (key, dtype, shape, size, file).")
@click.option("--no-tensors", is_flag=True,
              help="Do not list tensors, even with --verbose (the default without it).")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default=None,
              help="Read PATH as this foreign format (default: detected).")
@_key_option
@_edge
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

    info = describe(path, format=fmt, key=_key(key_file))
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        render_inspect(info, sys.stdout, tensors=verbose and not no_tensors)


@main.command(name="diff")
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
@_key_option
@_edge
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

    sd = diff(a, b, key=_key(key_file), tolerance=Tolerance(atol=atol, rtol=rtol), top=top)
    if components:
        sd = sd.only(components)
    if as_json:
        render_json(sd, sys.stdout)
    else:
        render_text(sd, sys.stdout, top=top)
    sys.exit(1 if sd.different else 0 if sd.equal else 2)


@main.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default=None,
              help="Read PATH as this foreign format (default: detected).")
@click.option("--force", is_flag=True,
              help="Adopt even when verify finds damage or pickles that need code.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output: what was written and what verify says.")
@click.option("--step", type=click.IntRange(min=0), default=None,
              help="The optimizer step PATH holds, when nothing records it (an Accelerate "
              "checkpoint_N whose name counts saves). PATH must be one checkpoint.")
@_expect_option
@_key_option
@_edge
def adopt(
    path: Path,
    fmt: str | None,
    force: bool,
    as_json: bool,
    step: int | None,
    expect: str | None,
    key_file: Path | None,
) -> None:
    """Write a ckptkit manifest beside a foreign checkpoint (digests, components, gaps).

    PATH is one foreign checkpoint, or a run directory: then each of its checkpoints.
    A checkpoint of a framework run is adopted through its run, at its real step: a
    step adopted before is never rewritten (a different --step is refused), an
    Accelerate checkpoint_N takes the step its intent record says, else --step (without
    either it is refused: its name counts saves, not steps). With a key (--key-file, or
    CKPTKIT_HMAC_KEY / CKPTKIT_HMAC_KEY_FILE) the manifest is signed with it, and later
    verifies under that key refuse it if it is unsigned or signed with another.

    The checkpoint is verified first: damage, NaN weights or resume state in a pickle
    that needs code to load are refused (exit 2, nothing written) unless --force. Later
    'ckptkit verify PATH' checks every file against the recorded digests, so corruption
    and drift are detected. The original files are never modified. Exit 0 when adopted
    and it verifies, 1 when adopted but verify finds errors (e.g. a missing optimizer;
    the output says what is missing), 2 when refused or not a recognised layout.

    \b
    Example:
        ckptkit adopt out/checkpoint-500
        ckptkit adopt out                    # every checkpoint-N of a Trainer run
        ckptkit adopt lightning_logs/version_0/checkpoints/last.ckpt --json
        ckptkit adopt model.safetensors --expect weights
        ckptkit adopt --step 80 project/checkpoints/checkpoint_1
    """
    from ckptkit._progress import activity, bytes_under
    from ckptkit.run.directory import adopt as adopt_one
    from ckptkit.verify.foreign.adopt import Adoption

    targets = _adopt_targets(path, fmt)
    if step is not None and len(targets) != 1:
        raise click.UsageError(
            f"--step names the step of one checkpoint; {path} holds {len(targets)}: pass "
            "the one checkpoint whose step nothing records"
        )
    key = _key(key_file)
    results: list[Adoption | None] = []  # None: refused before anything was written
    for target in targets:
        with activity(f"adopting {target.name}", bytes_under(target), None):
            try:
                a = adopt_one(target, fmt, step=step, force=force, expect=expect, key=key)  # type: ignore[arg-type]
            except CkptkitError as e:
                if len(targets) == 1:
                    raise
                click.echo(f"refused {target}: {e}")
                results.append(None)
                continue
        results.append(a)
        if as_json:
            continue
        if a.refused is not None:
            if len(targets) == 1:
                raise a.refused
            click.echo(f"refused {target}: {a.refused}")
            continue
        click.echo(f"wrote {a.manifest}")
        if a.unverifiable:
            click.echo("not verified (pickles that need code, never run): "
                       + ", ".join(a.unverifiable))
        if not a.report.ok:
            errors = a.report.errors
            click.echo(
                f"but it does not verify: {len(errors)} error(s)"
                + (f"; missing: {', '.join(a.missing)}" if a.missing else "")
            )
            for f in errors:
                click.echo(f"  {f.code} {f.component}: {f.message}")
    if as_json:
        docs = [a.to_dict() if a is not None else None for a in results]
        click.echo(json.dumps(docs[0] if path in targets else docs, indent=2))
    refused = any(a is None or a.refused is not None for a in results)
    sys.exit(2 if refused else 0 if all(a is not None and a.ok for a in results) else 1)


def _adopt_targets(path: Path, fmt: str | None) -> list[Path]:
    """What ``ckptkit adopt PATH`` adopts: PATH itself, or each checkpoint of a run directory."""
    from ckptkit.checkpoint.detect import detect
    from ckptkit.run.directory import open_run

    if fmt is not None or not path.is_dir() or detect(path) is not None:
        return [path]
    run = open_run(path)
    try:
        if run.layout != "ckptkit":
            return [Path(str(c.path)) for c in sorted(run.checkpoints(), key=lambda c: c.step)]
    finally:
        run.close()
    found = [c for c in sorted(path.iterdir()) if not c.is_symlink() and detect(c) is not None]
    if not found:
        raise CkptkitError(
            "no foreign checkpoint here, and no run layout recognises the directory",
            path=path,
            hint="pass one checkpoint (a checkpoint-N/ directory, a .ckpt or .pt file), or "
            "--format to name its layout",
        )
    return found


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


class _Bytes(click.ParamType):
    """A byte count: ``500000000``, ``500MB``, ``1.5TB``, ``2GiB``."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().replace(" ", "")
        num = text.rstrip("kmgtib")
        unit = text[len(num) :]
        try:
            n = float(num) * _SIZE_UNITS[unit]
        except (ValueError, KeyError):
            self.fail(
                f"{value!r} is not a size (examples: 500000000, 500MB, 1.5TB, 2GiB)", param, ctx
            )
        if n < 0:
            self.fail(f"{value!r}: a size cannot be negative", param, ctx)
        return int(n)


@main.command(name="ls")
@click.argument("run_dir", type=_Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option(
    "--verify",
    "reverify",
    is_flag=True,
    help="Re-verify every checkpoint now (reads every byte) and record the outcome.",
)
@_key_option
@_edge
def ls(run_dir: Path, as_json: bool, reverify: bool, key_file: Path | None) -> None:
    """List a run's checkpoints: step, time, size, status, pins, health.

    RUN_DIR is a ckptkit run or a framework's checkpoint directory (a Trainer output_dir,
    an Accelerate checkpoints/, a Lightning checkpoints/). Status is verified, committed (not verified, or changed since), corrupt or incomplete.
    Exit 0 when none is corrupt or incomplete, 1 otherwise, 2 when RUN_DIR cannot be read.

    \b
    Example:
        ckptkit ls runs/exp1/ckpt
        ckptkit ls runs/exp1/ckpt --verify --json
        ckptkit ls runs/exp1/ckpt --key-file ~/.ckptkit/hmac.key   # unsigned: corrupt
    """
    from ckptkit.checkpoint.catalog import UNUSABLE
    from ckptkit.cli.render.text import render_ls
    from ckptkit.run.directory import ignored, listing, open_run, signature_note
    from ckptkit.signals.recovery_log import iter_records

    _must_be_a_run(run_dir)
    # Lazy (open_run): --verify records only while no live writer holds the run lock; a
    # writer's run is verified all the same, and the writer keeps the records.
    run = open_run(run_dir, readonly=not reverify, key=_key(key_file))
    try:
        infos = listing(run, verify=reverify)
        left = run.leftovers()
        strays = ignored(run)
        unsigned_note = signature_note(run)
    finally:
        run.close()
    _warn_ignored(strays)
    if unsigned_note is not None:
        click.echo(f"note: {unsigned_note}", err=True)
    recs = list(iter_records(run_dir))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(run_dir),
                    "layout": run.layout,
                    "checkpoints": [c.to_dict() for c in infos],
                    "leftovers": [str(p) for p in left],
                    "ignored": [i.to_dict() for i in strays],
                    "recoveries": recs,
                },
                indent=2,
            )
        )
    else:
        render_ls(infos, sys.stdout, leftovers=left, layout=run.layout, recoveries=recs)
        if not infos:
            _say_what_else(run_dir)
    sys.exit(1 if any(c.status in UNUSABLE or c.status == "unreadable" for c in infos) else 0)


def _warn_ignored(strays: list[Any]) -> None:
    """Name, on stderr, what lies in a run directory but is not one of its checkpoints
    (``ckptkit.run.directory.ignored``: strays of another layout, a second directory for a step)."""
    for i in strays:
        click.echo(f"warning: {i.why}", err=True)


def _say_what_else(run_dir: Path) -> None:
    """After '0 checkpoints': name foreign checkpoints no run layout claimed (on stderr)."""
    from ckptkit.checkpoint.detect import detect

    local = fs.local_path(fs.location(run_dir))
    if local is None:  # foreign formats are read on a local filesystem only
        return
    found = [(c.name, f) for c in sorted(local.iterdir()) if (f := detect(c))]
    if found:
        names = ", ".join(f"{n} ({f})" for n, f in found[:4]) + (" …" if len(found) > 4 else "")
        click.echo(
            f"note: no run layout recognises {run_dir}, but it holds {len(found)} foreign "
            f"checkpoint(s): {names}; 'ckptkit verify {run_dir}' checks them, "
            f"'ckptkit adopt {run_dir}' records their digests",
            err=True,
        )


@main.command()
@click.argument("run_dir", type=_Where())
@click.option(
    "--keep-last",
    type=click.IntRange(min=1),
    required=True,
    help="Keep the K newest verified checkpoints.",
)
@click.option(
    "--keep-every", type=click.IntRange(min=1), help="Also keep every step that is a multiple of N."
)
@click.option(
    "--max-bytes",
    type=_Bytes(),
    help="Drop the oldest unprotected checkpoints to fit (500GB, 2TiB).",
)
@click.option(
    "--delete-corrupt", is_flag=True, help="Also delete corrupt and incomplete checkpoints."
)
@click.option(
    "--dry-run", is_flag=True, help="Print what would be removed and why; remove nothing."
)
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@_key_option
@_edge
def prune(
    run_dir: Path,
    keep_last: int,
    keep_every: int | None,
    max_bytes: int | None,
    delete_corrupt: bool,
    dry_run: bool,
    as_json: bool,
    key_file: Path | None,
) -> None:
    """Apply a retention policy to a run directory by hand, printing what goes and why.

    RUN_DIR is a ckptkit run or a framework's checkpoint directory (as for 'ls'). Before
    anything is deleted, the newest checkpoint kept is verified again from its bytes.
    Pinned checkpoints and the newest verified one are never removed. Takes the run's
    writer lock, so it fails (exit 2) while a training run holds it.

    \b
    Example:
        ckptkit prune runs/exp1/ckpt --keep-last 3 --keep-every 10000 --dry-run
        ckptkit prune runs/exp1/ckpt --keep-last 2 --max-bytes 500GB
        ckptkit prune runs/exp1/ckpt --keep-last 2 --key-file ~/.ckptkit/hmac.key
    """
    from ckptkit.cli.render.text import render_prune
    from ckptkit.run import retain
    from ckptkit.run.directory import ignored, open_run
    from ckptkit.run.directory import prune as run_prune

    _must_be_a_run(run_dir)
    run = open_run(run_dir, readonly=dry_run, key=_key(key_file))
    policy = retain.Policy(
        keep_last=keep_last, keep_every=keep_every, max_bytes=max_bytes,
        delete_corrupt=delete_corrupt,
    )
    try:
        _warn_ignored(ignored(run))  # never in the plan: never deleted
        plan = run_prune(run, policy, dry_run=dry_run)
    finally:
        run.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(run_dir),
                    "dry_run": dry_run,
                    "budget_note": plan.budget_note,
                    "decisions": [
                        {
                            "step": d.ckpt.step,
                            "keep": d.keep,
                            "reason": d.reason,
                            "size": d.ckpt.size,
                        }
                        for d in plan.decisions
                    ],
                },
                indent=2,
            )
        )
    else:
        render_prune(plan, sys.stdout, dry_run=dry_run)


@main.command()
@click.argument("run_dir", type=_Where())
@click.option(
    "--since",
    default=None,
    help="Only checkpoints of this step or later (5000), or saved this recently (36h, 7d, 2w).",
)
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@_key_option
@_edge
def scrub(run_dir: Path, since: str | None, as_json: bool, key_file: Path | None) -> None:
    """Re-read a run's kept checkpoints from their bytes and record what they hold now.

    Bit rot happens between saves: a checkpoint verified at save can fail its digests
    later. Every checkpoint (or those of --since) is verified again from every byte, and
    the outcome is recorded in the run index, so 'ls', 'prune', 'rollback' and restore see
    a once-good checkpoint that went bad ('latest' moves off it). Outcomes are recorded
    through the run lock when it is free; while a training run holds it they are reported,
    not recorded (the message says so). Exit 0 when every checkpoint read verified, 1
    otherwise, 2 when RUN_DIR cannot be read.

    \b
    Example:
        ckptkit scrub runs/exp1/ckpt
        ckptkit scrub runs/exp1/ckpt --since 7d --json
        ckptkit scrub out/ --since 5000          # a Trainer output_dir, step 5000 on
    """
    from ckptkit.cli.render.text import render_scrub
    from ckptkit.run.directory import ignored, open_run
    from ckptkit.run.scrub import Since
    from ckptkit.run.scrub import scrub as run_scrub

    _must_be_a_run(run_dir)
    which = Since.parse(since) if since is not None else None
    run = open_run(run_dir, readonly=False, key=_key(key_file))
    try:
        _warn_ignored(ignored(run))
        report = run_scrub(run, since=which)
    finally:
        run.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        render_scrub(report, sys.stdout)
    sys.exit(0 if report.ok else 1)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Drill TOML file (e.g. drills/tiny_lm.toml); options given here win.",
)
@click.option(
    "--steps-before",
    "-W",
    type=click.IntRange(1),
    default=None,
    help="Steps before the save (default 10).",
)
@click.option(
    "--steps-after",
    "-N",
    type=click.IntRange(1),
    default=None,
    help="Steps after the save, compared (default 10).",
)
@click.option(
    "--from",
    "from_ckpt",
    type=_Where(),
    help="Start the reference from this checkpoint (a path or URL) instead of from scratch.",
)
@click.option(
    "--repeat",
    type=click.IntRange(1),
    default=None,
    help="Fresh reference runs, and control restores of the save (default 1); 2+ also "
    "reports whether the script reproduces itself from scratch.",
)
@click.option(
    "--threads",
    type=click.IntRange(1),
    default=None,
    help="Threads pinned in every run (default 1).",
)
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
@_edge
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
    from ckptkit.cli.render.drill import render_json, render_junit
    from ckptkit.drill.runner import DrillReport

    def write_reports(report: DrillReport) -> None:
        if json_file == "-":
            render_json(report, sys.stdout)
        elif json_file:
            with open(_out_file(json_file), "w", encoding="utf-8") as fh:
                render_json(report, fh)
        if junit_file is not None:
            with open(_out_file(junit_file), "w", encoding="utf-8") as fh:
                render_junit(report, fh)

    try:
        _drill(command, config_file, steps_before, steps_after, from_ckpt, repeat, threads,
               device, pass_device, isolate, workdir, keep, timeout, noise_factor, json_file,
               plot_file, launch, quiet, write_reports)
    except (CkptkitError, click.UsageError) as e:
        report = getattr(e, "report", None)
        if report is None:
            msg = e.format_message() if isinstance(e, click.UsageError) else e
            report = DrillReport.failure(
                e if isinstance(e, CkptkitError) else str(msg), command=list(command),
                stage="config",
            )
        write_reports(report)
        raise


def _drill(
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
    plot_file: Path | None,
    launch: str | None,
    quiet: bool,
    write_reports: Callable[[Any], None],
) -> None:
    from ckptkit.cli.render.drill import render_plot, render_text
    from ckptkit.drill.runner import DrillConfig, cleanup, load_config, run_drill

    _no_option_as_command(command)
    thresholds = {"noise_factor": noise_factor} if noise_factor is not None else None
    given: dict[str, Any] = {
        "command": list(command) or None,
        "steps_before": steps_before,
        "steps_after": steps_after,
        "from_ckpt": from_ckpt,
        "repeat": repeat,
        "threads": threads,
        "device": device,
        "pass_device": pass_device,
        "isolate": isolate,
        "timeout": timeout,
        "launch": launch,
    }
    if config_file is not None:
        cfg = load_config(config_file, **given)
        if thresholds:
            cfg.thresholds = {**cfg.thresholds, **thresholds}
    else:
        if not command:
            raise click.UsageError("give the training command after '--' (or --config FILE)")
        cfg = DrillConfig(
            **{k: v for k, v in given.items() if v is not None}, thresholds=thresholds or {}
        )
    cfg.workdir, cfg.keep = workdir, keep

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"ckptkit drill: {msg}", err=True)

    report = run_drill(cfg, on_event=say)
    try:
        if plot_file is not None:
            why = render_plot(report, _out_file(plot_file))
            if why:
                click.echo(f"ckptkit drill: {why}", err=True)
            else:
                report.plot = plot_file
        if json_file != "-":
            render_text(report, sys.stdout, quiet=quiet)
        write_reports(report)
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


@main.command()
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
@_edge
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


@main.command()
@click.argument("run_dir", type=_Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@_key_option
@_edge
def rollback(run_dir: Path, as_json: bool, key_file: Path | None) -> None:
    """Pick the newest healthy checkpoint of a run, say why, and suggest recovery steps.

    Checkpoints whose recorded health (from a StabilityWatch) is warn or critical, or not
    judged (saved during the watch's warm-up), or that are corrupt, are passed over with
    the reason. Changes nothing: resume from the
    printed path ('mgr.restore(ts, healthy=True)' picks the same one). The hints are
    suggestions; ckptkit never changes hyper-parameters. Exit 0 when a healthy
    checkpoint exists, 1 when none does, 2 when RUN_DIR cannot be read.

    \b
    Example:
        ckptkit rollback runs/exp1/ckpt
        ckptkit rollback runs/exp1/ckpt --key-file ~/.ckptkit/hmac.key
    """
    from ckptkit.cli.render.text import render_recoveries
    from ckptkit.run.directory import ignored_at
    from ckptkit.run.directory import rollback as pick

    _must_be_a_run(run_dir)
    _warn_ignored(ignored_at(run_dir))
    choice = pick(run_dir, key=_key(key_file))
    if as_json:
        click.echo(json.dumps(choice.to_dict(), indent=2))
    else:
        c = choice.checkpoint
        click.echo(f"roll back to: {c.path}" if c else "no healthy checkpoint in this run")
        for r in choice.reasons:
            click.echo(f"  {r}")
        if choice.resume:
            click.echo(f"resume: {choice.resume}")
        if choice.hints:
            click.echo("suggestions (nothing is changed for you):")
            for h in choice.hints:
                click.echo(f"  - {h}")
        render_recoveries(choice.recoveries, sys.stdout)
    sys.exit(0 if choice.checkpoint is not None else 1)
