"""JUnit XML output, one testcase per check outcome, for CI dashboards."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, TextIO


def _fails(severity: Any, strict: bool) -> bool:
    """The rule of ``VerifyResult.ok``: errors fail; with ``strict`` warnings fail too."""
    return str(severity) == "error" or (strict and str(severity) == "warning")


def render_verify(result: Any, out: TextIO) -> None:
    """Write a VerifyResult as JUnit XML: one testsuite per checkpoint, one case per finding.

    A finding is a ``<failure>`` exactly when it makes ``verify`` exit 1: an error, or
    with ``result.strict`` (``--strict``) also a warning.
    """
    strict = bool(getattr(result, "strict", False))
    suites = ET.Element("testsuites", name="ckptkit verify")
    for rep in result.reports:
        cases = rep.findings or []
        strict_rep = strict or bool(getattr(rep, "strict", False))
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=str(rep.path),
            tests=str(max(1, len(cases))),
            failures=str(len([f for f in cases if _fails(f.severity, strict_rep)])),
        )
        if not cases:
            ET.SubElement(suite, "testcase", classname="verify", name="all checks")
        for f in cases:
            case = ET.SubElement(suite, "testcase", classname=f.component, name=f"{f.code} {f.path or ''}".strip())
            if _fails(f.severity, strict_rep):
                fail = ET.SubElement(case, "failure", message=f.message, type=f.code)
                fail.text = f"{f.severity}: {f.message}\nFix: {f.hint}"
            else:
                ET.SubElement(case, "system-out").text = f"{f.severity}: {f.message}\nFix: {f.hint}"
    out.write(ET.tostring(suites, encoding="unicode"))
    out.write("\n")
