"""Scrub: re-read a run's kept checkpoints from their bytes, and record what they hold now.

Bit rot happens between saves: a checkpoint verified when it was written can fail its
digests a week later, while the run index still says ``verified``. Listing trusts that
record (it checks file sizes, not bytes), so until something reads the bytes again
retention counts the rotted checkpoint among the good ones it keeps, ``latest`` names it
and ``ckptkit rollback`` picks it. A scrub reads every kept checkpoint again (or those of
``--since``), with the same verify as a save, and records each outcome in the run index
through the run's one recording path (:meth:`ckptkit.run.Run.scrub_one`: a verdict keyed
by the bytes it was made on, signed with the run's key). From then on ``ls`` lists the
rotted checkpoint ``corrupt`` with the finding, retention no longer counts it as good,
``latest`` moves off it, and rollback and restore pass over it.

The run lock: recording needs it. A scrub never holds it across the whole read (a
training run started meanwhile must not be refused for hours); it takes it for the moment
of each record, as ``ls --verify`` does. While a live writer (a training run) holds it,
the scrub still reads every byte and reports, but records nothing and says so: the writer
is the only one who may change the index, and it re-reads from bytes whatever it is about
to trust (the newest kept checkpoint before rotation deletes anything, every candidate
before a restore). Run the scrub again once the writer has stopped to record it, or
read the report.

Incomplete checkpoints (no commit marker) are never scrubbed: they are not checkpoints.
"""

from __future__ import annotations

import builtins
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ckptkit import codes
from ckptkit.checkpoint.catalog import CheckpointInfo, Status
from ckptkit.codes import Finding
from ckptkit.errors import CkptkitError
from ckptkit.run.core import Run
from ckptkit.run.registry import RunLike
from ckptkit.storage import fs, lock

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"\A([0-9]+(?:\.[0-9]+)?)([smhdw])\Z")


@dataclass(frozen=True)
class Since:
    """Which checkpoints a scrub reads: those of a step or later, or saved recently.

    Example:
        >>> Since.parse("5000"), Since.parse("36h").seconds
        (Since(step=5000, seconds=None), 129600.0)
    """

    step: int | None = None
    """Checkpoints of this step or later."""
    seconds: float | None = None
    """Checkpoints saved within this many seconds before the scrub began."""

    @classmethod
    def parse(cls, text: str) -> Since:
        """``5000`` (a step) or a duration: ``90m``, ``36h``, ``7d``, ``2w``.

        Raises:
            CkptkitError: neither (the message gives the forms).
        """
        t = text.strip().lower()
        if t.isascii() and t.isdigit() and len(t) <= 19:
            return cls(step=int(t))
        m = _DURATION.match(t)
        if m is None:
            raise CkptkitError(
                f"--since {text!r} is neither a step nor a duration",
                hint="give a step (--since 5000: that step and later) or a duration "
                "(--since 36h, 7d, 2w: checkpoints saved that recently)",
            )
        return cls(seconds=float(m.group(1)) * _UNITS[m.group(2)])

    def selects(self, info: CheckpointInfo, *, now: float) -> bool:
        """Whether ``info`` is one the scrub reads (a checkpoint whose save time is
        unknown is read: when in doubt, read the bytes)."""
        if self.step is not None:
            return info.step >= self.step
        if self.seconds is not None and info.time > 0:
            return info.time >= now - self.seconds
        return True


@dataclass(frozen=True)
class Scrubbed:
    """One checkpoint the scrub read."""

    name: str
    step: int
    before: Status
    """Its status as the run listed it before the scrub (what the index claimed)."""
    outcome: codes.Outcome
    """What its bytes say now."""
    errors: tuple[Finding, ...]
    """The error findings of this read (empty: verified)."""
    recorded: bool | None
    """The outcome is in the run index now; False: a live writer holds the lock (see the
    module docstring); None: a third-party run object that does not say."""

    @property
    def went_bad(self) -> bool:
        """It was listed verified, and its bytes fail now (bit rot since its last verify)."""
        return self.before == "verified" and self.outcome == "corrupt"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``ckptkit scrub --json``)."""
        return {
            "name": self.name,
            "step": self.step,
            "before": self.before,
            "outcome": self.outcome,
            "went_bad": self.went_bad,
            "recorded": self.recorded,
            "findings": [f.to_dict() for f in self.errors],
        }


@dataclass
class ScrubReport:
    """What a scrub read, found and recorded."""

    root: str
    layout: str
    checked: builtins.list[Scrubbed] = field(default_factory=list)
    skipped: builtins.list[str] = field(default_factory=list)
    """``"name: why"`` per checkpoint not read (incomplete, or outside ``--since``)."""
    not_recorded: str | None = None
    """Why outcomes were not recorded (a live writer holds the lock), None when all were."""
    latest: str | None = None
    """What ``latest`` names after the scrub (native runs)."""

    @property
    def ok(self) -> bool:
        """Every checkpoint read verified (exit 0)."""
        return all(c.outcome == "verified" for c in self.checked)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``ckptkit scrub --json``)."""
        return {
            "root": self.root,
            "layout": self.layout,
            "ok": self.ok,
            "checked": [c.to_dict() for c in self.checked],
            "skipped": self.skipped,
            "not_recorded": self.not_recorded,
            "latest": self.latest,
        }


def scrub(run: RunLike, *, since: Since | None = None) -> ScrubReport:
    """Re-verify the kept checkpoints of ``run`` from their bytes and record each outcome.

    Open ``run`` writable and lazy (:func:`ckptkit.run.directory.open_run` with ``readonly=False``)
    so that it records through the lock when the lock is free; see the module docstring
    for what happens while a live writer holds it.

    Args:
        run: the run (any layout).
        since: read only these checkpoints (default: all that are not incomplete).

    Example:
        >>> import tempfile, torch, ckptkit
        >>> from ckptkit.run.directory import open_run
        >>> d = tempfile.mkdtemp()
        >>> with ckptkit.CheckpointManager(d) as mgr:
        ...     _ = mgr.save(ckptkit.TrainState(model=torch.nn.Linear(2, 1), step=1))
        >>> rep = scrub(open_run(d, readonly=False))
        >>> [(c.name, c.outcome, c.recorded) for c in rep.checked], rep.latest
        ([('step-00000001', 'verified', True)], 'step-00000001')
    """
    now = time.time()
    report = ScrubReport(root=str(run.root), layout=run.layout)
    for c in sorted(run.checkpoints(), key=lambda c: c.step):
        name = c.path.name
        if c.status == "incomplete":
            report.skipped.append(f"{name}: incomplete (no commit marker): not a checkpoint")
            continue
        if since is not None and not since.selects(c, now=now):
            report.skipped.append(f"{name}: outside --since")
            continue
        if isinstance(run, Run):
            errors, outcome, recorded = run.scrub_one(c)
            rec: bool | None = recorded
        else:
            errors = run.reverify(c)
            outcome, rec = codes.outcome(f.code for f in errors), None
        report.checked.append(Scrubbed(name, c.step, c.status, outcome, tuple(errors), rec))
    if isinstance(run, Run):
        if any(c.recorded is False for c in report.checked):
            report.not_recorded = _why_not_recorded(run)
        report.latest = run.point_latest() if run.strategy.keeps_latest else None
        if report.latest is None and run.strategy.keeps_latest:
            report.latest = run.catalog.latest_name()
    return report


def _why_not_recorded(run: Run) -> str:
    """Who keeps this scrub from recording: the live writer named by the lock file."""
    if run.readonly:
        return "the run was opened read-only"
    local = fs.local_path(run.meta)
    holder = lock.read_lock_info(local) if local is not None else None
    who = holder.describe() if holder is not None else "another process"
    return (
        f"a live writer holds the run lock ({who}): the outcomes above were reported, not "
        "recorded; that writer re-reads from bytes what it is about to trust (before "
        "rotation deletes anything, before a restore); run 'ckptkit scrub' again once it "
        "has stopped to record them"
    )


__all__ = ["ScrubReport", "Scrubbed", "Since", "scrub"]
