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
framework source the fact was read from (``tests/unit/foreign/test_loads.py`` checks each
quoted call against the installed framework, so the table cannot silently go stale); every
reader reaches the verdict through :func:`needs_code_verdict`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptkit.verify.findings import ERROR, INFO, Severity


@dataclass(frozen=True)
class Source:
    """Where a framework's load of a file is written (checked against the installed package)."""

    module: str
    """The importable module holding the call, e.g. ``accelerate.checkpointing``."""
    call: str
    """Text that appears in that module's source (compared with whitespace removed)."""


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

    def matches(self, rel: str) -> bool:
        return re.fullmatch(self.pattern, rel) is not None


_TORCH_DEFAULT = Source("torch.serialization", "return pickle_module is None and not is_fbcode")
"""torch >= 2.6: ``torch.load(weights_only=None)`` means ``weights_only=True``."""
_TRAINER = "transformers.trainer"
_ACCELERATE = "accelerate.checkpointing"
_ACC_LOAD = Source("accelerate.utils.other", 'kwargs["weights_only"] = True')
"""Accelerate's ``load`` defaults to ``weights_only=True`` unless the caller says otherwise."""
_CRASH = "the framework refuses it too, so the resume crashes"

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
        ),
        FileLoad(
            r"scheduler\.pt",
            "torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "torch.load(os.path.join(checkpoint, SCHEDULER_NAME), "
                                      "weights_only=True)"),),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"scaler\.pt",
            "torch.load(os.path.join(checkpoint, SCALER_NAME), weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "torch.load(os.path.join(checkpoint, SCALER_NAME), "
                                      "weights_only=True)"),),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"rng_state(_\d+)?\.pth",
            "torch.load(rng_file, weights_only=True) (Trainer._load_rng_state)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_TRAINER, "checkpoint_rng_state = torch.load(rng_file, weights_only=True)"),),
            if_refused=_CRASH + " (the load is not guarded)",
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
            sources=(Source(_ACCELERATE, "load(input_model_file, map_location=map_location)"), _ACC_LOAD),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"optimizer(_\d+)?\.bin",
            "load(input_optimizer_file, map_location=map_location, **load_kwargs) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_optimizer_file, map_location=map_location, "
                                         "**load_kwargs)"), _ACC_LOAD),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"scheduler(_\d+)?\.bin",
            "load(input_scheduler_file, **load_kwargs) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_scheduler_file, **load_kwargs)"), _ACC_LOAD),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"sampler(_\d+)?\.bin",
            "load(input_sampler_file) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "dataloader.set_sampler(load(input_sampler_file))"), _ACC_LOAD),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"dl_state_dict(_\d+)?\.bin",
            "load(input_dataloader_state_dict_file, **load_kwargs) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(Source(_ACCELERATE, "load(input_dataloader_state_dict_file, **load_kwargs)"),
                     _ACC_LOAD),
            if_refused=_CRASH,
        ),
        FileLoad(
            r"scaler\.pt",
            "load(input_scaler_file) (weights_only=True)",
            on_resume=True,
            runs_code=False,
            sources=(
                Source(_ACCELERATE, "scaler_state = load(input_scaler_file)"),
                _ACC_LOAD,
                # FSDP2 loads the scaler itself, with torch's default (weights_only=True).
                Source("accelerate.accelerator", "scaler_state = torch.load(input_scaler_file)"),
                _TORCH_DEFAULT,
            ),
            if_refused=_CRASH,
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
            ),
            if_refused="load_state ignores the failure, so the resume silently runs on fresh "
            "RNG streams (and a file planted there is loaded on every resume)",
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


__all__ = ["FRAMEWORK", "LOADS", "FileLoad", "Source", "file_load", "needs_code_verdict"]
