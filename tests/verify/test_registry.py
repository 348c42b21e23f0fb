"""The code registry: every code documented, decorator self-validating, findings well-formed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptkit.verify import findings
from ckptkit.verify.runner import verify  # noqa: F401  (imports and registers all checks)

DOC = Path(__file__).resolve().parents[2] / "docs" / "verify-codes.md"


def _documented() -> set[str]:
    return set(re.findall(r"^### (CK-[A-Z]\d{3})$", DOC.read_text(), flags=re.M))


@pytest.mark.parametrize("code", sorted(findings.CODES))
def test_every_registered_code_is_documented(code: str) -> None:
    assert code in _documented(), f"{code} is registered but not documented in {DOC.name}"


def test_no_stale_docs() -> None:
    assert _documented() <= set(findings.CODES) | _drill_codes()


def _drill_codes() -> set[str]:
    return {c for c in _documented() if c.startswith("CK-D")}


def test_duplicate_code_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        findings.register_code("CK-F001", family="integrity", severity=findings.ERROR,
                               title="x", hint="y")


def test_family_prefix_enforced() -> None:
    with pytest.raises(ValueError, match="family 'consistency'"):
        findings.register_code("CK-F950", family="consistency", severity=findings.ERROR,
                               title="x", hint="y")
    assert "CK-F950" not in findings.CODES


def test_every_code_has_title_hint_and_error_class() -> None:
    for code in findings.CODES.values():
        assert code.title and code.hint
        assert issubclass(code.error_class, Exception)


def test_check_emitting_foreign_code_is_a_bug() -> None:
    chk = findings.Check(code=findings.CODES["CK-F001"],
                         fn=lambda ctx: [findings.CODES["CK-F002"].finding("x")])
    with pytest.raises(AssertionError, match="emitted CK-F002"):
        list(chk.run(None))  # type: ignore[arg-type]
