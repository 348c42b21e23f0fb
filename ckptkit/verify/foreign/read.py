"""Read a foreign checkpoint: detect its format, then let that format's reader fill a scan.

One reader per format fills a :class:`~ckptkit.verify.foreign.scan.Scan` (its files, the
container findings, where each component is); :mod:`.report` hands the resulting state
view to the registered checks, and :mod:`.adopt` records digests. Both start here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckptkit.checkpoint.detect import FORMATS, detect
from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.verify.foreign import accelerate, hf_trainer, lightning, torch_save, weights
from ckptkit.verify.foreign import distcp as dcp
from ckptkit.verify.foreign.adopted import read_adopted_manifest
from ckptkit.verify.foreign.scan import Scan

SCANNERS: dict[str, Callable[[Scan], None]] = {
    "hf-trainer": hf_trainer.scan,
    "accelerate": accelerate.scan,
    "lightning": lightning.scan,
    "dcp": dcp.scan,
    "torch-save": torch_save.scan,
    "safetensors": weights.scan,
}
"""Format name → the function that fills a :class:`Scan` (keys match ``FORMATS``)."""

assert set(SCANNERS) == set(FORMATS)


def resolve_format(path: Path, fmt: str | None) -> str:
    """Return ``fmt`` if given (validated), else the detected format; raise if none."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise CkptkitError(
                f"unknown format {fmt!r}", path=path, hint="use one of: " + ", ".join(FORMATS)
            )
        return fmt
    found = detect(path)
    if found is None:
        raise CkptkitError(
            "not a ckptkit checkpoint (no manifest.json) and not a recognised foreign layout",
            path=path,
            hint="ckptkit reads "
            + "; ".join(f"{k}: {v}" for k, v in FORMATS.items())
            + ". Pass --format NAME if detection is wrong",
        )
    return found


def scan(
    path: Path | str,
    fmt: str | None = None,
    *,
    scan_values: bool = True,
    adopted: bool = False,
    key: bytes | None = None,
) -> Scan:
    """Read a foreign checkpoint into a :class:`Scan` (components and container findings).

    With ``adopted``, the adopted manifest is read first (validated, and signed with ``key``
    when one is given; a refusal is a finding on the scan), so that the format's reader
    holds the files to its list (:meth:`Scan.listing`): a ``ckptkit.dcp`` directory is
    then read exactly as ``ckptkit.dcp.check`` reads it.

    Example:
        >>> import tempfile, pathlib, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "ck.pt"
        >>> torch.save({"net": {"w": torch.ones(2)}, "iter_num": 3}, p)
        >>> s = scan(p); s.finish().found()["model"].describe(), s.step
        ('found at ck.pt:net', 3)
    """
    p = Path(path)
    if not (p.exists() or p.is_symlink()):
        raise IncompleteCheckpointError("no such file or directory", path=p, hint="check the path")
    name = resolve_format(p, fmt)
    s = Scan.start(p, name, scan_values=scan_values)
    if adopted:
        s.adopted_record, s.adopted = read_adopted_manifest(s, key=key)
    SCANNERS[name](s)
    return s


__all__ = ["SCANNERS", "resolve_format", "scan"]
