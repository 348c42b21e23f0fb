"""The commands over a run directory: ``adopt``, ``ls``, ``prune``, ``scrub``, ``rollback``.

A run directory is a ckptkit run or a framework's checkpoint directory (a Trainer
output_dir, an Accelerate or Lightning checkpoints/); ``adopt`` also takes one foreign
checkpoint.
"""

from __future__ import annotations

import json
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
    signing_key,
    warn_ignored,
)
from ckptkit.errors import CkptkitError
from ckptkit.storage import fs


@click.command()
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
@expect_option
@key_option
@edge
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
    key = signing_key(key_file)
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
            return [
                fs.require_local(c.path, needs="adopting a checkpoint")
                for c in sorted(run.checkpoints(), key=lambda c: c.step)
            ]
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


@click.command(name="ls")
@click.argument("run_dir", type=Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option(
    "--verify",
    "reverify",
    is_flag=True,
    help="Re-verify every checkpoint now (reads every byte) and record the outcome.",
)
@key_option
@edge
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

    must_be_a_run(run_dir)
    # Lazy (open_run): --verify records only while no live writer holds the run lock; a
    # writer's run is verified all the same, and the writer keeps the records.
    run = open_run(run_dir, readonly=not reverify, key=signing_key(key_file))
    try:
        infos = listing(run, verify=reverify)
        left = run.leftovers()
        strays = ignored(run)
        unsigned_note = signature_note(run)
    finally:
        run.close()
    warn_ignored(strays)
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


@click.command()
@click.argument("run_dir", type=Where())
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
@key_option
@edge
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

    must_be_a_run(run_dir)
    run = open_run(run_dir, readonly=dry_run, key=signing_key(key_file))
    policy = retain.Policy(
        keep_last=keep_last, keep_every=keep_every, max_bytes=max_bytes,
        delete_corrupt=delete_corrupt,
    )
    try:
        warn_ignored(ignored(run))  # never in the plan: never deleted
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


@click.command()
@click.argument("run_dir", type=Where())
@click.option(
    "--since",
    default=None,
    help="Only checkpoints of this step or later (5000), or saved this recently (36h, 7d, 2w).",
)
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@key_option
@edge
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

    must_be_a_run(run_dir)
    which = Since.parse(since) if since is not None else None
    run = open_run(run_dir, readonly=False, key=signing_key(key_file))
    try:
        warn_ignored(ignored(run))
        report = run_scrub(run, since=which)
    finally:
        run.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        render_scrub(report, sys.stdout)
    sys.exit(0 if report.ok else 1)



@click.command()
@click.argument("run_dir", type=Where())
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@key_option
@edge
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

    must_be_a_run(run_dir)
    warn_ignored(ignored_at(run_dir))
    choice = pick(run_dir, key=signing_key(key_file))
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
