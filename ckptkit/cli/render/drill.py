"""Drill report output: a rich terminal summary, JSON, JUnit XML and a loss/grad-norm plot.

Each renderer takes a :class:`~ckptkit.drill.report.DrillReport`; the JSON conforms to
``schemas/drill-report.schema.json``.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from ckptkit.drill.report import DrillReport


def _console(out: TextIO) -> Console:
    return Console(file=out, soft_wrap=False, width=None if out.isatty() else 120, highlight=False)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _pair(a: Any, b: Any) -> str:
    """``a → b`` with as many digits as it takes to show that they differ (a float pair
    that rounds alike at 4 digits is shown to 17, where floats differ).

    Example:
        >>> _pair(3.25601, 3.25603), _pair(1.5, 2.0)
        ('3.25601 → 3.25603', '1.5 → 2')
    """
    if isinstance(a, float) and isinstance(b, float) and a != b:
        for digits in (4, 6, 9, 12, 17):
            x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
            if x != y:
                return f"{x} → {y}"
    return f"{_fmt(a)} → {_fmt(b)}"


def _check_summary(c: dict[str, Any]) -> str:
    d = c["detail"]
    if c.get("skipped"):
        return str(d.get("reason", "skipped"))
    if c["name"] == "twin":
        fd = d.get("first_divergence")
        if not fd and d.get("not_judgeable"):
            return "; ".join(str(v) for v in d["not_judgeable"].values())
        if not fd:
            modes = set((d.get("modes") or {}).values())
            how = "bitwise" if modes <= {"bitwise"} else "within the noise floor"
            return f"{len(d.get('compared', []))} fields equal ({how}) at every step"
        vals = "; ".join(
            f"{k}: {_pair(v['reference'], v['resumed'])}" for k, v in fd["values"].items()
        )
        return f"first divergence at step {fd['step']}: {vals}"
    if c["name"] == "exposure" and d.get("basis") == "rows":
        return str(d.get("summary", ""))  # no sample ids: the rows' verdict
    if c["name"] == "exposure":
        return (
            f"{d['samples']['resumed']}/{d['samples']['reference']} samples; replayed "
            f"{d['replayed']}, skipped {d['skipped']}, unexpected {d['unexpected']}, "
            f"content changed {d['content_changed']}"
        )
    if c["name"] == "continuity":
        bad = [i for i in d.get("items", []) if not i["ok"]]
        if not bad:
            return f"{len(d.get('items', []))} items match ({d.get('source')})"
        return "; ".join(
            f"{i['what']}: recorded {_fmt(i['checkpoint'])}, resumed {_fmt(i['resumed'])}"
            for i in bad
        )
    return str(d.get("summary", ""))


def render_text(report: DrillReport, out: TextIO, *, quiet: bool = False) -> None:
    """Print the verdict, the checks table, the diagnosis and the overhead.

    ``quiet`` (``ckptkit drill -q``): the verdict line only, and for a failed drill one more
    line naming the failed checks and the diagnosis (the reports hold the rest).

    Example:
        >>> render_text(report, sys.stdout)  # doctest: +SKIP
    """
    con = _console(out)
    d = report.to_dict()
    cfg = d["config"]
    verdict = "[bold green]PASSED[/]" if d["ok"] else "[bold red]FAILED[/]"
    con.print(
        f"{verdict} resume drill: save after step {cfg['save_step']}, compare steps "
        f"{cfg['save_step'] + 1}..{cfg['stop_step']} ({cfg['repeat']} reference run(s), "
        f"{cfg['threads']} thread(s), {cfg['device']})"
    )
    if quiet:
        if not d["ok"]:
            failed = [c["name"] for c in d["checks"] if not (c["ok"] or c["informational"])]
            diag = d["diagnosis"]
            con.print(
                f"failed: {', '.join(failed) or 'the drill did not run'}; diagnosis: "
                f"{diag['component']} ({diag['confidence']} confidence)"
            )
        return
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("check", "verdict", "statistic", "threshold", "detail"):
        table.add_column(col, overflow="fold")
    for c in d["checks"]:
        if c.get("skipped"):
            mark = "[dim]skipped[/]"
        elif c["ok"]:
            mark = "[green]pass[/]"
        else:
            # An informational check never fails the drill: say "differs", not a verdict.
            mark = "[cyan]differs (info)[/]" if c["informational"] else "[red]FAIL[/]"
        name = c["name"] + (" (info)" if c["informational"] else "")
        table.add_row(name, mark, _fmt(c["statistic"]), _fmt(c["threshold"]), _check_summary(c))
    con.print(table)
    diag = d["diagnosis"]
    if diag["component"] != "none":
        cands = diag.get("candidates") or []
        con.print(
            f"[bold]diagnosis:[/] [bold red]{diag['component']}[/] "
            f"({diag['confidence']} confidence)"
            + (f"; candidates: {', '.join(cands)}" if cands else "")
        )
        for e in diag["evidence"]:
            con.print(f"  - {e}")
        con.print(f"  [bold]fix:[/] {diag['hint']}")
    noise = d["noise_floor"]
    if noise.get("action"):
        con.print(f"noise: {noise['action']}")
    elif noise["measured"]:
        state = (
            "bitwise reproducible"
            if noise["deterministic"]
            else "not bitwise reproducible: " + ", ".join(noise["noisy_fields"])
        )
        con.print(f"noise floor over {noise['runs']} reference runs: {state}")
    o = d["overhead"]
    warm = f"warm-up {o['warmup_s']:.1f}s, " if o.get("warmup_s") else ""
    con.print(
        f"time: {o['total_s']:.1f}s total, training {o['training_s']:.1f}s; drill overhead "
        f"{o['overhead_s']:.1f}s ({100 * (o['overhead_fraction'] or 0):.0f}%): {warm}process "
        f"start {o['process_start_s']:.1f}s, save {o['save_s']:.2f}s, restore "
        f"{o['restore_s']:.2f}s, statistics {o['statistics_s']:.2f}s"
    )
    if d["workdir"]:
        con.print(f"runs kept in {d['workdir']}")


def render_json(report: DrillReport, out: TextIO) -> None:
    """Write the report as JSON (``schemas/drill-report.schema.json``).

    Example:
        >>> render_json(report, sys.stdout)  # doctest: +SKIP
    """
    json.dump(report.to_dict(), out, indent=2, allow_nan=False)
    out.write("\n")


def render_junit(report: DrillReport, out: TextIO) -> None:
    """Write JUnit XML: one testcase per check (informational ones never fail).

    Example:
        >>> render_junit(report, sys.stdout)  # doctest: +SKIP
    """
    d = report.to_dict()
    checks = d["checks"]
    failures = [c for c in checks if not c["ok"] and not c["informational"]]
    suites = ET.Element("testsuites", name="ckptkit drill")
    if d.get("error"):
        # The drill could not run (exit 2): one testcase in error, with the reason.
        err = d["error"]
        suite = ET.SubElement(suites, "testsuite", name="resume drill", tests="1",
                              failures="0", errors="1", skipped="0",
                              time=f"{d['overhead']['total_s']:.3f}")
        case = ET.SubElement(suite, "testcase", classname="ckptkit.drill", name="drill")
        fail = ET.SubElement(case, "error", message=f"the drill could not run: {err['reason']}",
                             type=f"drill.{err.get('stage') or 'setup'}")
        fail.text = "\n".join(
            x for x in (err["reason"], f"Fix: {err['hint']}" if err.get("hint") else None,
                        f"Path: {err['path']}" if err.get("path") else None) if x
        )
        out.write(ET.tostring(suites, encoding="unicode"))
        out.write("\n")
        return
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="resume drill",
        tests=str(len(checks)),
        failures=str(len(failures)),
        skipped=str(sum(1 for c in checks if c.get("skipped"))),
        time=f"{d['overhead']['total_s']:.3f}",
    )
    diag = d["diagnosis"]
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname="ckptkit.drill", name=c["name"])
        text = json.dumps(c["detail"], indent=1)
        if c.get("skipped"):
            ET.SubElement(case, "skipped", message=_check_summary(c))
        elif not c["ok"] and not c["informational"]:
            msg = (
                f"{c['name']}: statistic {_fmt(c['statistic'])} > threshold "
                f"{_fmt(c['threshold'])}; {_check_summary(c)}"
            )
            fail = ET.SubElement(case, "failure", message=msg, type=f"drill.{c['name']}")
            fail.text = (
                f"diagnosis: {diag['component']} ({diag['confidence']})\n"
                + "\n".join(diag["evidence"])
                + f"\nFix: {diag['hint']}\n\n{text}"
            )
        else:
            ET.SubElement(case, "system-out").text = f"{_check_summary(c)}\n{text}"
    out.write(ET.tostring(suites, encoding="unicode"))
    out.write("\n")


def render_plot(report: DrillReport, path: Path) -> str | None:
    """Plot loss and grad norm vs step (pre-save window, reference, resumed; save marked)
    and a difference panel: resumed − reference per step, the first divergence marked.

    Returns:
        None when written, else why not (matplotlib is optional: ``pip install matplotlib``).

    Example:
        >>> render_plot(report, Path("drill.png"))  # doctest: +SKIP
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot written"
    if not any(r.role == "resumed" for r in report.runs) or not report.config:
        return "the drill did not run both processes; no plot written"
    save = report.config["save_step"]
    stop = report.config["stop_step"]
    ref = report.reference.records
    series = {
        "pre-save window": [r for r in ref if _step(r) is not None and _step(r) <= save],  # type: ignore[operator]
        "reference": [r for r in ref if _step(r) is not None and save <= _step(r) <= stop],  # type: ignore[operator]
        "resumed": list(report.resumed.records),
    }
    # Start the resumed line at the saved step so both continuations visibly branch there.
    series["resumed"][:0] = [r for r in series["pre-save window"] if _step(r) == save][:1]
    styles = {
        "pre-save window": ("tab:gray", "-"),
        "reference": ("tab:blue", "-"),
        "resumed": ("tab:orange", "--"),
    }
    keys = ("loss", "grad_norm")
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(8, 8),
                             gridspec_kw={"height_ratios": [3, 2, 2]})
    for ax, key in zip(axes[:2], keys, strict=True):
        for label, recs in series.items():
            pts = _points(recs, key)
            if pts:
                xs, ys = zip(*pts, strict=True)
                color, ls = styles[label]
                ax.plot(xs, ys, color=color, linestyle=ls, label=label, linewidth=1.2)
        ax.axvline(save, color="tab:red", linestyle=":", label=f"save (step {save})")
        ax.set_ylabel(key.replace("_", " "))
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    diff_ax = axes[2]
    ref_by = {_step(r): r for r in series["reference"]}
    colors = {"loss": "tab:purple", "grad_norm": "tab:green"}
    for key in keys:
        pts = [
            (x, y - ref_by[x][key])
            for x, y in _points(series["resumed"], key)
            if x in ref_by and isinstance(ref_by[x].get(key), int | float)
        ]
        if pts:
            xs, ys = zip(*pts, strict=True)
            diff_ax.plot(xs, ys, color=colors[key], marker=".", linewidth=1.0,
                         label=f"{key.replace('_', ' ')}: resumed − reference")
    first = report.diagnosis.step
    if isinstance(first, int):
        diff_ax.axvline(first, color="tab:red", linestyle="--", linewidth=1.0,
                        label=f"first divergence (step {first})")
    diff_ax.axhline(0.0, color="black", linewidth=0.6)
    diff_ax.axvline(save, color="tab:red", linestyle=":")
    diff_ax.set_ylabel("difference")
    diff_ax.grid(alpha=0.3)
    if diff_ax.get_legend_handles_labels()[0]:
        diff_ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("step")
    verdict = "PASSED" if report.ok else f"FAILED ({report.diagnosis.component})"
    fig.suptitle(f"ckptkit resume drill: {verdict}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _points(recs: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for r in recs:
        x, y = _step(r), r.get(key)
        if x is not None and isinstance(y, int | float) and not isinstance(y, bool):
            out.append((x, float(y)))
    return out


def _step(r: dict[str, Any]) -> int | None:
    s = r.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


DRILL_RENDERERS = {"text": render_text, "json": render_json, "junit": render_junit}
"""Drill report renderers by name."""

__all__ = ["DRILL_RENDERERS", "render_json", "render_junit", "render_plot", "render_text"]
