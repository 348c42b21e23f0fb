"""``ckptkit adopt``: write a ckptkit manifest beside a foreign checkpoint.

The manifest (``ckptkit-manifest.json`` inside a checkpoint directory, or
``<file>.ckptkit-manifest.json`` beside a single-file checkpoint) is a valid ckptkit
manifest: its ``manifest_digest`` covers everything, its component table is the one verify
detected, and ``user.adopted`` records the foreign format, what is missing and the xxh3-128
digest and size of every file. Foreign names (``epoch=0-step=2.ckpt``, ``.metadata``) fall
outside the native ``files[].path`` grammar, so the digests live in ``user.adopted.files``
and the native ``files`` list stays empty: the foreign directory is never taken for a
native checkpoint. The original files are never modified.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from ckptkit import manifest as mf
from ckptkit.errors import CkptkitError, IntegrityError, UnsafeInputError
from ckptkit.foreign._scan import ADOPTED_SUFFIX, Scan
from ckptkit.foreign.read import scan
from ckptkit.storage import digest
from ckptkit.storage.atomic import fsync_dir
from ckptkit.verify.findings import ERROR

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def adopted_path(target: Path) -> Path:
    """Where the adopted manifest of ``target`` lives.

    Example:
        >>> adopted_path(Path("/runs/last.ckpt")).name
        'last.ckpt.ckptkit-manifest.json'
    """
    if target.is_dir():
        return target / ADOPTED_SUFFIX
    return target.with_name(f"{target.name}.{ADOPTED_SUFFIX}")


def adopt(path: Path | str, fmt: str | None = None, *, force: bool = False) -> Path:
    """Record digests and the component table of a foreign checkpoint; return the manifest path.

    Every file is hashed and the checkpoint verified first: a checkpoint with integrity
    errors (CRC, truncation, missing shard) is refused unless ``force``, so that a
    damaged state is not blessed as the reference.

    Args:
        path: a foreign checkpoint (directory or file).
        fmt: its format; detected when None.
        force: adopt even with integrity errors.

    Raises:
        IntegrityError: the checkpoint has integrity errors (and not ``force``).
        CkptkitError: the layout is not recognised.

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ck.pt"
        >>> torch.save({"model": {"w": torch.ones(2)}}, p)
        >>> adopt(p).name
        'ck.pt.ckptkit-manifest.json'
    """
    s = scan(path, fmt)
    bad = [
        f for f in s.findings if f.severity is ERROR and f.code.startswith(("CK-F", "CK-M", "CK-S"))
    ]
    if bad and not force:
        first = bad[0]
        raise IntegrityError(
            f"refusing to adopt a damaged checkpoint: {first.message}"
            + (f" ({len(bad) - 1} more)" if len(bad) > 1 else ""),
            path=s.root / first.path if first.path else s.target,
            code=first.code,
            hint="restore the damaged files first, or pass --force to record them as they are",
        )
    files = []
    for rel in s.files:
        hexd, size = digest.hash_file(s.path(rel))
        files.append({"path": rel, "size": size, "xxh3_128": hexd})
    import torch

    m = mf.Manifest(
        files=(),
        tensors=(),
        tree=None,
        components={n: c for n, c in s.components.items()},
        env={"torch": torch.__version__, "python": platform.python_version()},
        step=s.step,
        user={
            "adopted": {
                "format": s.format,
                "target": s.target.name,
                "files": files,
                "missing": sorted(
                    n for n, c in s.components.items() if c.required and not c.present
                ),
                "findings": sorted({f.code for f in s.findings}),
            }
        },
    )
    out = adopted_path(s.target)
    text = m.to_json()
    mf.Manifest.from_json(text, path=str(out))  # what we write must read back
    _write_atomic(out, text)
    return out


def _write_atomic(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` through a uniquely named sibling, fsync, rename, fsync dir.

    A unique temporary name lets concurrent adopts of one checkpoint race safely: each
    writes its own file and the last rename wins with a complete manifest.
    """
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # not every filesystem can fsync a directory
        fsync_dir(out.parent)


def read_adopted(s: Scan) -> dict[str, Any] | None:
    """Return ``user.adopted`` of the adopted manifest (validated), or None when absent.

    A manifest that fails validation is reported as a finding on ``s`` (its CK-M code)
    and an empty record is returned.
    """
    p = adopted_path(s.target)
    if not os.path.lexists(p):
        return None
    rel = p.name
    try:
        # The same reader as native manifests: a regular file only (never a symlink or a
        # FIFO, CK-M008), size-capped, strict JSON, validated once.
        m = mf.read_path(p)
    except CkptkitError as e:
        s.add(e.code or "CK-M002", f"adopted manifest: {e.what}", path=rel, hint=e.hint)
        return {}
    adopted = (m.user or {}).get("adopted")
    if not isinstance(adopted, dict) or not isinstance(adopted.get("files"), list):
        s.add("CK-M003", "adopted manifest has no user.adopted.files record", path=rel)
        return {}
    for f in adopted["files"]:
        ok = (
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("size"), int)
            and isinstance(f.get("xxh3_128"), str)
            and _HEX32.match(f["xxh3_128"])
        )
        if not ok:
            s.add(
                "CK-M003", f"adopted manifest has a malformed file entry: {str(f)[:120]}", path=rel
            )
            return {}
        pp = PurePosixPath(f["path"])
        if pp.is_absolute() or ".." in pp.parts or not f["path"]:
            s.add(
                "CK-M005", f"adopted manifest path {f['path']!r} escapes the checkpoint", path=rel
            )
            return {}
    return adopted


def check_adopted(s: Scan) -> bool | None:
    """Compare every file with the adopted digests; None when nothing was adopted.

    Reuses the native codes: CK-F001 (recorded file missing), CK-F002 (size), CK-F003
    (digest: corruption or drift), CK-F006 (file added since adopt).
    """
    adopted = read_adopted(s)
    if adopted is None:
        return None
    recorded = {f["path"]: f for f in adopted.get("files", [])}
    rel_m = adopted_path(s.target).name
    for rel, f in sorted(recorded.items()):
        if rel not in s.files:
            s.add("CK-F001", f"{rel} was recorded by 'ckptkit adopt' but is missing", path=rel)
            continue
        p = s.path(rel)
        if p.is_symlink() or not p.resolve().is_relative_to(s.root.resolve()):
            s.add("CK-F009", "resolves outside the checkpoint: not read", path=rel)
            continue
        size = p.stat().st_size
        if size != f["size"]:
            s.add("CK-F002", f"size {size} differs from the adopted {f['size']} bytes", path=rel)
            continue
        try:
            hexd, _ = digest.hash_file(p)
        except UnsafeInputError as e:  # a FIFO or device where a file was: never opened
            s.add(e.code or "CK-F022", e.what, path=rel, hint=e.hint)
            continue
        if hexd != f["xxh3_128"]:
            s.add(
                "CK-F003",
                f"digest mismatch since adopt (expected {f['xxh3_128'][:12]}…, "
                f"got {hexd[:12]}…): corrupted or overwritten",
                path=rel,
            )
    for rel in s.files:
        if recorded and rel not in recorded:
            s.add(
                "CK-F006",
                f"{rel} appeared after 'ckptkit adopt' ({rel_m} does not list it)",
                path=rel,
                hint="re-run 'ckptkit adopt' if the change is intended",
            )
    return True
