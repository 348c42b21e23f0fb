"""The README's first snippet, with a DataLoader built after ``mgr.restore`` and iterated
directly (``for x, y in loader``, no Recorder), resumes bitwise in a fresh process.

The loader's ``iter()`` draws its workers' base seed from the restored global torch RNG;
the uninterrupted run, still inside its epoch, drew nothing there. The resume guard sees
the restored sampler's first pass and puts that one draw back (``guard.on_resumed_pass``),
so every dropout mask after the resume is the uninterrupted run's.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.docs.preludes import TINY_TRAINING

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SAVE_AT, STOP = 3, 9
"""6 batches per epoch: the save is mid-epoch and the run crosses an epoch boundary."""

LOOP = '''\
loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=ts.sampler)
step = ts.step
for epoch in range(ts.sampler.epoch, 100):
    ts.sampler.set_epoch(epoch)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if step == {save_at}:
{tail}
        if step == {stop}:
            break
    if step == {stop}:
        break
import hashlib
print("PARAMS", hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
print("GUARD", sorted(f.code for f in (guard.findings if guard else [])))
'''


def readme_first_snippet() -> tuple[str, str]:
    """The README's first python block, split at its ``...``: (up to the restore, the save)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Use\n.*?```python\n(.*?)```", text, flags=re.S)
    assert block, "README.md lost its first snippet"
    head, sep, tail = block.group(1).partition("\n...\n")
    assert sep and "mgr.restore(ts)" in head and "mgr.save(ts)" in tail, block.group(1)
    return head, tail


def script() -> str:
    head, tail = readme_first_snippet()
    # The snippet as written; the restore's result is kept to read the guard's findings.
    head = head.replace("mgr.restore(ts)", "result = mgr.restore(ts)")
    assert "result = mgr.restore(ts)" in head
    loop = LOOP.format(save_at=SAVE_AT, stop=STOP, tail=textwrap.indent(tail.strip(), " " * 12))
    return TINY_TRAINING + head + "\nguard = result.guard if result else None\n" + loop


def run(zygote: Any, cwd: Path) -> tuple[str, str]:
    """One run of the script in a fresh process (a fork of the warmed zygote)."""
    out = zygote.run(script(), cwd=cwd, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    return lines["PARAMS"], lines["GUARD"]


def test_readme_first_snippet_with_a_loader_built_after_restore_resumes_bitwise(
    tmp_path: Path, zygote: Any
) -> None:
    reference, _ = run(zygote, tmp_path)  # fresh start: trains to STOP, saves at SAVE_AT
    resumed, findings = run(zygote, tmp_path)  # restores SAVE_AT in a fresh process
    assert findings == "[]"
    assert resumed == reference
