"""Training progress counters: step, epoch, consumed samples and tokens, accumulation position.

These decide where a resumed run starts counting; a wrong ``consumed_samples`` replays or
skips data even when the sampler is right, and a wrong ``micro_step`` applies a partial
gradient-accumulation window twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptkit.capture import INT64_MAX, is_int, refuse, show


@dataclass
class Progress:
    """Where the run is.

    Example:
        >>> p = Progress(step=10, consumed_samples=640)
        >>> Progress.from_dict(p.to_dict()) == p
        True
    """

    step: int = 0
    """Optimizer steps taken (global step)."""
    epoch: int = 0
    """Current epoch."""
    consumed_samples: int = 0
    """Samples consumed across all ranks since the run started."""
    consumed_tokens: int = 0
    """Tokens consumed across all ranks since the run started."""
    micro_step: int = 0
    """Micro-batches done inside the current accumulation window (0 at a step boundary)."""
    accum_steps: int = 1
    """Micro-batches per optimizer step."""

    def to_dict(self) -> dict[str, int]:
        """Return the counters as a plain dict.

        Example:
            >>> Progress(step=3).to_dict()["step"]
            3
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Progress:
        """Build a Progress from :meth:`to_dict` output, checking every field.

        Raises:
            StateError: ``CK-S013`` unknown or missing keys, non-integers, or impossible
                values (see :func:`problems`).

        Example:
            >>> Progress.from_dict({"step": 5, "epoch": 0, "consumed_samples": 0,
            ...     "consumed_tokens": 0, "micro_step": 0, "accum_steps": 1}).step
            5
        """
        refuse("progress", problems(state))
        return cls(**{f.name: int(state[f.name]) for f in dataclasses.fields(cls)})

    def validate(self) -> list[str]:
        """Return problems with the counters (empty when consistent).

        Example:
            >>> Progress(micro_step=4, accum_steps=4).validate()
            ['micro_step 4 is not below accum_steps 4']
        """
        problems = []
        if self.accum_steps < 1:
            problems.append(f"accum_steps {self.accum_steps} is below 1")
        elif self.micro_step >= self.accum_steps:
            problems.append(
                f"micro_step {self.micro_step} is not below accum_steps {self.accum_steps}"
            )
        return problems


def problems(state: Any) -> list[str]:
    """Return what in a snapshot :func:`restore` could not set as saved (empty: nothing).

    The six counters, no other key, each an integer from 0 to 2**63-1 (the range torch
    and every sampler can count in), and consistent (:meth:`Progress.validate`). Only the
    snapshot is read: this is the rule verify (CK-S013) and restore share.

    Example:
        >>> problems(capture(Progress(step=3)))
        []
        >>> problems({**capture(Progress()), "step": [], "epoch": -1})
        ['step is [], not a non-negative int', 'epoch is -1, not a non-negative int']
    """
    if not isinstance(state, Mapping):
        return [f"the snapshot is {show(state)}, not an object"]
    names = [f.name for f in dataclasses.fields(Progress)]
    unknown = sorted(k if isinstance(k, str) else show(k) for k in state if k not in names)
    missing = [n for n in names if n not in state]
    if unknown or missing:
        return [f"unknown keys {unknown} and missing {missing} (not a ckptkit progress record, "
                "or one from a newer version)"]
    out = [
        f"{name} is {show(state[name])}, not a non-negative int"
        for name in names
        if not is_int(state[name], hi=INT64_MAX)
    ]
    if not out:
        out = Progress(**{name: state[name] for name in names}).validate()
    return out


def capture(progress: Progress) -> dict[str, Any]:
    """Snapshot the progress counters.

    Args:
        progress: the run's :class:`Progress`.

    Returns:
        A dict of the six counters.

    Example:
        >>> capture(Progress(step=7))["step"]
        7
    """
    return progress.to_dict()


def restore(progress: Progress, state: Mapping[str, Any]) -> None:
    """Set ``progress`` in place from a snapshot.

    Args:
        progress: the object to update.
        state: a tree from :func:`capture`.

    Raises:
        StateError: ``CK-S013`` the snapshot is malformed (see :func:`problems`).

    Example:
        >>> p = Progress()
        >>> restore(p, capture(Progress(step=7)))
        >>> p.step
        7
    """
    loaded = Progress.from_dict(state)
    for field in dataclasses.fields(Progress):
        setattr(progress, field.name, getattr(loaded, field.name))


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the counters themselves (they are already small).

    Example:
        >>> summary(capture(Progress(step=2)))["step"]
        2
    """
    return dict(state)


__all__ = ["Progress", "capture", "problems", "restore", "summary"]
