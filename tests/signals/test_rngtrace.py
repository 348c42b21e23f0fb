"""rngtrace: how far each global generator moved between two snapshots, and who drew."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptkit.signals import rngtrace
from ckptkit.signals.rngtrace import Draws, RngSnapshot, draws_between, explain


def test_nothing_drawn_is_an_empty_result_and_an_equal_fingerprint() -> None:
    a = RngSnapshot.take()
    b = RngSnapshot.take()
    assert draws_between(a, b) == {}
    assert a == b and a.fingerprint() == b.fingerprint()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 3000), floats=st.integers(0, 3000))
def test_torch_words_are_counted_exactly(n: int, floats: int) -> None:
    """torch.rand draws one 32-bit word per float; random_() on int64 draws two."""
    torch.manual_seed(n)
    a = RngSnapshot.take()
    torch.rand(floats)
    for _ in range(n % 7):
        torch.empty((), dtype=torch.int64).random_()
    d = draws_between(a, RngSnapshot.take())
    want = floats + 2 * (n % 7)
    assert (d["torch"].words if "torch" in d else 0) == want


def test_python_and_numpy_are_counted_too() -> None:
    random.seed(1)
    np.random.seed(1)
    a = RngSnapshot.take()
    random.getrandbits(32 * 700)  # crosses a twist
    np.random.randint(0, 2**31, size=5, dtype=np.int64)
    d = draws_between(a, RngSnapshot.take())
    assert d["python"].words == 700
    assert d["numpy"].words is not None and d["numpy"].words > 0
    assert "torch" not in d


@pytest.mark.parametrize("same_seed", [True, False])
def test_a_reseed_is_found_with_its_seed(same_seed: bool) -> None:
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    torch.rand(3000)
    random.random()
    np.random.rand(3)
    a = RngSnapshot.take()
    seed = 5 if same_seed else 1234
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.rand(10)
    d = draws_between(a, RngSnapshot.take(), seeds=[5])
    assert d["torch"].words is None and d["torch"].seed == seed and d["torch"].after_seed == 10
    assert d["python"].seed == seed and d["numpy"].seed == seed
    what, fix = explain(d)
    assert f"torch.manual_seed({seed})" in what and "after the restore" in what
    assert "before mgr.restore()" in fix


def test_a_dataloader_iterator_is_named_as_the_likely_caller() -> None:
    a = RngSnapshot.take()
    iter(torch.utils.data.DataLoader(list(range(4))))
    d = draws_between(a, RngSnapshot.take())
    assert rngtrace.pattern(d) == {"torch": 2}
    what, fix = explain(d)
    assert "iter(DataLoader)" in what and "generator=" in fix


def test_other_draws_name_the_generators() -> None:
    what, _ = explain({"numpy": Draws("numpy", 6), "python": Draws("python", 2)})
    assert "np.random" in what and "random.*" in what
