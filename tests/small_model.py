"""The tests' tiny model and a trained state of it, importable by helper modules.

Not in ``conftest.py``: a helper (``damaged_run.py``) that imported ``conftest`` got
whichever ``conftest`` module was imported first (a subfolder may have its own), so a run of
those files together failed to collect.
"""

from __future__ import annotations

from typing import Any

import torch


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
