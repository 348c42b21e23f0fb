"""What verify returns: a :class:`Report` per checkpoint, a :class:`VerifyResult` per call.

A leaf module (it imports only the manifest and the code registry) so that every reader —
the native runner and the foreign-format readers — returns the same type without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptkit._repr import brief
from ckptkit.codes import Finding, Severity
from ckptkit.format import manifest as mf
from ckptkit.storage.fs import Location
from ckptkit.verify.view import Found


@dataclass
class Report:
    """Findings for one checkpoint directory."""

    path: Location
    findings: list[Finding]
    components: dict[str, mf.Component]
    manifest: mf.Manifest | None = None
    strict: bool = False
    files_checked: int = 0
    bytes_checked: int = 0
    seconds: float = 0.0
    format: str = "ckptkit"
    gone: bool = False
    """The checkpoint was deleted while it was checked (rotation of a live run)."""
    found: dict[str, Found] = field(default_factory=dict)
    """Where each present component was found and how surely (readers of foreign formats
    fill it: ``found`` at a conventional key or file, or ``inferred`` from structure)."""
    expect: str | None = None
    """What the checkpoint was checked as: ``weights`` or ``training`` (None: as recorded)."""
    expect_source: str | None = None
    """``given`` (``--expect``) or ``inferred`` (from what the checkpoint holds)."""
    expect_why: str = ""
    """Why, when inferred."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def ok(self) -> bool:
        """No error findings (``strict``: no warnings either)."""
        bad = {Severity.ERROR, Severity.WARNING} if self.strict else {Severity.ERROR}
        return not any(f.severity in bad for f in self.findings)

    @property
    def step(self) -> int | None:
        return self.manifest.step if self.manifest is not None else None

    def __repr__(self) -> str:
        return brief(
            "Report",
            path=self.path,
            ok=self.ok,
            step=self.step,
            format=self.format,
            findings=[f"{f.severity} {f.code}" for f in self.findings],
        )

    def raise_first(self) -> None:
        """Raise the exception matching the first error finding (what ``load`` would)."""
        errs = self.errors
        if errs:
            raise errs[0].to_error(base=str(self.path))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (schemas/verify-report.schema.json, ``$defs/report``)."""
        return {
            "path": str(self.path),
            "ok": self.ok,
            "format": self.format,
            "step": self.step,
            "files_checked": self.files_checked,
            "bytes_checked": self.bytes_checked,
            "seconds": round(self.seconds, 4),
            "findings": [f.to_dict() for f in self.findings],
            "components": {name: self._component(name, c) for name, c in self.components.items()},
            "expect": (
                {"as": self.expect, "source": self.expect_source, "why": self.expect_why}
                if self.expect is not None
                else None
            ),
        }

    def _component(self, name: str, c: mf.Component) -> dict[str, Any]:
        out: dict[str, Any] = {"present": c.present, "required": c.required, "where": list(c.where)}
        f = self.found.get(name)
        if f is not None and c.present:
            out["how"] = f.how
            out["found"] = f.describe()
            if f.evidence:
                out["evidence"] = f.evidence
        if c.reason and not c.present:
            out["reason"] = c.reason
        return out


@dataclass
class VerifyResult:
    """What :func:`verify` returns: one report per checkpoint found."""

    path: Location
    reports: list[Report] = field(default_factory=list)
    strict: bool = False

    @property
    def ok(self) -> bool:
        return bool(self.reports) and all(r.ok for r in self.reports)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.reports for f in r.findings]

    def __repr__(self) -> str:
        return brief(
            "VerifyResult",
            path=self.path,
            ok=self.ok,
            checkpoints=len(self.reports),
            failed=[r.path.name for r in self.reports if not r.ok],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "path": str(self.path),
            "strict": self.strict,
            "reports": [r.to_dict() for r in self.reports],
        }


def empty_components() -> dict[str, mf.Component]:
    """A component table with every spec §1 component absent and not required."""
    return {n: mf.Component(name=n, present=False, required=False) for n in mf.COMPONENTS}


__all__ = ["Report", "VerifyResult", "empty_components"]
