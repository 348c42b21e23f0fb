"""Rich terminal output for verify and inspect."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ckptkit._repr import short
from ckptkit.signals import recovery_log


def _e(x: object) -> str:
    """Escape text from checkpoints and users: '[/x]' in a key must print, not crash rich."""
    return escape(str(x))


_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def human_bytes(n: float) -> str:
    """Format a byte count (``1536`` -> ``1.5 KiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class PipeConsole(Console):
    """A rich console that leaves a closed pipe to the CLI's edge.

    Rich's own handling exits with status 1 (``ckptkit verify | head`` would then look
    like a failed verify); raising lets :func:`ckptkit.cli.shared.edge` end the command the
    way ``cat`` ends.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(32, "Broken pipe")


def _console(out: TextIO) -> Console:
    return PipeConsole(file=out, soft_wrap=False, width=None if out.isatty() else 120)


def render_verify(result: Any, out: TextIO, *, verbose: bool = False) -> None:
    """Print each report: a verdict line, its components, then one line per finding.

    One checkpoint shows its component table; a run directory shows one verdict line per
    checkpoint and its findings (``verbose``: the component table of each too). Errors
    carry their fix on the next line (``verbose``: every finding). Findings are plain
    lines, never a box-drawing table, so ``grep`` and ``head`` work on the output.
    """
    con = _console(out)
    many = len(result.reports) > 1
    for rep in result.reports:
        verdict = "[bold green]OK[/]" if rep.ok else "[bold red]FAILED[/]"
        step = f" step {rep.step}" if rep.step is not None else ""
        con.print(
            f"{verdict} {_e(rep.path)}{step} — {rep.files_checked} files, "
            f"{human_bytes(rep.bytes_checked)} checked in {rep.seconds:.2f}s"
        )
        expect = getattr(rep, "expect", None)
        if expect is not None and (verbose or not many):
            src = getattr(rep, "expect_source", None)
            why = getattr(rep, "expect_why", "")
            con.print(
                f"checked as a {expect} checkpoint"
                + (f" (inferred: {_e(why)}; --expect to override)" if src == "inferred" else "")
            )
        if (rep.manifest is not None or rep.format != "ckptkit") and (verbose or not many):
            found = getattr(rep, "found", {}) or {}
            comps = Table(title=None, show_header=True, header_style="bold", box=None)
            cols = ["component", "present", "required", "where"]
            if found:
                cols[-1] = "where (how it was recognised)"
            for col in cols:
                comps.add_column(col, overflow="fold")
            for name, c in rep.components.items():
                if not (c.present or c.required):
                    continue
                mark = "[green]yes[/]" if c.present else "[red]MISSING[/]"
                f = found.get(name)
                if f is not None and c.present:
                    where = f.describe()
                    if f.how == "inferred":
                        where = "[yellow]" + _e(where).replace("inferred", "INFERRED", 1) + "[/]"
                    else:
                        where = _e(where)
                else:
                    where = _e(", ".join(c.where[:3]) + (" …" if len(c.where) > 3 else ""))
                comps.add_row(name, mark, "yes" if c.required else "", where)
            if comps.row_count:  # none when nothing could be read (an opaque pickle)
                con.print(comps)
        for f in rep.findings:
            sev = str(f.severity)
            where = f" {_e(f.path)}" if f.path else ""
            _line(con, f"  [{_STYLE[sev]}]{sev:<7}[/] {f.code} {_e(f.component)}{where}: {_e(f.message)}")
            if verbose or f.severity == "error":
                _line(con, f"          Fix: {_e(f.hint)}")
    if many:
        bad = sum(not r.ok for r in result.reports)
        more = "" if verbose else " (--verbose: each checkpoint's components and every fix)"
        con.print(f"{len(result.reports)} checkpoints, {bad} failed{more}")


def _line(con: Console, text: str) -> None:
    """Print one record: wrapped on a terminal, one unbroken line for grep otherwise."""
    con.print(text, soft_wrap=not con.is_terminal, highlight=False)


def render_inspect(info: dict[str, Any], out: TextIO, *, tensors: bool = False) -> None:
    """Print what a checkpoint holds: step, components, files, and a tensor summary.

    ``tensors`` (``--verbose``) lists every tensor (key, dtype, shape, size, file) instead
    of a one-line summary, and component summaries in full (parameter names included).
    """
    con = _console(out)
    by = (f"ckptkit {info['ckptkit_version']}" if info.get("format", "ckptkit") == "ckptkit"
          else f"{info['format']} (foreign)")
    con.print(
        f"[bold]{_e(info['path'])}[/]  step={info['step']}  written {info['created_at']} by {by}"
        f"  total {human_bytes(info['total_bytes'])}"
    )
    if info.get("manifest_digest"):
        sig = info.get("signature")
        signed = (
            f"signed (key id {sig['key_id']}, {sig['status']})" if sig else "unsigned"
        )
        con.print(f"manifest_digest {info['manifest_digest']}  {signed}")
    comps = Table(show_header=True, header_style="bold", box=None, title="components")
    for col in ("component", "present", "required", "where", "summary"):
        comps.add_column(col, overflow="fold")
    for name, c in info["components"].items():
        summary = ", ".join(
            f"{k}={v if tensors or isinstance(v, (str, int, float)) else short(v)}"
            for k, v in list(c.get("summary", {}).items())[:4]
        )
        where = c.get("found") or ", ".join(c.get("where", [])[:3])
        comps.add_row(
            name,
            "yes" if c["present"] else "-",
            "yes" if c["required"] else "",
            _e(where.replace("inferred", "INFERRED", 1) if c.get("how") == "inferred" else where),
            _e(summary),
        )
    con.print(comps)
    files = Table(show_header=True, header_style="bold", box=None, title="files")
    for col in ("file", "size", "compression", "xxh3_128"):
        files.add_column(col)
    for f in info["files"]:
        files.add_row(_e(f["path"]), human_bytes(f["size"]), f.get("compression") or "",
                      f["xxh3_128"][:16] + "…")
    con.print(files)
    if tensors:
        tt = Table(show_header=True, header_style="bold", box=None, title=f"tensors ({len(info['tensors'])})")
        for col in ("key", "dtype", "shape", "size", "file"):
            tt.add_column(col, overflow="fold")
        for t in info["tensors"]:
            tt.add_row(_e(t["key"]), t["dtype"], str(t["shape"]), human_bytes(t["nbytes"]),
                       _e(t["file"]))
        con.print(tt)
    elif info["tensors"]:
        con.print(tensor_summary(info["tensors"]) + " (--verbose lists them)", highlight=False)


def tensor_summary(tensors: Sequence[dict[str, Any]]) -> str:
    """One line: how many tensors, per top-level key and per dtype, and their bytes.

    Example:
        >>> tensor_summary([{"key": "model/w", "dtype": "F32", "nbytes": 2048},
        ...                 {"key": "optimizer/m", "dtype": "F32", "nbytes": 2048}])
        'tensors: 2 (model 1, optimizer 1; F32 2), 4.0 KiB'
    """
    by_head: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    for t in tensors:
        head = str(t["key"]).split("/", 1)[0]
        by_head[head] = by_head.get(head, 0) + 1
        by_dtype[str(t["dtype"])] = by_dtype.get(str(t["dtype"]), 0) + 1
    heads = ", ".join(f"{_e(k)} {n}" for k, n in by_head.items())
    dtypes = ", ".join(f"{k} {n}" for k, n in sorted(by_dtype.items(), key=lambda kv: -kv[1]))
    total = sum(int(t.get("nbytes", 0)) for t in tensors)
    return f"tensors: {len(tensors)} ({heads}; {dtypes}), {human_bytes(total)}"


_STATUS_STYLE = {
    "verified": "green",
    "committed": "yellow",
    "corrupt": "bold red",
    "unreadable": "magenta",
    "incomplete": "red",
    "replica-divergent": "bold red",
    "untrusted": "bold magenta",
    "unsound": "yellow",
}


def render_ls(
    infos: Sequence[Any],
    out: TextIO,
    *,
    leftovers: Sequence[Any] = (),
    layout: str = "ckptkit",
    recoveries: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Print a run's checkpoints (``CheckpointInfo``), oldest first, any leftovers, and the
    run's automatic recoveries (:func:`ckptkit.signals.recovery_log.iter_records`).

    ``layout`` names the framework for a framework run (``hf-trainer`` ...).
    """
    con = _console(out)
    t = Table(show_header=True, header_style="bold", box=None)
    for col in ("step", "time", "size", "status", "verified", "pinned", "health", "problem"):
        t.add_column(col, overflow="fold", justify="right" if col in ("step", "size") else "left")
    now = datetime.now().timestamp()
    for c in infos:
        when = datetime.fromtimestamp(c.time).strftime("%Y-%m-%d %H:%M:%S") if c.time else "-"
        at = getattr(c, "verified_at", None)
        t.add_row(
            str(c.step),
            when,
            human_bytes(c.size),
            f"[{_STATUS_STYLE.get(c.status, 'default')}]{_e(c.status)}[/]",
            _ago(now - at) if at else "never",
            _e(",".join(c.pins)),
            c.health or "",
            _e(c.problem or ""),
        )
    con.print(t)
    total = sum(c.size for c in infos)
    good = sum(c.status == "verified" for c in infos)
    kind = "" if layout == "ckptkit" else f" ({_e(layout)} run)"
    con.print(f"{len(infos)} checkpoints, {good} verified, {human_bytes(total)}{kind}")
    for p in leftovers:
        con.print(
            f"[yellow]leftover of an interrupted save:[/] {_e(p)} (removed when a writer opens the run)"
        )
    render_recoveries(recoveries, con)


def render_recoveries(records: Sequence[Mapping[str, Any]], out: TextIO | Console) -> None:
    """Print one line per automatic recovery or refusal of a run (nothing when none)."""
    if not records:
        return
    con = out if isinstance(out, Console) else _console(out)
    con.print(f"automatic recoveries ({len(records)}):")
    for r in records:
        style = "red" if "refused" in r or "failed" in r else "yellow"
        con.print(f"  [{style}]{_e(recovery_log.describe(r))}[/]")


def _ago(seconds: float) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``: when a checkpoint was last verified."""
    s = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def render_scrub(report: Any, out: TextIO) -> None:
    """Print a scrub (:class:`ckptkit.run.scrub.ScrubReport`): one row per checkpoint read,
    what its bytes say now against what the index said before, then what was recorded."""
    con = _console(out)
    t = Table(show_header=True, header_style="bold", box=None)
    for col in ("step", "was", "now", "finding"):
        t.add_column(col, overflow="fold", justify="right" if col == "step" else "left")
    for c in report.checked:
        now = f"[{_STATUS_STYLE.get(c.outcome, '')}]{c.outcome}[/]"
        if c.went_bad:
            now += " [bold red](went bad since it was verified)[/]"
        first = f"{c.errors[0].code} {c.errors[0].message}" if c.errors else ""
        t.add_row(str(c.step), c.before, now, _e(first))
    con.print(t)
    bad = [c for c in report.checked if c.outcome != "verified"]
    went = [c for c in report.checked if c.went_bad]
    kind = "" if report.layout == "ckptkit" else f" ({_e(report.layout)} run)"
    con.print(
        f"scrubbed {len(report.checked)} checkpoint(s) from their bytes{kind}: "
        f"{len(report.checked) - len(bad)} verified, {len(bad)} not"
        + (f", {len(went)} went bad since verified" if went else "")
        + (f"; {len(report.skipped)} skipped" if report.skipped else "")
    )
    if report.not_recorded:
        con.print(f"[yellow]not recorded:[/] {_e(report.not_recorded)}")
    elif bad:
        con.print(
            "recorded in the run index: ls lists them with the finding; retention, "
            "rollback and restore no longer count them as good"
        )
    if report.latest is not None:
        con.print(f"latest: {_e(report.latest)}")


def render_prune(plan: Any, out: TextIO, *, dry_run: bool) -> None:
    """Print a retention plan: every checkpoint, keep or delete, and why."""
    con = _console(out)
    t = Table(show_header=True, header_style="bold", box=None)
    for col in ("step", "size", "action", "why"):
        t.add_column(col, overflow="fold", justify="right" if col in ("step", "size") else "left")
    gone = "would delete" if dry_run else "deleted"
    for d in sorted(plan.decisions, key=lambda d: d.ckpt.step):
        action = "[green]keep[/]" if d.keep else f"[red]{gone}[/]"
        why = d.reason.split(": ", 1)[1] if ": " in d.reason else d.reason
        t.add_row(str(d.ckpt.step), human_bytes(d.ckpt.size), action, _e(why))
    con.print(t)
    dropped = plan.delete
    con.print(
        f"{gone} {len(dropped)} ({human_bytes(sum(c.size for c in dropped))}), kept "
        f"{len(plan.keep)} ({human_bytes(plan.bytes_kept)})"
    )
    if plan.budget_note:
        con.print(f"[yellow]{_e(plan.budget_note)}[/]")
