"""Tell which foreign layout a path holds, by file names and pickle keys (nothing is loaded).

A path holding ``manifest.json`` is a native ckptkit checkpoint and is never detected as
foreign. Detection is ordered from the most specific marker to the least.
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

from ckptkit.storage.atomic import MANIFEST_NAME

FORMATS: dict[str, str] = {
    "hf-trainer": "Hugging Face Trainer checkpoint folder (checkpoint-N/)",
    "accelerate": "Accelerate save_state folder",
    "lightning": "Lightning .ckpt file",
    "dcp": "torch.distributed.checkpoint directory (.metadata + *.distcp)",
    "torch-save": "plain torch.save file (a dict of state)",
}
"""Foreign formats ckptkit verify/inspect/adopt understand, by ``--format`` name."""

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar", ".pkl")
_LIGHTNING_KEYS = ("pytorch-lightning_version", "optimizer_states", "lr_schedulers")


def detect(path: Path | str) -> str | None:
    """Return the foreign format name of ``path`` (a key of :data:`FORMATS`), or None.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "trainer_state.json").write_text("{}")
        >>> detect(d)
        'hf-trainer'
    """
    p = Path(path)
    if p.is_dir():
        if (p / MANIFEST_NAME).exists():
            return None
        names = {c.name for c in p.iterdir() if c.is_file()}
        if ".metadata" in names or any(n.endswith(".distcp") for n in names):
            return "dcp"
        if "trainer_state.json" in names or "training_args.bin" in names:
            return "hf-trainer"
        if any(n.startswith("random_states_") and n.endswith(".pkl") for n in names) or (
            names & {"optimizer.bin", "scheduler.bin", "sampler.bin", "dl_state_dict.bin"}
        ):
            return "accelerate"
        return None
    if p.is_file():
        if p.suffix == ".ckpt" or _has_lightning_keys(p):
            return "lightning"
        if p.suffix in TORCH_SUFFIXES or _is_zip(p):
            return "torch-save"
    return None


def _is_zip(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _has_lightning_keys(p: Path) -> bool:
    """Whether the pickle of a torch zip file names Lightning's top-level keys."""
    if not _is_zip(p):
        return False
    try:
        with zipfile.ZipFile(p) as zf:
            name = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
            if name is None or zf.getinfo(name).file_size > 64 << 20:
                return False
            data = zf.read(name)
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name.endswith("UNICODE") and arg in _LIGHTNING_KEYS:
                return True
    except Exception:  # damaged pickle: not evidence either way
        return False
    return False
