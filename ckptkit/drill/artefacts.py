"""The drill's ``artefacts`` check: every checkpoint or tensor file both runs wrote, compared.

The ``end_state`` check compares the checkpoint each run saves after the stop step. A script
also writes files of its own into its checkpoint directory: an EMA kept outside the
``TrainState`` and exported at the end, a final ``model.safetensors``, an intermediate
checkpoint after the save step. Those hold state no step record shows, so a resume that loses
it (an EMA never saved, restarted from the current weights) passes every other check. This
check lists what each run wrote there (:func:`written`) and judges each file the reference
and the resumed run both wrote, at the same relative path, with the function that judges the
final checkpoints (:func:`ckptkit.drill.endstate.end_state`, over
:func:`ckptkit.verify.statediff.diff`: native checkpoints, safetensors, torch files read with
``weights_only``, DCP, framework layouts). A file only one run wrote after the save step is
a finding too.

What is not compared, and why:

* the final checkpoint (``end_state`` compares it) and anything inside a checkpoint
  directory (the directory is the artefact);
* what the reference wrote up to its step-``W`` save (the resumed run starts from that
  checkpoint, so it cannot write them): a file of the reference's that no resumed file
  matches is judged only when it is newer than that checkpoint and its name carries no step
  number up to ``W`` (``ema-step4.pt`` written beside the step-4 save is the save's);
* files that are neither a checkpoint nor a tensor file (logs, JSON, the manager's pointer
  and lock), and the commit's temporary siblings.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ckptkit.checkpoint.detect import TORCH_SUFFIXES, detect
from ckptkit.drill.compare import CheckResult
from ckptkit.errors import CkptkitError
from ckptkit.storage.atomic import MANIFEST_NAME, OLD_SUFFIX, TMP_SUFFIX

NAME = "artefacts"
"""The check's name in the drill report."""

TENSOR_SUFFIXES = (*TORCH_SUFFIXES, ".safetensors")
"""Files compared as tensor files (torch files are read with ``weights_only``)."""

RUN_PATHS = re.compile(
    r"\Acallbacks/ModelCheckpoint.*/(?:best_model_path|last_model_path|kth_best_model_path"
    r"|best_k_models)(?:/|\Z)"
)
"""A Lightning ``ModelCheckpoint``'s record of the files it wrote: Lightning restores it only
into the directory it was saved from, and each run of a drill has its own, so the resumed
run's next intermediate checkpoint holds ``''`` where the reference's names its own file
(the final checkpoint holds the paths again, and ``end_state`` compares them)."""


class Judge(Protocol):
    """Judges one artefact as the end-state check judges the final checkpoints: the
    references' copies (None where a reference lacks it) against the resumed run's, within
    the drill's tolerance (bitwise where the run is; else within the noise the control
    runs' copies measure). :func:`ckptkit.drill.endstate.end_state` with the drill's
    thresholds; ``roots`` lists the references', the resumed run's, then the controls'
    directories."""

    def __call__(
        self, references: Sequence[Path | None], resumed: Path | None, /, *,
        roots: Sequence[str], controls: Sequence[Path | None],
    ) -> CheckResult: ...


def written(ckpt_dir: Path, *, skip: Collection[Path] = ()) -> dict[str, Path]:
    """The checkpoints and tensor files a run wrote under ``ckpt_dir``, by relative path.

    A directory that is a checkpoint (a ``manifest.json``, a DCP ``.metadata``, a framework
    folder ``ckptkit verify`` detects) is one artefact and is not descended into; a file with
    a tensor suffix (:data:`TENSOR_SUFFIXES`) outside one is an artefact of its own.

    Args:
        ckpt_dir: the run's checkpoint directory (``$CKPTKIT_CKPT_DIR``).
        skip: artefacts another check compares (the final checkpoint).

    Example:
        >>> import tempfile, torch
        >>> d = Path(tempfile.mkdtemp()); torch.save({"w": torch.ones(1)}, d / "ema.pt")
        >>> list(written(d))
        ['ema.pt']
    """
    skipped = {p.resolve() for p in skip}
    found: dict[str, Path] = {}

    def walk(d: Path) -> None:
        for p in sorted(d.iterdir()):
            if p.name.startswith(".") or TMP_SUFFIX in p.name or OLD_SUFFIX in p.name:
                continue
            if p.is_symlink() or p.resolve() in skipped:
                continue
            if p.is_dir():
                if (p / MANIFEST_NAME).is_file() or detect(p) is not None:
                    found[p.relative_to(ckpt_dir).as_posix()] = p
                else:
                    walk(p)
            elif p.is_file() and p.name.endswith(TENSOR_SUFFIXES):
                found[p.relative_to(ckpt_dir).as_posix()] = p

    if ckpt_dir.is_dir():
        walk(ckpt_dir)
    return found


def modified(path: Path) -> float:
    """When ``path`` was last written: its newest file's modification time.

    Example:
        >>> import tempfile
        >>> modified(Path(tempfile.mkdtemp())) > 0
        True
    """
    if path.is_file():
        return path.stat().st_mtime
    times = [f.stat().st_mtime for f in path.rglob("*") if f.is_file()]
    return max(times, default=path.stat().st_mtime)


def compare_artefacts(
    references: Sequence[Path],
    resumed: Path | None,
    *,
    judge: Judge,
    saved_at: float,
    save_step: int | None = None,
    skip: Collection[Path] = (),
    why_not: str | None = None,
    controls: Sequence[Path] = (),
) -> CheckResult:
    """Compare every artefact the runs wrote in their checkpoint directories.

    Args:
        references: each reference run's checkpoint directory (reference 0 first).
        resumed: the resumed run's checkpoint directory (None: it did not run to the end).
        judge: how one artefact is judged (the end-state check's comparison and tolerance).
        saved_at: when the reference's step-W checkpoint was committed (:func:`modified`):
            what the reference wrote before it is not expected of the resumed run.
        save_step: the step ``W`` of that checkpoint: a file whose name carries a number up
            to it was written with that save or before, and is not expected either.
        skip: artefacts compared elsewhere (each run's final checkpoint).
        why_not: why the resumed run's artefacts are not compared (with ``resumed`` None).
        controls: the checkpoint directories of the control runs (restored from the same
            step-W checkpoint as the resumed run): their copies of each artefact go to the
            judge, which measures the noise from them.

    Returns:
        ``statistic`` = artefacts that differ or that one run alone wrote, ``threshold`` 0;
        ``detail.files`` per relative path its status and what differs; ``detail.different``
        per component (``ema``, a file's name) its summary, tensors and files, in the shape
        of the end-state check's. Skipped (informational) when there is nothing to compare.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> compare_artefacts([d], d, judge=None, saved_at=0.0).skipped  # type: ignore[arg-type]
        True
    """
    t0 = time.perf_counter()
    if resumed is None or not references:
        return _skipped(why_not or "the resumed run did not run to its end")
    ref_files = [written(r, skip=skip) for r in references]
    res_files = written(resumed, skip=skip)
    ctl_files = [written(c, skip=skip) for c in controls]
    files: dict[str, dict[str, Any]] = {}
    different: dict[str, dict[str, Any]] = {}
    modes: set[str] = set()
    roots = [str(r) for r in (*references, resumed, *controls)]
    for rel in sorted(set(ref_files[0]) | set(res_files)):
        ref0, res = ref_files[0].get(rel), res_files.get(rel)
        if res is None:
            assert ref0 is not None
            if modified(ref0) <= saved_at or _names_step_up_to(rel, save_step):
                continue  # written with the save or before: the resumed run started after it
            files[rel] = {"status": "only-reference",
                          "summary": f"only the reference wrote {rel}"}
            _add(different, _file_component(rel), files[rel]["summary"], rel)
            continue
        if ref0 is None:
            files[rel] = {"status": "only-resumed",
                          "summary": f"only the resumed run wrote {rel}"}
            _add(different, _file_component(rel), files[rel]["summary"], rel)
            continue
        try:
            got = judge([f.get(rel) for f in ref_files], res, roots=roots,
                        controls=[f.get(rel) for f in ctl_files])
        except CkptkitError as e:
            files[rel] = {"status": "not-compared", "summary": str(e)}
            continue
        d = got.detail
        if got.skipped:
            files[rel] = {"status": "not-compared", "summary": str(d.get("reason", ""))}
            continue
        modes.add(str(d.get("mode", "bitwise")))
        comps = set(d.get("compared") or []) | set(d.get("different") or {})
        named = _named(rel, ref0, comps)
        diffs = _beyond_run_paths(d.get("different") or {})
        if got.ok or not diffs:
            files[rel] = {"status": "equal", "summary": f"equal ({d.get('mode', 'bitwise')})"}
            continue
        parts = {named(c): str(what.get("summary")) for c, what in diffs.items()}
        files[rel] = {"status": "different", "components": sorted(parts),
                      "summary": "; ".join(f"{c}: {w}" for c, w in parts.items())}
        for c, what in diffs.items():
            _add(different, named(c), f"{rel}: {what.get('summary')}", rel,
                 tensors=what.get("tensors") or [], values=what.get("values") or [])
    bad = [rel for rel, f in files.items() if f["status"] not in ("equal", "not-compared")]
    compared = [rel for rel, f in files.items() if f["status"] != "not-compared"]
    if not compared:
        unread = "; ".join(f"{rel}: {f['summary']}" for rel, f in files.items())
        return _skipped(
            "the runs wrote no checkpoint or tensor file besides the final checkpoint"
            + (f" that could be compared ({unread})" if unread else ""), files=files)
    mode = "bitwise" if modes <= {"bitwise"} else sorted(modes - {"bitwise"})[0]
    if bad:
        summary = (f"{len(bad)} of {len(compared)} artefacts differ: "
                   + "; ".join(f"{rel} ({files[rel]['summary']})" for rel in bad[:3]))
    else:
        summary = f"{len(compared)} artefacts equal ({mode})"
    return CheckResult(
        name=NAME,
        ok=not bad,
        statistic=len(bad),
        threshold=0,
        detail={
            "mode": mode,
            "files": files,
            "compared": compared,
            "different": different,
            "not_compared_state": [],
            "summary": summary,
            "seconds": round(time.perf_counter() - t0, 3),
        },
    )


def _beyond_run_paths(different: Mapping[str, Any]) -> dict[str, Any]:
    """The judge's differing components, less values that are only :data:`RUN_PATHS`."""
    kept: dict[str, Any] = {}
    for comp, what in different.items():
        values = [v for v in what.get("values") or [] if not RUN_PATHS.match(str(v.get("path")))]
        if what.get("tensors") or values or not what.get("values"):
            kept[comp] = what
    return kept


def _skipped(reason: str, *, files: Mapping[str, Any] | None = None) -> CheckResult:
    return CheckResult(NAME, True, None, 0, informational=True, skipped=True,
                       detail={"reason": reason, "files": dict(files or {}), "different": {}})


def _names_step_up_to(rel: str, step: int | None) -> bool:
    """Whether ``rel`` names a step up to ``step`` (``step-00000004``, ``ema_4.pt``)."""
    nums = re.findall(r"\d+", rel)
    return step is not None and bool(nums) and int(nums[-1]) <= step


def _file_component(rel: str) -> str:
    """A file's own name as the component it holds: ``export/ema.safetensors`` → ``ema``."""
    name = rel.rsplit("/", 1)[-1]
    for suffix in TENSOR_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] or name
    return name


def _named(rel: str, path: Path, comps: Collection[str]) -> Any:
    """How a component of artefact ``rel`` is named: its own name, except that a file
    holding one component only (a flat state dict, which the readers call ``model``) is
    named by the file (``ema.safetensors`` → ``ema``)."""
    whole = _file_component(rel) if path.is_file() and len(comps) <= 1 else None
    return lambda c: whole or c


def _add(
    different: dict[str, dict[str, Any]],
    comp: str,
    summary: str,
    rel: str,
    *,
    tensors: Sequence[Any] = (),
    values: Sequence[Any] = (),
) -> None:
    e = different.setdefault(comp, {"summary": "", "tensors": [], "values": [], "files": []})
    e["summary"] = f"{e['summary']}; {summary}" if e["summary"] else summary
    e["tensors"] = [*e["tensors"], *tensors][:20]
    e["values"] = [*e["values"], *values][:20]
    e["files"].append(rel)


__all__ = ["NAME", "TENSOR_SUFFIXES", "Judge", "compare_artefacts", "modified", "written"]
