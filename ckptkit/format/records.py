"""Typed records that travel in manifests and run logs: health, look-ahead, recoveries, replicas.

Four records cross module boundaries as JSON: the stability watch's **health** (a
manifest's ``health``, read by the catalog, the layouts, rollback and recovery), the
**look-ahead** (a manifest's ``lookahead``: the resume guard's automatic part and the
user's own keys), the **recoveries** (a manifest's ``recoveries`` summary and each
record of the run's recoveries log) and the **replicas** check made at save (a manifest's
``replicas``, read by the catalog and verify). This module says what they are, in one place.

Each record is a frozen dataclass with ``to_dict()`` (the JSON written today, key for
key: the on-disk format does not change) and ``from_dict()``, which is tolerant: a field
of the wrong type reads as absent (None, or empty), keys this version does not know are
kept in ``extra`` and written back, so an old or hand-edited record never raises while
being read. ``of(obj)`` reads anything a manifest field can hold (None, a non-object)
and returns None when there is no record.

What a reader *acts on* is checked first, by one validator per record, the one verify
uses: :func:`recovery_problems` and :func:`recoveries_problems` for the recoveries
(``CK-S031``; verify reports them, restore skips such a checkpoint, the log reader leaves
such an entry out and names it); the manifest's JSON Schema for ``replicas`` (every
manifest read applies it); :func:`lookahead_problems` for the look-ahead
(``CK-S012``; verify, restore and the integrations' guards). A record that passes its validator never raises in a reader.

A format-layer module: it imports only the code registry, the number rule
(:mod:`ckptkit.format.numbers`: a look-ahead's number may be a 0-d tensor) and the tree's
tag, so every layer can read the records.

Example:
    >>> h = Health.of({"level": "warn", "signals": {"loss.z": {"detail": "spike"}}})
    >>> h.level, h.healthy, h.signal_names, Health.of(None)
    ('warn', False, ('loss.z',), None)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptkit import codes
from ckptkit.format.numbers import is_real
from ckptkit.format.tree import TAG

HealthLevel = Literal["ok", "not judged", "warn", "critical"]
"""A checkpoint's recorded health: the watch's level, or ``not judged`` (saved while the watch
could not judge the run yet: neither healthy nor unhealthy)."""
HEALTH_LEVELS: tuple[str, ...] = ("ok", "not judged", "warn", "critical")
"""Every health level, from healthiest to least healthy."""

_EMPTY: Mapping[str, Any] = {}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if isinstance(v, float) or abs(v) <= sys.float_info.max else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else _EMPTY


def _rest(d: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in known}


# --- health ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    """The stability watch's record of a run's health at a save (a manifest's ``health``).

    Written by :meth:`ckptkit.StabilityWatch.snapshot`; read by ``ckptkit ls``, rollback,
    ``restore(healthy=True)`` and automatic recovery.
    """

    level: str | None
    """``ok``, ``not judged``, ``warn`` or ``critical`` (:data:`HEALTH_LEVELS`); None when the
    record does not say."""
    not_judging: str | None = None
    """Why the watch could not judge yet (with level ``not judged``), else None."""
    step: int | None = None
    """The step of the watch's last verdict."""
    episode_start: int | None = None
    """The first step of the current warn/critical episode."""
    first_warn_step: int | None = None
    """The first step of the run the watch warned at."""
    signals: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each signal of the current episode: ``{level, statistic, threshold, detail}``."""
    window: Mapping[str, Any] = field(default_factory=dict)
    """Rolling statistics per tracked metric."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """The thresholds in effect."""
    time: float | None = None
    """Wall-clock time of the snapshot (seconds since the epoch)."""
    ranks: tuple[str | None, ...] | None = None
    """Every rank's level, when the record is the worst of several ranks' (else None)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept for the round trip."""

    _KNOWN = frozenset(
        {"level", "not_judging", "step", "episode_start", "first_warn_step", "signals",
         "window", "params", "time", "ranks"}
    )

    @property
    def healthy(self) -> bool:
        """Whether the record vouches for the run (level ``ok``; ``not judged`` does not)."""
        return self.level == "ok"

    @property
    def signal_names(self) -> tuple[str, ...]:
        """The names of the signals that fired, in record order."""
        return tuple(str(k) for k in self.signals)

    def detail(self, name: str) -> str:
        """The human line of signal ``name`` (empty when it has none).

        Example:
            >>> Health("warn", signals={"loss.z": {"detail": "spike"}}).detail("loss.z")
            'spike'
        """
        sig = self.signals.get(name)
        if isinstance(sig, Mapping):
            return str(sig.get("detail", ""))
        return "" if sig is None else str(sig)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Health:
        """Read a health record; a field of the wrong type reads as absent.

        Example:
            >>> Health.from_dict({"level": "ok", "step": "7", "new": 1})
            Health(level='ok', ..., extra={'new': 1})
        """
        ranks = d.get("ranks")
        sigs = _map(d.get("signals"))
        return cls(
            level=_str(d.get("level")),
            not_judging=_str(d.get("not_judging")),
            step=_int(d.get("step")),
            episode_start=_int(d.get("episode_start")),
            first_warn_step=_int(d.get("first_warn_step")),
            signals={str(k): (v if isinstance(v, Mapping) else {"detail": str(v)})
                     for k, v in sigs.items()},
            window=dict(_map(d.get("window"))),
            params=dict(_map(d.get("params"))),
            time=_num(d.get("time")),
            ranks=tuple(_str(r) for r in ranks) if isinstance(ranks, list | tuple) else None,
            extra=_rest(d, cls._KNOWN),
        )

    @classmethod
    def of(cls, obj: Any) -> Health | None:
        """Read whatever a manifest's ``health`` holds: None when it is not a record.

        Example:
            >>> Health.of({"level": "critical"}).level, Health.of("ok")
            ('critical', None)
        """
        return cls.from_dict(obj) if isinstance(obj, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able record, as the watch writes it into a manifest.

        Example:
            >>> Health("ok", step=3).to_dict()["step"]
            3
        """
        out: dict[str, Any] = {
            "level": self.level,
            "not_judging": self.not_judging,
            "step": self.step,
            "episode_start": self.episode_start,
            "first_warn_step": self.first_warn_step,
            "signals": {k: dict(v) for k, v in self.signals.items()},
            "window": dict(self.window),
            "params": dict(self.params),
            "time": self.time,
        }
        if self.ranks is not None:
            out["ranks"] = list(self.ranks)
        out.update(self.extra)
        return out


def health_level(obj: Any) -> str | None:
    """The level of whatever a manifest's ``health`` holds (None: no record, or no level).

    Example:
        >>> health_level({"level": "warn"}), health_level(None), health_level({"level": 3})
        ('warn', None, None)
    """
    h = Health.of(obj)
    return h.level if h is not None else None


# --- look-ahead --------------------------------------------------------------------------------

GUARD_KEY = "guard"
"""Key of the resume guard's automatic look-ahead inside a manifest's ``lookahead``."""


@dataclass(frozen=True)
class LookAhead:
    """What the run will do right after a checkpoint (a manifest's ``lookahead``).

    Two parts: the resume guard's automatic look-ahead (``guard``: next step, LR per group,
    loss scale, optimizer step, RNG fingerprint, next sample ids, ...; its keys and their
    types are listed, and checked before a restore, by :func:`lookahead_problems`), and the
    user's own keys (``mgr.save(ts, lookahead={...})``), which the drill compares.
    """

    guard: Mapping[str, Any] | None = None
    """The resume guard's automatic look-ahead; None when the checkpoint has none."""
    user: Mapping[str, Any] = field(default_factory=dict)
    """The user's own look-ahead keys."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LookAhead:
        """Read a look-ahead; a ``guard`` part that is not an object reads as absent.

        Example:
            >>> LookAhead.from_dict({"guard": {"next_step": 5}, "lr": 0.1})
            LookAhead(guard={'next_step': 5}, user={'lr': 0.1})
        """
        g = d.get(GUARD_KEY)
        return cls(
            guard=g if isinstance(g, Mapping) else None,
            user={k: v for k, v in d.items() if k != GUARD_KEY},
        )

    @classmethod
    def of(cls, obj: Any) -> LookAhead:
        """Read whatever a manifest's ``lookahead`` holds (an empty look-ahead when none).

        Example:
            >>> LookAhead.of(None)
            LookAhead(guard=None, user={})
        """
        return cls.from_dict(obj) if isinstance(obj, Mapping) else cls()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able look-ahead, as a manifest stores it.

        Example:
            >>> LookAhead({"k": 8}, {"lr": 0.1}).to_dict()
            {'lr': 0.1, 'guard': {'k': 8}}
        """
        out = dict(self.user)
        if self.guard is not None:
            out[GUARD_KEY] = dict(self.guard)
        return out


MAX_K = 1 << 16
"""The most next sample ids a look-ahead records (a larger ``guard_k`` checks this many):
a restore peeks that many, so a hostile ``k`` is refused instead of sizing an allocation."""


def _la_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _la_str(v: Any) -> bool:
    return isinstance(v, str)


def _la_k(v: Any) -> bool:
    return _la_int(v) and 0 <= v <= MAX_K


def _la_reals(v: Any) -> bool:
    return isinstance(v, list) and all(is_real(x) for x in v)


def _la_ints(v: Any) -> bool:
    return isinstance(v, list) and all(_la_int(x) for x in v)


def _la_mappings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, Mapping) for x in v)


_LOOKAHEAD_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "k": (_la_k, f"an integer from 0 to {MAX_K}"),
    "next_step": (_la_int, "an integer"),
    "rng": (_la_str, "a string"),
    "rng_v": (_la_int, "an integer"),
    "rng_gaps": (_la_mappings, "a list of objects"),
    "rng_at": (_la_str, "a string"),
    "lr": (_la_reals, "a list of finite numbers"),
    "opt_step": (_la_int, "an integer"),
    "sched_epoch": (_la_int, "an integer"),
    "loss_scale": (is_real, "a finite number"),
    "scale_growth": (_la_int, "an integer"),
    "scaler": (_la_str, "a string"),
    "sample_ids": (_la_ints, "a list of integers"),
    "epoch": (_la_int, "an integer"),
    "data_id": (_la_str, "a string"),
    "probe_loss": (is_real, "a finite number"),
    "cursor_ahead": (lambda v: isinstance(v, bool), "true or false"),
    "world_size": (_la_int, "an integer"),
}
"""Every look-ahead key the resume guard reads, with the type it reads it as
(:func:`ckptkit.checkpoint.lookahead.compute` writes exactly these)."""


def _plain_json(v: Any) -> bool:
    """A value the tree decoder returns as it is (not a tagged object such as a tensor)."""
    return not (isinstance(v, Mapping) and TAG in v)


def lookahead_problems(saved: Any, tree: Any) -> list[str]:
    """Return what the resume guard could not read in a checkpoint (empty: all of it).

    The guard compares the restored run with the checkpoint's look-ahead record
    (``saved``, the manifest's ``lookahead.guard``) and reads some values back from the
    restored objects (``tree``: the scheduler's ``last_epoch``, every optimizer group's
    ``lr``). Each of them is checked here, so that a checkpoint carrying a value of the
    wrong type is refused by verify and by restore alike (``CK-S012``) before anything is
    restored, instead of raising out of ``restore()`` once the live state was replaced.
    (The resume guard reads it as ``ckptkit.signals.guard.problems``.)

    Example:
        >>> lookahead_problems({"k": "three", "next_step": 4}, {})
        ["look-ahead 'k' is 'three', not an integer from 0 to 65536"]
    """
    out: list[str] = []
    if saved is not None:
        if not isinstance(saved, Mapping):
            return [f"look-ahead record is a {type(saved).__name__}, not an object"]
        for key, (ok, want) in _LOOKAHEAD_KEYS.items():
            if key in saved and not ok(saved[key]):
                out.append(f"look-ahead {key!r} is {_shown(saved[key])}, not {want}")
    parts = tree if isinstance(tree, Mapping) else {}
    sched = parts.get("scheduler")
    sd = sched.get("state_dict") if isinstance(sched, Mapping) else None
    if isinstance(sd, Mapping) and "last_epoch" in sd:
        v = sd["last_epoch"]
        if _plain_json(v) and not _la_int(v):
            out.append(f"scheduler last_epoch is {_shown(v)}, not an integer")
    opt = parts.get("optimizer")
    osd = opt.get("state_dict") if isinstance(opt, Mapping) else None
    groups = osd.get("param_groups") if isinstance(osd, Mapping) else None
    for i, g in enumerate(groups if isinstance(groups, list) else []):
        v = g.get("lr") if isinstance(g, Mapping) else None
        if isinstance(g, Mapping) and "lr" in g and _plain_json(v) and not is_real(v):
            out.append(f"optimizer param group {i} lr is {_shown(v)}, not a finite number")
    return out


# --- recoveries --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """One automatic recovery or refusal (a record of the run's recoveries log, and of a
    manifest's ``recoveries.history``), written by :mod:`ckptkit.signals.recovery`."""

    n: int | None
    """The recovery's number in the run (1, 2, ...)."""
    detected_at: int | None = None
    """The step the trigger was detected at."""
    trigger: Mapping[str, Any] = field(default_factory=dict)
    """What triggered it: ``{level, signals, first_warning_step, ...}``."""
    refused: str | None = None
    """Why a limit refused it (a refusal record), else None."""
    failed: str | None = None
    """Why it failed, else None."""
    restored: Mapping[str, Any] = field(default_factory=dict)
    """The checkpoint it restored: ``{checkpoint, step, ...}``."""
    actions: Mapping[str, Any] = field(default_factory=dict)
    """What it did: ``{lr, clip, skip, callback}``."""
    abandoned: tuple[Any, ...] = ()
    """Checkpoints set aside (saved after the restored one, from the unstable stretch)."""
    timing: Mapping[str, Any] = field(default_factory=dict)
    """How long it took (``detect_to_resume_s``, ...)."""
    time: float | None = None
    """Wall-clock time of the record."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys not named above (``policy``, ``steps_lost``, ...), kept for the round trip."""

    _KNOWN = frozenset(
        {"n", "detected_at", "trigger", "refused", "failed", "restored", "actions",
         "abandoned", "timing", "time"}
    )

    @property
    def outcome(self) -> Literal["recovered", "refused", "failed"]:
        """``refused``, ``failed`` or ``recovered``."""
        if self.refused is not None:
            return "refused"
        return "failed" if self.failed is not None else "recovered"

    @property
    def level(self) -> str | None:
        """The level of the trigger."""
        return _str(self.trigger.get("level"))

    @property
    def signal_names(self) -> tuple[str, ...]:
        """The names of the trigger's signals."""
        return tuple(str(k) for k in _map(self.trigger.get("signals")))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Recovery:
        """Read one record; a field of the wrong type reads as absent.

        Example:
            >>> r = Recovery.from_dict({"n": 1, "refused": "limit", "trigger": {"level": "warn"}})
            >>> r.outcome, r.level
            ('refused', 'warn')
        """
        ab = d.get("abandoned")
        return cls(
            n=_int(d.get("n")),
            detected_at=_int(d.get("detected_at")),
            trigger=dict(_map(d.get("trigger"))),
            refused=None if d.get("refused") is None else str(d["refused"]),
            failed=None if d.get("failed") is None else str(d["failed"]),
            restored=dict(_map(d.get("restored"))),
            actions=dict(_map(d.get("actions"))),
            abandoned=tuple(ab) if isinstance(ab, list | tuple) else (),
            timing=dict(_map(d.get("timing"))),
            time=_num(d.get("time")),
            extra=_rest(d, cls._KNOWN),
        )

    @classmethod
    def of(cls, obj: Any) -> Recovery | None:
        """Read whatever a log entry holds: None when it is not a record."""
        return cls.from_dict(obj) if isinstance(obj, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able record; fields the record did not have stay out.

        Example:
            >>> Recovery(1, detected_at=90, refused="limit").to_dict()
            {'n': 1, 'detected_at': 90, 'refused': 'limit'}
        """
        out: dict[str, Any] = {"n": self.n}
        optional: dict[str, Any] = {
            "detected_at": self.detected_at,
            "trigger": dict(self.trigger) or None,
            "refused": self.refused,
            "failed": self.failed,
            "restored": dict(self.restored) or None,
            "actions": dict(self.actions) or None,
            "abandoned": list(self.abandoned) or None,
            "timing": dict(self.timing) or None,
            "time": self.time,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Recoveries:
    """The recoveries in the history of a saved state (a manifest's ``recoveries``).

    A restore continues from it: the LR and clip-norm scales in effect, the records, and a
    data skip still due.
    """

    count: int
    """How many recoveries the history holds."""
    lr_scale: float = 1.0
    """The LR scale the recoveries left in effect."""
    clip_scale: float = 1.0
    """The clip-norm scale the recoveries left in effect."""
    history: tuple[Mapping[str, Any], ...] = ()
    """One compact record per recovery (read each with :meth:`Recovery.from_dict`)."""
    pending_skip: Mapping[str, Any] | None = None
    """A data skip still due at the save: ``{n, at_step, to}``, else None."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept for the round trip."""

    _KNOWN = frozenset({"count", "lr_scale", "clip_scale", "history", "pending_skip"})

    @property
    def records(self) -> tuple[Recovery, ...]:
        """The history as typed records."""
        return tuple(Recovery.from_dict(r) for r in self.history)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Recoveries:
        """Read the summary; scales that are not numbers read as 1 (no scaling).

        Example:
            >>> Recoveries.from_dict({"count": 1, "lr_scale": 0.5, "history": [{"n": 1}, 3]})
            Recoveries(count=1, lr_scale=0.5, clip_scale=1.0, history=({'n': 1},), ...)
        """
        hist = d.get("history")
        pend = d.get("pending_skip")
        lr, clip = _num(d.get("lr_scale")), _num(d.get("clip_scale"))
        return cls(
            count=_int(d.get("count")) or 0,
            lr_scale=1.0 if lr is None else lr,
            clip_scale=1.0 if clip is None else clip,
            history=tuple(r for r in hist if isinstance(r, Mapping))
            if isinstance(hist, list | tuple) else (),
            pending_skip=pend if isinstance(pend, Mapping) else None,
            extra=_rest(d, cls._KNOWN),
        )

    @classmethod
    def read(cls, obj: Any, *, path: object = None) -> Recoveries | None:
        """Read a manifest's ``recoveries`` to act on it: None when the run never recovered.

        Raises:
            StateError: ``CK-S031``, the record is malformed (:func:`recoveries_problems`).

        Example:
            >>> Recoveries.read({"count": 1, "lr_scale": 0.5, "clip_scale": 1.0,
            ...                  "history": [{"n": 1}]}).lr_scale
            0.5
            >>> Recoveries.read({"count": 1, "lr_scale": 0.5, "clip_scale": 1.0, "history": [],
            ...                  "pending_skip": {"n": 1}})
            Traceback (most recent call last):
            ...
            ckptkit.errors.StateError: CK-S031 ...: pending_skip: 'at_step' is missing...
        """
        if obj is None:
            return None
        found = recoveries_problems(obj)
        if found:
            raise codes.error(codes.S031, "the manifest's recoveries record is malformed: "
                              + "; ".join(found[:3]), path=path)
        return cls.from_dict(obj)

    @classmethod
    def of(cls, obj: Any) -> Recoveries | None:
        """Read whatever a manifest's ``recoveries`` holds: None when the run never recovered.

        Example:
            >>> Recoveries.of(None), Recoveries.of({"count": 2}).count
            (None, 2)
        """
        return cls.from_dict(obj) if isinstance(obj, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able summary, as a manifest stores it.

        Example:
            >>> Recoveries(1, 0.5, 1.0, ({"n": 1},)).to_dict()
            {'count': 1, 'lr_scale': 0.5, 'clip_scale': 1.0, 'history': [{'n': 1}]}
        """
        out: dict[str, Any] = {
            "count": self.count,
            "lr_scale": self.lr_scale,
            "clip_scale": self.clip_scale,
            "history": [dict(r) for r in self.history],
        }
        if self.pending_skip is not None:
            out["pending_skip"] = dict(self.pending_skip)
        out.update(self.extra)
        return out


# The one validator of each recoveries record: verify (CK-S031), restore, the log reader.


def recovery_problems(obj: Any) -> list[str]:
    """What makes ``obj`` a recovery record its readers cannot act on (empty: none).

    Each field a reader uses (:func:`ckptkit.signals.recovery_log.describe`, ``ckptkit ls``,
    automatic recovery's limits) must have its type; fields it does not know are free.

    Example:
        >>> recovery_problems({"n": 1, "restored": {"step": "5"}})
        ["restored: 'step' is '5', not an integer >= 0"]
        >>> recovery_problems({"n": 1, "detected_at": 90, "actions": {"lr": {"scale": 0.3}}})
        []
    """
    if not isinstance(obj, Mapping):
        return [f"a record is {_shown(obj)}, not an object"]
    out = _fields(obj, "", {"n": _INT, "detected_at": _INT, "time": _REAL, "refused": _STR,
                            "failed": _STR, "trigger": _MAP, "restored": _MAP,
                            "actions": _MAP, "abandoned": _LIST, "timing": _MAP})
    if out:
        return out
    if "n" not in obj:
        out.append("'n' is missing")
    trig, rest = _map(obj.get("trigger")), _map(obj.get("restored"))
    out += _fields(trig, "trigger: ", {"level": _STR, "signals": _MAP})
    out += _fields(rest, "restored: ", {"step": _INT, "checkpoint": _STR})
    acts = _map(obj.get("actions"))
    out += _fields(acts, "actions: ", {"lr": _MAP, "clip": _MAP, "skip": _MAP})
    for name in ("lr", "clip"):
        out += _fields(_map(acts.get(name)), f"actions.{name}: ",
                       {"factor": _REAL, "scale": _REAL, "applied": _BOOL})
    out += _fields(_map(acts.get("skip")), "actions.skip: ",
                   {"status": _STR, "from_step": _INT, "to_step": _INT, "at_step": _INT,
                    "samples": _INT})
    out += _fields(_map(obj.get("timing")), "timing: ", dict.fromkeys(
        ("detect_to_resume_s", "restore_s", "set_aside_s"), _REAL))
    return out


def recoveries_problems(obj: Any) -> list[str]:
    """What makes ``obj`` a manifest ``recoveries`` record a restore cannot continue from.

    Example:
        >>> recoveries_problems({"count": 1, "lr_scale": 0.0, "clip_scale": 1.0, "history": []})
        ["'lr_scale' is 0.0, not a number in (0, 1]"]
    """
    if not isinstance(obj, Mapping):
        return [f"the record is {_shown(obj)}, not an object"]
    out = _fields(obj, "", {"count": _INT, "history": _LIST, "pending_skip": _MAP})
    for key in ("count", "lr_scale", "clip_scale", "history"):
        if key not in obj:
            out.append(f"{key!r} is missing")
    if isinstance(obj.get("count"), int) and obj["count"] < 1:
        out.append(f"'count' is {obj['count']}, not at least 1")
    for key in ("lr_scale", "clip_scale"):
        v = obj.get(key, 1.0)
        if not (_REAL[0](v) and 0 < v <= 1):
            out.append(f"{key!r} is {_shown(v)}, not a number in (0, 1]")
    hist = obj.get("history")
    for i, rec in enumerate(hist if isinstance(hist, list | tuple) else ()):
        out += [f"history[{i}]: {p}" for p in recovery_problems(rec)]
    pend = obj.get("pending_skip")
    if isinstance(pend, Mapping):
        if "at_step" not in pend:
            out.append("pending_skip: 'at_step' is missing")
        out += _fields(pend, "pending_skip: ", {"n": _INT, "at_step": _INT, "to": _MAP})
        to = pend.get("to")
        if isinstance(to, Mapping) and not all(
            isinstance(k, str) and k.isdigit() for k in to
        ):
            out.append("pending_skip: 'to' is not a map of ranks to cursors")
    return out


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _real(v: Any) -> bool:
    """A finite number a reader can format and compute with (an int past every float is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return math.isfinite(v) if isinstance(v, float) else abs(v) <= sys.float_info.max


_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0")
_REAL = (_real, "a finite number")
_STR = (lambda v: isinstance(v, str), "a string")
_MAP = (lambda v: isinstance(v, Mapping), "an object")
_LIST = (lambda v: isinstance(v, list | tuple), "a list")
_BOOL = (lambda v: isinstance(v, bool), "true or false")


def _fields(d: Mapping[str, Any], where: str, kinds: Mapping[str, Any]) -> list[str]:
    """``where: 'key' is ..., not <kind>`` for each present, non-null field of the wrong kind."""
    return [
        f"{where}{k!r} is {_shown(d[k])}, not {want}"
        for k, (ok, want) in kinds.items()
        if d.get(k) is not None and not ok(d[k])
    ]


# --- replicas ----------------------------------------------------------------------------------

MAX_DIVERGENT = 100
"""Divergent tensors a manifest records at most (the rest are counted in ``more``)."""
ReplicaPolicy = Literal["raise", "warn"]
REPLICA_POLICIES: tuple[ReplicaPolicy, ...] = ("raise", "warn")
"""``CheckpointManager(on_divergence=...)``: what a save does when replicas disagree."""


@dataclass(frozen=True)
class Divergence:
    """One replicated tensor whose copies differ between ranks."""

    key: str
    """The tensor: its manifest key (``model/a.weight``) or, for DCP state, its
    fully-qualified name and the offsets of the shard the ranks share."""
    copies: Mapping[str, tuple[int, ...]]
    """Each distinct digest (xxh3-128 hex of the copy's bytes) -> the ranks holding it."""
    minority: tuple[int, ...] | None
    """The ranks outside the one copy most ranks hold; None when no copy is held by more
    ranks than every other (two replicas that differ: either may be the faulty one)."""

    def describe(self) -> str:
        """One line naming the tensor and the ranks.

        Example:
            >>> Divergence("model/w", {"aa": (0, 1, 3), "bb": (2,)}, (2,)).describe()
            'model/w: rank 2 differs from ranks 0, 1, 3'
            >>> Divergence("model/w", {"aa": (0,), "bb": (1,)}, None).describe()
            'model/w: ranks 0 | 1 hold different copies (no majority: any of them may be the faulty one)'
        """
        if self.minority is not None:
            rest = sorted(r for rs in self.copies.values() for r in rs if r not in self.minority)
            return f"{self.key}: {_ranks(self.minority)} differ{'s' if len(self.minority) == 1 else ''} from {_ranks(rest)}"
        sides = " | ".join(", ".join(str(r) for r in rs) for rs in sorted(self.copies.values()))
        return (
            f"{self.key}: ranks {sides} hold different copies (no majority: any of them may be "
            "the faulty one)"
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Divergence:
        copies = _map(d.get("copies"))
        minority = d.get("minority")
        return cls(
            key=str(d.get("key", "")),
            copies={
                str(k): tuple(int(r) for r in v if isinstance(r, int))
                for k, v in copies.items()
                if isinstance(v, list | tuple)
            },
            minority=tuple(int(r) for r in minority if isinstance(r, int))
            if isinstance(minority, list | tuple)
            else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "copies": {k: list(v) for k, v in sorted(self.copies.items())},
            "minority": list(self.minority) if self.minority is not None else None,
        }


def _ranks(rs: tuple[int, ...] | list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


@dataclass(frozen=True)
class Replicas:
    """The replica agreement check made at a save (a manifest's ``replicas``).

    Every rank hashed its copy of each replicated tensor; the digests were compared
    (:mod:`ckptkit.checkpoint.replicas`). Absent from a manifest when no check ran (one process, or a
    save the sampling ``replica_check_every`` skipped).

    Example:
        >>> r = Replicas.of({"ranks": 2, "groups": 1, "tensors": 4, "policy": "warn",
        ...                  "divergent": [{"key": "model/w", "copies": {"aa": [0], "bb": [1]},
        ...                                 "minority": None}]})
        >>> r.agree, r.divergent[0].key, Replicas.of(None)
        (False, 'model/w', None)
    """

    ranks: int
    """World size of the save."""
    groups: int
    """Sets of two or more ranks that hold the same replicated tensors (1 for DDP)."""
    tensors: int
    """Replicated tensors compared (counted once per group)."""
    policy: str = "raise"
    """The saver's ``on_divergence``."""
    divergent: tuple[Divergence, ...] = ()
    """The tensors whose copies differ (the first :data:`MAX_DIVERGENT`)."""
    more: int = 0
    """Divergent tensors beyond those listed."""

    @property
    def agree(self) -> bool:
        """Whether every compared copy matched."""
        return not self.divergent and not self.more

    def summary(self) -> str:
        """One line for ``ls`` and the findings: what differed, and on which ranks.

        Example:
            >>> Replicas(4, 1, 8).summary()
            'replicas agree: 8 tensor(s) on 4 ranks'
        """
        if self.agree:
            return f"replicas agree: {self.tensors} tensor(s) on {self.ranks} ranks"
        shown = "; ".join(d.describe() for d in self.divergent[:3])
        rest = len(self.divergent) - 3 + self.more
        return (
            f"replicas disagree at save: {shown}"
            + (f"; and {rest} more tensor(s)" if rest > 0 else "")
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Replicas:
        div = d.get("divergent")
        return cls(
            ranks=_int(d.get("ranks")) or 0,
            groups=_int(d.get("groups")) or 0,
            tensors=_int(d.get("tensors")) or 0,
            policy=_str(d.get("policy")) or "raise",
            divergent=tuple(Divergence.from_dict(x) for x in div if isinstance(x, Mapping))
            if isinstance(div, list | tuple)
            else (),
            more=_int(d.get("more")) or 0,
        )

    @classmethod
    def of(cls, obj: Any) -> Replicas | None:
        """Read whatever a manifest's ``replicas`` holds: None when no check ran."""
        return cls.from_dict(obj) if isinstance(obj, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ranks": self.ranks,
            "groups": self.groups,
            "tensors": self.tensors,
            "policy": self.policy,
            "divergent": [d.to_dict() for d in self.divergent],
        }
        if self.more:
            out["more"] = self.more
        return out


def replica_problem(obj: Any) -> str | None:
    """Why a manifest's ``replicas`` record makes its checkpoint ``replica-divergent``, or None.

    Example:
        >>> replica_problem(None), replica_problem({"ranks": 2, "groups": 1, "tensors": 3})
        (None, None)
    """
    rec = Replicas.of(obj)
    return None if rec is None or rec.agree else rec.summary()


__all__ = [
    "GUARD_KEY",
    "HEALTH_LEVELS",
    "MAX_DIVERGENT",
    "MAX_K",
    "REPLICA_POLICIES",
    "Divergence",
    "Health",
    "HealthLevel",
    "LookAhead",
    "Recoveries",
    "Recovery",
    "ReplicaPolicy",
    "Replicas",
    "health_level",
    "lookahead_problems",
    "recoveries_problems",
    "recovery_problems",
    "replica_problem",
]
