"""Replica agreement: the replicas of a tensor held different bytes when it was saved.

The bytes of such a checkpoint are whole (the integrity checks pass them), but they are
one rank's copy of a state the ranks no longer agree on. The check made at save
(:mod:`ckptkit.checkpoint.replicas`) is recorded in the manifest's ``replicas`` field, signed with
the rest of the manifest; this check reports it, one finding per divergent tensor, so
``ckptkit verify`` exits 1 and the run records the checkpoint ``replica-divergent``
(:func:`ckptkit.codes.outcome`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ckptkit import codes
from ckptkit.codes import CODES, Finding
from ckptkit.format.records import Replicas
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import check


@check(codes.F120)
def replicas_disagree(ctx: CheckContext) -> Iterator[Finding]:
    rec = Replicas.of(ctx.manifest.replicas) if ctx.manifest is not None else None
    if rec is None or rec.agree:
        return
    for d in rec.divergent:
        head = d.key.split("/", 1)[0]
        yield CODES[codes.F120].finding(
            f"replicas disagreed at save: {d.describe()}",
            component=head if head in ("model", "optimizer") else "checkpoint",
        )
    if rec.more:
        yield CODES[codes.F120].finding(
            f"replicas disagreed at save on {rec.more} more tensor(s) than listed"
        )
