"""One rank of the multi-rank resume-choice test: ``python _resume_worker.py SPEC``.

Over a gloo group of 2, each rank asks the Lightning integration what to resume from
(``resume_checkpoint``) in a run whose newest file was never adopted, then asks
:func:`ckptkit.run.resume_target` in an Accelerate run whose newest checkpoint's step is
unknown. Every :class:`~ckptkit.run.Run` this rank opens is noted (writable or not), so the
test sees which rank could have taken the lock or adopted. Each rank writes what it saw to
``out/result-<rank>.json``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ckptkit.collective import leave
from ckptkit.errors import CkptkitError
from ckptkit.run import Run, resume_target
from ckptkit.run.layouts.hf import AccelerateLayout


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    rank, world = int(spec["rank"]), int(spec["world"])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    opened: list[bool] = []  # per Run this rank constructs: was it writable?
    real_init = Run.__init__

    def noting(self: Run, *args: Any, **kw: Any) -> None:
        opened.append(not kw.get("readonly", True))
        real_init(self, *args, **kw)

    Run.__init__ = noting  # type: ignore[method-assign]
    from ckptkit.integrations.lightning import resume_checkpoint

    chosen = resume_checkpoint(spec["lightning"])
    lightning_opened = list(opened)
    failure: str | None = None
    try:
        resume_target(spec["accelerate"], AccelerateLayout())
    except CkptkitError as e:
        failure = str(e)
    out = Path(spec["out"]) / f"result-{rank}.json"
    out.write_text(json.dumps({"chosen": chosen, "writable": lightning_opened, "failure": failure}))
    leave(0)  # no teardown (ckptkit.collective.leave says why)


if __name__ == "__main__":
    main()
