"""What a checkpoint holds, for ``ckptkit inspect``: read from the manifest, no tensor bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptkit import manifest as mf
from ckptkit.foreign.detect import detect
from ckptkit.foreign.report import describe_foreign
from ckptkit.storage.atomic import MANIFEST_NAME
from ckptkit.whatis import not_a_checkpoint


def describe(path: Path | str, *, format: str | None = None) -> dict[str, Any]:
    """Return a JSON-able description of a checkpoint: step, components, files, tensors.

    Only the manifest is read (and validated); use :func:`ckptkit.verify` to check bytes.
    A foreign checkpoint (no ``manifest.json``; detected, or named by ``format``) is
    described by :func:`ckptkit.foreign.report.describe_foreign`.

    Raises:
        IncompleteCheckpointError / ManifestError: as :func:`ckptkit.manifest.read`.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp() + "/c"
        >>> _ = ckptkit.save({"model": {"w": torch.ones(2, 3)}}, d, step=5)
        >>> info = describe(d); info["step"], info["tensors"][0]["shape"]
        (5, [2, 3])
    """
    if format is not None or (
        not (Path(path) / MANIFEST_NAME).exists() and detect(path) is not None
    ):
        return describe_foreign(path, format)
    wrong = not_a_checkpoint(path, foreign_ok=True)
    if wrong is not None:
        raise wrong
    m = mf.read(path)
    return {
        "path": str(path),
        "format": "ckptkit",
        "step": m.step,
        "created_at": m.created_at,
        "ckptkit_version": m.ckptkit_version,
        "schema_version": m.schema_version,
        "total_bytes": m.total_bytes,
        "components": {n: c.to_dict() for n, c in m.components.items()},
        "files": [f.to_dict() for f in m.files],
        "tensors": [{**t.to_dict(), "nbytes": t.nbytes} for t in m.tensors],
        "env": dict(m.env),
        "pins": list(m.pins),
        "health": dict(m.health) if m.health else None,
    }
