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

from ckptkit.errors import StateError


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
            StateError: unknown or missing keys, non-integers, or impossible values.

        Example:
            >>> Progress.from_dict({"step": 5, "epoch": 0, "consumed_samples": 0,
            ...     "consumed_tokens": 0, "micro_step": 0, "accum_steps": 1}).step
            5
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown, missing = sorted(set(state) - set(names)), sorted(set(names) - set(state))
        if unknown or missing:
            raise StateError(
                f"progress state has unknown keys {unknown} and misses {missing}",
                hint="the snapshot is not a ckptkit progress record, or is from a newer version",
            )
        for name in names:
            value = state[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateError(
                    f"progress {name} must be a non-negative int, got {value!r}",
                    hint="the snapshot is corrupt",
                )
        progress = cls(**{name: int(state[name]) for name in names})
        problems = progress.validate()
        if problems:
            raise StateError(f"progress state is impossible: {'; '.join(problems)}")
        return progress

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
        StateError: the snapshot is malformed (see :meth:`Progress.from_dict`).

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


__all__ = ["Progress", "capture", "restore", "summary"]
