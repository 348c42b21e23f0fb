"""A small torch file whose compressed members inflate to gigabytes is refused before it is
loaded (issue 23, reproduction 11): ``CK-F109`` names the file, the sizes and the override.

``torch.load`` reads ``data.pkl`` into memory whole; a 1.5 GB deflated ``data.pkl`` in a
file of a few MB drove ``verify`` / ``inspect`` / ``adopt`` to 3 GB of memory. Each command
on the bomb runs as a new interpreter under a wrapper that reports the peak RSS of its one
child (``RUSAGE_CHILDREN``): it must stay far below the inflated size. (A fork of a warmed
process would start with the parent's memory counted in; the override's cases, which measure
no memory, run as forks of the warmed zygote, tests/zygote.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from zygote import Zygote

from ckptkit.checkpoint.safeload import MAX_INFLATED_ENV

pytestmark = pytest.mark.integration

TIMEOUT = 180
INFLATED = 1536 << 20
"""What the hostile ``data.pkl`` inflates to (1.5 GiB)."""

_WRAPPER = """
import json, resource, subprocess, sys
r = subprocess.run([sys.executable, "-m", "ckptkit", *sys.argv[1:]], capture_output=True,
                   text=True, timeout=170)
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": r.returncode, "out": r.stdout, "err": r.stderr, "peak_kib": peak_kib}))
"""


def _bomb(path: Path, inflated: int) -> Path:
    """A torch.save archive whose ``data.pkl`` is its pickle followed by ``inflated`` zero
    bytes, deflated (the unpickler stops at the pickle's end; torch reads the record whole).

    Deflate level 1: 2-3 times faster to write than the default, and zeros still shrink
    about 200-fold."""
    src = path.with_suffix(".src")
    torch.save({"model": {"w": torch.ones(2)}, "step": 1}, src)
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(
        path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1
    ) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if not info.filename.endswith("/data.pkl"):
                zout.writestr(info, data)  # as torch wrote it (stored)
                continue
            with zout.open(info.filename, "w", force_zip64=True) as m:
                m.write(data)
                for _ in range(inflated // len(chunk)):
                    m.write(chunk)
    src.unlink()
    return path


def _run(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    e = {**os.environ, "CKPTKIT_NO_PROGRESS": "1", "PYTHONWARNINGS": "ignore", **(env or {})}
    p = subprocess.run([sys.executable, "-c", _WRAPPER, *args], capture_output=True, text=True,
                       timeout=TIMEOUT, env=e)
    assert p.returncode == 0, p.stderr[-2000:]
    out: dict[str, object] = json.loads(p.stdout)
    return out


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = _bomb(tmp_path_factory.mktemp("bomb") / "bomb.pt", INFLATED)
    assert path.stat().st_size < 64 << 20  # a few MB on disk
    return path


@pytest.mark.parametrize("command", ["verify", "inspect", "adopt"])
def test_a_deflate_bomb_is_refused_before_it_is_loaded(bomb: Path, command: str) -> None:
    # inspect's findings are in its JSON (its text view lists components and files).
    r = _run(command, str(bomb), *(["--json"] if command == "inspect" else []))
    text = f"{r['out']}{r['err']}"
    assert "CK-F109" in text and "bomb.pt" in text and "data.pkl" in text, text
    assert str(INFLATED) in text.replace(",", "") or "inflates" in text
    assert MAX_INFLATED_ENV in text  # the override is named
    assert "Traceback" not in text
    # verify fails (1), adopt refuses (2, nothing written), inspect describes (0).
    assert r["rc"] == {"verify": 1, "inspect": 0, "adopt": 2}[command], text
    assert not bomb.with_name("bomb.pt.ckptkit-manifest.json").exists()
    peak = int(str(r["peak_kib"])) * 1024
    assert peak < INFLATED // 2, f"peak RSS {peak} bytes: the archive was inflated"


def test_the_override_and_a_bad_value(tmp_path: Path, cli_zygote: Zygote) -> None:
    small = _bomb(tmp_path / "small.pt", 8 << 20)  # inflates to 8 MiB

    def verify(limit: str) -> tuple[int, str, str]:
        env = {"CKPTKIT_NO_PROGRESS": "1", MAX_INFLATED_ENV: limit}
        r = cli_zygote.ckptkit("verify", small, env=env, timeout=TIMEOUT)
        return r.returncode, r.stdout, r.stderr

    rc, out, err = verify(str(1 << 20))
    assert rc == 1 and "CK-F109" in out, (out, err)
    rc, out, err = verify(str(64 << 20))
    assert "CK-F109" not in out, (out, err)  # allowed: read and checked as usual
    rc, out, err = verify("lots")
    text = f"{out}{err}"
    assert rc == 2 and MAX_INFLATED_ENV in text and "Traceback" not in text, text
