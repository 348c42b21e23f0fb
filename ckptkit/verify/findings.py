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
    "register_code",
]
