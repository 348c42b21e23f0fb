"""Tell which foreign layout a path holds, by file names and pickle keys (nothing is loaded).

A path holding ``manifest.json`` is a native ckptkit checkpoint and is never detected as
foreign. Detection is ordered from the most specific marker to the least.
"""

from __future__ import annotations

import os
import pickletools
from pathlib import Path

from ckptkit.checkpoint.safeload import ZIP_READ_ERRORS, is_zip, open_zip
from ckptkit.storage.atomic import MANIFEST_NAME

FORMATS: dict[str, str] = {
    "hf-trainer": "Hugging Face Trainer checkpoint folder (checkpoint-N/)",
    "accelerate": "Accelerate save_state folder",
    "lightning": "Lightning .ckpt file",
    "dcp": "torch.distributed.checkpoint directory (.metadata + *.distcp)",
    "torch-save": "plain torch.save file (a dict of state)",
    "safetensors": "safetensors weights: a .safetensors file, or a save_pretrained folder",
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
        if os.path.lexists(p / MANIFEST_NAME):  # even a dangling link: native, refused there
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
        if _save_pretrained(names):
            return "safetensors"
        return None
    if p.is_file():
        if p.suffix == ".safetensors":
            return "safetensors"
        if p.suffix == ".ckpt" or _has_lightning_keys(p):
            return "lightning"
        if p.suffix in TORCH_SUFFIXES or is_zip(p):
            return "torch-save"
    return None


def _save_pretrained(names: set[str]) -> bool:
    """A ``save_pretrained`` folder: safetensors weights beside ``config.json`` or an index.

    A folder of native ckptkit shards that lost its manifest (``model.safetensors``,
    ``rng-rank00000.safetensors`` ...) is never taken for one: it has neither.
    """
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights or any(n.startswith("rng-rank") for n in weights):
        return False
    return "config.json" in names or any(n.endswith(".safetensors.index.json") for n in names)


def _has_lightning_keys(p: Path) -> bool:
    """Whether the pickle of a torch zip file names Lightning's top-level keys."""
    if not is_zip(p):
        return False
    zf, _why = open_zip(p)
    if zf is None:  # damaged: detected by suffix, reported by verify
        return False
    try:
        with zf:
            name = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
            if name is None or zf.getinfo(name).file_size > 64 << 20:
                return False
            data = zf.read(name)
    except ZIP_READ_ERRORS:
        return False
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name.endswith("UNICODE") and arg in _LIGHTNING_KEYS:
                return True
    except Exception:  # damaged pickle: not evidence either way
        return False
    return False
