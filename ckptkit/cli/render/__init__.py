"""Renderers for verify reports: rich text, JSON, JUnit XML; chosen by name from a registry."""

from __future__ import annotations

from collections.abc import Callable

from ckptkit.cli.render import json as json_render
from ckptkit.cli.render import junit, text

Renderer = Callable[..., None]
"""``(result, out, **options)``: options a renderer does not take are not passed."""

RENDERERS: dict[str, Renderer] = {
    "text": text.render_verify,
    "json": json_render.render_verify,
    "junit": junit.render_verify,
}
"""Verify report renderers by name (``ckptkit verify`` picks text, ``--json`` or ``--junit``)."""

__all__ = ["RENDERERS", "Renderer"]
