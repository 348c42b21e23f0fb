"""``ckptkit verify``: findings about a checkpoint's integrity, completeness and consistency."""

from ckptkit.verify.findings import CHECKS, CODES, Finding, Severity
from ckptkit.verify.runner import Report, VerifyResult, verify, verify_one

__all__ = ["CHECKS", "CODES", "Finding", "Report", "Severity", "VerifyResult", "verify", "verify_one"]
