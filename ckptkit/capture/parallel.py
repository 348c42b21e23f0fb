"""The parallelism layout of a run: world size, DP/TP/PP/CP/EP degrees, ZeRO/FSDP, batch sizes.

World size 1 is a layout too, and it is recorded so a resume on 8 ranks from a 1-rank
checkpoint is a visible decision rather than an accident. Restoring a layout does not change
anything (the launcher decides the layout); :func:`restore` compares the saved layout with the
current one and refuses a silent change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ckptkit.errors import StateError

# Fields that are per process, not part of the run's layout.
_PER_RANK = ("rank",)


@dataclass(frozen=True)
class ParallelConfig:
    """How the run is split across processes.

    Example:
        >>> cfg = ParallelConfig(world_size=8, tp=2)
        >>> cfg.dp
        4
        >>> cfg.validate()
        []
    """

    world_size: int = 1
    """Number of processes."""
    dp: int | None = None
    """Data-parallel degree; defaults to ``world_size // (tp * pp * cp)``."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
    cp: int = 1
    """Context (sequence) parallel degree."""
    ep: int = 1
    """Expert-parallel degree (carved out of dp × cp)."""
    zero_stage: int = 0
    """ZeRO stage 0-3 (0: optimizer state not sharded)."""
    fsdp: bool = False
    """Whether parameters are sharded with FSDP."""
    rank: int = 0
    """This process's global rank."""
    global_batch_size: int | None = None
    """Samples per optimizer step across all ranks."""
    micro_batch_size: int | None = None
    """Samples per micro-batch per data-parallel rank."""

    def __post_init__(self) -> None:
        if self.dp is None:
            denom = self.tp * self.pp * self.cp
            # Leave dp unset when it cannot be derived; validate() then names the problem.
            if denom > 0 and self.world_size % denom == 0:
                object.__setattr__(self, "dp", self.world_size // denom)

    @classmethod
    def from_env(cls, **overrides: Any) -> ParallelConfig:
        """Read world size and rank from ``torch.distributed`` (1 and 0 when not initialised).

        Args:
            **overrides: any other field (``tp=2``, ``zero_stage=1``...).

        Example:
            >>> ParallelConfig.from_env(tp=1).world_size
            1
        """
        values: dict[str, Any] = {"world_size": 1, "rank": 0}
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            values = {"world_size": dist.get_world_size(), "rank": dist.get_rank()}
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Return all fields as a plain dict.

        Example:
            >>> ParallelConfig().to_dict()["dp"]
            1
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ParallelConfig:
        """Build a config from :meth:`to_dict` output.

        Raises:
            StateError: unknown keys.

        Example:
            >>> ParallelConfig.from_dict({"world_size": 4}).dp
            4
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(state) - names)
        if unknown:
            raise StateError(
                f"parallel config has unknown keys {unknown}",
                hint="the snapshot is from a newer ckptkit, or not a parallel config",
            )
        return cls(**dict(state))

    def validate(self) -> list[str]:
        """Return the layout's problems (empty when consistent).

        Example:
            >>> ParallelConfig(world_size=6, tp=4).validate()
            ['world_size 6 is not divisible by tp*pp*cp = 4']
        """
        problems: list[str] = []
        degrees = {
            "world_size": self.world_size,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
        }
        if self.dp is not None:
            degrees["dp"] = self.dp
        bad = [f"{k} {v} is below 1" for k, v in degrees.items() if v < 1]
        if bad:
            return bad
        denom = self.tp * self.pp * self.cp
        if self.dp is None:
            problems.append(f"world_size {self.world_size} is not divisible by tp*pp*cp = {denom}")
        elif self.dp * denom != self.world_size:
            problems.append(
                f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = {self.dp * denom} "
                f"!= world_size {self.world_size}"
            )
        if self.dp is not None and (self.dp * self.cp) % self.ep:
            problems.append(f"ep {self.ep} does not divide dp*cp = {self.dp * self.cp}")
        if not 0 <= self.rank < self.world_size:
            problems.append(f"rank {self.rank} is outside [0, {self.world_size})")
        if self.zero_stage not in (0, 1, 2, 3):
            problems.append(f"zero_stage {self.zero_stage} is not 0, 1, 2 or 3")
        if self.global_batch_size is not None and self.micro_batch_size is not None:
            per_step = self.micro_batch_size * (self.dp or 1)
            if per_step < 1 or self.global_batch_size % per_step:
                problems.append(
                    f"global_batch_size {self.global_batch_size} is not a multiple of "
                    f"micro_batch_size*dp = {per_step}"
                )
        return problems


def capture(config: ParallelConfig) -> dict[str, Any]:
    """Snapshot a layout.

    Example:
        >>> capture(ParallelConfig(world_size=2))["world_size"]
        2
    """
    return config.to_dict()


def diff(saved: Mapping[str, Any], current: ParallelConfig) -> list[str]:
    """List the layout fields that differ, ignoring the per-process ``rank``.

    Example:
        >>> diff(capture(ParallelConfig(world_size=2)), ParallelConfig(world_size=4))
        ['world_size: 2 -> 4', 'dp: 2 -> 4']
    """
    before = ParallelConfig.from_dict(saved).to_dict()
    after = current.to_dict()
    return [
        f"{key}: {before[key]} -> {after[key]}"
        for key in before
        if key not in _PER_RANK and before[key] != after[key]
    ]


def restore(
    current: ParallelConfig, state: Mapping[str, Any], *, allow_change: bool = False
) -> None:
    """Check the current layout against the saved one (a layout cannot be "set").

    Args:
        current: the layout of the resumed run.
        state: a tree from :func:`capture`.
        allow_change: accept a different layout (a deliberate resharding resume).

    Raises:
        StateError: the layouts differ and ``allow_change`` is False.

    Example:
        >>> restore(ParallelConfig(world_size=2, rank=1), capture(ParallelConfig(world_size=2)))
    """
    changes = diff(state, current)
    if changes and not allow_change:
        raise StateError(
            f"parallel layout changed since the checkpoint: {', '.join(changes)}",
            hint="launch with the saved layout, or pass allow_change=True if the resharded "
            "resume is intended (model/optimizer shards must then be resharded too)",
        )


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the layout plus its problems for the manifest.

    Example:
        >>> summary(capture(ParallelConfig()))["problems"]
        []
    """
    return {**dict(state), "problems": ParallelConfig.from_dict(state).validate()}


__all__ = ["ParallelConfig", "capture", "diff", "restore", "summary"]
