"""``TrainingSession``: what watches a training run (recorder, probe, resume guard), handed to its ``TrainState``.

A :class:`~ckptkit.capture.state.TrainState` holds what a checkpoint saves and restores; the
session holds what watches the run instead: the recorder whose step records fill the
manifest's ``metrics``, the probe the look-ahead evaluates, the resume guard's settings, and
the guard a restore started. Their classes live in :mod:`ckptkit.signals`, a layer above this
one, so the fields are typed here by the Protocols below: each says what ckptkit calls on the
object, and :class:`ckptkit.Recorder` and :class:`ckptkit.signals.guard.ResumeGuard` satisfy
them (mypy checks it where they are passed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

DEFAULT_K = 8
"""Next sample ids a look-ahead records (and first steps the resume guard checks) unless the
session says otherwise."""

ProbeFn = Callable[[torch.nn.Module], Any]
"""A probe: ``probe(model)`` returns the loss of a fixed batch."""


class SessionRecorder(Protocol):
    """What a ``TrainState`` calls on its recorder (:class:`ckptkit.Recorder` is one).

    ``snapshot`` at every capture. A recorder that also has ``bind(state)`` is bound to the
    ``TrainState`` it is given to (a Recorder then fills its step records from the state);
    the save and restore paths read its ``observer`` and ``records`` where it has them.
    """

    def snapshot(self) -> Mapping[str, Any]:
        """Return the pre-save window, saved as the manifest's ``metrics`` component."""
        ...


class SessionGuard(Protocol):
    """The resume guard a restore started (:class:`~ckptkit.signals.guard.ResumeGuard` is one).

    A ``TrainState`` calls nothing on it; it keeps it for the run. An automatic recovery
    adjusts ``saved``, and the run reads ``findings`` and ``unknown``.
    """

    saved: Mapping[str, Any]
    """The look-ahead the resumed run is checked against (read from the manifest)."""

    @property
    def findings(self) -> Sequence[Any]:
        """The mismatches found so far (``CK-D`` and ``CK-R003`` findings)."""
        ...

    @property
    def unknown(self) -> Sequence[str]:
        """What the guard could not check, and why."""
        ...


@dataclass
class TrainingSession:
    """What watches one training run rather than what its checkpoints save.

    Give it to :class:`~ckptkit.TrainState` as ``session=``; ``TrainState(recorder=...,
    probe=..., guard_k=...)`` builds one from those keywords instead.

    Example:
        >>> import torch, ckptkit
        >>> from ckptkit.capture.session import TrainingSession
        >>> session = TrainingSession(recorder=ckptkit.Recorder(None), guard_k=4)
        >>> ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2), session=session)
        >>> ts.recorder is session.recorder, ts.guard_k, ts.guard
        (True, 4, None)
    """

    recorder: SessionRecorder | None = None
    """A :class:`~ckptkit.Recorder` whose pre-save window goes into the manifest; it is bound
    to the ``TrainState`` and fills its step records from it (RNG at step start, LR used,
    optimizer step, loss scale, batch hash, sample ids, cursor)."""
    probe: ProbeFn | None = None
    """``probe(model) -> loss`` on a fixed batch; run in eval mode without grad at every save
    and after every restore (resume guard: weights are what was saved)."""
    guard_k: int = DEFAULT_K
    """How many next sample ids and first steps the resume guard checks (0 turns it off)."""
    guard: SessionGuard | None = None
    """The resume guard of the last restore that started one (None before)."""

    def __post_init__(self) -> None:
        self.guard_k = int(self.guard_k)


def session_of(
    session: TrainingSession | None,
    *,
    recorder: SessionRecorder | None,
    probe: ProbeFn | None,
    guard_k: int | None,
) -> TrainingSession:
    """The session a ``TrainState`` is given: ``session``, or one built from the keywords.

    Raises:
        TypeError: ``session`` and any of the keywords are both given.

    Example:
        >>> session_of(None, recorder=None, probe=None, guard_k=None).guard_k
        8
        >>> session_of(TrainingSession(), recorder=None, probe=None, guard_k=0)
        Traceback (most recent call last):
        TypeError: TrainState takes session= or guard_k=, not both: pass guard_k to TrainingSession(guard_k=...) instead
    """
    given = {"recorder": recorder, "probe": probe, "guard_k": guard_k}
    if session is None:
        return TrainingSession(
            recorder=recorder,
            probe=probe,
            guard_k=DEFAULT_K if guard_k is None else guard_k,
        )
    both = [name for name, value in given.items() if value is not None]
    if both:
        names = "/".join(f"{n}=" for n in both)
        keys = ", ".join(f"{n}=..." for n in both)
        raise TypeError(
            f"TrainState takes session= or {names}, not both: pass "
            f"{' and '.join(both)} to TrainingSession({keys}) instead"
        )
    return session
