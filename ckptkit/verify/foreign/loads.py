"""How each framework loads each file of its checkpoint on resume: the one table behind the
verdict on a pickle that needs code (``CK-F103``).

A framework checkpoint counts as good (``ckptkit verify``'s exit code, the run index and
``ls``, the resume picks of the integrations, ``prune`` and ``rollback``) only if every file
a resume will load can be loaded safely *as the framework will load it*. ckptkit reads every
pickle with ``torch.load(weights_only=True)`` and a narrow allow-list, so it never runs
pickled code itself; the framework may be less careful. What a file that needs code means
therefore depends on who loads it and how:

* loaded with ``torch.load(weights_only=False)`` or ``pickle.load`` (Accelerate's
  ``custom_checkpoint_<i>.pkl``, DCP's ``.metadata`` and its pickled items): resuming runs
  the pickled code. An **error**.
* loaded with ``weights_only=True`` (the Trainer's ``rng_state.pth``, ``optimizer.pt``; a
  Lightning ``.ckpt`` under torch's default): the framework refuses it too, and the resume
  crashes (or, for Accelerate's RNG files, silently resumes on fresh RNG streams). An
  **error**: a resume pick must take the previous checkpoint instead.
* not loaded on resume (the Trainer's ``training_args.bin``): **info**.

One rule, then: a file that needs code is an error when a resume loads it, info when none
does. :data:`LOADS` records, per layout, which files a resume loads and how, with the
framework source the fact was read from (``tests/checkpoint/test_foreign_loads.py`` checks each
quoted call against the installed framework, so the table cannot silently go stale); every
reader reaches the verdict through :func:`needs_code_verdict`.

"weights_only=True" is not one list, though: each load accepts torch's default globals
plus what its caller adds (:class:`AllowList`). ckptkit's own list (numpy arrays, dtypes
and scalars ...) reads files the framework's load refuses: a Lightning ``.ckpt`` holding an
``np.float64`` loads here and crashes Lightning's resume (torch's default adds no numpy).
So each weights-only entry names its load's list, taken from the installed framework when
it is importable (a static copy otherwise, checked against the framework by the tests),
and :func:`refused_by_load` holds every file a resume loads to it.
"""

from __future__ import annotations

import codecs
import importlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from ckptkit.checkpoint import safeload as _load
from ckptkit.verify.findings import ERROR, INFO, Severity


@dataclass(frozen=True)
class Source:
    """Where a framework's load of a file is written (checked against the installed package)."""

    module: str
    """The importable module holding the call, e.g. ``accelerate.checkpointing``."""
    call: str
    """Text that appears in that module's source (compared with whitespace removed)."""
    gone_in: str | None = None
    """The first release of the module's distribution without this call (None: every
    release ckptkit supports has it): the load stays in the table for the releases before."""


@dataclass(frozen=True)
class AllowList:
    """The globals a ``torch.load(weights_only=True)`` accepts: torch's default list plus
    what its caller adds (``torch.serialization.safe_globals`` / ``add_safe_globals``)."""

    name: str
    """Whose list it is, for messages: ``torch's default``, ``the Trainer's`` ..."""
    adds: str = ""
    """Where the caller's additions are defined (empty: it adds none)."""
    module: str | None = None
    """The framework module that holds the additions (None: nothing to import)."""
    read: Callable[[ModuleType], list[Any]] | None = None
    """How to take the additions from that module, as installed."""
    copy: Callable[[], list[Any]] = list
    """ckptkit's copy of the additions, built the way the framework builds them: used when
    the framework is not installed (the tests check it against the installed framework)."""

    def extra(self) -> tuple[list[Any], str]:
        """The additions and where they came from: the installed framework when it imports,
        else ckptkit's copy."""
        if self.module is None or self.read is None:
            return self.copy(), self.adds
        try:
            with warnings.catch_warnings():  # a framework's import-time deprecations
                warnings.simplefilter("ignore")
                mod = importlib.import_module(self.module)
            return list(self.read(mod)), f"{self.adds}, as installed"
        except Exception:  # not installed, or broken: the copy, and the message says so
            return self.copy(), f"ckptkit's copy of {self.adds}: {self.module} is not importable here"

    def names(self) -> tuple[frozenset[str], str]:
        """The globals this load accepts by name (torch's default included), and where the
        additions came from. Read once per process."""
        hit = _NAMES.get(self.name)
        if hit is None:
            extra, origin = self.extra()
            hit = _NAMES[self.name] = (_load.torch_default_names() | _load.global_names(extra), origin)
        return hit


_NAMES: dict[str, tuple[frozenset[str], str]] = {}


def _np_core() -> Any:
    return getattr(np, "_core", None) or np.core


def _trainer_copy() -> list[Any]:
    """``transformers.trainer_pt_utils.safe_globals()``'s list as transformers 5 builds it."""
    return [_np_core().multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _accelerate_copy() -> list[Any]:
    """``accelerate.utils.other.TORCH_SAFE_GLOBALS`` as accelerate 1.x builds it."""
    out = [_np_core().multiarray._reconstruct, np.ndarray, codecs.encode, np.dtype]
    dtypes = getattr(np, "dtypes", None)  # numpy >= 1.25
    if dtypes is not None:
        out.append(dtypes.UInt32DType)
    return out


TORCH_DEFAULT = AllowList("torch's default")
"""``torch.load(weights_only=True)`` with nothing added (and ``weights_only=None``, torch's
default since 2.6)."""
TRAINER = AllowList(
    "the Trainer's",
    adds="transformers.trainer_pt_utils.safe_globals()",
    module="transformers.trainer_pt_utils",
    read=lambda m: list(m.safe_globals().safe_globals),
    copy=_trainer_copy,
)
"""The Trainer's ``safe_globals()`` context (numpy arrays and dtypes, not scalars): only
around its load of ``rng_state.pth``."""
ACCELERATE = AllowList(
    "Accelerate's",
    adds="accelerate.utils.other.TORCH_SAFE_GLOBALS",
    module="accelerate.utils.other",
    read=lambda m: list(m.TORCH_SAFE_GLOBALS),
    copy=_accelerate_copy,
)
"""What Accelerate's ``load`` helper adds around every load (numpy arrays and dtypes, not
scalars)."""
CKPTKIT = AllowList(
    "ckptkit's own", adds="ckptkit.checkpoint.safeload.SAFE_GLOBALS", copy=lambda: list(_load.SAFE_GLOBALS)
)
"""What ckptkit reads every foreign pickle with: every list above is part of it (a test
holds that), so a file a framework's load accepts is never refused by ckptkit."""

ALLOW_LISTS = (TORCH_DEFAULT, TRAINER, ACCELERATE, CKPTKIT)


@dataclass(frozen=True)
class FileLoad:
    """How a resume of one layout loads the files whose relative path matches ``pattern``."""

    pattern: str
    """A regular expression (full match) of the path relative to the checkpoint."""
    loader: str
    """The call that loads it, as the framework writes it (for messages and docs)."""
    on_resume: bool
    """A resume loads it (False: the framework writes it but never reads it back)."""
    runs_code: bool
    """That load would run pickled code (``weights_only=False``, ``pickle.load``)."""
    sources: tuple[Source, ...] = ()
    """The framework code this entry was read from (empty: no framework, e.g. user code)."""
    if_refused: str = ""
    """What happens on resume when the load refuses the file (``weights_only=True``)."""
    allow: AllowList | None = None
    """The allow-list of that ``weights_only=True`` load (None: no pickle, a load that runs
    code, or not loaded on resume). Two loads of one file (a plain and an FSDP path): the
    narrower list, since the file must load on either."""

    def matches(self, rel: str) -> bool:
        return re.fullmatch(self.pattern, rel) is not None


_TORCH_DEFAULT = Source("torch.serialization", "return pickle_module is None and not is_fbcode")
"""torch >= 2.6: ``torch.load(weights_only=None)`` means ``weights_only=True``."""
_TRAINER = "transformers.trainer"
_ACCELERATE = "accelerate.checkpointing"
_ACC_LOAD = Source("accelerate.utils.other", 'kwargs["weights_only"] = True')
"""Accelerate's ``load`` defaults to ``weights_only=True`` unless the caller says otherwise."""
_ACC_ALLOW = Source("accelerate.utils.other", "torch.serialization.add_safe_globals(TORCH_SAFE_GLOBALS)")
"""... and adds :data:`ACCELERATE`'s list around the load."""
_CRASH = "the framework's load refuses it, so the resume crashes"

LOADS: dict[str, tuple[FileLoad, ...]] = {
    "hf-trainer": (
        FileLoad(
            r"(model|adapter_model)(-\d+-of-\d+)?\.safetensors",
            "safetensors.torch.load_file",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, 'safetensors.torch.load_file(safe_weights_file, device="cpu")'),),
        ),
        FileLoad(
            r"(pytorch_model|adapter_model)(-\d+-of-\d+)?\.bin",
            'torch.load(weights_file, map_location="cpu", weights_only=True)',
            on_resume=True,
            runs_code=False,
            sources=(
                Source(_TRAINER, 'torch.load(weights_file, map_location="cpu", weights_only=True)'),
                Source("transformers.trainer_utils",
                       'partial(torch.load, map_location="cpu", weights_only=True)'),
            ),
            if_refused=_CRASH,
            allow=TORCH_DEFAULT,
        ),
        FileLoad(
            r"optimizer\.(pt|bin)",
            "torch.load(os.path.join(checkpoint, OPTIMIZER_NAME), weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(
                Source(_TRAINER, "torch.load(os.path.join(checkpoint, OPTIMIZER_NAME), "
                                 "map_location=map_location, weights_only=True)"),
                Source("accelerate.utils.fsdp_utils",
                       "torch.load(input_optimizer_file, weights_only=True)"),
            ),
            if_refused=_CRASH,
            allow=TORCH_DEFAULT,
        ),
        FileLoad(
            r"scheduler\.pt",
            "torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "torch.load(os.path.join(checkpoint, SCHEDULER_NAME), "
                                      "weights_only=True)"),),
            if_refused=_CRASH,
            allow=TORCH_DEFAULT,
        ),
        FileLoad(
            r"scaler\.pt",
            "torch.load(os.path.join(checkpoint, SCALER_NAME), weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "torch.load(os.path.join(checkpoint, SCALER_NAME), "
                                      "weights_only=True)"),),
            if_refused=_CRASH,
            allow=TORCH_DEFAULT,
        ),
        FileLoad(
            r"rng_state(_\d+)?\.pth",
            "torch.load(rng_file, weights_only=True) under safe_globals() (Trainer._load_rng_state)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "with safe_globals(): check_torch_load_is_safe() "
                                      "checkpoint_rng_state = torch.load(rng_file, weights_only=True)"),),
            if_refused=_CRASH + " (the load is not guarded)",
            allow=TRAINER,
        ),
        FileLoad(
            r"trainer_state\.json",
            "TrainerState.load_from_json",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "TrainerState.load_from_json(os.path.join("
                                      "resume_from_checkpoint, TRAINER_STATE_NAME))"),),
        ),
        FileLoad(
            r"training_args\.bin",
            "not loaded (Trainer only writes it: torch.save(self.args, ...))",
            on_resume=False,
            runs_code=False,
            sources=(Source(_TRAINER, "torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))"),),
        ),
    ),
    "accelerate": (
        FileLoad(
            r"model(_\d+)?\.safetensors",
            "safetensors.torch.load_model",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load_model(model, input_model_file, device=str(map_location)"),),
        ),
        FileLoad(
            r"pytorch_model(_\d+)?\.bin",
            "load(input_model_file, map_location=map_location) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_model_file, map_location=map_location)"), _ACC_LOAD, _ACC_ALLOW),
            if_refused=_CRASH,
            allow=ACCELERATE,
        ),
        FileLoad(
            r"optimizer(_\d+)?\.bin",
            "load(input_optimizer_file, map_location=map_location, **load_kwargs) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_optimizer_file, map_location=map_location, "
                                         "**load_kwargs)"), _ACC_LOAD, _ACC_ALLOW),
            if_refused=_CRASH,
            allow=ACCELERATE,
        ),
        FileLoad(
            r"scheduler(_\d+)?\.bin",
            "load(input_scheduler_file, **load_kwargs) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_scheduler_file, **load_kwargs)"), _ACC_LOAD, _ACC_ALLOW),
            if_refused=_CRASH,
            allow=ACCELERATE,
        ),
        FileLoad(
            r"sampler(_\d+)?\.bin",
            "load(input_sampler_file) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "dataloader.set_sampler(load(input_sampler_file))"), _ACC_LOAD, _ACC_ALLOW),
            if_refused=_CRASH,
            allow=ACCELERATE,
        ),
        FileLoad(
            r"dl_state_dict(_\d+)?\.bin",
            "load(input_dataloader_state_dict_file, **load_kwargs) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_dataloader_state_dict_file, **load_kwargs)"),
                     _ACC_LOAD, _ACC_ALLOW),
            if_refused=_CRASH,
            allow=ACCELERATE,
        ),
        FileLoad(
            r"scaler\.pt",
            "load(input_scaler_file) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(
                Source(_ACCELERATE, "scaler_state = load(input_scaler_file)"),
                _ACC_LOAD,
                # Before 1.16, FSDP2 loaded the scaler itself, with torch's default
                # (weights_only=True).
                Source(
                    "accelerate.accelerator",
                    "scaler_state = torch.load(input_scaler_file)",
                    gone_in="1.16.0",
                ),
                _TORCH_DEFAULT,
            ),
            if_refused=_CRASH,
            # The narrower of the two lists: the file must load on either path.
            allow=TORCH_DEFAULT,
        ),
        FileLoad(
            r"random_states_\d+\.pkl",
            "load(random_states_<rank>.pkl) (weights_only=True; a failure is logged and ignored)",
            on_resume=True,
            runs_code=False,
            sources=(
                Source(_ACCELERATE, 'states = load(input_dir.joinpath(f"{RNG_STATE_NAME}_{process_index}.pkl"))'),
                Source(_ACCELERATE, 'logger.info("Could not load random states")'),
                _ACC_LOAD,
                _ACC_ALLOW,
            ),
            if_refused="load_state ignores the failure, so the resume silently runs on fresh "
            "RNG streams (and a file planted there is loaded on every resume)",
            allow=ACCELERATE,
        ),
        FileLoad(
            r"custom_checkpoint_\d+\.pkl",
            'load(load_location, map_location="cpu", weights_only=False) (load_custom_state)',
            on_resume=True,
            runs_code=True,
            sources=(Source(_ACCELERATE, 'load(load_location, map_location="cpu", weights_only=False)'),),
        ),
    ),
    "lightning": (
        FileLoad(
            r".+",
            "torch.load(f, map_location=..., weights_only=weights_only) with weights_only=None "
            "(Trainer.fit(ckpt_path=...), fabric.load): torch's default, weights_only=True "
            "(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 makes it False, and the code runs)",
            on_resume=True,
            runs_code=False,
            sources=(
                Source("lightning.fabric.utilities.cloud_io",
                       "torch.load(f, map_location=map_location, weights_only=weights_only,)"),
                Source("lightning.fabric.utilities.cloud_io", "weights_only: Optional[bool] = None"),
                _TORCH_DEFAULT,
            ),
            if_refused=_CRASH,
            allow=TORCH_DEFAULT,
        ),
    ),
    "torch-save": (
        FileLoad(
            r".+",
            "torch.load(path) in the training script: weights_only=True by default since "
            "torch 2.6; a script passing weights_only=False runs the code",
            on_resume=True,
            runs_code=False,
            sources=(_TORCH_DEFAULT,),
            if_refused="a weights_only=True load refuses it (the resume crashes) and a "
            "weights_only=False one runs the code",
            # The script's own list is unknown (it may add numpy, as ckptkit does): the file
            # is held to what ckptkit itself reads.
            allow=CKPTKIT,
        ),
    ),
    "dcp": (
        FileLoad(
            r"\.metadata",
            "pickle.load(metadata_file) (FileSystemReader.read_metadata)",
            on_resume=True,
            runs_code=True,
            sources=(Source("torch.distributed.checkpoint.filesystem", "metadata = pickle.load(metadata_file)"),),
        ),
        FileLoad(
            r".+\.distcp",
            "tensors read as raw bytes; pickled (BYTE_IO) items with "
            "torch.load(value, weights_only=False) (DefaultLoadPlanner.load_bytes)",
            on_resume=True,
            runs_code=True,
            sources=(Source("torch.distributed.checkpoint.default_planner",
                            "torch.load(value, weights_only=False)"),),
        ),
    ),
    "safetensors": (
        FileLoad(r".+", "safetensors (no pickle)", on_resume=True, runs_code=False),
    ),
}
"""Per layout (the ``--format`` names), which files a resume loads and how; first match wins."""

FRAMEWORK = {
    "hf-trainer": "the Trainer",
    "accelerate": "Accelerate's load_state",
    "lightning": "Lightning",
    "torch-save": "a training script",
    "dcp": "torch.distributed.checkpoint.load",
    "safetensors": "safetensors",
}
"""Who loads a layout's files on resume (for messages)."""


def file_load(fmt: str, rel: str) -> FileLoad | None:
    """The entry of :data:`LOADS` for file ``rel`` of a ``fmt`` checkpoint, or None.

    Example:
        >>> file_load("accelerate", "custom_checkpoint_0.pkl").runs_code
        True
        >>> file_load("hf-trainer", "training_args.bin").on_resume
        False
    """
    return next((e for e in LOADS.get(fmt, ()) if e.matches(rel)), None)


def needs_code_verdict(fmt: str, rel: str) -> tuple[Severity, str]:
    """What a pickle that needs code means in file ``rel`` of a ``fmt`` checkpoint.

    Returns:
        ``(severity, why)``: ``ERROR`` when a resume loads the file (``why`` says how and
        what follows: the code runs, or the resume fails), ``INFO`` when no resume does.
        A file the table does not know is an error: it was read as resume state, and how
        the framework treats it cannot be vouched for.

    Example:
        >>> sev, why = needs_code_verdict("accelerate", "custom_checkpoint_0.pkl")
        >>> str(sev), "would run that code" in why
        ('error', True)
        >>> str(needs_code_verdict("hf-trainer", "training_args.bin")[0])
        'info'
    """
    who = FRAMEWORK.get(fmt, fmt)
    e = file_load(fmt, rel)
    if e is None:
        return ERROR, f"ckptkit does not know how {who} loads {rel} on resume"
    if not e.on_resume:
        return INFO, f"{who} does not load it on resume"
    if e.runs_code:
        return ERROR, f"{who} loads it with {e.loader}: resuming from this checkpoint would run that code"
    return ERROR, f"{who} loads it with {e.loader}: {e.if_refused}"


@dataclass(frozen=True)
class Refusal:
    """A file ckptkit read that the load a resume uses refuses (``CK-F103`` as an error)."""

    refused: tuple[str, ...]
    """The globals its pickle names outside that load's allow-list."""
    message: str
    """What, which load, and what follows on resume."""
    hint: str
    """The fix."""


REFUSAL_HINT = (
    "save plain Python numbers, lists and tensors instead of numpy values (float(x) or "
    "x.item() for a numpy scalar, torch.from_numpy(a) for an array), or load it with the "
    "framework's allow-list extended (torch.serialization.add_safe_globals([...]) with "
    "these globals, before the resume, if you trust the file); until then, resume from an "
    "earlier checkpoint"
)


def refused_by_load(fmt: str, rel: str, path: Path) -> Refusal | None:
    """Whether the load a resume of a ``fmt`` checkpoint uses for its file ``rel`` (at
    ``path``) refuses it: globals its pickle names outside that load's :class:`AllowList`,
    or an object of a type off that list (torch checks both).

    For a file ckptkit itself read with its own, wider list (:data:`CKPTKIT`): an
    ``np.float64`` in a Lightning ``.ckpt`` loads here and crashes Lightning's resume. The
    pickle is walked first, never run: a file whose globals are all on torch's default
    list needs no framework list (and imports no framework), one naming a global off the
    list is refused by name; only when every name is on the list is the file loaded with
    that list, as the framework will load it (only objects on the list are built).

    Returns:
        None when the file loads as the framework will load it, when no resume loads it,
        or when that load has no allow-list (no pickle, or a load that runs code: judged by
        :func:`needs_code_verdict` instead); else the :class:`Refusal`.

    Example:
        >>> import tempfile, pathlib, numpy, torch
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "epoch=0-step=5.ckpt"
        >>> torch.save({"global_step": 5, "best": numpy.float64(1.0)}, p)
        >>> r = refused_by_load("lightning", p.name, p)
        >>> [g.rsplit(".", 1)[1] for g in r.refused], "resume crashes" in r.message
        (['scalar', 'dtype'], True)
        >>> refused_by_load("torch-save", p.name, p) is None  # ckptkit's own list reads it
        True
    """
    e = file_load(fmt, rel)
    if e is None or not e.on_resume or e.allow is None:
        return None
    outside = _load.refused_globals(path, allowed=())  # beyond torch's default list
    if not outside:
        return None  # torch's default reads it, so every list does
    allowed, origin = e.allow.names()
    # What this process added with torch.serialization.add_safe_globals counts too: a
    # framework loading here (a resume pick in the training process) accepts it as well.
    allowed |= _load.global_names(torch.serialization.get_safe_globals())
    held = f"{e.allow.name} allow-list" + (
        f" (torch's default plus {origin})" if e.allow.adds else ""
    )
    refused = tuple(g for g in outside if g not in allowed)
    if refused:
        names = ", ".join(refused[:12]) + (" …" if len(refused) > 12 else "")
        what = f"it names {names}, outside {held}"
    else:
        # Every global is on the list by name, but torch also checks the type of each
        # object it builds (a float32 array's dtype is a numpy.dtypes.Float32DType): so
        # load it as the framework will, with that list (nothing on it runs code).
        why = _load.weights_only_refusal(path, e.allow.extra()[0])
        if why is None:
            return None
        refused = tuple(re.findall(r"<class '([\w.]+)'>", why))
        what = f"under {held}: {why}"
    who = FRAMEWORK.get(fmt, fmt)
    return Refusal(
        refused=refused,
        message=(
            f"{who} cannot load it on resume: {what}; ckptkit's own list reads it "
            f"(nothing was run). {who} loads it with {e.loader}: {e.if_refused}"
        ),
        hint=REFUSAL_HINT,
    )


__all__ = [
    "ACCELERATE",
    "ALLOW_LISTS",
    "CKPTKIT",
    "FRAMEWORK",
    "LOADS",
    "TORCH_DEFAULT",
    "TRAINER",
    "AllowList",
    "FileLoad",
    "Refusal",
    "Source",
    "file_load",
    "needs_code_verdict",
    "refused_by_load",
]
