"""DCP checkpoints written the way the PyTorch DCP tutorial and torchtitan write them.

All written at test time by the real ``torch.distributed.checkpoint.save`` (a ``Stateful``
app wrapper; torchtitan's layout; two gloo ranks) and, where it is installed, by
torchtitan's own checkpointer. Before, such checkpoints were FAILED ("no step counter";
model and optimizer not recognised): now the component table is complete and each entry
says where it was found.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import ckptkit
from ckptkit.verify.foreign.report import verify_foreign

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


class AppState(Stateful):
    """The DCP tutorial's wrapper: model and optimizer through get_state_dict."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def _trained(steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    for _ in range(steps):
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return m, opt, sched


def _save(state: dict[str, Any], path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process"
        dcp.save(state, checkpoint_id=str(path))
    return path


def _table(rep: Any) -> dict[str, tuple[bool, bool, str | None]]:
    return {
        n: (c.present, c.required, rep.found[n].describe() if n in rep.found else None)
        for n, c in rep.components.items()
        if c.present or c.required
    }


def _loader_state() -> dict[str, Any]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    dl = StatefulDataLoader(list(range(20)), batch_size=4, shuffle=False)
    it = iter(dl)
    next(it)
    next(it)
    return dl.state_dict()


def test_dcp_tutorial_app_state(tmp_path: Path) -> None:
    m, opt, _sched = _trained()
    d = _save({"app": AppState(m, opt)}, tmp_path / "tutorial")
    rep = verify_foreign(d)
    t = _table(rep)
    assert t["model"] == (True, True, "found at .metadata:app/model")
    assert t["optimizer"] == (True, True, "found at .metadata:app/optim")
    # The tutorial's own checkpoint has no step: the one thing missing, and said so.
    assert [(f.code, f.component) for f in rep.errors] == [("CK-C001", "progress")]
    # The optimizer state is FQN-keyed: every moment matched to its parameter by name.
    assert not [f for f in rep.findings if f.code in ("CK-S001", "CK-S002", "CK-C104")]


def test_dcp_tutorial_with_train_state_loader_and_rng(tmp_path: Path) -> None:
    m, opt, sched = _trained()
    state = {
        "app": AppState(m, opt),
        "train_state": {"step": 3, "epoch": 0},
        "lr_scheduler": sched.state_dict(),
        "dataloader": _loader_state(),
        "rng": {"torch": torch.get_rng_state()},
    }
    rep = verify_foreign(_save(state, tmp_path / "full"))
    assert rep.ok and rep.step == 3 and rep.expect == "training"
    t = _table(rep)
    assert t["progress"] == (True, True, "found at .metadata:train_state")
    assert t["scheduler"] == (True, True, "found at .metadata:lr_scheduler")
    assert t["sampler"] == (True, True, "found at .metadata:dataloader")
    assert t["rng"] == (True, True, "found at .metadata:rng")
    assert not [f for f in rep.findings if str(f.severity) != "info" and f.code != "CK-F107"]
    # Counters agree with each other (optimizer step 3, scheduler last_epoch 3, step 3).
    assert rep.components["optimizer"].summary["step_max"] == 3
    assert rep.components["scheduler"].summary["last_epoch"] == 3


def _torchtitan_flat_optim(osd: dict[str, Any]) -> dict[str, Any]:
    """torchtitan's get_flat_optim_state_dict: 'state.<fqn>.<moment>', 'param_groups.<fqn>.<hp>'."""
    flat: dict[str, Any] = {}
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            flat[f"state.{fqn}.{k}"] = v
    for g in osd["param_groups"]:
        for fqn in g["params"]:
            for k, v in g.items():
                if k != "params":
                    flat[f"param_groups.{fqn}.{k}"] = v
    return flat


def _torchtitan_layout(m: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    """What torchtitan 0.3's CheckpointManager hands dcp.save (_flattened_model_states_sd):
    the model's parameters at the top level beside optimizer, lr_scheduler, dataloader and
    train_state."""
    _msd, osd = get_state_dict(m, opt)
    return {
        **m.state_dict(),
        "optimizer": _torchtitan_flat_optim(osd),
        "lr_scheduler": {"last_epoch": step},
        "dataloader": {"dp_rank_0": pickle.dumps(_loader_state()), "world_size": 1},
        "train_state": {"step": step, "ntokens_seen": step * 64},
    }


def test_torchtitan_layout(tmp_path: Path) -> None:
    m, opt, _sched = _trained()
    rep = verify_foreign(_save(_torchtitan_layout(m, opt, 3), tmp_path / "step-3"))
    assert rep.ok and rep.step == 3
    t = _table(rep)
    assert t["model"][:2] == (True, True)
    assert t["model"][2] is not None and t["model"][2].startswith(
        "inferred from structure at .metadata (4 tensors at the top level"
    )
    assert t["optimizer"] == (True, True, "found at .metadata:optimizer")
    assert t["scheduler"] == (True, True, "found at .metadata:lr_scheduler")
    assert t["sampler"] == (True, True, "found at .metadata:dataloader")
    assert t["progress"] == (True, True, "found at .metadata:train_state")
    assert {f.component for f in rep.findings if f.code == "CK-C012"} == {"model"}
    assert not [f for f in rep.findings if f.code in ("CK-S002", "CK-C104", "CK-F103")]


def test_torchtitan_layout_defects_use_the_native_codes(tmp_path: Path) -> None:
    m, opt, _sched = _trained()
    state = _torchtitan_layout(m, opt, 3)
    state["optimizer"]["state.2.weight.exp_avg"] = torch.zeros(3, 3)
    state["0.weight"] = state["0.weight"].clone()
    state["0.weight"][0, 0] = float("nan")
    state["train_state"]["step"] = 900
    rep = verify_foreign(_save(state, tmp_path / "bad"))
    msgs = {f.code: f.message for f in rep.findings}
    assert msgs["CK-S002"] == "1 shape mismatch(es): 'exp_avg' of '2.weight' is [3, 3], the parameter [2, 8]"
    assert msgs["CK-S010"] == "1 tensor(s) hold NaN/Inf: '0.weight' (1 NaN)"
    assert msgs["CK-S003"] == "optimizer step is 3 but the global step is 900"
    assert not rep.ok


def test_torchtitan_run_directory(tmp_path: Path) -> None:
    """A run's step-N directories (no manifests) are verified as DCP checkpoints."""
    m, opt, _sched = _trained()
    run = tmp_path / "checkpoint"
    for step in (1, 2):
        _save(_torchtitan_layout(m, opt, step), run / f"step-{step}")
    res = ckptkit.verify(run)
    assert res.ok and [(r.format, r.step) for r in res.reports] == [("dcp", 1), ("dcp", 2)]


def test_torchtitan_checkpointer(tmp_path: Path) -> None:
    """torchtitan's own CheckpointManager, when torchtitan is installed (it is not in the
    default environment: its dependency pins downgrade huggingface_hub and fsspec)."""
    pytest.importorskip("torchtitan")
    from torchtitan.components.checkpointer import CheckpointManager
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

    class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            g = torch.Generator().manual_seed(0)
            while True:
                yield torch.randn(8, generator=g), torch.randn(4, generator=g)

    class Train(Stateful):
        step = ntokens_seen = 0

        def state_dict(self) -> dict[str, Any]:
            return {"step": self.step, "ntokens_seen": self.ntokens_seen}

        def load_state_dict(self, sd: dict[str, Any]) -> None:
            self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    opts = default_adamw(lr=1e-3, fused=False, foreach=False).build(model_parts=[model])
    scheds = LRSchedulersContainer.Config(warmup_steps=2, total_steps=10).build(
        optimizers=opts, training_steps=10
    )
    dl = ParallelAwareDataloader(Stream(), dp_rank=0, dp_world_size=1, batch_size=4)
    ts = Train()
    cfg = CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=1, keep_latest_k=0, last_save_model_only=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ck = CheckpointManager(cfg, dataloader=dl, model_parts=[model], optimizers=opts,
                               lr_schedulers=scheds, states={"train_state": ts},
                               sd_adapter=None, base_folder=str(tmp_path))
        it = iter(dl)
        for step in (1, 2):
            x, y = next(it)
            ((model(x) - y) ** 2).mean().backward()
            opts.step()
            scheds.step()
            opts.zero_grad()
            ts.step, ts.ntokens_seen = step, step * 32
            ck.save(step)
        ck.close()
    res = ckptkit.verify(tmp_path / "checkpoint")
    assert res.ok and [r.step for r in res.reports] == [1, 2]
    for rep in res.reports:
        for comp in ("model", "optimizer", "scheduler", "sampler", "progress"):
            assert rep.components[comp].present, (comp, rep.findings)


_RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, pickle, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 4)).sum().backward()
    opt.step()
    torch.manual_seed(100 + rank)
    msd, osd = get_state_dict(m, opt)
    state = {
        "app": {"model": msd, "optim": osd},
        "train_state": {"step": 1},
        "dataloader": {f"dp_rank_{rank}": pickle.dumps({"_num_yielded": 1}), "world_size": 2},
        "rng": {f"rank{rank}": torch.get_rng_state()},
    }
    dcp.save(state, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.distributed
def test_two_rank_gloo_stateful_save(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = tmp_path / "ck"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), port, str(out)], env=env)
        for r in range(2)
    ]
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0, 0]
    assert sorted(p.name for p in out.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    rep = verify_foreign(out)
    assert rep.ok and rep.step == 1, rep.findings
    t = _table(rep)
    assert t["rng"] == (True, True, "found at .metadata:rng")
    assert t["sampler"] == (True, True, "found at .metadata:dataloader")
    assert t["model"][2] == "found at .metadata:app/model"
    info = json.loads(json.dumps(rep.to_dict()))
    assert info["components"]["optimizer"]["how"] == "found"
