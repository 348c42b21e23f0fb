"""Read what ``ckptkit adopt`` recorded beside a foreign checkpoint (a leaf of the package).

The adopted manifest (``ckptkit-manifest.json`` inside a checkpoint directory, or
``<file>.ckptkit-manifest.json`` beside a single-file checkpoint) is a valid ckptkit
manifest whose ``user.adopted`` holds the size and xxh3-128 of every file. Verify reads it
here; :mod:`ckptkit.verify.foreign.adopt` writes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ckptkit import codes
from ckptkit.checkpoint import manifest_io
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.verify.foreign.loads import needs_code_verdict
from ckptkit.verify.foreign.scan import ADOPTED_SUFFIX, Scan

_READOPT = "remove it, then " + codes.ADOPT


def adopted_path(target: Path) -> Path:
    """Where the adopted manifest of ``target`` lives.

    Example:
        >>> adopted_path(Path("/runs/last.ckpt")).name
        'last.ckpt.ckptkit-manifest.json'
    """
    if target.is_dir():
        return target / ADOPTED_SUFFIX
    return target.with_name(f"{target.name}.{ADOPTED_SUFFIX}")


def load_adopted(target: Path, *, key: bytes | None = None) -> mf.Manifest | None:
    """Return the adopted manifest of ``target`` (validated), or None when it has none.

    The one reader of adopted manifests (verify, the run layouts): it opens a regular file
    only, never following a symlink and never blocking (:func:`ckptkit.checkpoint.manifest_io.read_path`),
    so a FIFO named like an adopted manifest is refused, not waited on.

    With ``key``, it must be signed with that key (``CK-M010``/``CK-M011``, the
    findings of a native manifest that is not).

    Raises:
        CkptkitError: there is one, but it cannot be used: ``CK-M008`` (not a regular
            file, or unreadable; the fix says to remove it and adopt again) or the
            ``CK-M`` code of what makes it invalid.

    Example:
        >>> import tempfile, os
        >>> d = Path(tempfile.mkdtemp()); (d / "a.ckpt").touch()
        >>> load_adopted(d / "a.ckpt") is None
        True
        >>> os.mkfifo(adopted_path(d / "a.ckpt")); load_adopted(d / "a.ckpt")
        Traceback (most recent call last):
        ...
        ckptkit.errors.UnsafeInputError: CK-M008 a.ckpt.ckptkit-manifest.json: is a FIFO (named pipe)...
    """
    p = adopted_path(target)
    if not os.path.lexists(p):
        return None
    try:
        return manifest_io.read_path(p, key=key)
    except CkptkitError as e:
        if e.code == codes.M001:
            return None  # removed since we looked
        if e.code == codes.M008:
            raise type(e)(e.what, path=p.name, code=e.code, hint=_READOPT) from None
        raise


def read_adopted(s: Scan, *, key: bytes | None = None) -> dict[str, Any] | None:
    """Return ``user.adopted`` of the adopted manifest (validated, and with ``key`` signed
    with it), or None when absent.

    A manifest that fails validation (or is not a regular file) is reported as a finding
    on ``s`` (its CK-M code) and an empty record is returned.
    """
    return read_adopted_manifest(s, key=key)[0]


def read_adopted_manifest(
    s: Scan, *, key: bytes | None = None
) -> tuple[dict[str, Any] | None, mf.Manifest | None]:
    """:func:`read_adopted`, with the manifest it read (None unless it is valid): verify
    checks its other fields too (the look-ahead a DCP save or an integration recorded)."""
    rel = adopted_path(s.target).name
    try:
        m = load_adopted(s.target, key=key)
    except CkptkitError as e:
        s.add(e.code or codes.M002, f"adopted manifest: {e.what}", path=rel, hint=e.hint)
        return {}, None
    if m is None:
        return None, None
    try:
        mf.adopted_files(m, path=rel)  # the one check of the record (ckptkit.dcp's too)
    except CkptkitError as e:
        s.add(e.code or codes.M003, e.what, path=rel)
        return {}, None
    return dict((m.user or {})["adopted"]), m


def recorded_files(s: Scan, adopted: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The adopted file records, by path; reports files added since (CK-F006)."""
    recorded = {f["path"]: f for f in adopted.get("files", [])}
    rel_m = adopted_path(s.target).name
    for rel in s.files:
        if recorded and rel not in recorded:
            s.add(
                codes.F006,
                f"{rel} appeared after 'ckptkit adopt' ({rel_m} does not list it)",
                path=rel,
                hint="re-run 'ckptkit adopt' if the change is intended",
            )
    return recorded


def unverifiable(man: mf.Manifest) -> list[str]:
    """Files an adopted manifest records as needing code to unpickle (``adopt --force``).

    Adopt records a file there when its ``CK-F103`` was not info, i.e. when a resume of the
    layout loads it (:func:`ckptkit.verify.foreign.loads.needs_code_verdict`). The manifest was
    written with ``--force`` and cannot vouch for such a file: a run listing must not call
    the checkpoint verified.

    Example:
        >>> unverifiable(mf.Manifest(files=(), tensors=(), tree=None, components={},
        ...     env={}, user={"adopted": {"files": [], "unverifiable": ["x.pkl"]}}))
        ['x.pkl']
    """
    adopted = (man.user or {}).get("adopted")
    names = adopted.get("unverifiable") if isinstance(adopted, dict) else None
    if not isinstance(names, list):
        return []
    return sorted({n for n in names if isinstance(n, str)})


def needs_code_problem(names: list[str], fmt: str) -> str:
    """Why a checkpoint whose adopted manifest records ``names`` as needing code is not good.

    Example:
        >>> needs_code_problem(["custom_checkpoint_0.pkl"], "accelerate").endswith(
        ...     "resuming from this checkpoint would run that code")
        True
    """
    _sev, why = needs_code_verdict(fmt, names[0])
    more = f" (and {', '.join(names[1:3])})" if len(names) > 1 else ""
    return (
        f"{codes.F103}: {names[0]}{more} needs code to unpickle, or names globals off the "
        f"allow-list of the framework's load (recorded by 'ckptkit adopt --force'; not "
        f"executed): {why}"
    )


__all__ = [
    "adopted_path",
    "load_adopted",
    "needs_code_problem",
    "read_adopted",
    "recorded_files",
    "unverifiable",
]
