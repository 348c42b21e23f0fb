"""``diff`` within a tolerance: a non-finite number differs from every finite one, both ways.

``|b - a| <= atol + rtol * |a|`` alone calls ``a = inf`` close to every finite ``b`` (and to
``-inf``) as soon as ``rtol > 0``, but not ``b = inf`` close to a finite ``a``: the verdict
depended on which checkpoint came first. One rule (:class:`~ckptkit.verify.statediff.Tolerance`)
for tensors element by element and for other leaves value by value, in both directions.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptkit.cli import main
from ckptkit.verify.statediff import Tolerance, diff, tensor_diff
from ckptkit.verify.statediff import _value_diff as value_diff

INF, NAN = math.inf, math.nan
TOLERANCES = [Tolerance(rtol=1e-3), Tolerance(atol=1e-3), Tolerance(atol=1.0, rtol=1.0)]
numbers = st.one_of(
    st.sampled_from([INF, -INF, NAN, 0.0, -0.0, 1.0, 1e30]),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)


def _equal(a: float, b: float, tol: Tolerance) -> tuple[bool, bool]:
    """(tensor verdict, value verdict) for one pair of numbers."""
    t = tensor_diff("w", torch.tensor([a], dtype=torch.float64),
                    torch.tensor([b], dtype=torch.float64), tol)
    return t.equal, value_diff("w", a, b, tol, None).equal


@pytest.mark.parametrize("tol", TOLERANCES, ids=repr)
@pytest.mark.parametrize("bad", [INF, -INF, NAN])
@pytest.mark.parametrize("finite", [0.0, 1.0, -3.5, 1e300])
def test_a_non_finite_number_differs_from_every_finite_one_in_both_directions(
    tol: Tolerance, bad: float, finite: float
) -> None:
    assert _equal(bad, finite, tol) == (False, False)
    assert _equal(finite, bad, tol) == (False, False)


@pytest.mark.parametrize("tol", TOLERANCES, ids=repr)
def test_nan_equals_nan_inf_equals_inf_and_differs_from_minus_inf(tol: Tolerance) -> None:
    assert _equal(NAN, NAN, tol) == (True, True)
    assert _equal(INF, INF, tol) == (True, True)
    assert _equal(-INF, -INF, tol) == (True, True)
    assert _equal(INF, -INF, tol) == (False, False)
    assert _equal(-INF, INF, tol) == (False, False)


@settings(max_examples=300, deadline=None)
@given(a=numbers, b=numbers, atol=st.sampled_from([0.0, 1e-3, 1.0]),
       rtol=st.sampled_from([0.0, 1e-3, 1.0]))
def test_tensors_and_values_follow_one_rule(a: float, b: float, atol: float, rtol: float) -> None:
    tol = Tolerance(atol=atol, rtol=rtol)
    t, v = _equal(a, b, tol)
    if not tol.bitwise:  # bitwise, tensors compare bytes (-0.0 != 0.0); values compare numbers
        assert t == v, (a, b, tol)
    if math.isfinite(a) != math.isfinite(b):
        assert not t and not v
    expected = a == b or (math.isnan(a) and math.isnan(b)) or (
        math.isfinite(a) and math.isfinite(b) and abs(b - a) <= atol + rtol * abs(a))
    assert v == expected


def test_a_value_past_every_float_is_compared_exactly() -> None:
    tol = Tolerance(rtol=1e-3)
    assert value_diff("n", 10**400, 1.5, tol, None).status == "changed"
    assert value_diff("n", 1.5, 10**400, tol, None).status == "changed"
    assert value_diff("n", 10**400, 10**400, tol, None).equal


@pytest.fixture
def inf_and_finite(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"model": {"w": torch.tensor([1.0, INF])}, "loss": INF}, a)
    torch.save({"model": {"w": torch.tensor([1.0, 2.0])}, "loss": 2.0}, b)
    return a, b


@pytest.mark.parametrize("flip", [False, True], ids=["inf-first", "finite-first"])
def test_library_diff_calls_inf_different_from_finite_in_both_orders(
    inf_and_finite: tuple[Path, Path], flip: bool
) -> None:
    a, b = inf_and_finite[::-1] if flip else inf_and_finite
    sd = diff(a, b, tolerance=Tolerance(rtol=0.5))
    assert sd.different and not sd.equal
    model = next(c for c in sd.components if c.name == "model")
    assert [t.status for t in model.tensors] == ["changed"]


@pytest.mark.parametrize("flip", [False, True], ids=["inf-first", "finite-first"])
def test_cli_diff_rtol_exits_1_in_both_orders(inf_and_finite: tuple[Path, Path], flip: bool) -> None:
    a, b = inf_and_finite[::-1] if flip else inf_and_finite
    res = CliRunner().invoke(main, ["diff", str(a), str(b), "--rtol", "0.5"],
                             catch_exceptions=False)
    assert res.exit_code == 1, res.output
