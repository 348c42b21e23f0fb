"""JSON output (schemas/verify-report.schema.json)."""

from __future__ import annotations

import json
from typing import Any, TextIO


def render_verify(result: Any, out: TextIO) -> None:
    """Write a VerifyResult as JSON conforming to the verify-report schema."""
    json.dump(result.to_dict(), out, indent=2)
    out.write("\n")
