"""Per-step training metrics: a JSONL log plus the rolling pre-save window.

A :class:`Recorder` is the one thing a training script calls every step besides
``CheckpointManager``. It does two jobs:

* appends one JSON object per step to a JSONL file, which resume drills read back
  (reference vs resumed run) with :func:`read_jsonl`;
* keeps the last ``window`` records in memory; ``snapshot()`` is what the
  checkpoint manager stores in the manifest's ``metrics`` component, so a later
  resume can be compared with the steps just before the save.

File contract (used by ``ckptkit drill``): when ``path`` is None and the
environment variable ``CKPTKIT_METRICS`` is set, records go to that file, so the
drill can point each run at its own file without any code change. JSON has no NaN
or infinity, so non-finite floats are written as the strings ``"nan"``, ``"inf"``
and ``"-inf"``; :func:`read_jsonl` turns them back into floats.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, TYPE_CHECKING, Any

from ckptkit._jsonval import decode, decode_float, encode_float
from ckptkit.errors import CkptkitError
from ckptkit.signals import observe

if TYPE_CHECKING:
    from ckptkit.capture.state import TrainState
    from ckptkit.signals.observe import StepObserver

log = logging.getLogger(__name__)

ENV_METRICS = "CKPTKIT_METRICS"
"""Environment variable naming the metrics file when ``Recorder(path=None)``."""

# Keys written by the recorder itself; user scalars may not shadow them.
_RESERVED = frozenset({"step", "time"})
# Per-record fields that are lists, not scalars: no per-metric stats for them.
_LIST_FIELDS = frozenset({"seq_lens", "sample_ids", "guard"})


@dataclass(frozen=True)
class Logged:
    """One step record, as a :class:`Recorder` subscriber receives it.

    Both views are given because listeners differ in what they need: the stability watch
    scores the values the loop passed (tensors and numbers as they were), the resume guard
    checks the record as written, with the fields the observer filled.
    """

    step: int
    """The step of the record."""
    given: Mapping[str, Any]
    """The values the loop passed to :meth:`Recorder.log` (None values left out), unconverted."""
    record: Mapping[str, Any]
    """The record as written to the file (JSON values, automatic fields included)."""


Subscriber = Callable[[Logged], None]
"""What :meth:`Recorder.subscribe` takes: called once per record, after it is written."""


class Subscription:
    """The handle :meth:`Recorder.subscribe` returns; :meth:`remove` ends the subscription.

    Like a torch hook's ``RemovableHandle``: removing is idempotent, and removes only this
    subscription (never another listener's).
    """

    def __init__(self, recorder: Recorder, fn: Subscriber, key: str | None) -> None:
        self._recorder = recorder
        self.fn = fn
        """The subscriber."""
        self.key = key
        """The name it was subscribed under (see :meth:`Recorder.subscribe`), or None."""

    @property
    def active(self) -> bool:
        """Whether the recorder still calls this subscriber."""
        return self in self._recorder._subscriptions

    def remove(self) -> None:
        """Stop calling the subscriber; a second call does nothing.

        Example:
            >>> rec = Recorder(None)
            >>> sub = rec.subscribe(print)
            >>> sub.remove(); sub.remove(); sub.active
            False
        """
        subs = self._recorder._subscriptions
        if self in subs:
            subs.remove(self)


class Recorder:
    """Log per-step metrics to JSONL and keep a rolling window for checkpoints.

    Converting values calls ``.tolist()`` on tensors and numpy values, which for a
    CUDA tensor waits for the GPU (a device sync, like ``loss.item()``). Log values
    you already synced for, or log every few steps, if that matters.

    The file is opened in append mode, so a resumed run continues the same file (a
    partial last line left by a killed writer is ended first, so no record is glued on);
    records are flushed to the OS every ``flush_every`` steps (not fsynced: a killed
    process loses nothing flushed, a power cut may lose the tail). Use one Recorder
    per file (typically on rank 0 only).

    **Subscribers.** Anything that must hear about every step (the stability watch, the
    resume guard) subscribes with :meth:`subscribe`; nothing wraps or replaces :meth:`log`,
    so listeners are independent: removing one never removes another.

    **Records that fill themselves.** Attached to a :class:`~ckptkit.TrainState`
    (``TrainState(..., recorder=rec)``), the recorder watches the state's model, optimizer,
    scaler and sampler and adds to each record every field the loop did not log: the RNG
    fingerprint at the start of the step, the LR the optimizer used, its step count, the
    loss scale and growth tracker, a hash of the model inputs, the sample ids (with content
    hashes where the dataset has ``sample_hash``) and a fingerprint of the data cursor
    (:mod:`ckptkit.signals.observe`). So ``rec.log(step, loss=loss)`` is the one call a loop needs
    per step for a drill to check everything the step did. ``auto=False`` turns it off.

    Args:
        path: JSONL file to append to; None uses ``$CKPTKIT_METRICS`` if set,
            else keeps records in memory only.
        window: how many recent records ``snapshot()`` and ``window_stats()`` cover.
        flush_every: flush the file every this many records (1: every line).
        auto: fill step records from the attached TrainState (see above).

    Example:
        >>> rec = Recorder(None, window=4)
        >>> rec.log(1, loss=2.5, lr=1e-3)
        >>> rec.window_stats()["metrics"]["loss"]["last"]
        2.5
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        window: int = 512,
        flush_every: int = 1,
        auto: bool = True,
    ) -> None:
        if window < 1:
            raise ValueError(f"Recorder: window must be >= 1, got {window}")
        if flush_every < 1:
            raise ValueError(f"Recorder: flush_every must be >= 1, got {flush_every}")
        if path is None and os.environ.get(ENV_METRICS):
            path = os.environ[ENV_METRICS]
        self.path: Path | None = Path(path) if path is not None else None
        self.window = window
        self.flush_every = flush_every
        self.auto = bool(auto)
        self.observer: StepObserver | None = None
        """What fills the records; set when a TrainState binds this recorder."""
        self.records: deque[dict[str, Any]] = deque(maxlen=window)
        self._subscriptions: list[Subscription] = []
        self._pending = 0
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if _ends_torn(self.path):
                # A killed writer left a partial last line: end it, so the first record
                # appended now is a line of its own instead of glued onto the fragment
                # (the fragment is then one damaged line, skipped and counted by readers).
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write("\n")
            # Line buffering flushes each line; with flush_every > 1 we batch instead.
            self._file = open(  # noqa: SIM115 - closed in close()
                self.path, "a", encoding="utf-8", buffering=1 if flush_every == 1 else -1
            )

    def __del__(self) -> None:
        # A training script rarely closes its recorder; close quietly at collection
        # (like logging's handlers at exit) rather than emit a ResourceWarning.
        file = getattr(self, "_file", None)
        if file is not None and not file.closed:
            file.close()

    def bind(self, state: TrainState) -> None:
        """Watch ``state`` and fill every record with what it shows (``TrainState`` calls it).

        Example:
            >>> import torch, ckptkit
            >>> rec = Recorder(None)
            >>> _ = ckptkit.TrainState(model=torch.nn.Linear(1, 1), recorder=rec)
            >>> rec.observer is not None
            True
        """
        observe.bind(state, self)

    def subscribe(self, fn: Subscriber, *, key: str | None = None) -> Subscription:
        """Call ``fn(Logged)`` after every record is written, in subscription order.

        A subscriber that raises stops :meth:`log` (the record is already written); one
        that must never break training catches its own errors, as the resume guard does.

        Args:
            fn: the subscriber.
            key: a name for the role this subscriber plays (``"resume-guard"``): an earlier
                subscription under the same key is removed first, so a role has at most
                one subscriber (a second restore replaces the first restore's guard).

        Returns:
            The handle that removes this subscription.

        Example:
            >>> rec = Recorder(None)
            >>> seen = []
            >>> sub = rec.subscribe(lambda e: seen.append((e.step, e.given["loss"])))
            >>> rec.log(3, loss=0.5); sub.remove(); rec.log(4, loss=0.25)
            >>> seen
            [(3, 0.5)]
        """
        if key is not None:
            old = self.subscription(key)
            if old is not None:
                old.remove()
        sub = Subscription(self, fn, key)
        self._subscriptions.append(sub)
        return sub

    def subscription(self, key: str) -> Subscription | None:
        """The active subscription made under ``key``, or None.

        Example:
            >>> rec = Recorder(None)
            >>> _ = rec.subscribe(print, key="printer")
            >>> rec.subscription("printer").key, rec.subscription("other")
            ('printer', None)
        """
        return next((s for s in self._subscriptions if s.key == key), None)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def log(
        self,
        step: int,
        *,
        loss: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        loss_scale: Any = None,
        tokens: Any = None,
        seq_lens: Any = None,
        sample_ids: Any = None,
        **scalars: Any,
    ) -> None:
        """Record one training step; None values are left out of the record.

        Args:
            step: the global step this record describes (after the optimizer step).
            loss: training loss (tensor, numpy or Python number).
            grad_norm: total gradient norm before clipping.
            lr: learning rate used for this step.
            loss_scale: AMP loss scale (a decrease marks an fp16 skipped step).
            tokens: tokens processed this step (for throughput).
            seq_lens: sequence lengths of the batch (for length-bucket counts).
            sample_ids: ids of the samples in the batch (for the drill's exposure check).
            **scalars: any other JSON-able values (numbers, strings, bools, lists).

        Raises:
            TypeError: a value cannot be written as JSON.
            ValueError: a scalar uses a reserved name (``step``, ``time``).

        Example:
            >>> rec = Recorder(None)
            >>> rec.log(7, loss=float("nan"), seq_lens=[3, 100])
            >>> rec.records[-1]["loss"], rec.records[-1]["seq_lens"]
            ('nan', [3, 100])
        """
        clash = _RESERVED & scalars.keys()
        if clash:
            raise ValueError(f"Recorder.log: {sorted(clash)} are reserved record keys")
        rec: dict[str, Any] = {"step": int(step), "time": time.time()}
        named = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "loss_scale": loss_scale,
            "tokens": tokens,
            "seq_lens": seq_lens,
            "sample_ids": sample_ids,
        }
        given = {k: v for k, v in (*named.items(), *scalars.items()) if v is not None}
        fields = dict(given)
        if self.observer is not None:
            fields.update(self.observer.finish(given))
        for key, value in fields.items():
            rec[key] = _jsonable(value, key)
        self.records.append(rec)
        if self._file is not None:
            self._file.write(json.dumps(rec, allow_nan=False, separators=(",", ":")) + "\n")
            self._pending += 1
            if self._pending >= self.flush_every:
                self.flush()
        if self._subscriptions:
            # Read-only views: the window and the file must not change under a listener.
            event = Logged(rec["step"], MappingProxyType(given), MappingProxyType(rec))
            # A copy: a subscriber that removes itself (or another) must not skip the next.
            for sub in list(self._subscriptions):
                if sub.active:
                    sub.fn(event)

    def flush(self) -> None:
        """Flush buffered lines to the OS.

        Example:
            >>> Recorder(None).flush()
        """
        if self._file is not None:
            self._file.flush()
        self._pending = 0

    def close(self) -> None:
        """Flush and close the file; the in-memory window stays readable. Idempotent.

        Example:
            >>> Recorder(None).close()
        """
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None

    def window_stats(self) -> dict[str, Any]:
        """Summarize the rolling window.

        Returns:
            ``{"count", "first_step", "last_step", "metrics", "length_buckets",
            "fp16_skipped_steps", "throughput"}``. ``metrics`` maps each numeric
            metric to ``{count, nonfinite, last, median, mad, mean, min, max}`` over its
            finite values (``mad`` is the unscaled median absolute deviation; x1.4826
            estimates a normal sigma). ``length_buckets`` maps a power of two ``b`` (as
            a string) to how many sequences had length in ``[b, 2b)`` (``"0"``: empty).
            ``fp16_skipped_steps`` counts records whose ``loss_scale`` fell below the
            previous one (GradScaler backs off exactly when it skips a step).
            ``throughput`` is tokens per second between consecutive records, or None.
            Non-finite numbers appear as ``"nan"``/``"inf"`` strings, as in the file.

        Example:
            >>> rec = Recorder(None)
            >>> for s, scale in enumerate([8.0, 4.0, 4.0]):
            ...     rec.log(s, loss_scale=scale, seq_lens=[5, 6, 64])
            >>> st = rec.window_stats()
            >>> st["fp16_skipped_steps"], st["length_buckets"]
            (1, {'4': 6, '64': 3})
        """
        recs = list(self.records)
        values: dict[str, list[float]] = {}
        for r in recs:
            for key, v in r.items():
                if key in _RESERVED or key in _LIST_FIELDS:
                    continue
                f = decode_float(v)
                if f is not None:
                    values.setdefault(key, []).append(f)
        metrics = {key: _summary(vs) for key, vs in sorted(values.items())}

        buckets: dict[int, int] = {}
        for r in recs:
            for n in _flat(r.get("seq_lens", ())):
                if isinstance(n, int | float) and not isinstance(n, bool) and n >= 0:
                    b = 0 if n < 1 else 1 << (int(n).bit_length() - 1)
                    buckets[b] = buckets.get(b, 0) + 1

        skipped = 0
        prev_scale: float | None = None
        for r in recs:
            scale = decode_float(r.get("loss_scale"))
            if scale is None or math.isnan(scale):
                continue
            if prev_scale is not None and scale < prev_scale:
                skipped += 1
            prev_scale = scale

        rates: list[float] = []
        for before, cur in itertools.pairwise(recs):
            tok = decode_float(cur.get("tokens"))
            dt = cur["time"] - before["time"]
            if tok is not None and math.isfinite(tok) and dt > 0:
                rates.append(tok / dt)

        return _sanitize(
            {
                "count": len(recs),
                "first_step": recs[0]["step"] if recs else None,
                "last_step": recs[-1]["step"] if recs else None,
                "metrics": metrics,
                "length_buckets": {str(b): n for b, n in sorted(buckets.items())},
                "fp16_skipped_steps": skipped,
                "throughput": _summary(rates) if rates else None,
            }
        )

    def snapshot(self) -> dict[str, Any]:
        """Return the JSON-able pre-save window for the manifest's ``metrics`` component.

        Example:
            >>> rec = Recorder(None, window=2)
            >>> for s in range(5):
            ...     rec.log(s, loss=1.0 / (s + 1))
            >>> snap = rec.snapshot()
            >>> [r["step"] for r in snap["records"]], snap["window"]
            ([3, 4], 2)
        """
        return {
            "window": self.window,
            "records": copy.deepcopy(list(self.records)),  # the manifest must not alias the window
            "stats": self.window_stats(),
        }


def parse_line(line: str | bytes, *, decode_nonfinite: bool = True) -> dict[str, Any] | None:
    """Parse one line of a Recorder JSONL file; None when the line is damaged.

    The one damaged-line policy shared by :func:`read_jsonl` and
    :class:`ckptkit.cli.watch.JsonlFollower`: a line is a record when it is a JSON object;
    anything else (a torn fragment of a killed writer, two records glued together,
    non-object JSON, bytes that are not UTF-8) is damaged. Blank lines are neither:
    callers skip them before parsing.

    Example:
        >>> parse_line('{"step":3,"loss":"inf"}'), parse_line('{"step":3,"lo'), parse_line("[1]")
        ({'step': 3, 'loss': inf}, None, None)
    """
    try:
        rec = json.loads(line)
    except ValueError:  # includes JSONDecodeError and UnicodeDecodeError
        return None
    if not isinstance(rec, dict):
        return None
    return decode(rec) if decode_nonfinite else rec


def read_jsonl(
    path: str | os.PathLike[str], *, decode_nonfinite: bool = True, strict: bool = False
) -> list[dict[str, Any]]:
    """Read a Recorder JSONL file, skipping damaged lines.

    A process killed mid-write leaves a partial last line; a Recorder that later appends
    to the file first ends that fragment with a newline, so it can also sit mid-file. A
    damaged line (see :func:`parse_line`) is skipped and counted, as the live follower
    of ``ckptkit watch`` does; the count is logged as a warning (an incomplete last line
    is expected and not warned about).

    Args:
        path: the JSONL file.
        decode_nonfinite: turn the strings ``"nan"``, ``"inf"``, ``"-inf"`` back into floats.
        strict: raise on a damaged line other than an incomplete last one instead.

    Returns:
        One dict per complete record, in file order.

    Raises:
        CkptkitError: ``strict`` and a line other than the incomplete last is damaged.
        FileNotFoundError: the file does not exist.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "m.jsonl"
        >>> _ = p.write_text('{"step":1,"loss":"nan"}\\n{"step":2,"lo')
        >>> read_jsonl(p)
        [{'step': 1, 'loss': nan}]
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    out: list[dict[str, Any]] = []
    bad: list[int] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        rec = parse_line(line, decode_nonfinite=decode_nonfinite)
        if rec is None:
            if i == len(lines) - 1:
                break  # truncated tail of a killed writer (no trailing newline)
            if strict:
                raise CkptkitError(
                    f"line {i + 1} is not a JSON record",
                    path=path,
                    hint="the metrics file is damaged in the middle; truncate it before "
                    "this line (or read it with strict=False to skip damaged lines)",
                )
            bad.append(i + 1)
            continue
        out.append(rec)
    if bad:
        log.warning(
            "ckptkit: %s: skipped %d damaged line(s) (first: line %d)", path, len(bad), bad[0]
        )
    return out


def _ends_torn(path: Path) -> bool:
    """Whether ``path`` exists, is not empty and does not end with a newline."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except OSError:  # missing, or not seekable (a pipe): nothing to repair
        return False


# ---------------------------------------------------------------- helpers


def _jsonable(value: Any, key: str) -> Any:
    """Convert tensors/numpy to Python, non-finite floats to strings; reject the rest."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()  # torch.Tensor, np.ndarray, np.generic; syncs a CUDA tensor
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return encode_float(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, key) for k, v in value.items()}
    raise TypeError(
        f"Recorder.log: {key}={value!r} ({type(value).__name__}) cannot be written as JSON; "
        "pass a number, string, list, tensor or numpy value"
    )


def _sanitize(obj: Any) -> Any:
    return _jsonable(obj, "stats")


def _summary(vs: list[float]) -> dict[str, Any]:
    finite = [v for v in vs if math.isfinite(v)]
    out: dict[str, Any] = {"count": len(vs), "nonfinite": len(vs) - len(finite), "last": vs[-1]}
    if finite:
        med = statistics.median(finite)
        out |= {
            "median": med,
            "mad": statistics.median(abs(v - med) for v in finite),
            "mean": math.fsum(finite) / len(finite),
            "min": min(finite),
            "max": max(finite),
        }
    else:
        out |= dict.fromkeys(("median", "mad", "mean", "min", "max"))
    return out


def _flat(v: Any) -> Iterable[Any]:
    if isinstance(v, list | tuple):
        for x in v:
            yield from _flat(x)
    else:
        yield v


__all__ = [
    "ENV_METRICS",
    "Logged",
    "Recorder",
    "Subscriber",
    "Subscription",
    "parse_line",
    "read_jsonl",
]
