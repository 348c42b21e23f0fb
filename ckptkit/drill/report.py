"""The drill's results: each process's RunResult and the DrillReport, with their JSON form.

The report's JSON conforms to ``schemas/drill-report.schema.json`` (:data:`SCHEMA_VERSION`);
renderers in :mod:`ckptkit.cli.render.drill` print it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ckptkit.drill import compare, diagnose
from ckptkit.errors import CkptkitError

SCHEMA_VERSION = 2
"""Version of the JSON report (``schemas/drill-report.schema.json``)."""

Role = Literal["reference", "resumed", "control"]


@dataclass
class RunResult:
    """One process of the drill."""

    role: Role
    index: int
    argv: list[str]
    returncode: int
    wall_s: float
    records: list[dict[str, Any]]
    run_dir: Path
    ckpt_dir: Path
    metrics_path: Path
    stdout_tail: list[str]
    stderr_tail: list[str]
    launched_at: float
    ended_at: float
    summary: dict[str, Any] | None = None
    """The last JSON object the script printed on stdout (e.g. ``param_hash``), if any."""
    method: str = "spawn"
    """How the process was started: ``fork`` or ``spawn``."""
    warm_s: float = 0.0
    """Seconds the drill process spent importing for this run before forking it."""

    def to_dict(self) -> dict[str, Any]:
        steps = [r.get("step") for r in self.records]
        return {
            "role": self.role,
            "index": self.index,
            "argv": list(self.argv),
            "method": self.method,
            "returncode": self.returncode,
            "wall_s": round(self.wall_s, 3),
            "records": len(self.records),
            "first_step": steps[0] if steps else None,
            "last_step": steps[-1] if steps else None,
            "ckpt_dir": str(self.ckpt_dir),
            "metrics": str(self.metrics_path),
            "summary": self.summary,
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
        }


@dataclass
class DrillReport:
    """Everything the drill found; renderers in :mod:`ckptkit.cli.render.drill` print it.

    A drill that could not run has ``error`` set (exit 2) and whatever it had gathered.
    """

    ok: bool
    command: list[str]
    config: dict[str, Any]
    checks: list[compare.CheckResult]
    diagnosis: diagnose.Diagnosis
    runs: list[RunResult]
    overhead: dict[str, Any]
    noise: compare.NoiseFloor
    checkpoint: Path | None
    workdir: Path | None
    workdir_kept: bool = True
    plot: Path | None = None
    error: dict[str, Any] | None = None
    """Why the drill could not run: ``reason``, ``hint``, ``path``, ``stage``."""

    @property
    def exit_code(self) -> int:
        """0 when every non-informational check passed, 1 when one failed, 2: no drill."""
        if self.error is not None:
            return 2
        return 0 if self.ok else 1

    @property
    def reference(self) -> RunResult:
        return next(r for r in self.runs if r.role == "reference")

    @property
    def resumed(self) -> RunResult:
        return next(r for r in self.runs if r.role == "resumed")

    @classmethod
    def failure(
        cls,
        error: CkptkitError | str,
        *,
        command: Sequence[str] = (),
        config: Mapping[str, Any] | None = None,
        runs: Sequence[RunResult] = (),
        workdir: Path | None = None,
        stage: str = "setup",
        total_s: float = 0.0,
    ) -> DrillReport:
        """The report of a drill that could not run (exit 2), with the reason.

        Example:
            >>> r = DrillReport.failure("no training command given", stage="config")
            >>> r.exit_code, r.to_dict()["error"]["reason"]
            (2, 'no training command given')
        """
        if isinstance(error, CkptkitError):
            err = {"reason": error.what, "hint": error.hint, "path": str(error.path)
                   if error.path else None}
        else:
            err = {"reason": str(error), "hint": None, "path": None}
        return cls(
            ok=False,
            command=list(command),
            config=dict(config or {}),
            checks=[],
            diagnosis=diagnose.Diagnosis(
                "unknown", "low", [f"the drill could not run: {err['reason']}"],
                "fix what the reason says, then drill again",
            ),
            runs=list(runs),
            overhead={"total_s": rounded(total_s), "training_s": 0.0, "overhead_s": rounded(total_s)},
            noise=compare.NoiseFloor(runs=max(1, sum(r.role == "reference" for r in runs))),
            checkpoint=None,
            workdir=workdir,
            error={**err, "stage": stage},
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (``schemas/drill-report.schema.json``)."""
        return compare.jsonable(
            {
                "schema_version": SCHEMA_VERSION,
                "ok": self.ok,
                "exit_code": self.exit_code,
                "error": self.error,
                "command": self.command,
                "config": self.config,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None,
                "workdir": str(self.workdir) if self.workdir and self.workdir_kept else None,
                "checks": [c.to_dict() for c in self.checks],
                "diagnosis": self.diagnosis.to_dict(),
                "noise_floor": self.noise.to_dict(),
                "runs": [r.to_dict() for r in self.runs],
                "overhead": self.overhead,
                "plot": str(self.plot) if self.plot else None,
            }
        )


def rounded(x: float) -> float:
    return round(x, 4) if math.isfinite(x) else x


__all__ = ["SCHEMA_VERSION", "DrillReport", "Role", "RunResult", "rounded"]
