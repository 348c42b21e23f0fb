"""The tiny LM's data: a synthetic token corpus, its batches and the order they come in.

A sparse first-order Markov chain generates variable-length sequences (:func:`make_corpus`);
:class:`Corpus` gives each sample a content hash, :func:`collate` pads a batch, and
:func:`next_batch` / :func:`peek_batch` read the :class:`~ckptkit.ResumableSampler`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence

import numpy as np
import torch
import xxhash

import ckptkit

PAD = 0
"""Padding token id; real tokens are 1..vocab-1."""


def make_corpus(
    num: int, *, seed: int, version: str, vocab: int = 256, min_len: int = 8, max_len: int = 64
) -> list[torch.Tensor]:
    """Generate ``num`` token sequences from a sparse first-order Markov chain.

    The chain (each token has four likely successors) depends only on ``seed``, so the loss
    falls well below ``log(vocab)``; the sampled sequences and their lengths depend on
    ``(seed, version)``, so another data version is another snapshot of the same language.
    """
    chain = np.random.default_rng(xxhash.xxh3_64_intdigest(f"tiny_lm.chain:{seed}".encode()))
    succ = chain.integers(1, vocab, size=(vocab, 4))
    cum = np.cumsum(chain.dirichlet(np.ones(4), size=vocab), axis=1)
    rng = np.random.default_rng(xxhash.xxh3_64_intdigest(f"tiny_lm.data:{seed}:{version}".encode()))
    lengths = rng.integers(min_len, max_len + 1, size=num)
    tokens = np.empty((num, max_len), dtype=np.int64)
    tokens[:, 0] = rng.integers(1, vocab, size=num)
    for t in range(1, max_len):
        prev = tokens[:, t - 1]
        k = (rng.random(num)[:, None] > cum[prev]).sum(axis=1).clip(max=3)
        tokens[:, t] = succ[prev, k]
    return [torch.from_numpy(tokens[i, : lengths[i]].copy()) for i in range(num)]


class Corpus(Sequence[torch.Tensor]):
    """The token sequences, indexable, with a content hash per sample (``sample_hash``).

    A :class:`~ckptkit.ResumableSampler` built on it records each sample's hash next to
    its id, so a drill sees "same ids, other content" even when the script logs only loss.
    """

    def __init__(self, data: list[torch.Tensor]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        return self.data[i]

    def sample_hash(self, i: int) -> str:
        """xxh3-64 of sample ``i``'s tokens (8 hex digits)."""
        return xxhash.xxh3_64_hexdigest(self.data[i].numpy().tobytes())[:8]


def corpus_id(corpus: Sequence[torch.Tensor]) -> str:
    """Content hash of a corpus (the data snapshot id recorded in checkpoints)."""
    h = xxhash.xxh3_64()
    for seq in corpus:
        h.update(len(seq).to_bytes(4, "little"))
        h.update(seq.numpy().tobytes())
    return h.hexdigest()


def collate(seqs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a batch; return (inputs, targets) with padded targets set to -100."""
    width = max(len(s) for s in seqs)
    batch = torch.full((len(seqs), width), PAD, dtype=torch.int64)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
    targets = batch[:, 1:].clone()
    targets[targets == PAD] = -100
    return batch[:, :-1].contiguous(), targets


def next_batch(sampler: ckptkit.ResumableSampler, batch_size: int) -> list[int]:
    """Take the next batch of indices, starting the next epoch when this one is done.

    The last batch of an epoch may be short; the epoch rolls over *before* a batch is
    drawn, so a checkpoint taken at the end of an epoch resumes into the next one.
    """
    if sampler.position >= len(sampler):
        sampler.set_epoch(sampler.epoch + 1)
    return list(itertools.islice(iter(sampler), batch_size))


def peek_batch(sampler: ckptkit.ResumableSampler, batch_size: int) -> tuple[int, list[int]]:
    """The (epoch, indices) :func:`next_batch` will return next, without advancing."""
    if sampler.position >= len(sampler):
        probe = copy.deepcopy(sampler)
        probe.set_epoch(sampler.epoch + 1)
        return probe.epoch, probe.next_indices(batch_size)
    return sampler.epoch, sampler.next_indices(batch_size)
