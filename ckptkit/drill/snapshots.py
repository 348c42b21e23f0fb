"""Where a drill finds the checkpoints its runs saved, and the private snapshots it restores from.

The reference's step-``W`` checkpoint, once committed, is taken as a snapshot (hard links)
into the drill's own directory (:func:`committed`); each run's final checkpoint is found in
place (:func:`final_checkpoint`), a ckptkit one or a framework's through its run layout.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.drill.config import DrillConfig
from ckptkit.drill.process import Running
from ckptkit.drill.report import RunResult
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.run import directory as runs
from ckptkit.storage import atomic, fs
from ckptkit.verify.foreign.adopted import adopted_path


def committed(
    config: DrillConfig,
    ref0: Running,
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
        shutil.copytree(found, dst, copy_function=link_or_copy)
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
    src = fs.require_local(max(hits, key=lambda c: c.status == "verified").path, needs="a drill")
    dst = workdir / "checkpoint" / src.name
    try:
        if dst.parent.exists():
            shutil.rmtree(dst.parent)
        dst.parent.mkdir(parents=True)
        if src.is_dir():
            shutil.copytree(src, dst, copy_function=link_or_copy)
        else:
            link_or_copy(str(src), str(dst))
            side = adopted_path(src)
            if side.is_file():
                link_or_copy(str(side), str(adopted_path(dst)))
    except (OSError, shutil.Error):
        shutil.rmtree(dst.parent, ignore_errors=True)
        return None  # caught mid-rotation or mid-write: look again at the next poll
    return dst


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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


def final_checkpoint(run: RunResult, stop_at: int) -> Path | None:
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
    return fs.require_local(max(hits, key=lambda c: c.status == "verified").path, needs="a drill")


__all__ = ["committed", "final_checkpoint", "find_checkpoint", "link_or_copy"]
