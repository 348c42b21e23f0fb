"""The state view of a foreign checkpoint: what its reader hands the registered checks.

A foreign reader (one module per format, via :class:`ckptkit.verify.foreign.scan.Scan`) ends
with a :class:`ForeignState`, the :class:`~ckptkit.verify.view.StateView` the native
checks read: the component table (with the expectation applied), where each component was
found and how surely, the optimizers' per-parameter state shapes, the model's tensor
shapes and the NaN/Inf counts. Summaries use the native vocabulary (``step``,
``step_max``, ``last_epoch``, ``scale`` ...), so CK-S003/S004/S008 judge foreign state too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptkit.format import manifest as mf
from ckptkit.verify.foreign.structure import TensorMeta, as_int, is_floating, shape_of, value
from ckptkit.verify.view import (
    Expect,
    Found,
    NonFinite,
    OptimizerView,
    OptParam,
    apply_expect,
)

BUFFER_SUFFIXES = (
    "running_mean",
    "running_var",
    "num_batches_tracked",
    "inv_freq",
    "position_ids",
    "masked_bias",
)
"""State-dict entries that are buffers, never optimized (matching optimizer state by
position skips them)."""


@dataclass
class ForeignState:
    """A foreign checkpoint's :class:`~ckptkit.verify.view.StateView`."""

    table: dict[str, mf.Component]
    """The component table as read (requirements of the reader, before the expectation)."""
    where_found: dict[str, Found]
    expect: Expect | None
    expect_why: str
    opt_views: list[OptimizerView] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Model tensor shapes by state-dict name (the primary model)."""
    bad: dict[str, list[NonFinite]] = field(default_factory=dict)

    def components(self) -> Mapping[str, mf.Component]:
        return apply_expect(self.table, self.expect, why=self.expect_why)

    def found(self) -> Mapping[str, Found]:
        return self.where_found

    def expectation(self) -> tuple[Expect | None, str]:
        return self.expect, self.expect_why

    def part(self, name: str) -> Any:
        return None  # no native state tree: the checks read the summaries

    def optimizers(self) -> list[OptimizerView]:
        return self.opt_views

    def model_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self.shapes

    def model_names(self) -> Mapping[str, list[str]]:
        return {}

    def trainable(self) -> frozenset[str]:
        return frozenset()  # foreign state dicts do not say which tensors are parameters

    def nonfinite(self) -> Mapping[str, list[NonFinite]]:
        return self.bad


# --- optimizers ----------------------------------------------------------------------------------


def _moment_shapes(per: Any) -> dict[str, tuple[int, ...]] | None:
    per = value(per)
    if not isinstance(per, Mapping) or not per:
        return None
    out = {}
    for k, v in per.items():
        shp = shape_of(value(v))
        if isinstance(k, str) and shp is not None:
            out[k] = shp
    return out


def _flat_to_nested(sd: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """torchtitan's FQN-keyed flat optimizer state → ``({fqn: {moment: t}}, groups)``."""
    state: dict[str, dict[str, Any]] = {}
    hps: dict[str, dict[str, Any]] = {}
    for k, v in sd.items():
        if not isinstance(k, str):
            continue
        head, _, rest = k.partition(".")
        fqn, _, leaf = rest.rpartition(".")
        if not fqn:
            continue
        if head == "state":
            state.setdefault(fqn, {})[leaf] = v
        elif head == "param_groups":
            hps.setdefault(fqn, {})[leaf] = v
    groups: list[dict[str, Any]] = []
    for fqn in sorted(set(state) | set(hps)):
        hp = {k: value(v) for k, v in hps.get(fqn, {}).items()}
        for g in groups:
            if {k: v for k, v in g.items() if k != "params"} == hp:
                g["params"].append(fqn)
                break
        else:
            groups.append({**hp, "params": [fqn]})
    return state, groups


def optimizer_facts(sd: Any) -> tuple[dict[str, Any], list[dict[str, Any]], Mapping[Any, Any]]:
    """``(summary, groups, state)`` of an optimizer state dict (standard or flat FQN-keyed)."""
    sd = value(sd)
    if isinstance(value(sd.get("state")), Mapping) and "param_groups" in sd:
        state = value(sd["state"])
        groups = [dict(value(g)) for g in value(sd["param_groups"]) if isinstance(value(g), Mapping)]
    else:
        state, groups = _flat_to_nested(sd)
    steps = []
    for per in state.values():
        per = value(per)
        if isinstance(per, Mapping) and "step" in per:
            lazy = isinstance(per["step"], TensorMeta)
            s = as_int(per["step"])
            if s is not None:
                steps.append(s)
                if lazy:
                    break  # one read from disk: parameters step together
    with_state = sum(1 for per in state.values() if isinstance(value(per), Mapping) and value(per))
    n = sum(len(value(g.get("params")) or ()) for g in groups)
    summ: dict[str, Any] = {
        "num_param_groups": len(groups),
        "num_params": n,
        "num_params_with_state": with_state,
        "num_params_without_state": max(0, n - with_state),
    }
    if steps:
        summ["step_max"] = max(steps)
        summ["step_min"] = min(steps)
    lrs = [value(g.get("lr")) for g in groups]
    if lrs and all(isinstance(x, int | float) and not isinstance(x, bool) for x in lrs):
        summ["lrs"] = [float(x) for x in lrs if isinstance(x, int | float)]
    return summ, groups, state


def param_like(name: str, t: Any) -> bool:
    """Whether a state-dict entry can be an optimized parameter (floating, not a buffer)."""
    return is_floating(t) and not name.endswith(BUFFER_SUFFIXES)


def optimizer_view(
    sd: Any, model: Mapping[str, Any], *, alone: bool
) -> OptimizerView | None:
    """Build the checks' view of one optimizer state dict.

    Parameters are named by the state dict when it names them (FQN-keyed state from
    ``get_state_dict`` / torchtitan, or ``param_names``); otherwise, when this is the only
    optimizer and it optimizes exactly as many tensors as the model has parameters, they
    are matched to the model's tensors by position (``torch.optim`` numbers parameters in
    ``model.parameters()`` order), and the view says so. A match that disagrees with most
    moment shapes is dropped as wrong.
    """
    try:
        _summ, groups, state = optimizer_facts(sd)
    except (TypeError, AttributeError, ValueError):
        return None
    ids: list[tuple[int, int, Any]] = []
    for gi, g in enumerate(groups):
        params = value(g.get("params"))
        if not isinstance(params, list | tuple):
            return None
        ids.extend((gi, pi, pid) for pi, pid in enumerate(params))
    names: dict[Any, str] = {}
    by_position = False
    for g in groups:
        pn = value(g.get("param_names"))
        if isinstance(pn, list | tuple):
            for pid, n in zip(value(g.get("params")), pn, strict=False):
                if isinstance(n, str):
                    names[pid] = n
    if all(isinstance(pid, str) for _, _, pid in ids):
        names.update({pid: pid for _, _, pid in ids})
    elif not names and alone:
        cands = [n for n, t in model.items() if param_like(n, t)]
        if cands and len(cands) == len(ids):
            names = {pid: cands[i] for i, (_, _, pid) in enumerate(ids)}
            by_position = True
    out = []
    for gi, pi, pid in ids:
        per = state.get(pid, state.get(str(pid))) if isinstance(state, Mapping) else None
        name = names.get(pid)
        shape = shape_of(model[name]) if name is not None and name in model else None
        out.append(
            OptParam(
                index=pid if isinstance(pid, int | str) else str(pid),
                name=name or f"#{pi} of group {gi}",
                shape=shape,
                moments=_moment_shapes(per),
            )
        )
    if by_position and _mostly_wrong(out):
        out = [
            OptParam(p.index, f"#{i}", None, p.moments) for i, p in enumerate(out)
        ]
        by_position = False
    return OptimizerView(
        kind=None,
        params=out,
        groups=[{k: v for k, v in g.items() if k not in ("params", "param_names")} for g in groups],
        matched_by_position=by_position,
    )


def _mostly_wrong(params: list[OptParam]) -> bool:
    """A positional match that disagrees with more than one parameter in ten: then the match
    is more likely off (a frozen parameter, an unknown buffer) than the state wrong."""
    judged = wrong = 0
    for p in params:
        if p.shape is None or not p.moments:
            continue
        full = [s for s in p.moments.values() if s]
        if not full:
            continue
        judged += 1
        wrong += any(s != p.shape for s in full)
    return judged > 0 and wrong > max(1, judged // 10)


def count_tensors(node: Any) -> int:
    """Tensors in a nested mapping (for a model's summary)."""
    node = value(node)
    if isinstance(node, torch.Tensor | TensorMeta):
        return 1
    if isinstance(node, Mapping):
        return sum(count_tensors(v) for v in node.values())
    return 0


__all__ = ["ForeignState", "count_tensors", "optimizer_facts", "optimizer_view", "param_like"]
