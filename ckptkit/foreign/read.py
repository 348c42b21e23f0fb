"""Read a foreign checkpoint into a :class:`~ckptkit.foreign._scan.Scan`: detect, then scan.

One scanner per format fills the scan's component table and findings; :mod:`.report`
turns a scan into a verify report and :mod:`.adopt` records its digests. Both start here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckptkit.errors import CkptkitError, IncompleteCheckpointError
from ckptkit.foreign import accelerate, dcp, hf_trainer, lightning, torch_save
from ckptkit.foreign._scan import Scan
from ckptkit.foreign.detect import FORMATS, detect

SCANNERS: dict[str, Callable[[Scan], None]] = {
    "hf-trainer": hf_trainer.scan,
    "accelerate": accelerate.scan,
    "lightning": lightning.scan,
    "dcp": dcp.scan,
    "torch-save": torch_save.scan,
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


def scan(path: Path | str, fmt: str | None = None, *, scan_values: bool = True) -> Scan:
    """Read a foreign checkpoint into a :class:`Scan` (components and findings)."""
    p = Path(path)
    if not p.exists():
        raise IncompleteCheckpointError("no such file or directory", path=p, hint="check the path")
    name = resolve_format(p, fmt)
    s = Scan.start(p, name, scan_values=scan_values)
    SCANNERS[name](s)
    return s


__all__ = ["SCANNERS", "resolve_format", "scan"]
