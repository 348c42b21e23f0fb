"""The table of how each framework loads each file on resume (``ckptkit.verify.foreign.loads``).

It states, per layout, which files a resume loads and how, and what a pickle that needs
code in each of them means; then it checks every call the table quotes against the
installed framework's source, so a framework upgrade that changes how a file is loaded
fails here instead of silently keeping an old verdict.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pickle
import random
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from packaging.version import Version

from ckptkit.checkpoint import safeload
from ckptkit.checkpoint.detect import FORMATS
from ckptkit.verify.findings import ERROR, INFO
from ckptkit.verify.foreign.loads import (
    ALLOW_LISTS,
    CKPTKIT,
    LOADS,
    TRAINER,
    AllowList,
    file_load,
    needs_code_verdict,
    refused_by_load,
)

# (layout, file, how it is loaded on resume: "code" runs pickled code, "refuses" is a
# weights_only=True load (a pickle needing code makes the resume fail), "pickle-free" holds
# no pickle, None: not loaded on resume)
EXPECTED = [
    ("hf-trainer", "model.safetensors", "pickle-free"),
    ("hf-trainer", "model-00001-of-00002.safetensors", "pickle-free"),
    ("hf-trainer", "pytorch_model.bin", "refuses"),
    ("hf-trainer", "optimizer.pt", "refuses"),
    ("hf-trainer", "scheduler.pt", "refuses"),
    ("hf-trainer", "scaler.pt", "refuses"),
    ("hf-trainer", "rng_state.pth", "refuses"),
    ("hf-trainer", "rng_state_3.pth", "refuses"),
    ("hf-trainer", "trainer_state.json", "pickle-free"),
    ("hf-trainer", "training_args.bin", None),
    ("accelerate", "model.safetensors", "pickle-free"),
    ("accelerate", "pytorch_model_1.bin", "refuses"),
    ("accelerate", "optimizer.bin", "refuses"),
    ("accelerate", "scheduler_1.bin", "refuses"),
    ("accelerate", "sampler.bin", "refuses"),
    ("accelerate", "dl_state_dict.bin", "refuses"),
    ("accelerate", "scaler.pt", "refuses"),
    ("accelerate", "random_states_0.pkl", "refuses"),
    ("accelerate", "custom_checkpoint_0.pkl", "code"),
    ("accelerate", "custom_checkpoint_12.pkl", "code"),
    ("lightning", "epoch=0-step=4.ckpt", "refuses"),
    ("lightning", "last.ckpt", "refuses"),
    ("torch-save", "ckpt.pt", "refuses"),
    ("dcp", ".metadata", "code"),
    ("dcp", "__0_0.distcp", "code"),
]


def _how(fmt: str, rel: str) -> str | None:
    e = file_load(fmt, rel)
    assert e is not None, (fmt, rel)
    if not e.on_resume:
        return None
    if e.runs_code:
        return "code"
    return "pickle-free" if not e.if_refused else "refuses"


@pytest.mark.parametrize(("fmt", "rel", "how"), EXPECTED)
def test_each_layout_states_which_files_a_resume_loads_and_how(
    fmt: str, rel: str, how: str | None
) -> None:
    assert _how(fmt, rel) == how
    sev, why = needs_code_verdict(fmt, rel)
    # The one rule: a pickle needing code is an error in any file a resume loads.
    assert sev is (INFO if how is None else ERROR), (fmt, rel, why)
    if how == "code":
        assert "would run that code" in why
    elif how == "refuses":
        assert "weights_only=True" in why or "weights_only=None" in why


def test_every_foreign_format_has_a_table_and_unknown_files_are_errors() -> None:
    assert set(LOADS) == set(FORMATS)
    # A file the table does not know cannot be vouched for.
    assert file_load("accelerate", "mystery.pkl") is None
    sev, why = needs_code_verdict("accelerate", "mystery.pkl")
    assert sev is ERROR and "does not know" in why


def _source(module: str) -> str | None:
    """The module's source with comments and whitespace removed (None: not installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None:
        return None
    text = Path(spec.origin).read_text("utf-8")
    text = re.sub(r"#[^\n]*", "", text)
    return re.sub(r"\s+", "", text)


_SOURCES = sorted(
    {(fmt, s.module, s.call, s.gone_in) for fmt, entries in LOADS.items() for e in entries
     for s in e.sources},
    key=str,
)


@pytest.mark.parametrize(("fmt", "module", "call", "gone_in"), _SOURCES)
def test_the_quoted_framework_calls_are_in_the_installed_sources(
    fmt: str, module: str, call: str, gone_in: str | None
) -> None:
    src = _source(module)
    if src is None:
        pytest.skip(f"{module} is not installed (the interop extra)")
    installed = Version(importlib.metadata.version(module.split(".")[0]))
    if gone_in is not None and installed >= Version(gone_in):
        # The table says this release dropped the call: it must be gone, or the table is wrong.
        assert re.sub(r"\s+", "", call) not in src, (
            f"{module} {installed} still contains {call!r}, which the table says is gone in "
            f"{gone_in}: fix gone_in in ckptkit/verify/foreign/loads.py"
        )
        return
    assert re.sub(r"\s+", "", call) in src, (
        f"{module} {installed} no longer contains {call!r}: re-read how {fmt} loads its files "
        "on resume and update ckptkit/verify/foreign/loads.py (gone_in=, and docs/formats.md)"
    )


def test_no_load_in_the_resume_code_escapes_the_table() -> None:
    """Every torch.load in the resume code of the Trainer and Accelerate is one the table
    quotes: a new load path (a new file, or weights_only=False) fails here."""
    quoted = {s.call for entries in LOADS.values() for e in entries for s in e.sources}
    flat = {re.sub(r"\s+", "", c) for c in quoted}
    acc = _source("accelerate.checkpointing")
    if acc is None:
        pytest.skip("accelerate is not installed")
    # Accelerate's checkpointing loads only through its own ``load`` helper, one call per file kind.
    loads = re.findall(r"(?<![\w.])load\((.*?)\)", acc)
    assert loads, "no load( call found in accelerate.checkpointing"
    for args in loads:
        assert any(f"load({args})" in q or f"load({args}" in q for q in flat), (
            f"accelerate.checkpointing has a load({args}) the table does not quote"
        )
    # custom_checkpoint_<i>.pkl, and only it, is loaded with weights_only=False (a call
    # argument; the docstring that says so is not counted).
    assert len(re.findall(r"weights_only=False\)", acc)) == 1
    trainer = _source("transformers.trainer")
    if trainer is None:
        pytest.skip("transformers is not installed")
    assert not re.findall(r"weights_only=False\)", trainer)


# --- the allow-list of each weights-only load ---------------------------------------------------
# "weights_only=True" is torch's default list plus what the caller adds: each such entry names
# its load's list, and a file is held to that list, not to ckptkit's wider one.


def test_every_weights_only_load_names_its_allow_list() -> None:
    for fmt, entries in LOADS.items():
        for e in entries:
            weights_only = e.on_resume and not e.runs_code and bool(e.if_refused)
            assert (e.allow is not None) == weights_only, (fmt, e.pattern)


@pytest.mark.parametrize("allow", [a for a in ALLOW_LISTS if a.module is not None], ids=lambda a: a.name)
def test_the_copy_of_each_framework_list_is_the_installed_one(allow: AllowList) -> None:
    """The copy is used where the framework is not installed: it must say what it says."""
    if importlib.util.find_spec(allow.module.split(".")[0]) is None:  # type: ignore[union-attr]
        pytest.skip(f"{allow.module} is not installed (the interop extra)")
    installed, origin = allow.extra()
    assert origin.endswith("as installed"), origin
    assert safeload.global_names(allow.copy()) == safeload.global_names(installed), (
        f"{allow.adds} changed: update its copy in ckptkit/verify/foreign/loads.py (and docs/formats.md)"
    )


@pytest.mark.parametrize("allow", ALLOW_LISTS, ids=lambda a: a.name)
def test_ckptkit_reads_every_file_a_framework_load_accepts(allow: AllowList) -> None:
    """Else ckptkit would call a file 'needs code' that the framework loads."""
    names, _origin = allow.names()
    mine, _ = CKPTKIT.names()
    assert names <= mine, sorted(names - mine)


def _payloads() -> dict[str, Any]:
    """Plain state, the Trainer's RNG state (built the way the Trainer builds it), numpy
    values, and ckptkit's other extras: what each load accepts differs."""
    return {
        "plain": {"w": torch.ones(2), "step": 3, "lr": 0.1, "name": "x", "b": b"\x00"},
        "numpy-rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "cpu": torch.random.get_rng_state(),
        },
        "numpy-scalar": {"best": np.float64(1.0), "n": np.int64(3)},
        "numpy-array": {"a": np.arange(3, dtype=np.float32)},
        "torch-version": {"v": torch.__version__},
    }


def _framework_load(fmt: str, rel: str) -> Callable[[Path], Any] | None:
    """The framework's own load of file ``rel`` on resume (None: not installed here)."""
    if fmt == "lightning":
        if importlib.util.find_spec("lightning") is None:
            return None
        from lightning.fabric.utilities.cloud_io import _load as lightning_load

        return lambda p: lightning_load(p)
    if fmt == "accelerate":
        if importlib.util.find_spec("accelerate") is None:
            return None
        from accelerate.utils.other import load as accelerate_load

        if rel == "scaler.pt":  # Accelerate's load, and FSDP2's plain torch.load
            return lambda p: (accelerate_load(p), torch.load(p))
        return lambda p: accelerate_load(p)
    if fmt == "hf-trainer":
        if importlib.util.find_spec("transformers") is None:
            return None
        from transformers.trainer_pt_utils import safe_globals

        def trainer_rng(p: Path) -> Any:
            with safe_globals():
                return torch.load(p, weights_only=True)

        return trainer_rng if rel.startswith("rng_state") else lambda p: torch.load(p, weights_only=True)
    if fmt == "torch-save":  # the script's own load: held to ckptkit's list
        def ckptkit_load(p: Path) -> Any:
            obj, problem = safeload.safe_torch_load(p)
            if problem is not None:
                raise RuntimeError(problem.message)
            return obj

        return ckptkit_load
    return None


_WEIGHTS_ONLY = [(fmt, rel) for fmt, rel, how in EXPECTED if how == "refuses"]


@pytest.mark.parametrize(("fmt", "rel"), _WEIGHTS_ONLY)
def test_the_verdict_is_what_the_framework_load_does(tmp_path: Path, fmt: str, rel: str) -> None:
    """For each weights-only file of each layout, and state of every kind: the file is
    refused exactly when the installed framework's own load raises on it."""
    load = _framework_load(fmt, rel)
    if load is None:
        pytest.skip(f"the framework of {fmt} is not installed")
    for kind, payload in _payloads().items():
        p = tmp_path / kind / rel
        p.parent.mkdir()
        torch.save(payload, p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                load(p)
                framework_refuses = False
            except pickle.UnpicklingError:
                framework_refuses = True
            except RuntimeError:  # ckptkit_load's refusal
                framework_refuses = True
        refusal = refused_by_load(fmt, rel, p)
        assert (refusal is not None) == framework_refuses, (fmt, rel, kind, refusal)
        if refusal is not None:
            assert "multiarray.scalar" in " ".join(refusal.refused) or kind != "numpy-scalar"


def test_which_trainer_and_lightning_loads_add_to_the_list() -> None:
    """The Trainer widens the list around its rng_state.pth load only; Lightning never."""
    trainer = _source("transformers.trainer")
    if trainer is not None:
        quoted = [e for e in LOADS["hf-trainer"] if e.allow is TRAINER]
        assert trainer.count("withsafe_globals():") == len(quoted) == 1
    lightning = importlib.util.find_spec("lightning")
    if lightning is not None and lightning.submodule_search_locations:
        root = Path(next(iter(lightning.submodule_search_locations)))
        hits = [p for p in root.rglob("*.py") if "safe_globals" in p.read_text("utf-8", "replace")]
        assert not hits, f"Lightning now extends the weights-only list: {hits}"


def test_globals_this_process_added_count_as_the_frameworks_load_would(tmp_path: Path) -> None:
    """The hint's fix: a training process that extends torch's list before resuming gets a
    load that accepts the file, and a resume pick made in that process agrees."""
    p = tmp_path / "epoch=0-step=5.ckpt"
    torch.save({"global_step": 5, "callbacks": {"x": {"best": np.float64(1.0)}}}, p)
    assert refused_by_load("lightning", p.name, p) is not None
    core = getattr(np, "_core", None) or np.core
    with torch.serialization.safe_globals([core.multiarray.scalar, np.dtype, type(np.dtype(np.float64))]):
        torch.load(p, weights_only=True)  # what Lightning's load does in this process
        assert refused_by_load("lightning", p.name, p) is None
    assert refused_by_load("lightning", p.name, p) is not None
