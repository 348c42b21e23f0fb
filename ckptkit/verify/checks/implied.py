"""Completeness from content: components the checkpoint's own bytes imply, found absent.

:mod:`.completeness` judges a checkpoint against what is *required* of it (recorded by the
run, asked with ``--expect``, or what the writing tool needs). This module judges it
against what its *content* shows the run used: state that is only there because another
component existed. Such a component is absent without anyone having said it is required
(a plain ``torch.save`` dict, a hand-built ``TrainState`` that left it out), and a resume
then starts it over in silence.

A rule belongs here only when the saved bytes are the evidence, never a guess about how
people usually train:

* ``initial_lr`` in an optimizer's param groups. Every ``torch.optim.lr_scheduler``
  scheduler writes it into each group when it is attached (``LRScheduler.__init__``:
  ``group.setdefault("initial_lr", group["lr"])``; ``OneCycleLR`` sets it itself), and
  nothing else in torch does; a ``load_state_dict`` carries it along. Some schedulers
  leave a signature of their own beside it (``OneCycleLR``: ``max_lr`` and ``min_lr``;
  ``SWALR``: ``swa_lr``; ``CyclicLR`` with momentum cycling: ``base_momentum`` and
  ``max_momentum``), which names the scheduler in the finding.

Considered and left out, because the bytes do not show them: a loss scaler (fp32 master
weights under fp16 autocast look like any fp32 run; a ``GradScaler`` leaves nothing in
the optimizer), an EMA (its absence leaves no trace), FP8 scaling state (TransformerEngine
keeps it inside the model's ``_extra_state``, so it is never separately absent), a data
cursor (every training checkpoint without one is already ``CK-C002``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ckptkit import codes
from ckptkit.verify.checks import _state as st
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, Finding, check
from ckptkit.verify.view import OptimizerView

SCHEDULER_MARK = "initial_lr"
"""The param-group key every torch LR scheduler writes when it is attached."""

SCHEDULER_SIGNATURES: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"max_lr", "min_lr"}), "OneCycleLR"),
    (frozenset({"swa_lr"}), "SWALR"),
    (frozenset({"base_momentum", "max_momentum"}), "CyclicLR"),
)
"""Param-group keys that name the scheduler which wrote them, most specific first
(``OneCycleLR`` also writes the momentum pair, so it is matched before ``CyclicLR``)."""


@dataclass(frozen=True)
class Implied:
    """A component the content implies, and the evidence."""

    component: str
    """The spec §1 component the content implies (``scheduler``)."""
    what: str
    """What it is, as precisely as the bytes say (``a OneCycleLR``, ``an LR scheduler``)."""
    evidence: str
    """What in the content shows it (which keys, where)."""
    consequence: str
    """What a resume without it does."""
    detail: str = ""
    """Where the saved state stood, in numbers when the content gives them."""


def scheduler_evidence(opt: OptimizerView, *, index: int = 0, count: int = 1) -> Implied | None:
    """The scheduler an optimizer's param groups show was attached, or None.

    Example:
        >>> v = OptimizerView(kind="AdamW", params=[], groups=[
        ...     {"lr": 4e-4, "initial_lr": 1e-3, "max_lr": 1e-2, "min_lr": 1e-6}])
        >>> i = scheduler_evidence(v)
        >>> i.what, i.detail
        ('a OneCycleLR', 'group 0 is at lr 0.0004, the schedule started at 0.001')
    """
    marked = [(gi, g) for gi, g in enumerate(opt.groups) if SCHEDULER_MARK in g]
    if not marked:
        return None
    keys = set().union(*(set(g) for _, g in marked))
    name = next((n for sig, n in SCHEDULER_SIGNATURES if sig <= keys), None)
    what = f"a {name}" if name else "an LR scheduler"
    sig = next((s for s, n in SCHEDULER_SIGNATURES if n == name), frozenset())
    signed = f" and {', '.join(repr(k) for k in sorted(sig))}" if name else ""
    where = (opt.kind or "the optimizer") + (f" #{index}" if count > 1 else "")
    evidence = (
        f"{where}'s param groups carry {SCHEDULER_MARK!r}{signed} "
        f"({len(marked)} of {len(opt.groups)} group(s))"
    )
    return Implied(
        "scheduler", what, evidence, "a resume starts the schedule over", _moved(marked)
    )


def _moved(marked: list[tuple[int, Mapping[str, Any]]]) -> str:
    """Where the schedule had taken the LR: the first group whose lr left its start."""
    for gi, g in marked:
        lr, start = st.num(g.get("lr")), st.num(g.get(SCHEDULER_MARK))
        if lr is not None and start is not None and lr != start:
            return f"group {gi} is at lr {lr:g}, the schedule started at {start:g}"
    return ""


def implied(ctx: CheckContext) -> list[Implied]:
    """Every component the checkpoint's content implies, present or not (the one place
    these rules live; the check below reports the absent ones)."""
    opts = st.optimizers(ctx) or _plain_optimizer(ctx)
    out: list[Implied] = []
    for i, opt in enumerate(opts):
        found = scheduler_evidence(opt, index=i, count=len(opts))
        if found is not None:
            out.append(found)
            break  # one scheduler finding names the first optimizer that shows it
    return out


def _plain_optimizer(ctx: CheckContext) -> list[OptimizerView]:
    """The param groups of an optimizer state dict a plain native ``ckptkit.save`` holds
    (``{"optimizer": opt.state_dict(), ...}``): it records no optimizer summary, so the
    view reads no per-parameter state, but the groups are in the tree all the same."""
    if not st.present(ctx, "optimizer"):
        return []
    part = st.mapping(st.tree_part(ctx, "optimizer"))
    sd = st.mapping(part.get("state_dict")) or part
    groups = [st.mapping(g) for g in st.seq(sd.get("param_groups"))]
    return [OptimizerView(kind=None, params=[], groups=groups)] if groups else []


@check(codes.C020, needs=("state",))
def implied_missing(ctx: CheckContext) -> Iterator[Finding]:
    expect, _ = st.view(ctx).expectation()
    if expect == "weights":
        return  # asked to check the weights only: training state is not expected
    for imp in implied(ctx):
        c = st.component(ctx, imp.component)
        if c is not None and (c.present is True or c.required is True):
            continue  # present, or CK-C001 already reports it missing
        detail = f"; {imp.detail}" if imp.detail else ""
        yield CODES[codes.C020].finding(
            f"{imp.evidence}: the run that wrote it had {imp.what} attached, but the "
            f"checkpoint holds no {imp.component} state, so {imp.consequence}{detail}",
            component=imp.component,
        )


__all__ = [
    "SCHEDULER_MARK",
    "SCHEDULER_SIGNATURES",
    "Implied",
    "implied",
    "implied_missing",
    "scheduler_evidence",
]
