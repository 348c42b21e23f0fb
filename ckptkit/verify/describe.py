"""What a checkpoint holds, for ``ckptkit inspect``: read from the manifest, no tensor bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.detect import detect
from ckptkit.checkpoint.whatis import not_a_checkpoint
from ckptkit.format import signing
from ckptkit.storage import fs
from ckptkit.storage.atomic import MANIFEST_NAME
from ckptkit.verify.foreign.report import describe_foreign


def describe(
    path: Path | str, *, format: str | None = None, key: signing.KeyLike | None = None
) -> dict[str, Any]:
    """Return a JSON-able description of a checkpoint: step, components, files, tensors.

    Only the manifest is read (and validated, once); use :func:`ckptkit.verify` to check
    bytes. A foreign checkpoint (no ``manifest.json``; detected, or named by ``format``)
    is described by :func:`ckptkit.verify.foreign.report.describe_foreign`.

    ``manifest_digest`` is what to pin to refuse a replayed older checkpoint (see
    docs/security.md); ``signature`` says whether the manifest is signed, by which key
    id, and whether that was checked (``"verified"``) or not (``"not checked"``).

    Args:
        path: the checkpoint directory.
        format: a foreign format name overriding detection.
        key: HMAC key the manifest must be signed with (default: ``CKPTKIT_HMAC_KEY`` /
            ``CKPTKIT_HMAC_KEY_FILE``, else none).

    Raises:
        IncompleteCheckpointError / ManifestError / SignatureError: as
            :func:`ckptkit.checkpoint.manifest_io.read`.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp() + "/c"
        >>> _ = ckptkit.save({"model": {"w": torch.ones(2, 3)}}, d, step=5)
        >>> info = describe(d); info["step"], info["tensors"][0]["shape"]
        (5, [2, 3])
    """
    loc = fs.location(path)
    local = fs.local_path(loc)  # foreign formats are read on a local filesystem only
    if format is not None or (
        local is not None
        and not os.path.lexists(local / MANIFEST_NAME)
        and detect(local) is not None
    ):
        return describe_foreign(fs.require_local(loc, needs="reading a foreign checkpoint"), format)
    wrong = not_a_checkpoint(path, foreign_ok=True)
    if wrong is not None:
        raise wrong
    k = signing.resolve_key(key)
    m = manifest_io.read(loc, key=k)
    sig = None
    if m.signature is not None:
        sig = {
            "alg": m.signature.alg,
            "key_id": m.signature.key_id,
            "status": "verified" if k is not None else "not checked",
        }
    return {
        "path": str(path),
        "format": "ckptkit",
        "step": m.step,
        "created_at": m.created_at,
        "ckptkit_version": m.ckptkit_version,
        "schema_version": m.schema_version,
        "manifest_digest": m.digest,
        "signature": sig,
        "total_bytes": m.total_bytes,
        "components": {n: c.to_dict() for n, c in m.components.items()},
        "files": [f.to_dict() for f in m.files],
        "tensors": [{**t.to_dict(), "nbytes": t.nbytes} for t in m.tensors],
        "env": dict(m.env),
        "pins": list(m.pins),
        "health": dict(m.health) if m.health else None,
    }
