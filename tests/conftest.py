"""Shared factories: tiny models, training states and saved checkpoints, all built in code."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptkit

os.environ.setdefault("CKPTKIT_NO_PROGRESS", "1")


class TinyLM(torch.nn.Module):
    """A two-layer causal LM small enough for unit tests, with tied embeddings."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.block = torch.nn.Sequential(
            torch.nn.Linear(dim, dim * 2), torch.nn.GELU(), torch.nn.Dropout(0.1),
            torch.nn.Linear(dim * 2, dim),
        )
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        return self.head(self.norm(h + self.block(h)))


@pytest.fixture
def tiny_model() -> Callable[..., TinyLM]:
    def make(seed: int = 0, **kw: Any) -> TinyLM:
        torch.manual_seed(seed)
        return TinyLM(**kw)

    return make


def trained_state(seed: int = 0, steps: int = 3) -> dict[str, Any]:
    """A model + AdamW state after a few steps, as a plain nested dict."""
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 8))
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": steps}


@pytest.fixture
def train_state() -> Callable[..., dict[str, Any]]:
    return trained_state


@pytest.fixture
def saved_ckpt(tmp_path: Path) -> Callable[..., Path]:
    """Save a small training state under tmp_path and return the checkpoint directory."""

    def make(name: str = "ckpt", **kw: Any) -> Path:
        d = tmp_path / name
        ckptkit.save(trained_state(), d, step=3, **kw)
        return d

    return make
