"""Record the software environment a checkpoint was written in.

Versions of torch, CUDA, cuDNN, NCCL, Python, NumPy and ckptkit, the host, the thread count and
the code revision. ``ckptkit verify --against-env`` compares them with the resuming process.
Capture runs on every save, so it must stay cheap: the git lookup (the only subprocess) is
cached per process and working directory.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptkit._version import __version__

_GIT_TIMEOUT_S = 2.0


def capture(*, cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Snapshot the environment of this process.

    Args:
        cwd: where to look for a git checkout; the process's working directory when None.

    Returns:
        ``torch``, ``cuda``, ``cudnn``, ``nccl``, ``gpus`` (device names), ``python``,
        ``numpy``, ``ckptkit``, ``hostname``, ``platform``, ``num_threads`` and ``git``
        (``{"revision", "dirty"}``, or None outside a git checkout or without git).

    Example:
        >>> capture()["ckptkit"] == __version__
        True
    """
    cuda_ok = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl_version() if cuda_ok else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda_ok
        else [],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ckptkit": __version__,
        "hostname": socket.gethostname(),
        "platform": _platform(),
        "num_threads": torch.get_num_threads(),
        "git": git_revision(str(Path(cwd if cwd is not None else os.getcwd()).resolve())),
    }


def restore(state: dict[str, Any]) -> None:
    """Do nothing: an environment is compared on resume, never restored.

    Example:
        >>> restore(capture())
    """
    del state


def summary(state: dict[str, Any]) -> dict[str, Any]:
    """Return the snapshot itself (it is small and JSON already).

    Example:
        >>> summary(capture())["torch"] == torch.__version__
        True
    """
    return dict(state)


@functools.cache
def git_revision(directory: str) -> dict[str, Any] | None:
    """Return ``{"revision": sha, "dirty": bool}`` for the checkout holding ``directory``.

    Cached per directory for the life of the process: the revision of running code does not
    change under it, and a subprocess per save would cost more than the rest of the capture.

    Args:
        directory: an absolute path.

    Returns:
        None outside a checkout, without git, or when git is slow.

    Example:
        >>> git_revision("/") is None
        True
    """
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
        if head.returncode != 0:
            return None
        # --no-optional-locks: never take index.lock, so a save cannot collide with a commit.
        status = subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = None if status.returncode != 0 else bool(status.stdout.strip())
    return {"revision": head.stdout.strip(), "dirty": dirty}


@functools.cache
def _platform() -> str:
    return f"{platform.platform()} ({sys.implementation.name})"


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version)
    return str(version)


__all__ = ["capture", "git_revision", "restore", "summary"]
