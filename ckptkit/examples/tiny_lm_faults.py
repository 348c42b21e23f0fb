"""The faults ``--fault`` injects: the classic resume bugs, applied right after a restore,
and the instabilities induced during training.
"""

from __future__ import annotations

import argparse

import torch

import ckptkit
from ckptkit.examples.tiny_lm_data import Corpus, make_corpus
from ckptkit.examples.tiny_lm_model import set_seed

FAULT_COMPONENTS = {
    "none": "none",
    "no-rng": "rng",
    "no-sampler": "sampler",
    "sampler-reshuffle": "sampler",
    "no-scheduler": "scheduler",
    "sched-off-by-one": "scheduler",
    "no-moments": "optimizer",
    "no-scaler": "scaler",
    "step-reset": "progress",
    "data-version": "data-version",
    "lr-changed": "hyperparameters",
}
"""Each ``--fault`` and the component a drill should name for it."""
FAULTS = tuple(FAULT_COMPONENTS)
"""The resume faults (applied at a restore; a drill should name their component)."""
INSTABILITIES = ("lr-spike",)
"""Faults that are no resume bug but an instability induced during training (see
:func:`~ckptkit.examples.tiny_lm_schedule.lr_spike`): for the stability watch and the automatic recovery, not for drills."""


def inject_fault(
    fault: str,
    args: argparse.Namespace,
    ts: ckptkit.TrainState,
    *,
    corpus: Corpus,
    sampler: ckptkit.ResumableSampler,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR,
) -> tuple[Corpus, ckptkit.ResumableSampler]:
    """Apply one classic resume bug after a restore; return the (corpus, sampler) to use.

    Faults that leave a component out of the TrainState (``no-sampler``, ``no-scheduler``,
    ``no-scaler``) already happened at construction; the others are done here.
    """
    if fault == "no-rng":
        set_seed(args.seed)  # the classic: seeding after loading the checkpoint
    elif fault == "sampler-reshuffle":
        other = ckptkit.ResumableSampler(
            sampler.data_len,
            seed=sampler.seed + 1,
            shuffle=True,
            lengths=sampler.lengths,
            bucket_size=sampler.bucket_size,
            batch_size=sampler.batch_size,
        )
        other.load_state_dict({**sampler.state_dict(), "seed": other.seed})
        sampler = other
    elif fault == "sched-off-by-one":
        sched.last_epoch -= 1
    elif fault == "no-moments":
        opt.state.clear()
    elif fault == "step-reset":
        ts.step = 0
    elif fault == "data-version":
        # Same ids, other content: the dataset object the sampler reads is refilled.
        corpus.data = make_corpus(
            args.num_seqs,
            seed=args.data_seed,
            version=f"{args.data_version}+changed",
            vocab=args.vocab,
            max_len=args.max_len,
        )
    elif fault == "lr-changed":
        for group in opt.param_groups:
            group["lr"] *= 1.1
            group["initial_lr"] *= 1.1
        sched.base_lrs = [lr * 1.1 for lr in sched.base_lrs]
    return corpus, sampler
