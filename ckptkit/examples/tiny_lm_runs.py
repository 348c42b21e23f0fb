"""The tiny LM's runs: where a run's checkpoints go, and what the script says about a
resume and a recovery.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

import ckptkit
from ckptkit.format.records import Health
from ckptkit.storage import fs

RUNS = "runs/tiny_lm"
"""Where runs without ``--ckpt-dir`` go: one ``run-NNN`` directory per invocation."""


def run_dir(*, resume: bool, world: int = 1) -> str:
    """The checkpoint directory of a run started without ``--ckpt-dir``.

    A new ``runs/tiny_lm/run-NNN/ckpt`` per invocation (the next free number), or with
    ``resume`` the newest existing one. Rank 0 decides; the other ranks take its answer.
    """
    choice: list[str | None] = [None]
    if world == 1 or torch.distributed.get_rank() == 0:
        runs = sorted(
            (p for p in Path(RUNS).glob("run-*") if p.name[4:].isdigit()),
            key=lambda p: int(p.name[4:]),
        )
        if resume and runs:
            path = runs[-1] / "ckpt"
            print(f"tiny_lm: --resume: continuing {path}", file=sys.stderr)
        else:
            n = int(runs[-1].name[4:]) + 1 if runs else 1
            path = Path(RUNS) / f"run-{n:03d}" / "ckpt"
            path.mkdir(parents=True)
            why = " (--resume: no earlier run)" if resume else ""
            print(
                f"tiny_lm: new run{why}, checkpoints in {path} (continue it with "
                f"--ckpt-dir {path}, or --resume for the newest run)",
                file=sys.stderr,
            )
        choice = [str(path)]
    if world > 1:
        torch.distributed.broadcast_object_list(choice, src=0)
    assert choice[0] is not None
    return choice[0]


def say_resumed(restored: Any, stop: int) -> None:
    """Say which checkpoint the run continues, and what about it is not ordinary."""
    print(f"tiny_lm: resumed from {restored.path} at step {restored.step}", file=sys.stderr)
    health = Health.of(restored.manifest.health if restored.manifest is not None else None)
    if health is not None and health.level not in (None, "ok"):
        level = health.level
        signals = ", ".join(sorted(health.signal_names)) or "no signal named"
        print(
            f"tiny_lm: warning: that checkpoint's recorded health is {level} ({signals}); "
            f"'ckptkit rollback {fs.url(fs.location(restored.path).parent)}' names the "
            "newest healthy one, or start a new run without --ckpt-dir",
            file=sys.stderr,
        )
    if restored.step >= stop:
        print(
            f"tiny_lm: step {restored.step} already reached the {stop} steps asked for: "
            "nothing to train (raise --steps, or start a new run without --ckpt-dir)",
            file=sys.stderr,
        )


def recovery_summary(record: Any) -> dict[str, Any]:
    """The numbers of one automatic recovery the summary line reports."""
    trig = record["trigger"]
    return {
        "n": record["n"],
        "first_warning": trig["first_warning_step"],
        "detected_at": record["detected_at"],
        "level": trig["level"],
        "signals": sorted(trig["signals"]),
        "restored": record["restored"]["step"],
        "lr_scale": record["actions"]["lr"]["scale"],
        "detect_to_resume_s": record["timing"]["detect_to_resume_s"],
    }


def skipped(mgr: ckptkit.CheckpointManager, n: int) -> int | None:
    """Samples recovery ``n`` skipped (None while the skip is not applied yet)."""
    for r in mgr.recovery.history if mgr.recovery is not None else ():
        if r.get("n") == n:
            skip = r.get("actions", {}).get("skip", {})
            return skip.get("samples") if skip.get("status") == "applied" else None
    return None
