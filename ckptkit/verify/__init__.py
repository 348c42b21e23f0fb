"""``ckptkit verify``: findings about a checkpoint's integrity, completeness and consistency.

The package re-exports only its vocabulary (:mod:`.findings`): every module that imports
a verify submodule runs this file first, and the foreign readers below the checks
(:mod:`ckptkit.verify.foreign`) use that vocabulary. The entry points, :func:`ckptkit.verify`
and :func:`.runner.verify_one`, sit at the top of the package and import those readers,
so they are imported from :mod:`.runner` (or from ``ckptkit``), never re-exported here:
that would close a cycle (``docs/architecture.md``).
"""

from ckptkit.verify.findings import CHECKS, CODES, Finding, Severity

__all__ = ["CHECKS", "CODES", "Finding", "Severity"]
