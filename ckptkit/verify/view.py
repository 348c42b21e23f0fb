"""What the state checks read: one view of a checkpoint's state, whichever reader made it.

A *reader* turns a checkpoint into a :class:`StateView`: the native reader from
``manifest.json`` (:class:`ckptkit.verify.checks._state.ManifestView`), the foreign readers
from a Trainer folder, a Lightning file, a DCP directory, a hand-rolled ``torch.save``
dict (:mod:`ckptkit.verify.foreign`). The completeness and consistency checks read only the view,
so one check (one NaN/Inf scan, one moment-shape rule, one "required component" rule)
judges every format with the same code and the same words.

A leaf module: it imports only the manifest's dataclasses and torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch

from ckptkit.format import manifest as mf

Expect = Literal["weights", "training"]
"""What a checkpoint is expected to be: model weights only, or a training resume point."""
EXPECTS: tuple[Expect, ...] = ("weights", "training")

TRAINING_REQUIRED: tuple[str, ...] = ("model", "optimizer", "progress")
"""Components a training checkpoint must hold whatever wrote it (spec §1, "always")."""

RESUME_STATE: tuple[str, ...] = mf.COMPONENTS[: mf.COMPONENTS.index("progress") + 1]
"""Components that are state a resume loads: the manifest's, in table order, up to
``progress`` (the rest describe the run)."""

How = Literal["recorded", "found", "inferred"]


@dataclass(frozen=True)
class Found:
    """Where a component was found, and how sure the reader is that it is that component.

    Example:
        >>> Found("inferred", ("ck.pt:trainer/opt",), "'state' and 'param_groups'").describe()
        "inferred from structure at ck.pt:trainer/opt ('state' and 'param_groups')"
    """

    how: How
    """``recorded`` (a ckptkit manifest says so), ``found`` (at a key or file the tool or
    the common conventions name for it, with content of the right shape) or ``inferred``
    (content of the right shape at a key whose name does not say so: a guess)."""
    at: tuple[str, ...]
    """The files or ``file:key/path`` locations."""
    evidence: str = ""
    """What in the content made the reader decide (for ``inferred``, always set)."""

    def describe(self) -> str:
        """``found at X`` or ``inferred from structure at X (evidence)``."""
        where = ", ".join(self.at[:3]) + (f" … (+{len(self.at) - 3})" if len(self.at) > 3 else "")
        if self.how == "recorded":
            return f"recorded in the manifest at {where}"
        if self.how == "found":
            return f"found at {where}"
        return f"inferred from structure at {where}" + (f" ({self.evidence})" if self.evidence else "")


# --- tensor values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NonFinite:
    """Non-finite values found in one tensor."""

    key: str
    nan: int
    posinf: int
    neginf: int

    @property
    def total(self) -> int:
        return self.nan + self.posinf + self.neginf

    def describe(self) -> str:
        parts = [
            f"{n} {what}"
            for n, what in ((self.nan, "NaN"), (self.posinf, "+Inf"), (self.neginf, "-Inf"))
            if n
        ]
        return f"'{self.key}' ({', '.join(parts)})"


def count_nonfinite(key: str, t: torch.Tensor) -> NonFinite | None:
    """Count NaN and ±Inf in a floating (or complex) tensor; None when all finite.

    The one NaN/Inf counter: the native scan of safetensors shards and every foreign reader
    call it.

    Example:
        >>> count_nonfinite("w", torch.tensor([1.0, float("nan"), float("-inf")])).describe()
        "'w' (1 NaN, 1 -Inf)"
    """
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return None
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        t = t.float()  # float8 and friends lack CPU kernels; widening is exact
    # One fused reduction first: NaN propagates into both, ±Inf shows up in min or max.
    lo, hi = torch.aminmax(t)
    if math.isfinite(float(lo)) and math.isfinite(float(hi)):
        return None
    return NonFinite(
        key=key,
        nan=int(torch.isnan(t).sum()),
        posinf=int(torch.isposinf(t).sum()),
        neginf=int(torch.isneginf(t).sum()),
    )


# --- optimizer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptParam:
    """One parameter an optimizer optimizes, as the checkpoint records it."""

    index: int | str
    """Its key in ``state_dict["state"]`` (an int, or a parameter name for FQN-keyed state)."""
    name: str
    """Parameter name (``'block.0.weight'``), or ``#i of group g`` when it is not known."""
    shape: tuple[int, ...] | None
    """The parameter's shape, None when the checkpoint does not say."""
    moments: Mapping[str, tuple[int, ...]] | None
    """Shape of each per-parameter state tensor (``exp_avg`` ...), None when it has no state."""


@dataclass(frozen=True)
class OptimizerView:
    """One optimizer's state as the checks see it."""

    kind: str | None
    """Class name (``AdamW``) when recorded, else None."""
    params: list[OptParam]
    groups: list[Mapping[str, Any]] = field(default_factory=list)
    """Param-group hyper-parameters (``lr``, ``betas``, ``momentum`` ...) as plain values."""
    flat: bool = False
    """Parameters are flat shards (FSDP / ZeRO): their shapes are not the model's."""
    matched_by_position: bool = False
    """Parameter names and shapes were matched to the model's tensors by position (the
    state dict names no parameter): a mismatch may also mean the match is off."""


# --- the view --------------------------------------------------------------------------------


class StateView(Protocol):
    """What a reader hands the state checks (see the module docstring)."""

    def components(self) -> Mapping[str, mf.Component]:
        """The spec §1 component table, with the expectation applied."""
        ...

    def found(self) -> Mapping[str, Found]:
        """Where each present component was found and how sure the reader is."""
        ...

    def expectation(self) -> tuple[Expect | None, str]:
        """``(expect, why)``: what the checkpoint is checked as, and why when inferred
        (``""`` when given by the caller or recorded at save time)."""
        ...

    def part(self, name: str) -> Any:
        """The component's raw state in the native tree form (tagged JSON), or None."""
        ...

    def optimizers(self) -> list[OptimizerView]:
        """Every optimizer whose per-parameter state can be read."""
        ...

    def model_shapes(self) -> Mapping[str, tuple[int, ...]]:
        """Shape of each model tensor, by state-dict name."""
        ...

    def model_names(self) -> Mapping[str, list[str]]:
        """Tensor key (as :class:`NonFinite` names it) → state-dict names holding it."""
        ...

    def trainable(self) -> frozenset[str]:
        """State-dict names of trainable parameters, when recorded (else empty)."""
        ...

    def nonfinite(self) -> Mapping[str, list[NonFinite]]:
        """Non-finite model and optimizer tensors, by component (``model``, ``optimizer``)."""
        ...


def apply_expect(
    components: Mapping[str, mf.Component], expect: Expect | None, *, why: str = ""
) -> dict[str, mf.Component]:
    """Return the table with ``required`` set by the expectation.

    ``weights``: only the model is required. ``training``: the model, the optimizer and
    the progress counters are required on top of what the table already requires (a
    reader's own requirements, a run's recorded ones). ``None``: unchanged.

    Example:
        >>> t = {"model": mf.Component("model", True, False),
        ...      "optimizer": mf.Component("optimizer", False, True)}
        >>> {n: c.required for n, c in apply_expect(t, "weights").items()}
        {'model': True, 'optimizer': False}
    """
    out = dict(components)
    if expect is None:
        return out
    label = f"a {expect} checkpoint" + (f", {why}" if why else "")
    for name, c in components.items():
        need = (name == "model") if expect == "weights" else (c.required or name in TRAINING_REQUIRED)
        if need == c.required:
            continue
        reason = c.reason or (f"expected in {label}" if need else None)
        out[name] = replace(c, required=need, reason=reason)
    return out


__all__ = [
    "EXPECTS",
    "RESUME_STATE",
    "TRAINING_REQUIRED",
    "Expect",
    "Found",
    "How",
    "NonFinite",
    "OptParam",
    "OptimizerView",
    "StateView",
    "apply_expect",
    "count_nonfinite",
]
