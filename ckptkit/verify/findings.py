"""Findings, severities and the one registry of finding codes and checks.

A *code* (``CK-F003``) is registered once, with its family, severity, title and
default fix; codes are never reused. A *check* is a small function registered with
:func:`check` that looks at a :class:`~ckptkit.verify.context.CheckContext` and
yields findings of its own code only. `ckptkit verify` runs every registered check
of the families asked for; ``load`` raises the error matching the first error
finding, with the same code.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ckptkit import errors

if TYPE_CHECKING:
    from ckptkit.verify.context import CheckContext

Family = Literal["integrity", "completeness", "consistency", "compat", "drill"]

# Which code prefixes each family may use (style.md: CK-M manifest, CK-F files, ...).
FAMILY_PREFIXES: dict[str, tuple[str, ...]] = {
    "integrity": ("CK-M", "CK-F"),
    "completeness": ("CK-C",),
    "consistency": ("CK-S",),
    "compat": ("CK-R",),
    "drill": ("CK-D",),
}
FAMILY_ORDER: tuple[str, ...] = ("integrity", "completeness", "consistency", "compat", "drill")


class Severity(enum.StrEnum):
    """How bad a finding is. Only ``error`` makes verify exit 1 (``--strict``: warnings too)."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


ERROR = Severity.ERROR
WARNING = Severity.WARNING
INFO = Severity.INFO


@dataclass(frozen=True)
class Finding:
    """One thing verify found.

    Example:
        >>> f = CODES["CK-F003"].finding("digest mismatch", path="model.safetensors")
        >>> f.severity
        <Severity.ERROR: 'error'>
    """

    code: str
    """Stable code, e.g. ``CK-F003``; documented in docs/verify-codes.md."""
    severity: Severity
    """error / warning / info."""
    component: str
    """Spec §1 component concerned (``model``, ``rng`` ...) or ``checkpoint``."""
    message: str
    """What is wrong, naming the file or key."""
    hint: str
    """How to fix it."""
    path: str | None = None
    """File concerned, relative to the checkpoint directory when inside it."""

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``verify --json`` (schemas/verify-report.schema.json)."""
        out: dict[str, Any] = {
            "code": self.code,
            "severity": str(self.severity),
            "component": self.component,
            "message": self.message,
            "hint": self.hint,
        }
        if self.path is not None:
            out["path"] = self.path
        return out

    def to_error(self, base: str | None = None) -> errors.CkptkitError:
        """Return the exception ``load`` raises for this finding (same code, path and hint)."""
        cls = CODES[self.code].error_class if self.code in CODES else errors.CkptkitError
        path = self.path if base is None or self.path is None else f"{base}/{self.path}"
        return cls(self.message, path=path, code=self.code, hint=self.hint)


@dataclass(frozen=True)
class Code:
    """A registered finding code: its family, severity, title and default fix."""

    code: str
    family: Family
    severity: Severity
    title: str
    hint: str
    component: str = "checkpoint"
    error_class: type[errors.CkptkitError] = errors.CkptkitError

    def finding(
        self,
        message: str,
        *,
        component: str | None = None,
        path: str | None = None,
        hint: str | None = None,
        severity: Severity | None = None,
    ) -> Finding:
        """Build a finding of this code; ``hint``/``component`` default to the registered ones."""
        return Finding(
            code=self.code,
            severity=severity or self.severity,
            component=component or self.component,
            message=message,
            hint=hint or self.hint,
            path=path,
        )


CODES: dict[str, Code] = {}
"""Every registered code, by code string."""


def register_code(
    code: str,
    *,
    family: Family,
    severity: Severity,
    title: str,
    hint: str,
    component: str = "checkpoint",
    error_class: type[errors.CkptkitError] | None = None,
) -> Code:
    """Register a finding code; raise at import time on a duplicate or a wrong family prefix.

    Example:
        >>> register_code("CK-X999", family="integrity", severity=ERROR, title="t", hint="h")
        Traceback (most recent call last):
        ...
        ValueError: CK-X999: family 'integrity' codes start with ('CK-M', 'CK-F')
    """
    if code in CODES:
        raise ValueError(f"{code}: finding code registered twice (codes are never reused)")
    prefixes = FAMILY_PREFIXES[family]
    if not code.startswith(prefixes):
        raise ValueError(f"{code}: family {family!r} codes start with {prefixes}")
    spec = Code(
        code=code,
        family=family,
        severity=severity,
        title=title,
        hint=hint,
        component=component,
        error_class=error_class or _default_error_class(code),
    )
    CODES[code] = spec
    return spec


def _default_error_class(code: str) -> type[errors.CkptkitError]:
    if code.startswith("CK-M"):
        return errors.ManifestError
    if code.startswith("CK-F"):
        return errors.IntegrityError
    if code.startswith("CK-C"):
        return errors.IncompleteCheckpointError
    if code.startswith(("CK-S", "CK-R")):
        return errors.StateError
    return errors.CkptkitError


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
                raise AssertionError(f"check {self.fn.__name__} emitted {f.code}, owns {self.code.code}")
            yield f


CHECKS: list[Check] = []
"""Every registered check, in registration (and run) order."""


def check(
    code: str,
    *,
    family: Family,
    severity: Severity,
    title: str,
    hint: str,
    component: str = "checkpoint",
    needs: Iterable[str] = ("manifest",),
    error_class: type[errors.CkptkitError] | None = None,
) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check owning ``code`` (registered here too).

    ``needs`` names what the context must hold for the check to run: ``manifest``
    (a schema-valid manifest was read) is the default; ``()`` runs always.

    Example:
        >>> @check("CK-F900", family="integrity", severity=ERROR, title="demo", hint="fix")
        ... def _demo(ctx):
        ...     return []
        >>> CODES.pop("CK-F900") and CHECKS.pop() and None
    """
    spec = register_code(
        code,
        family=family,
        severity=severity,
        title=title,
        hint=hint,
        component=component,
        error_class=error_class,
    )

    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(code=spec, fn=fn, needs=frozenset(needs)))
        return fn

    return deco
