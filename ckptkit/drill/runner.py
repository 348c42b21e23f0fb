"""Run a resume drill: the reference and resumed processes, then the checks and the verdict.

The drill drives the user's own training command through environment variables (the
contract of :mod:`ckptkit.integrations.drill_env`, plus the variables below that only the runner
sets), so no code change is needed beyond using ``CheckpointManager`` and ``Recorder``:

1. **reference** (``--repeat R`` times): a fresh start (or ``--from CKPT``), save after step
   ``W = start + steps_before``, continue uninterrupted to ``W + steps_after`` in one process;
2. **resumed**: a new process restores the step-``W`` checkpoint of reference 0 and runs to
   ``W + steps_after``. It starts as soon as that checkpoint has committed, while the
   reference finishes, and both are forks of this interpreter when the command allows it
   (:mod:`ckptkit.drill.launch`), so a drill takes little more than the reference run;
   **controls** (``max(1, R)``) restore the same checkpoint beside it: matching it bitwise,
   they show the run is deterministic; differing, they measure the noise from ``W`` that the
   resumed run is held to (:func:`ckptkit.drill.compare.control_noise`), with one more
   control run after them when only one ran (:data:`NOISY_CONTROLS`);
3. the checks of :mod:`ckptkit.drill.compare` (and the informational window check of
   :mod:`ckptkit.drill.stats`), then :func:`ckptkit.drill.diagnose.diagnose`.

Every outcome is a :class:`DrillReport`: passed (exit 0), failed checks (exit 1; a resume
ckptkit refused at restore is a failed ``restore`` check), or a drill that could not run
(exit 2: :class:`~ckptkit.errors.DrillError`, whose ``report`` holds the reason).

Every run gets its own checkpoint directory (``CKPTKIT_CKPT_DIR``) and metrics file
(``CKPTKIT_METRICS``); the thread count is pinned identically in all of them
(``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, default 1): a 1→2 thread change alone changes the
order of floating-point reductions and so gives last-bit differences.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ckptkit import errors
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.drill import artefacts, compare, diagnose, launch
from ckptkit.errors import CkptkitError, DrillError
from ckptkit.format import manifest as mf
from ckptkit.integrations.drill_env import (
    ENV_CKPT_DIR,
    ENV_DEVICE,
    ENV_RESUME_FROM,
    ENV_ROLE,
    ENV_SAVE_AT,
    ENV_SAVE_FINAL,
    ENV_STOP_AT,
    ENV_THREADS,
    ENV_VARS,
)
from ckptkit.run import directory as runs
from ckptkit.signals.recorder import ENV_METRICS, read_jsonl
from ckptkit.storage import atomic, fs
from ckptkit.verify.findings import CODES
from ckptkit.verify.foreign.adopted import adopted_path

SCHEMA_VERSION = 2
"""Version of the JSON report (``schemas/drill-report.schema.json``)."""
POLL_S = 0.02
"""How often running processes and the reference's checkpoint directory are polled."""

TAIL_LINES = 20
NOISY_CONTROLS = 2
"""Controls a drill runs once the first shows the run is not bitwise (``--repeat`` more:
that many)."""
"""How many last lines of each run's stdout/stderr the report keeps."""

Role = Literal["reference", "resumed", "control"]


@dataclass
class DrillConfig:
    """What to drill and how.

    Example:
        >>> cfg = DrillConfig(command=["python", "train.py"], steps_before=5, steps_after=5)
        >>> cfg.repeat, cfg.threads
        (1, 1)
    """

    command: Sequence[str]
    """The training command (argv list)."""
    steps_before: int = 10
    """``W``: steps from the start (or from ``from_ckpt``) to the save."""
    steps_after: int = 10
    """``N``: steps after the save, run by both the reference and the resumed run."""
    from_ckpt: Path | str | None = None
    """Start the reference from this checkpoint instead of from scratch."""
    repeat: int = 1
    """Fresh reference runs; with 2 or more the drill also reports whether the script
    reproduces itself from scratch (and names a generator it does not seed). The drill
    also runs ``max(1, repeat)`` control restores of the step-``W`` checkpoint: the noise
    the resumed run is held to is measured from there, never from the fresh starts."""
    threads: int = 1
    """Intra-op threads, pinned identically in every run."""
    device: str = "cpu"
    """Passed to the script as ``CKPTKIT_DEVICE``."""
    pass_device: bool = False
    """Also append ``--device DEVICE`` to the command."""
    workdir: Path | None = None
    """Where the runs write (default: a temporary directory)."""
    keep: bool = False
    """Keep the workdir even when the drill passes (it is always kept on failure)."""
    isolate: bool = False
    """Run each process in its own directory (for scripts that write relative paths)."""
    timeout: float | None = None
    """Seconds each process may run."""
    thresholds: Mapping[str, float] = field(default_factory=dict)
    """Overrides: ``noise_factor``, per-field absolute tolerances, window thresholds."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for every run."""
    launch: launch.Method = "auto"
    """``fork`` this interpreter for each run where possible (``auto``), or ``spawn``."""


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
            overhead={"total_s": _r(total_s), "training_s": 0.0, "overhead_s": _r(total_s)},
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


# ------------------------------------------------------------------------------- running


def run_drill(config: DrillConfig, *, on_event: Callable[[str], None] | None = None) -> DrillReport:
    """Run the reference and resumed processes, compare them, diagnose, measure overhead.

    Args:
        config: what to run.
        on_event: called with a one-line progress message as each run starts.

    Returns:
        The report; ``report.ok`` is False when any check failed (a resume that ckptkit
        refused at restore is a failed ``restore`` check).

    Raises:
        DrillError: the drill could not run (a run crashed, wrote no metrics, no checkpoint
            appeared at the save step); the message holds the script's last output lines
            and ``error.report`` (when set) the exit-2 :class:`DrillReport`.

    Example:
        >>> cfg = DrillConfig(command=[sys.executable, "-m", "ckptkit.examples.tiny_lm"],
        ...                   steps_before=10, steps_after=10)
        >>> report = run_drill(cfg)  # doctest: +SKIP
        >>> report.ok  # doctest: +SKIP
        True
    """
    if not config.command:
        raise DrillError("no training command given", hint="ckptkit drill [OPTIONS] -- CMD ...")
    if config.steps_before < 1 or config.steps_after < 1:
        raise DrillError(
            "steps_before and steps_after must be >= 1",
            hint="e.g. --steps-before 10 --steps-after 10",
        )
    if config.repeat < 1:
        raise DrillError("repeat must be >= 1", hint="--repeat 2 measures the noise floor")
    t0 = time.time()
    own_tmp = config.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="ckptkit-drill-")) if own_tmp else Path(config.workdir)  # type: ignore[arg-type]
    workdir.mkdir(parents=True, exist_ok=True)
    runs: list[RunResult] = []
    stage = ["setup"]
    cfg: dict[str, Any] = {}
    try:
        start = _start_step(config.from_ckpt)
        cfg = _config_dict(config, start)
        return _drill(config, on_event or (lambda _m: None), workdir, own_tmp, start, cfg,
                      runs, stage, t0)
    except DrillError as e:
        e.report = DrillReport.failure(  # type: ignore[attr-defined]
            e, command=config.command, config=cfg, runs=runs, workdir=workdir,
            stage=stage[0], total_s=time.time() - t0,
        )
        raise


def _config_dict(config: DrillConfig, start: int) -> dict[str, Any]:
    save_at = start + config.steps_before
    return {
        "steps_before": config.steps_before,
        "steps_after": config.steps_after,
        "start_step": start,
        "save_step": save_at,
        "stop_step": save_at + config.steps_after,
        "from_checkpoint": str(config.from_ckpt) if config.from_ckpt else None,
        "repeat": config.repeat,
        "threads": config.threads,
        "device": config.device,
        "launch": config.launch,
        "thresholds": dict(config.thresholds),
    }


@dataclass
class _Running:
    role: Role
    index: int
    spec: launch.Launch
    proc: launch.Proc
    run_dir: Path
    ckpt_dir: Path
    metrics: Path


def _drill(
    config: DrillConfig,
    say: Callable[[str], None],
    workdir: Path,
    own_tmp: bool,
    start: int,
    cfg: dict[str, Any],
    runs: list[RunResult],
    stage: list[str],
    t0: float,
) -> DrillReport:
    save_at, stop_at = cfg["save_step"], cfg["stop_step"]
    slots = max(1, (os.cpu_count() or 1) // max(1, config.threads))
    # Both runs also save after the stop step: the end-state check compares those.
    ref_env = {ENV_SAVE_AT: str(save_at), ENV_STOP_AT: str(stop_at), ENV_SAVE_FINAL: "1"}
    if config.from_ckpt is not None:
        loc = fs.location(config.from_ckpt)
        ref_env[ENV_RESUME_FROM] = str(fs.resolved(loc))
    waiting = list(range(config.repeat))
    running: list[_Running] = []
    started: list[_Running] = []
    polls = 0
    done: dict[tuple[str, int], RunResult] = {}
    ckpt: Path | None = None
    snaps: list[Path] = []
    resumed_started = False
    stage[0] = "reference"
    try:
        while waiting or running or not resumed_started:
            while waiting and (not running or len(running) < slots):
                i = waiting.pop(0)
                say(f"reference {i + 1}/{config.repeat}: steps {start + 1}..{stop_at}, "
                    f"save after {save_at}")
                running.append(_launch(config, "reference", i, ref_env, workdir))
                started.append(running[-1])
                if i == 0:
                    _import_statistics()  # scipy takes seconds: load it while the runs train
            if ckpt is None:
                ref0 = next((r for r in started if r.role == "reference" and r.index == 0),
                            None)
                # The manager's step directory is a cheap test; a scan for other layouts
                # reads manifests, so it runs once a second and once the reference ended.
                polls += 1
                thorough = polls % 50 == 0 or ("reference", 0) in done
                ckpt = (_committed(config, ref0, save_at, workdir, thorough,
                                   ended=("reference", 0) in done) if ref0 else None)
                if ckpt is None and ("reference", 0) in done:
                    ref = done[("reference", 0)]
                    raise DrillError(
                        f"no checkpoint for step {save_at} appeared in {ref.ckpt_dir}"
                        + _tail_text(ref),
                        path=ref.ckpt_dir,
                        hint=f"make the script save after step ${ENV_SAVE_AT} into "
                        f"${ENV_CKPT_DIR} (see docs/drills.md)",
                    )
            if ckpt is not None and not resumed_started:
                resumed_started = True
                snaps = _control_snapshots(config, ckpt, workdir)  # before a run may touch it
                say(f"resumed: restore {ckpt.name}, steps {save_at + 1}..{stop_at} "
                    "(started as the checkpoint committed)")
                running.append(_launch(
                    config, "resumed", 0,
                    {ENV_RESUME_FROM: str(ckpt.resolve()), ENV_STOP_AT: str(stop_at),
                     ENV_SAVE_FINAL: "1"}, workdir,
                ))
                running.extend(_start_controls(config, snaps[:max(1, config.repeat)], save_at,
                                               stop_at, workdir, say))
            for r in list(running):
                rc = r.proc.poll()
                timed_out = (rc is None and config.timeout is not None
                             and time.time() - r.proc.launched_at > config.timeout)
                if timed_out:
                    r.proc.kill()
                    rc = -9
                if rc is None:
                    continue
                running.remove(r)
                res = _result(r, rc)
                done[(r.role, r.index)] = res
                runs.append(res)
                if r.role == "control":
                    continue  # a control that failed measures nothing; it never stops a drill
                if r.role == "reference" and rc != 0:
                    raise _crash(res, timed_out=timed_out, stop_at=stop_at)
                if r.role == "reference":
                    _expect_steps(res, first=start + 1, last=stop_at)
            if running or waiting or not resumed_started:
                time.sleep(POLL_S)
    finally:
        for r in running:
            r.proc.kill()
    assert ckpt is not None
    refs = [done[("reference", i)] for i in range(config.repeat)]
    resumed = done[("resumed", 0)]
    ran_controls = [v for k, v in sorted(done.items()) if k[0] == "control"]
    runs[:] = [*refs, resumed, *ran_controls]
    stage[0] = "resumed"
    refusal = _refusal(resumed)
    timed_out = resumed.returncode == -9 and config.timeout is not None
    late = None if refusal is not None or timed_out else _failed_after_last_step(resumed, stop_at)
    if resumed.returncode != 0 and refusal is None and late is None:
        raise _crash(resumed, timed_out=timed_out, stop_at=stop_at)
    if refusal is None and not resumed.records:
        raise DrillError(
            "the resumed run wrote no metrics records" + _tail_text(resumed),
            path=resumed.metrics_path,
            hint=f"log every step with ckptkit.Recorder (it writes to ${ENV_METRICS})",
        )
    stage[0] = "compare"

    t_stats = time.time()
    facts = compare.checkpoint_facts(ckpt)
    noise = compare.noise_floor(
        [r.records for r in refs],
        start=save_at,
        stop=stop_at,
        finals=[_final_hash(r) for r in refs],
    )
    if "rng" in noise.noisy:
        noise.generators = _generators(refs, save_at)
    controls = _usable(ran_controls, resumed, save_at, stop_at)
    if controls:
        measured = _control_noise(noise, resumed, controls, save_at, stop_at)
        extra = snaps[len(ran_controls):NOISY_CONTROLS]
        if measured.noisy and len(controls) < NOISY_CONTROLS and extra:
            more = _more_controls(config, extra, save_at, stop_at, workdir, say,
                                  first=len(ran_controls))
            ran_controls += more
            runs[:] = [*refs, resumed, *ran_controls]
            controls = _usable(ran_controls, resumed, save_at, stop_at)
            measured = _control_noise(noise, resumed, controls, save_at, stop_at)
        noise = measured
    ctl_finals = [_final_checkpoint(c, stop_at) for c in controls]
    ref = refs[0]
    twin = compare.twin(
        ref.records,
        resumed.records,
        start=save_at,
        stop=stop_at,
        noise=noise,
        thresholds=config.thresholds,
        final=(_final_hash(ref), _final_hash(resumed)),
    )
    exposure = compare.exposure(ref.records, resumed.records, start=save_at, stop=stop_at)
    continuity = compare.continuity(
        facts, resumed.records, reference=ref.records, save_step=save_at
    )
    end_state = compare.end_state(
        [_final_checkpoint(r, stop_at) for r in refs],
        _final_checkpoint(resumed, stop_at) if refusal is None and late is None else None,
        roots=[str(r.ckpt_dir) for r in (*refs, resumed, *controls)],
        thresholds=config.thresholds,
        resumed_failed=late,
        controls=ctl_finals if not noise.deterministic else [],
    )
    checks = [twin, exposure, continuity, end_state,
              _artefacts(config, refs, resumed if refusal is None and late is None else None,
                         ckpt, stop_at, controls=controls if not noise.deterministic else [])]
    if refusal is not None:
        checks.insert(0, refusal)
    if resumed.records:
        checks.append(_window(ref.records, resumed.records, save_at, stop_at,
                              config.thresholds))
    diag = diagnose.diagnose(ref.records, resumed.records, checks, start=save_at, stop=stop_at,
                             facts=facts)
    stats_s = time.time() - t_stats
    ok = all(c.ok for c in checks if not c.informational)
    overhead = _overhead(refs, resumed, save_at=save_at, stats_s=stats_s, total_s=time.time() - t0)
    keep = config.keep or not ok or not own_tmp
    return DrillReport(
        ok=ok,
        command=list(config.command),
        config=cfg,
        checks=checks,
        diagnosis=diag,
        runs=[*refs, resumed, *ran_controls],
        overhead=overhead,
        noise=noise,
        checkpoint=ckpt,
        workdir=workdir,
        workdir_kept=keep,
    )


def _artefacts(
    config: DrillConfig, refs: Sequence[RunResult], resumed: RunResult | None, ckpt: Path,
    stop_at: int, *, controls: Sequence[RunResult],
) -> compare.CheckResult:
    """The ``artefacts`` check: every other checkpoint or tensor file both runs wrote in
    their checkpoint directories, judged as the end-state check judges the final ones
    (with the controls' copies when the run is not bitwise)."""

    def judge(references: Sequence[Path | None], res: Path | None, /, *,
              roots: Sequence[str], controls: Sequence[Path | None]) -> compare.CheckResult:
        return compare.end_state(references, res, roots=roots, thresholds=config.thresholds,
                                 controls=controls)

    finals = [f for r in (*refs, *([resumed] if resumed else []), *controls)
              if (f := _final_checkpoint(r, stop_at)) is not None]
    return artefacts.compare_artefacts(
        [r.ckpt_dir for r in refs], resumed.ckpt_dir if resumed else None, judge=judge,
        saved_at=artefacts.modified(ckpt), save_step=stop_at - config.steps_after, skip=finals,
        why_not="the resumed run did not save its final state",
        controls=[c.ckpt_dir for c in controls],
    )


def _control_snapshots(config: DrillConfig, ckpt: Path, workdir: Path) -> list[Path]:
    """One private copy (hard links) of the step-``W`` snapshot per control run that may
    run (``max(NOISY_CONTROLS, repeat)``), so a script that alters the checkpoint it resumes
    from (a test deleting a file) alters its own; taken before any run starts."""
    out = []
    for i in range(max(NOISY_CONTROLS, config.repeat)):
        dst = workdir / f"checkpoint-control-{i}"
        try:
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(ckpt.parent, dst, copy_function=_link_or_copy)
        except (OSError, shutil.Error):
            break  # no control: the drill measures nothing and stays as without one
        out.append(dst / ckpt.name)
    return out


def _start_controls(
    config: DrillConfig, snaps: Sequence[Path], save_at: int, stop_at: int, workdir: Path,
    say: Callable[[str], None],
) -> list[_Running]:
    """Start ``max(1, repeat)`` control runs: more restores of the step-``W`` checkpoint, in
    new processes, to the stop step (with their final save).

    Each starts from the state the resumed run starts from, with no step before ``W``
    behind it, so what separates it from the resumed run is the hardware's noise from
    ``W`` on. A restore bug that is deterministic is in both: it does not widen the noise
    (the comparison that catches it is the resumed run against the reference). A control
    is a resumed run for the script (``CKPTKIT_DRILL_ROLE=resumed``). They run beside the
    resumed run; a control that matches it bitwise, records and final state, shows the run
    is deterministic (docs/drills.md, statistical mode).
    """
    n = len(snaps)
    if not n:
        return []
    say(f"control{'s' if n > 1 else ''}: {n} more restore{'s' if n > 1 else ''} of "
        f"{snaps[0].name}, steps {save_at + 1}..{stop_at} (is the run bitwise? if not, its "
        "noise)")
    return [_launch_control(config, i, snap, stop_at, workdir) for i, snap in enumerate(snaps)]


def _launch_control(config: DrillConfig, index: int, snap: Path, stop_at: int, workdir: Path
                    ) -> _Running:
    """One control: a resumed run, for the script, from its own copy of the snapshot."""
    return _launch(config, "control", index,
                   {ENV_RESUME_FROM: str(snap.resolve()), ENV_STOP_AT: str(stop_at),
                    ENV_SAVE_FINAL: "1", ENV_ROLE: "resumed"}, workdir)


def _control_noise(base: compare.NoiseFloor, resumed: RunResult, controls: Sequence[RunResult],
                   save_at: int, stop_at: int) -> compare.NoiseFloor:
    """The noise the controls measure around the resumed run (records and final states)."""
    res_final = _final_checkpoint(resumed, stop_at)
    ctl_finals = [_final_checkpoint(c, stop_at) for c in controls]
    return compare.control_noise(
        base, resumed.records, [c.records for c in controls], start=save_at, stop=stop_at,
        finals=(_final_hash(resumed), [_final_hash(c) for c in controls]),
        states=[compare.states_differ(res_final, f, roots=(str(resumed.ckpt_dir),
                                                           str(c.ckpt_dir)))
                for c, f in zip(controls, ctl_finals, strict=True)
                if res_final is not None and f is not None],
    )


def _more_controls(
    config: DrillConfig, snaps: Sequence[Path], save_at: int, stop_at: int, workdir: Path,
    say: Callable[[str], None], *, first: int,
) -> list[RunResult]:
    """Run more controls after the first showed the run is not bitwise, and wait for them.

    With one control the noise at each step is one pair's difference, a single draw of a
    heavy-tailed ratio: 1 in 40 clean drills of a noisy script failed on it. Two controls
    give three restores to measure between. They run after the others, one segment more
    of wall time for a noisy run only, and never beside them: three copies of a model may
    not fit on one GPU.
    """
    say(f"control: the run is not bitwise; {len(snaps)} more restore(s) of "
        f"{snaps[0].name} to measure its noise")
    running = [_launch_control(config, first + i, snap, stop_at, workdir)
               for i, snap in enumerate(snaps)]
    return [_result(r, r.proc.wait(config.timeout)) for r in running]


def _usable(controls: Sequence[RunResult], resumed: RunResult, save_at: int, stop_at: int
            ) -> list[RunResult]:
    """The controls that ran ``W+1..W+N`` and exited cleanly (a control that failed, as a
    script that crashes on every resume does, measures nothing: then the fresh references'
    noise floor stands)."""
    if not resumed.records:
        return []
    return [c for c in controls if c.returncode == 0 and c.records
            and c.records[0].get("step") == save_at + 1
            and c.records[-1].get("step") == stop_at]


def _generators(refs: Sequence[RunResult], save_at: int) -> list[dict[str, str]]:
    """The generators the fresh references' step-``W`` checkpoints disagree on (the script
    does not seed them), or [] when there is one reference or a checkpoint is gone."""
    found = [find_checkpoint(r.ckpt_dir, save_at) for r in refs]
    if len(found) < 2 or found[0] is None:
        return []
    out: list[dict[str, str]] = []
    for other in found[1:]:
        if other is not None:
            out += [g for g in compare.differing_generators(found[0], other) if g not in out]
    return out


def _import_statistics() -> None:
    """Import the window check's statistics (scipy) now, while the reference trains."""
    import ckptkit.drill.stats  # noqa: F401


def _committed(
    config: DrillConfig,
    ref0: _Running,
    save_at: int,
    workdir: Path,
    thorough: bool,
    *,
    ended: bool = False,
) -> Path | None:
    """The reference's step-W checkpoint once committed, as a private snapshot (or None).

    The snapshot hard-links the files (copies across file systems) into the drill's own
    directory: the reference keeps running and may rotate its checkpoint away. Without
    ``thorough`` only the manager's own ``step-NNNNNNNN`` directory is looked for.
    """
    direct = ref0.ckpt_dir / step_dir_name(save_at)
    if (direct / mf.MANIFEST_NAME).is_file():
        found: Path | None = direct
    elif not thorough:
        return None
    else:
        found = find_checkpoint(ref0.ckpt_dir, save_at)
    if found is None and thorough:
        snap = _framework_snapshot(ref0.ckpt_dir, save_at, workdir, ended=ended)
        if snap is not None:
            return snap
    if found is None and config.isolate:
        # A script that ignores $CKPTKIT_CKPT_DIR writes under its own run directory.
        hits = sorted(
            p for p in ref0.run_dir.rglob(step_dir_name(save_at))
            if (p / mf.MANIFEST_NAME).is_file()
        )
        found = hits[0] if hits else None
    if found is None:
        return None
    # Named by its step, so the resumed run restores it as that step of a run directory.
    dst = workdir / "checkpoint" / step_dir_name(save_at)
    if dst.exists():
        shutil.rmtree(dst)
    try:
        shutil.copytree(found, dst, copy_function=_link_or_copy)
    except (OSError, shutil.Error):
        shutil.rmtree(dst, ignore_errors=True)
        return None  # caught mid-rotation or mid-write: look again at the next poll
    if not (dst / mf.MANIFEST_NAME).is_file():
        return None
    return dst


def _framework_snapshot(ckpt_dir: Path, save_at: int, workdir: Path, *, ended: bool) -> Path | None:
    """A framework's step-W checkpoint (a Trainer ``checkpoint-N``, a Lightning ``.ckpt``),
    found through its run layout (:func:`ckptkit.run.directory.open_run`), as a private snapshot.

    Only a ``verified`` one (adopted by the integration: digests and component table
    beside it) is taken while the reference runs; once it has ended, a ``committed`` one
    too (the drill then says it is not adopted when it resumes). The snapshot keeps the
    framework's name (and a single file's adopted manifest beside it).
    """
    if not ckpt_dir.is_dir():
        return None
    run = runs.open_run(ckpt_dir)
    try:
        if run.layout == "ckptkit":
            return None
        good = ("verified", "committed") if ended else ("verified",)
        hits = [c for c in run.checkpoints() if c.step == save_at and c.status in good]
    finally:
        run.close()
    if not hits:
        return None
    src = Path(str(max(hits, key=lambda c: c.status == "verified").path))
    dst = workdir / "checkpoint" / src.name
    try:
        if dst.parent.exists():
            shutil.rmtree(dst.parent)
        dst.parent.mkdir(parents=True)
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(src), str(dst))
            side = adopted_path(src)
            if side.is_file():
                _link_or_copy(str(side), str(adopted_path(dst)))
    except (OSError, shutil.Error):
        shutil.rmtree(dst.parent, ignore_errors=True)
        return None  # caught mid-rotation or mid-write: look again at the next poll
    return dst


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _launch(
    config: DrillConfig, role: Role, index: int, contract: Mapping[str, str], workdir: Path
) -> _Running:
    name = role if role == "resumed" else f"{role}-{index}"
    run_dir = workdir / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    ckpt_dir = run_dir / "ckpt"
    metrics = run_dir / "metrics.jsonl"
    argv = [str(a) for a in config.command]
    if argv and argv[0] in ("python", "python3"):
        # "python" in a drill definition means the interpreter running the drill (the one
        # ckptkit is installed in), not whatever PATH finds first.
        argv[0] = sys.executable
    if config.pass_device:
        argv += ["--device", config.device]
    env = dict(os.environ)
    for var in ENV_VARS:  # the drill sets every contract variable a run needs below
        env.pop(var, None)
    threads = str(config.threads)
    env.update(
        {
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            ENV_THREADS: threads,
            ENV_DEVICE: config.device,
            ENV_ROLE: role,
            ENV_CKPT_DIR: str(ckpt_dir.resolve()),
            ENV_METRICS: str(metrics.resolve()),
        }
    )
    env.setdefault("PYTHONHASHSEED", "0")
    if config.device.startswith("cuda"):
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env.update(contract)
    env.update(config.env)
    cwd: Path | None = None
    if config.isolate:
        here = Path.cwd()
        cwd = run_dir
        argv = [argv[0], *(_absolutize(a, here) for a in argv[1:])]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(here), env.get("PYTHONPATH")) if p)
    spec = launch.Launch(argv, env, cwd, run_dir / "stdout.txt", run_dir / "stderr.txt",
                         threads=config.threads)
    try:
        proc = launch.start(spec, method=config.launch)
    except OSError as e:
        raise DrillError(
            f"cannot start {argv[0]!r}: {e.strerror or e}", hint="check the command after '--'"
        ) from None
    except ValueError as e:
        raise DrillError(str(e), hint="use --launch auto or spawn") from None
    return _Running(role, index, spec, proc, run_dir, ckpt_dir, metrics)


def _run_one(
    config: DrillConfig, role: Role, index: int, contract: Mapping[str, str], workdir: Path
) -> RunResult:
    """Run one process to its end (killed after ``config.timeout``); raise if it failed."""
    r = _launch(config, role, index, contract, workdir)
    rc = r.proc.wait(config.timeout)
    res = _result(r, rc)
    if rc != 0:
        raise _crash(res, timed_out=rc == -9 and config.timeout is not None)
    return res


def _result(r: _Running, rc: int) -> RunResult:
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


def _failed_after_last_step(run: RunResult, stop_at: int) -> str | None:
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
        f"{run.returncode} before its final checkpoint was saved" + _tail_text(run)


def _crash(run: RunResult, *, timed_out: bool, stop_at: int | None = None) -> DrillError:
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
    return DrillError(f"the {name} run {why}" + _tail_text(run), path=run.run_dir, hint=hint)


_CK_ERROR = re.compile(r"^(?:ckptkit\.errors\.)?(\w+Error): (.*)$")
_COMPONENT_WORDS = ("scaler", "sampler", "scheduler", "optimizer", "rng", "fp8", "progress",
                    "model", "data", "parallel")


def _refusal(resumed: RunResult) -> compare.CheckResult | None:
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


def cleanup(report: DrillReport) -> None:
    """Remove the drill's temporary workdir unless the report says to keep it.

    Call it after rendering (the plot reads the records, which are in memory).

    Example:
        >>> cleanup(report)  # doctest: +SKIP
    """
    if not report.workdir_kept and report.workdir is not None:
        shutil.rmtree(report.workdir, ignore_errors=True)


def find_checkpoint(ckpt_dir: Path, step: int) -> Path | None:
    """Return the committed checkpoint of ``step`` under ``ckpt_dir`` (or None).

    Looks for the manager's ``step-NNNNNNNN`` directory first, then any directory (up to
    two levels down, or ``ckpt_dir`` itself) whose manifest records ``step``.

    Example:
        >>> find_checkpoint(Path("/nonexistent"), 10) is None
        True
    """
    if not ckpt_dir.is_dir():
        return None
    direct = ckpt_dir / step_dir_name(step)
    if (direct / mf.MANIFEST_NAME).is_file():
        return direct
    candidates = [ckpt_dir, *ckpt_dir.glob("*"), *ckpt_dir.glob("*/*")]
    for c in candidates:
        if atomic.is_temporary(c):
            continue  # a save still in progress (or one that was interrupted)
        if c.is_dir() and not c.is_symlink() and (c / mf.MANIFEST_NAME).is_file():
            try:
                if manifest_io.read(c).step == step:
                    return c
            except CkptkitError:
                continue
    return None


def _final_checkpoint(run: RunResult, stop_at: int) -> Path | None:
    """The checkpoint ``run`` saved after the stop step (``CKPTKIT_DRILL_SAVE_FINAL``), in
    place (the run has ended: nothing rotates it away now), or None when it saved none:
    the manager's ``step-NNNNNNNN``, or a framework's (Trainer ``checkpoint-N``,
    Lightning ``.ckpt``) found through its run layout."""
    found = find_checkpoint(run.ckpt_dir, stop_at)
    if found is not None or not run.ckpt_dir.is_dir():
        return found
    layout = runs.open_run(run.ckpt_dir)
    try:
        if layout.layout == "ckptkit":
            return None
        hits = [c for c in layout.checkpoints()
                if c.step == stop_at and c.status in ("verified", "committed")]
    finally:
        layout.close()
    if not hits:
        return None
    return Path(str(max(hits, key=lambda c: c.status == "verified").path))


def _start_step(from_ckpt: Path | str | None) -> int:
    if from_ckpt is None:
        return 0
    path = fs.location(from_ckpt)
    m = manifest_io.read(path)
    if m.step is not None:
        return int(m.step)
    prog = m.components.get("progress")
    if prog is not None and isinstance(prog.summary.get("step"), int):
        return int(prog.summary["step"])
    raise DrillError(
        "the --from checkpoint records no step",
        path=path,
        hint="save it with CheckpointManager (which records the step)",
    )


def _expect_steps(run: RunResult, *, first: int, last: int) -> None:
    if not run.records:
        raise DrillError(
            f"the {run.role} run wrote no metrics records" + _tail_text(run),
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


def _absolutize(arg: str, here: Path) -> str:
    if arg.startswith("-") or os.path.isabs(arg):
        return arg
    p = here / arg
    return str(p) if p.exists() else arg


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


def _final_hash(run: RunResult) -> str | None:
    for rec in reversed(run.records):
        if "param_hash" in rec:
            return str(rec["param_hash"])
    if run.summary and "param_hash" in run.summary:
        return str(run.summary["param_hash"])
    return None


def _tail_text(run: RunResult) -> str:
    lines = (run.stderr_tail or run.stdout_tail)[-8:]
    if not lines:
        return ""
    return "; last output:\n  " + "\n  ".join(lines) + "\n"


def _window(
    ref: list[dict[str, Any]],
    resumed: list[dict[str, Any]],
    save_at: int,
    stop_at: int,
    thresholds: Mapping[str, float],
) -> compare.CheckResult:
    from ckptkit.drill.stats import window_check  # scipy: imported while the runs train

    pre = [r for r in ref if isinstance(r.get("step"), int) and r["step"] <= save_at]
    post_ref = [r for r in ref if isinstance(r.get("step"), int) and save_at < r["step"] <= stop_at]
    out = window_check(pre, resumed, thresholds=dict(thresholds), reference_records=post_ref)
    known = {"name", "ok", "statistic", "threshold", "informational"}
    detail = {k: v for k, v in out.items() if k not in known}
    if isinstance(detail.get("detail"), str):
        detail["summary"] = detail.pop("detail")
    return compare.CheckResult(
        name=str(out.get("name", "window")),
        ok=bool(out.get("ok", True)),
        statistic=out.get("statistic"),
        threshold=out.get("threshold"),
        informational=bool(out.get("informational", True)),
        detail=detail,
    )


# ------------------------------------------------------------------------------- overhead


def _timing(run: RunResult, *, save_at: int | None) -> dict[str, Any]:
    """Split one run's wall time into start-up, training, save and tear-down.

    From the record timestamps: the median gap between consecutive records is one step;
    the time before the first record beyond one step is start-up (imports, setup,
    restore); the excess of the gap after the save step is the save. ``intervals`` are the
    wall-clock spans the run spent training (the save cut out).
    """
    times = [float(r["time"]) for r in run.records if isinstance(r.get("time"), int | float)]
    steps = [r.get("step") for r in run.records]
    if not times:
        return {"startup_s": run.wall_s, "train_s": 0.0, "save_s": 0.0, "teardown_s": 0.0,
                "intervals": []}
    gaps = [b - a for a, b in itertools.pairwise(times)]
    step_s = statistics.median(gaps) if gaps else 0.0
    save_s = 0.0
    intervals = [(times[0] - step_s, times[-1])]
    if save_at is not None and save_at in steps:
        i = steps.index(save_at)
        if i + 1 < len(times):
            save_s = max(0.0, times[i + 1] - times[i] - step_s)
            intervals = [(times[0] - step_s, times[i]), (times[i] + save_s, times[-1])]
    startup = max(0.0, times[0] - run.launched_at - step_s)
    train = max(0.0, times[-1] - times[0] + step_s - save_s)
    return {
        "startup_s": startup,
        "train_s": train,
        "save_s": save_s,
        "teardown_s": max(0.0, run.ended_at - times[-1]),
        "step_s": step_s,
        "intervals": intervals,
    }


def _union(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _overhead(
    refs: list[RunResult], resumed: RunResult, *, save_at: int, stats_s: float, total_s: float
) -> dict[str, Any]:
    ref_t = [_timing(r, save_at=save_at) for r in refs]
    res_t = _timing(resumed, save_at=None)
    busy = sum(t["train_s"] for t in ref_t) + res_t["train_s"]
    # Runs overlap (the resumed one starts once the checkpoint commits): the drill's
    # training time is the wall-clock time during which at least one run trained.
    train = _union([iv for t in (*ref_t, res_t) for iv in t["intervals"]])
    startup = sum(t["startup_s"] for t in ref_t) + res_t["startup_s"]
    save = sum(t["save_s"] for t in ref_t)
    # The resumed start-up minus a fresh start-up is the restore (same imports and setup).
    restore = max(0.0, res_t["startup_s"] - ref_t[0]["startup_s"])
    teardown = sum(t["teardown_s"] for t in ref_t) + res_t["teardown_s"]
    overhead = max(0.0, total_s - train)
    return {
        "total_s": _r(total_s),
        "training_s": _r(train),
        "training_process_s": _r(busy),
        "warmup_s": _r(sum(r.warm_s for r in (*refs, resumed))),
        "process_start_s": _r(startup - restore),
        "save_s": _r(save),
        "restore_s": _r(restore),
        "teardown_s": _r(teardown),
        "statistics_s": _r(stats_s),
        "overhead_s": _r(overhead),
        "overhead_fraction": _r(overhead / total_s) if total_s > 0 else None,
        "overhead_vs_training": _r(overhead / train) if train > 0 else None,
        "step_s": _r(ref_t[0].get("step_s", 0.0)),
        "launch": sorted({r.method for r in (*refs, resumed)}),
        "method": "estimated from record timestamps: training is the wall-clock time during "
        "which at least one run trained (runs overlap); warm-up is the drill process "
        "importing what the forked runs need (torch._dynamo ...); start-up is the time to "
        "the first record after the launch less one step (imports and setup of each run); "
        "restore is the resumed start-up less the fresh one; save is the excess of the gap "
        "after the save step; overhead is the total less training",
    }


def _r(x: float) -> float:
    return round(x, 4) if math.isfinite(x) else x


CONFIG_KEYS = frozenset(
    {
        "command",
        "steps_before",
        "steps_after",
        "device",
        "threads",
        "repeat",
        "thresholds",
        "pass_device",
        "isolate",
        "timeout",
        "env",
        "from_ckpt",
        "launch",
    }
)
"""Keys a drill TOML file may set (at top level or under ``[drill]``)."""


def load_config(path: str | Path, **overrides: Any) -> DrillConfig:
    """Read a drill TOML file (e.g. ``drills/tiny_lm.toml``); non-None overrides win.

    Raises:
        DrillError: the file is not valid TOML, has unknown keys, no command, or a value
            of the wrong type (integers for steps/repeat/threads, a number for
            ``timeout``, tables of strings for ``env`` and of numbers for ``thresholds``).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "d.toml"
        >>> _ = p.write_text('command = ["python", "train.py"]\\nsteps_before = 4\\n')
        >>> cfg = load_config(p, steps_after=3)
        >>> cfg.command, cfg.steps_before, cfg.steps_after
        (['python', 'train.py'], 4, 3)
    """
    import tomllib

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise DrillError(f"not valid TOML: {e}", path=path, hint="fix the drill file") from None
    if isinstance(data.get("drill"), dict):
        data = data["drill"]
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise DrillError(
            f"unknown keys {unknown}", path=path, hint=f"use only {sorted(CONFIG_KEYS)}"
        )
    values: dict[str, Any] = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    command = values.get("command")
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    if (
        not command
        or not isinstance(command, list | tuple)
        or not all(isinstance(a, str) for a in command)
    ):
        raise DrillError(
            "no command (a list of strings) given",
            path=path,
            hint='command = ["python", "-m", "my.train"]',
        )
    values["command"] = command
    _check_types(values, path)
    if values.get("from_ckpt") is not None:
        values["from_ckpt"] = Path(values["from_ckpt"])
    try:
        return DrillConfig(**values)
    except TypeError as e:
        raise DrillError(str(e), path=path, hint="check the drill file's keys") from None


_INT_KEYS = {"steps_before": 10, "steps_after": 10, "repeat": 2, "threads": 1}
"""Integer keys of a drill file, with an example value for the hint."""


def _check_types(values: Mapping[str, Any], path: Path) -> None:
    """Raise a DrillError naming the key when a drill file value has the wrong type."""

    def bad(key: str, want: str, example: str) -> DrillError:
        got = values[key]
        return DrillError(
            f"{key} = {got!r} ({type(got).__name__}) must be {want}",
            path=path,
            hint=f"write it as {example}",
        )

    for key, example in _INT_KEYS.items():
        v = values.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad(key, "an integer", f"{key} = {example}")
    for key in ("device", "from_ckpt"):
        v = values.get(key)
        if v is not None and not isinstance(v, str | os.PathLike):
            raise bad(
                key, "a string", f'{key} = "{"cpu" if key == "device" else "ckpt/step-00000010"}"'
            )
    if values.get("launch") is not None and values["launch"] not in ("auto", "fork", "spawn"):
        raise bad("launch", "one of auto, fork, spawn", 'launch = "auto"')
    for key in ("pass_device", "isolate"):
        v = values.get(key)
        if v is not None and not isinstance(v, bool):
            raise bad(key, "true or false", f"{key} = true")
    timeout = values.get("timeout")
    if timeout is not None and not _is_number(timeout):
        raise bad("timeout", "a number of seconds", "timeout = 600")
    if not _table_of(values.get("env"), lambda v: isinstance(v, str)):
        raise bad("env", "a table of string values", '[env] (or [drill.env]) NAME = "1"')
    if not _table_of(values.get("thresholds"), _is_number):
        raise bad(
            "thresholds",
            "a table of numbers",
            "[thresholds] (or [drill.thresholds]) noise_factor = 4.0",
        )


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _table_of(table: Any, ok: Callable[[Any], bool]) -> bool:
    """Whether ``table`` is absent, or a mapping of string keys to values ``ok`` accepts."""
    if table is None:
        return True
    if not isinstance(table, Mapping):
        return False
    return all(isinstance(k, str) and ok(v) for k, v in table.items())


__all__ = [
    "ENV_CKPT_DIR",
    "ENV_DEVICE",
    "ENV_ROLE",
    "ENV_THREADS",
    "DrillConfig",
    "DrillReport",
    "RunResult",
    "cleanup",
    "find_checkpoint",
    "load_config",
    "run_drill",
]
