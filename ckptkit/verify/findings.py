"""The check registry: small functions, each owning one registered finding code.

Codes themselves (title, severity, fix, error class) are declared once in
:mod:`ckptkit.codes`; a check names the code it reports with :func:`check`, which
refuses at import time an unknown code or a code that already has a check. `ckptkit
verify` runs every registered check of the families asked for; ``load`` raises the error
matching the first error finding, with the same code.

The code-level names (``CODES``, ``Finding``, ``Severity`` ...) are re-exported here so a
check module imports what it needs from one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ckptkit.codes import (
    CODES,
    ERROR,
    FAMILY_ORDER,
    FAMILY_PREFIXES,
    INFO,
    WARNING,
    Code,
    Family,
    Finding,
    Severity,
    register_code,
)

if TYPE_CHECKING:
    from ckptkit.verify.context import CheckContext

CheckFn = Callable[["CheckContext"], Iterable[Finding]]


@dataclass(frozen=True)
class Check:
    """A registered check: the function and the code it reports."""

    code: Code
    fn: CheckFn
    needs: frozenset[str] = field(default_factory=frozenset)

    @property
    def family(self) -> Family:
        return self.code.family

    def run(self, ctx: CheckContext) -> Iterator[Finding]:
        """Run the check; refuse findings of a code other than its own (a programming error)."""
        for f in self.fn(ctx):
            if f.code != self.code.code:
                raise AssertionError(
                    f"check {self.fn.__name__} emitted {f.code}, owns {self.code.code}"
                )
            yield f


CHECKS: list[Check] = []
"""Every registered check, in registration (and run) order."""


def check(code: str, *, needs: Iterable[str] = ("manifest",)) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check owning ``code`` (declared in :mod:`ckptkit.codes`).

    ``needs`` names what the context must hold for the check to run: ``manifest``
    (a schema-valid manifest was read) is the default; ``()`` runs always.

    Raises:
        ValueError: at import time, when ``code`` is not declared or already has a check.

    Example:
        >>> @check("CK-X404")
        ... def _demo(ctx):
        ...     return []
        Traceback (most recent call last):
        ...
        ValueError: CK-X404: no such finding code; declare it in ckptkit/codes.py first
    """
    spec = CODES.get(code)
    if spec is None:
        raise ValueError(f"{code}: no such finding code; declare it in ckptkit/codes.py first")
    if any(c.code.code == code for c in CHECKS):
        raise ValueError(f"{code}: already has a check (one check owns one code)")

    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(code=spec, fn=fn, needs=frozenset(needs)))
        return fn

    return deco


def run_checks(ctx: CheckContext, families: Iterable[str]) -> list[Finding]:
    """Run every registered check of ``families`` whose ``needs`` the context meets.

    Families run in :data:`FAMILY_ORDER`, checks in registration order. The caller makes
    sure the checks are registered (``import ckptkit.verify.checks``).
    """
    fams = set(families)
    out: list[Finding] = []
    for fam in FAMILY_ORDER:
        if fam not in fams:
            continue
        for chk in CHECKS:
            if chk.family == fam and chk.needs <= ctx.has:
                out.extend(chk.run(ctx))
    return out


_SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Findings in report order: errors first, then by code registration order."""
    order = {code: i for i, code in enumerate(CODES)}
    return sorted(findings, key=lambda f: (_SEVERITY_ORDER[f.severity], order.get(f.code, 0)))


__all__ = [
    "CHECKS",
    "CODES",
    "ERROR",
    "FAMILY_ORDER",
    "FAMILY_PREFIXES",
    "INFO",
    "WARNING",
    "Check",
    "CheckFn",
    "Code",
    "Family",
    "Finding",
    "Severity",
    "check",
    "ordered",
    "register_code",
    "run_checks",
]
