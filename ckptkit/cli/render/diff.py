"""``ckptkit diff`` output: per component a verdict, the tensors and values that differ,
and the tensors that moved most (JSON: :meth:`ckptkit.verify.statediff.StateDiff.to_dict`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TextIO

from ckptkit.verify.statediff import ComponentDiff, StateDiff, TensorDiff

SHOWN = 12
"""Changed tensors or values listed per component in text (the JSON lists all)."""


def render_text(sd: StateDiff, out: TextIO, *, top: int = 10) -> None:
    """Write the text report of ``sd`` to ``out``.

    Example:
        >>> import io, tempfile, torch, ckptkit
        >>> from ckptkit.verify.statediff import diff
        >>> d = tempfile.mkdtemp()
        >>> _ = ckptkit.save({"model": {"w": torch.ones(2)}}, d + "/a")
        >>> buf = io.StringIO(); render_text(diff(d + "/a", d + "/a"), buf)
        >>> buf.getvalue().splitlines()[-1]
        'EQUAL: every component is bitwise equal'
    """
    w = out.write
    w(f"A  {sd.a}  ({sd.format_a}{_step(sd.step_a)})\n")
    w(f"B  {sd.b}  ({sd.format_b}{_step(sd.step_b)})\n")
    tol = sd.tolerance
    how = "bitwise" if tol.bitwise else f"within atol={tol.atol:g}, rtol={tol.rtol:g}"
    w(f"compared {how}\n\n")
    width = max((len(c.name) for c in sd.components), default=9)
    for c in sd.components:
        mark = "=" if c.status == "compared" and c.equal else "?" if c.status == "not-read" else "≠"
        w(f"{mark} {c.name:<{width}}  {c.summary()}\n")
        if c.status == "compared" and not c.equal:
            _details(c, w)
    moved = sd.moved_most(top)
    if moved:
        w("\nmoved most (relative L2 change):\n")
        for i, t in enumerate(moved, 1):
            w(f"  {i:>2}. {t.path}  {_numbers(t)}\n")
    w("\n")
    if sd.different:
        w(f"DIFFERENT: {', '.join(c.name for c in sd.different)}\n")
    elif not sd.complete:
        unread = [c.name for c in sd.components if c.status == "not-read"]
        w(f"NOT COMPARED: {', '.join(unread)} could not be read; the rest is equal\n")
    else:
        w(f"EQUAL: every component is {'bitwise equal' if tol.bitwise else 'equal ' + how}\n")


def render_json(sd: StateDiff, out: TextIO) -> None:
    """Write ``sd`` as JSON (``schemas/diff-report.schema.json``)."""
    json.dump(sd.to_dict(), out, indent=2)
    out.write("\n")


def _details(c: ComponentDiff, write: Callable[[str], object]) -> None:
    ct = c.changed_tensors
    for t in ct[:SHOWN]:
        write(f"    {t.path}  {t.status}  {_numbers(t)}\n")
    if len(ct) > SHOWN:
        write(f"    … {len(ct) - SHOWN} more tensors (--json lists all)\n")
    cv = c.changed_values
    for v in cv[:SHOWN]:
        write(f"    {v.path}: {v.a!r} → {v.b!r}\n")
    if len(cv) > SHOWN:
        write(f"    … {len(cv) - SHOWN} more values (--json lists all)\n")


def _numbers(t: TensorDiff) -> str:
    if t.status in ("only-a", "only-b"):
        return f"{t.shape_a or t.shape_b} {t.dtype_a or t.dtype_b}"
    if t.status == "shape":
        return f"shape {list(t.shape_a or ())} → {list(t.shape_b or ())}"
    parts = []
    if t.rel_l2 is not None:
        parts.append(f"rel L2 {t.rel_l2:.3g}")
    if t.max_abs is not None:
        parts.append(f"max abs {t.max_abs:.3g}")
    dt = t.dtype_a if t.dtype_a == t.dtype_b else f"{t.dtype_a} → {t.dtype_b}"
    parts.append(f"{list(t.shape_a or ())} {dt}")
    return "  ".join(parts)


def _step(step: int | None) -> str:
    return f", step {step}" if step is not None else ""


__all__ = ["render_json", "render_text"]
