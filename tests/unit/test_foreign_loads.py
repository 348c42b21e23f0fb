"""The table of how each framework loads each file on resume (``ckptkit.foreign.loads``).

It states, per layout, which files a resume loads and how, and what a pickle that needs
code in each of them means; then it checks every call the table quotes against the
installed framework's source, so a framework upgrade that changes how a file is loaded
fails here instead of silently keeping an old verdict.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from ckptkit.foreign.detect import FORMATS
from ckptkit.foreign.loads import LOADS, file_load, needs_code_verdict
from ckptkit.verify.findings import ERROR, INFO

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
    {(fmt, s.module, s.call) for fmt, entries in LOADS.items() for e in entries for s in e.sources}
)


@pytest.mark.parametrize(("fmt", "module", "call"), _SOURCES)
def test_the_quoted_framework_calls_are_in_the_installed_sources(
    fmt: str, module: str, call: str
) -> None:
    src = _source(module)
    if src is None:
        pytest.skip(f"{module} is not installed (the interop extra)")
    assert re.sub(r"\s+", "", call) in src, (
        f"{module} no longer contains {call!r}: re-read how {fmt} loads its files on resume "
        "and update ckptkit/foreign/loads.py (and docs/formats.md)"
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
