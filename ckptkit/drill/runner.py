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
   resumed run is held to (:func:`ckptkit.drill.noisefloor.control_noise`), with one more
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

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptkit.checkpoint import manifest_io
from ckptkit.drill import (
    artefacts,
    compare,
    diagnose,
    endstate,
    launch,
    noisefloor,
    process,
    snapshots,
)
from ckptkit.drill import continuity as continuity_check
from ckptkit.drill import exposure as exposure_check
from ckptkit.drill.config import DrillConfig
from ckptkit.drill.overhead import drill_overhead
from ckptkit.drill.report import DrillReport, Role, RunResult
from ckptkit.errors import DrillError
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
from ckptkit.signals.recorder import ENV_METRICS
from ckptkit.storage import fs

POLL_S = 0.02
"""How often running processes and the reference's checkpoint directory are polled."""

NOISY_CONTROLS = 2
"""Controls a drill runs once the first shows the run is not bitwise (``--repeat`` more:
that many)."""

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
    running: list[process.Running] = []
    started: list[process.Running] = []
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
                ckpt = (snapshots.committed(config, ref0, save_at, workdir, thorough,
                                   ended=("reference", 0) in done) if ref0 else None)
                if ckpt is None and ("reference", 0) in done:
                    ref = done[("reference", 0)]
                    raise DrillError(
                        f"no checkpoint for step {save_at} appeared in {ref.ckpt_dir}"
                        + process.tail_text(ref),
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
                res = process.result(r, rc)
                done[(r.role, r.index)] = res
                runs.append(res)
                if r.role == "control":
                    continue  # a control that failed measures nothing; it never stops a drill
                if r.role == "reference" and rc != 0:
                    raise process.crash(res, timed_out=timed_out, stop_at=stop_at)
                if r.role == "reference":
                    process.expect_steps(res, first=start + 1, last=stop_at)
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
    refusal = process.refusal(resumed)
    timed_out = resumed.returncode == -9 and config.timeout is not None
    late = None if refusal is not None or timed_out else process.failed_after_last_step(resumed, stop_at)
    if resumed.returncode != 0 and refusal is None and late is None:
        raise process.crash(resumed, timed_out=timed_out, stop_at=stop_at)
    if refusal is None and not resumed.records:
        raise DrillError(
            "the resumed run wrote no metrics records" + process.tail_text(resumed),
            path=resumed.metrics_path,
            hint=f"log every step with ckptkit.Recorder (it writes to ${ENV_METRICS})",
        )
    stage[0] = "compare"

    t_stats = time.time()
    facts = continuity_check.checkpoint_facts(ckpt)
    noise = noisefloor.noise_floor(
        [r.records for r in refs],
        start=save_at,
        stop=stop_at,
        finals=[process.final_hash(r) for r in refs],
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
    ctl_finals = [snapshots.final_checkpoint(c, stop_at) for c in controls]
    ref = refs[0]
    twin = compare.twin(
        ref.records,
        resumed.records,
        start=save_at,
        stop=stop_at,
        noise=noise,
        thresholds=config.thresholds,
        final=(process.final_hash(ref), process.final_hash(resumed)),
    )
    exposure = exposure_check.exposure(ref.records, resumed.records, start=save_at, stop=stop_at)
    continuity = continuity_check.continuity(
        facts, resumed.records, reference=ref.records, save_step=save_at
    )
    end_state = endstate.end_state(
        [snapshots.final_checkpoint(r, stop_at) for r in refs],
        snapshots.final_checkpoint(resumed, stop_at) if refusal is None and late is None else None,
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
    overhead = drill_overhead(refs, resumed, save_at=save_at, stats_s=stats_s, total_s=time.time() - t0)
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
        return endstate.end_state(references, res, roots=roots, thresholds=config.thresholds,
                                 controls=controls)

    finals = [f for r in (*refs, *([resumed] if resumed else []), *controls)
              if (f := snapshots.final_checkpoint(r, stop_at)) is not None]
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
            shutil.copytree(ckpt.parent, dst, copy_function=snapshots.link_or_copy)
        except (OSError, shutil.Error):
            break  # no control: the drill measures nothing and stays as without one
        out.append(dst / ckpt.name)
    return out


def _start_controls(
    config: DrillConfig, snaps: Sequence[Path], save_at: int, stop_at: int, workdir: Path,
    say: Callable[[str], None],
) -> list[process.Running]:
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
                    ) -> process.Running:
    """One control: a resumed run, for the script, from its own copy of the snapshot."""
    return _launch(config, "control", index,
                   {ENV_RESUME_FROM: str(snap.resolve()), ENV_STOP_AT: str(stop_at),
                    ENV_SAVE_FINAL: "1", ENV_ROLE: "resumed"}, workdir)


def _control_noise(base: compare.NoiseFloor, resumed: RunResult, controls: Sequence[RunResult],
                   save_at: int, stop_at: int) -> compare.NoiseFloor:
    """The noise the controls measure around the resumed run (records and final states)."""
    res_final = snapshots.final_checkpoint(resumed, stop_at)
    ctl_finals = [snapshots.final_checkpoint(c, stop_at) for c in controls]
    return noisefloor.control_noise(
        base, resumed.records, [c.records for c in controls], start=save_at, stop=stop_at,
        finals=(process.final_hash(resumed), [process.final_hash(c) for c in controls]),
        states=[noisefloor.states_differ(res_final, f, roots=(str(resumed.ckpt_dir),
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
    return [process.result(r, r.proc.wait(config.timeout)) for r in running]


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
    found = [snapshots.find_checkpoint(r.ckpt_dir, save_at) for r in refs]
    if len(found) < 2 or found[0] is None:
        return []
    out: list[dict[str, str]] = []
    for other in found[1:]:
        if other is not None:
            out += [g for g in noisefloor.differing_generators(found[0], other) if g not in out]
    return out


def _import_statistics() -> None:
    """Import the window check's statistics (scipy) now, while the reference trains."""
    import ckptkit.drill.stats  # noqa: F401


def _launch(
    config: DrillConfig, role: Role, index: int, contract: Mapping[str, str], workdir: Path
) -> process.Running:
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
    return process.Running(role, index, spec, proc, run_dir, ckpt_dir, metrics)


def _run_one(
    config: DrillConfig, role: Role, index: int, contract: Mapping[str, str], workdir: Path
) -> RunResult:
    """Run one process to its end (killed after ``config.timeout``); raise if it failed."""
    r = _launch(config, role, index, contract, workdir)
    rc = r.proc.wait(config.timeout)
    res = process.result(r, rc)
    if rc != 0:
        raise process.crash(res, timed_out=rc == -9 and config.timeout is not None)
    return res


def cleanup(report: DrillReport) -> None:
    """Remove the drill's temporary workdir unless the report says to keep it.

    Call it after rendering (the plot reads the records, which are in memory).

    Example:
        >>> cleanup(report)  # doctest: +SKIP
    """
    if not report.workdir_kept and report.workdir is not None:
        shutil.rmtree(report.workdir, ignore_errors=True)


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


def _absolutize(arg: str, here: Path) -> str:
    if arg.startswith("-") or os.path.isabs(arg):
        return arg
    p = here / arg
    return str(p) if p.exists() else arg


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


__all__ = [
    "ENV_CKPT_DIR",
    "ENV_DEVICE",
    "ENV_ROLE",
    "ENV_THREADS",
    "cleanup",
    "run_drill",
]
