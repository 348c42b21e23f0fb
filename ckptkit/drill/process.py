"""What one drill process left behind: its RunResult, read from its output, and why it failed.

A started process (:class:`Running`) becomes a :class:`~ckptkit.drill.report.RunResult`
(:func:`result`); a failed one becomes a :class:`~ckptkit.errors.DrillError`
(:func:`crash`, :func:`expect_steps`), a late failure after its last step
(:func:`failed_after_last_step`) or, when ckptkit refused its resume, a failed ``restore``
check (:func:`refusal`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptkit import errors
from ckptkit.drill import compare, launch
from ckptkit.drill.report import Role, RunResult
from ckptkit.errors import CkptkitError, DrillError
from ckptkit.integrations.drill_env import ENV_CKPT_DIR, ENV_STOP_AT
from ckptkit.signals.recorder import ENV_METRICS, read_jsonl
from ckptkit.verify.findings import CODES

TAIL_LINES = 20
"""How many last lines of each run's stdout/stderr the report keeps."""


@dataclass
class Running:
    role: Role
    index: int
    spec: launch.Launch
    proc: launch.Proc
    run_dir: Path
    ckpt_dir: Path
    metrics: Path


def result(r: Running, rc: int) -> RunResult:
    ended = time.time()
    stdout = r.spec.stdout.read_text(errors="replace").splitlines()
    stderr = r.spec.stderr.read_text(errors="replace").splitlines()
    records = read_jsonl(r.metrics) if r.metrics.exists() else []
    return RunResult(
        role=r.role,
        index=r.index,
        argv=r.spec.argv,
        returncode=rc,
        wall_s=ended - r.proc.launched_at,
        records=records,
        run_dir=r.run_dir,
        ckpt_dir=r.ckpt_dir,
        metrics_path=r.metrics,
        stdout_tail=stdout[-TAIL_LINES:],
        stderr_tail=stderr[-TAIL_LINES:],
        launched_at=r.proc.launched_at,
        ended_at=ended,
        summary=_last_json(stdout),
        method=r.proc.method,
        warm_s=r.proc.warm_s,
    )


def failed_after_last_step(run: RunResult, stop_at: int) -> str | None:
    """Why ``run`` exited with an error after it recorded its stop step, or None.

    A run that trained and recorded every step and then failed in its final save (the
    state it reached cannot be saved: NaN weights under ``on_inconsistent="raise"``, a
    full disk) is a comparable run whose end state is missing, not a crash that stops the
    drill: its records are compared and the failed final save fails ``end_state``.
    """
    if run.returncode == 0 or not run.records:
        return None
    last = run.records[-1].get("step")
    if last != stop_at:
        return None
    return f"the resumed run recorded step {stop_at}, then exited with status " \
        f"{run.returncode} before its final checkpoint was saved" + tail_text(run)


def crash(run: RunResult, *, timed_out: bool, stop_at: int | None = None) -> DrillError:
    name = f"{run.role}-{run.index}" if run.role == "reference" else run.role
    why = "timed out" if timed_out else f"exited with status {run.returncode}"
    hint = "fix the script so it runs to the stop step, then drill again"
    if stop_at is not None and run.records and run.records[-1].get("step") == stop_at:
        # It trained to the end: what failed is its final save or the process's exit.
        why = (f"recorded its stop step {stop_at}, then {why}: it failed on its way out "
               "(its final save or the interpreter's shutdown), not in training")
        hint = ("make the script end cleanly after its last step (under torchrun with gloo, "
                "a process group a DDP model still holds at exit can hang or abort a rank "
                "in its teardown, pytorch/pytorch#179291: once everything is written, end "
                "the process with ckptkit.collective.leave(0)), then drill again")
    return DrillError(f"the {name} run {why}" + tail_text(run), path=run.run_dir, hint=hint)


_CK_ERROR = re.compile(r"^(?:ckptkit\.errors\.)?(\w+Error): (.*)$")
_COMPONENT_WORDS = ("scaler", "sampler", "scheduler", "optimizer", "rng", "fp8", "progress",
                    "model", "data", "parallel")


def refusal(resumed: RunResult) -> compare.CheckResult | None:
    """A ``restore`` check when ckptkit refused the resume (the run died on a ckptkit error
    before its first step), else None."""
    if resumed.returncode == 0 or resumed.records:
        return None
    for line in reversed(resumed.stderr_tail):
        m = _CK_ERROR.match(line.strip())
        if not m or not line.strip().startswith("ckptkit.errors."):
            continue
        cls = getattr(errors, m.group(1), None)
        if not (isinstance(cls, type) and issubclass(cls, CkptkitError)):
            continue
        message = m.group(2)
        code = re.match(r"(CK-[A-Z]\d{3})\b", message)
        component = None
        if code and code.group(1) in CODES and CODES[code.group(1)].component != "checkpoint":
            component = CODES[code.group(1)].component
        else:  # a code about the run as a whole (CK-R010): the message names the part
            low = message.lower()
            component = next((w for w in _COMPONENT_WORDS if w in low), None)
        return compare.CheckResult(
            name="restore",
            ok=False,
            statistic=1,
            threshold=0,
            detail={
                "error": m.group(1),
                "code": code.group(1) if code else None,
                "message": message,
                "component": component,
                "summary": f"ckptkit refused the resume: {m.group(1)}: {message}",
            },
        )
    return None


def expect_steps(run: RunResult, *, first: int, last: int) -> None:
    if not run.records:
        raise DrillError(
            f"the {run.role} run wrote no metrics records" + tail_text(run),
            path=run.metrics_path,
            hint=f"log every step with ckptkit.Recorder (it writes to ${ENV_METRICS})",
        )
    got = run.records[0].get("step")
    if got != first:
        raise DrillError(
            f"the {run.role} run started at step {got}, expected {first}: it did not start "
            "where the drill asked (did it restore a checkpoint from its own directory?)",
            path=run.run_dir,
            hint=f"make the script save into ${ENV_CKPT_DIR} (each run gets an empty one) or "
            "run the drill with --isolate",
        )
    if run.records[-1].get("step") != last:
        raise DrillError(
            f"the {run.role} run stopped at step {run.records[-1].get('step')}, expected {last}",
            path=run.run_dir,
            hint=f"make the script stop after step ${ENV_STOP_AT}",
        )


def _last_json(lines: Sequence[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        s = line.strip()
        if s.startswith("{") and s.endswith("}"):
            try:
                obj = json.loads(s)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def final_hash(run: RunResult) -> str | None:
    for rec in reversed(run.records):
        if "param_hash" in rec:
            return str(rec["param_hash"])
    if run.summary and "param_hash" in run.summary:
        return str(run.summary["param_hash"])
    return None


def tail_text(run: RunResult) -> str:
    lines = (run.stderr_tail or run.stdout_tail)[-8:]
    if not lines:
        return ""
    return "; last output:\n  " + "\n  ".join(lines) + "\n"


__all__ = [
    "TAIL_LINES",
    "Running",
    "crash",
    "expect_steps",
    "failed_after_last_step",
    "final_hash",
    "refusal",
    "result",
    "tail_text",
]
