"""The run's recoveries log: every automatic recovery and refusal, for humans and tools.

:mod:`ckptkit.signals.recovery` writes it (rank 0, under the run lock); ``ckptkit ls`` and
``ckptkit rollback`` read it. A leaf module, so the catalog and the renderers can read the
log without importing the machinery that acts on a run.

Example:
    >>> import tempfile
    >>> list(iter_records(tempfile.mkdtemp()))
    []
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ckptkit import codes
from ckptkit.format.records import Recovery, recovery_problems
from ckptkit.storage import fs
from ckptkit.storage.fs import Location

log = logging.getLogger(__name__)
LOG = ".ckptkit-recoveries.json"
"""The run's recoveries log (every recovery and refusal), written by the lock holder."""
LOG_VERSION = 1


def read_log(root: str | Location, *, strict: bool = False) -> dict[str, Any]:
    """Read a run's recoveries log: ``{"version", "recoveries": [...], "refusals": [...]}``.

    Absent: empty lists. Unreadable: empty lists and a ``problem`` (``strict``: raise).
    Every entry is checked by :func:`ckptkit.format.records.recovery_problems` (the validator of
    ``CK-S031``): a malformed one is left out and named in ``problem`` (``strict``: raise),
    so every entry returned is one the readers can act on.

    Raises:
        RecoveryError: ``strict`` and the log exists but cannot be read, or holds a
            malformed entry (``CK-D011``).
        UnsafeInputError: ``CK-F022``, the log is a FIFO, directory, device or symlink
            (never opened: a FIFO would block ``ckptkit ls``), strict or not.

    Example:
        >>> import tempfile
        >>> read_log(tempfile.mkdtemp())["recoveries"]
        []
    """
    path = fs.location(root) / LOG
    empty: dict[str, Any] = {"version": LOG_VERSION, "recoveries": [], "refusals": []}
    try:
        raw = fs.read_small(path, 256 << 20)
    except FileNotFoundError:
        return empty
    except OSError as e:
        problem = f"cannot read {LOG}: {e}"
    else:
        try:
            data = json.loads(raw)
            if (
                isinstance(data, dict)
                and isinstance(data.get("recoveries"), list)
                and isinstance(data.get("refusals"), list)
            ):
                dropped = _drop_malformed(data)
                if dropped is None:
                    return data
                if not strict:
                    return {**data, "problem": dropped}
                problem = dropped
            else:
                problem = f"{LOG} is not a recoveries log"
        except (ValueError, RecursionError) as e:  # RecursionError: nested past the stack
            problem = f"{LOG} is not valid JSON: {e}"
    if strict:
        raise codes.error(codes.D011, problem, path=path)
    return {**empty, "problem": problem}


def _drop_malformed(data: dict[str, Any]) -> str | None:
    """Leave the malformed entries out of ``data``'s lists; say which (None: none was)."""
    found: list[str] = []
    for key in ("recoveries", "refusals"):
        kept = []
        for i, rec in enumerate(data[key]):
            why = recovery_problems(rec)
            if why:
                found.append(f"{key}[{i}]: {'; '.join(why[:3])}")
            else:
                kept.append(rec)
        data[key] = kept
    if not found:
        return None
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return f"{LOG} holds malformed entries, left out: {' | '.join(found[:3])}{more}"


def write_log(root: Location, data: Mapping[str, Any]) -> None:
    """Replace the run's recoveries log atomically (the caller holds the run lock)."""
    text = json.dumps({**data, "version": LOG_VERSION}, indent=1, allow_nan=False)
    fs.replace_bytes(root / LOG, text.encode())  # atomic: temp, fsync, rename (or one PUT)


def describe(record: Mapping[str, Any] | Recovery) -> str:
    """One line for humans: what triggered a recovery, what it restored and did.

    Example:
        >>> describe({"n": 1, "detected_at": 90, "trigger": {"level": "critical",
        ...   "signals": {"loss.nonfinite": {}}}, "restored": {"checkpoint": "step-00000050"},
        ...   "actions": {"lr": {"factor": 0.3, "scale": 0.3}, "skip": {"status": "none"}}})
        'recovery #1 at step 90 (critical: loss.nonfinite): restored step-00000050; LR x0.3'
    """
    if not isinstance(record, Recovery):
        why = recovery_problems(record)
        if why:
            return f"malformed recovery record ({why[0]})"
        record = Recovery.from_dict(record)
    r = record
    sigs = ", ".join(r.signal_names[:3]) or "no signal named"
    head = f"recovery #{r.n} at step {r.detected_at} ({r.level}: {sigs})"
    if r.refused is not None:
        return f"{head}: refused: {r.refused}"
    if r.failed is not None:
        return f"{head}: failed: {r.failed}"
    parts = [f"restored {r.restored.get('checkpoint')}"]
    acts = r.actions
    lr, clip, skip = (acts.get(k) or {} for k in ("lr", "clip", "skip"))
    done = []
    if lr.get("factor") is not None:
        done.append(f"LR x{_scale(lr)}" if lr.get("applied", True) else "LR unchanged")
    if clip.get("factor") is not None:
        done.append(f"clip norm x{_scale(clip)}")
    if skip.get("status") == "applied":
        done.append(
            f"skipped {skip.get('samples')} samples (steps {skip.get('from_step')}-"
            f"{skip.get('to_step')})"
        )
    elif skip.get("status") == "pending":
        done.append(f"skip of steps {skip.get('from_step')}-{skip.get('to_step')} due")
    if acts.get("callback"):
        done.append("callback")
    if r.abandoned:
        done.append(f"{len(r.abandoned)} checkpoint(s) set aside")
    t = r.timing.get("detect_to_resume_s")
    if t is not None:
        done.append(f"{t:.2f} s")
    return f"{head}: {'; '.join(parts + done)}"



def iter_records(root: str | Location) -> Iterator[dict[str, Any]]:
    """Every recovery and refusal of a run, in order (for ``ckptkit ls`` / ``rollback``);
    what cannot be read is named in a warning and left out."""
    data = read_log(root)
    if "problem" in data:
        log.warning("ckptkit: %s", data["problem"])
    yield from sorted(
        [*data["recoveries"], *data["refusals"]],
        key=lambda r: (r.get("time") or 0, r.get("n") or 0),
    )


__all__ = ["LOG", "LOG_VERSION", "describe", "iter_records", "read_log", "write_log"]


def _scale(action: Mapping[str, Any]) -> str:
    """An action's recorded scale for the text, ``?`` where the log holds no number there
    (a hand-edited or damaged log is described, never raised from).

    Example:
        >>> _scale({"scale": 0.3}), _scale({"scale": None}), _scale({})
        ('0.3', '?', '1')
    """
    v = action.get("scale", 1.0)
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else "?"
