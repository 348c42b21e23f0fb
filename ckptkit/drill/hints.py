"""The drill's triage playbook: what to look at and fix for each component a diagnosis names."""

from __future__ import annotations

HINTS: dict[str, str] = {
    "none": "nothing to fix: the resume is exact",
    "progress": "the step counter is not restored: pass step=/Progress to TrainState and "
    "restore it (ckptkit.TrainState(..., step=...)); check 'ckptkit inspect CKPT' shows "
    "the progress component",
    "hyperparameters": "the resumed run uses other hyper-parameters (LR scaled by a constant): "
    "compare the launch flags/config of both runs; restore the optimizer's param_groups "
    "and the scheduler's base_lrs from the checkpoint instead of overriding them",
    "scheduler": "the LR scheduler is not saved/restored (or is stepped a different number "
    "of times): pass scheduler= to TrainState, restore it after the optimizer, and do not "
    "step it during restore",
    "scaler": "the AMP GradScaler is not saved/restored (or a new one is used after the "
    "restore): pass scaler= to TrainState and keep using that scaler",
    "data-version": "the same sample ids now have other content: the dataset or tokenizer "
    "changed between save and resume; pin the data snapshot (TrainState(data={...}))",
    "sampler": "the data order is not resumed: use a stateful sampler "
    "(ckptkit.ResumableSampler or torchdata's StatefulDataLoader), pass it as sampler= "
    "to TrainState, and do not rebuild, re-seed or reset it after the restore",
    "rng": "the RNG state is not restored, is re-seeded after the restore, or something "
    "draws from it between the restore and the first step (iter(DataLoader) without a "
    "generator=): seed before restoring, give the DataLoader a generator= or iterate it "
    "with ResumableSampler.batches(loader)",
    "optimizer": "the optimizer state (Adam moments, step counts) is not restored: pass "
    "optimizer= to TrainState and do not rebuild or clear the optimizer after restoring",
    "model": "the loss differs while all step inputs are equal: model weights/buffers are "
    "not fully restored, or randomness the records do not fingerprint (another generator, "
    "a CUDA RNG) differs",
    "unknown": "compare the differing fields in the report; docs/drills.md#triage lists "
    "what each signal points to",
}
"""The triage playbook: what to look at for each component (docs/drills.md#triage)."""


WEIGHTS_CHANGED_HINT = (
    "the model's weights changed after mgr.restore() (the resume guard's CK-D092 names "
    "them): load other weights (pretrained, a frozen part) and cast the model before the "
    "restore, never after it"
)
"""The ``model`` fix when the guard saw the weights change after the restore."""


WORKERS_HINT = (
    "the DataLoader's workers restart their random streams from a base seed drawn at every "
    "iter(), so random augmentation in Dataset.__getitem__ with num_workers > 0 differs "
    "after a resume while the main process's RNG is equal: make it a function of the sample "
    "(a torch.Generator seeded by the index, and the epoch if it should vary), or augment "
    "in the main process"
)


ACCUM_HINT = (
    "the gradient-accumulation counter (micro-batches since the last optimizer step) is not "
    "saved or is reset on resume, so the optimizer steps at other micro-steps: keep it in the "
    "TrainState (extra={'micro': ...}, with the gradients accumulated so far) or save only "
    "right after an optimizer step -- " + HINTS["progress"]
)


def extra_hint(name: str) -> str:
    return (f"'{name}' is saved but not restored as it was (e.g. an EMA rebuilt from the "
            "current weights after the restore): pass it to the TrainState (extra= or its "
            "own component) and restore it from the checkpoint instead of re-creating it; "
            "'ckptkit diff' of the two final checkpoints shows every tensor that differs")


__all__ = [
    "ACCUM_HINT",
    "HINTS",
    "WEIGHTS_CHANGED_HINT",
    "WORKERS_HINT",
    "extra_hint",
]
