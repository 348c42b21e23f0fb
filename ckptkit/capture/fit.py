"""Does a saved set of tensors fit a live one? Keys, shapes and dtypes, named one by one.

A load into existing tensors (``ckptkit.load(into=...)``, a restore into a model) must
never leave some tensors at their random init while reporting success: every missing or
unexpected key and every shape or dtype mismatch is found here, before anything is
copied, and named (the first few, plus a count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptkit._repr import brief
from ckptkit.format.tree import TAG, decode_key

SHOW = 5
"""How many names a summary spells out before it gives a count."""


@dataclass
class FitReport:
    """How a saved mapping of tensors fits a live one.

    Example:
        >>> r = fit_report({"w": torch.zeros(2), "b": torch.zeros(1)}, {"w": torch.ones(3)})
        >>> r.ok, r.missing, [m[0] for m in r.mismatched]
        (False, ['b'], ['w'])
    """

    loaded: list[str] = field(default_factory=list)
    """Keys present on both sides with the same shape and dtype."""
    missing: list[str] = field(default_factory=list)
    """Keys the live side has and the checkpoint lacks (they would keep their current values)."""
    unexpected: list[str] = field(default_factory=list)
    """Keys the checkpoint has and the live side lacks (they would be dropped)."""
    mismatched: list[tuple[str, str, str]] = field(default_factory=list)
    """``(key, saved, live)`` where shape or dtype differ (e.g. ``float32[8, 8]``)."""

    @property
    def ok(self) -> bool:
        """True when every key fits exactly."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """One line naming the first few of each problem and how many there are."""
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} missing from the checkpoint ({_few(self.missing)})")
        if self.unexpected:
            parts.append(
                f"{len(self.unexpected)} in the checkpoint but not here ({_few(self.unexpected)})"
            )
        if self.mismatched:
            parts.append(
                f"{len(self.mismatched)} with another shape or dtype ("
                + _few([f"{k}: saved {a}, here {b}" for k, a, b in self.mismatched])
                + ")"
            )
        return "; ".join(parts) or f"all {len(self.loaded)} tensors fit"

    def __repr__(self) -> str:
        return brief(
            "FitReport",
            ok=self.ok,
            loaded=len(self.loaded),
            missing=self.missing,
            unexpected=self.unexpected,
            mismatched=[k for k, _, _ in self.mismatched],
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict."""
        return {
            "ok": self.ok,
            "loaded": list(self.loaded),
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "mismatched": [list(m) for m in self.mismatched],
        }


def describe(t: Any) -> str:
    """``float32[8, 8]`` for a tensor, the type name otherwise."""
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
    return type(t).__name__


def fit_report(live: Mapping[str, Any], saved: Mapping[str, Any]) -> FitReport:
    """Compare ``saved`` tensors with ``live`` ones, key by key (nothing is copied)."""
    rep = FitReport()
    for key, t in live.items():
        if key not in saved:
            rep.missing.append(str(key))
            continue
        s = saved[key]
        if isinstance(t, torch.Tensor) and (
            not isinstance(s, torch.Tensor) or s.shape != t.shape or s.dtype != t.dtype
        ):
            rep.mismatched.append((str(key), describe(s), describe(t)))
        else:
            rep.loaded.append(str(key))
    rep.unexpected = [str(k) for k in saved if k not in live]
    return rep


def _few(names: list[str]) -> str:
    head = ", ".join(names[:SHOW])
    return head + (f", … (+{len(names) - SHOW})" if len(names) > SHOW else "")


__all__ = ["FitReport", "describe", "fit_report"]


def match_targets(
    obj: Any, encoded_tree: Any, shapes: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
) -> tuple[dict[str, torch.Tensor], FitReport]:
    """Pair the tensors of ``obj`` with the saved tensors at the same places.

    Args:
        obj: what the caller loads into (``{"model": model.state_dict()}``).
        encoded_tree: the checkpoint's state tree.
        shapes: saved tensor key -> ``(dtype, shape)`` (from the manifest).

    Returns:
        ``(targets, report)``: saved tensor key -> the live tensor that fits it exactly;
        the report names every live tensor without a saved one (``missing``), every saved
        tensor inside a mapping the caller passed but without a live one (``unexpected``;
        the top level only selects parts: ``{"model": sd}`` does not make the saved
        optimizer unexpected)
        and every pair whose shape or dtype differs (``mismatched``). Names are paths
        (``model/fc.weight``).
    """
    targets: dict[str, torch.Tensor] = {}
    rep = FitReport()

    def name(path: tuple[str, ...]) -> str:
        return "/".join(path)

    def live_tensors(x: Any, path: tuple[str, ...]) -> None:
        if isinstance(x, torch.Tensor):
            rep.missing.append(name(path))
        elif isinstance(x, Mapping):
            for k, v in x.items():
                live_tensors(v, (*path, str(k)))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                live_tensors(v, (*path, str(i)))

    def saved_tensors(t: Any, path: tuple[str, ...]) -> None:
        if isinstance(t, Mapping):
            tag = t.get(TAG)
            if tag in ("tensor", "ndarray"):
                rep.unexpected.append(name(path))
            elif tag is None:
                for k, v in t.items():
                    saved_tensors(v, (*path, str(k)))
            elif tag == "tuple":
                for i, v in enumerate(t.get("items") or []):
                    saved_tensors(v, (*path, str(i)))
            elif tag == "dict":
                for item in t.get("items") or []:
                    if isinstance(item, list) and len(item) == 2:
                        saved_tensors(item[1], (*path, str(decode_key(item[0]))))
        elif isinstance(t, list):
            for i, v in enumerate(t):
                saved_tensors(v, (*path, str(i)))

    def walk(x: Any, t: Any, path: tuple[str, ...]) -> None:
        if isinstance(x, torch.Tensor):
            if not (isinstance(t, Mapping) and t.get(TAG) == "tensor"):
                rep.missing.append(name(path))
                return
            key = str(t.get("key"))
            saved = shapes.get(key)
            if saved is None:
                rep.missing.append(name(path))
            elif saved != (x.dtype, tuple(x.shape)):
                dt, sh = saved
                rep.mismatched.append(
                    (name(path), f"{str(dt).removeprefix('torch.')}{list(sh)}", describe(x))
                )
            else:
                targets.setdefault(key, x)
                rep.loaded.append(name(path))
            return
        if isinstance(x, Mapping):
            saved_items: dict[Any, Any] = {}
            if isinstance(t, Mapping) and t.get(TAG) is None:
                saved_items = dict(t)
            elif isinstance(t, Mapping) and t.get(TAG) == "dict":
                saved_items = {
                    decode_key(i[0]): i[1]
                    for i in t.get("items") or []
                    if isinstance(i, list) and len(i) == 2
                }
            else:
                live_tensors(x, path)
                return
            for k, v in x.items():
                if k in saved_items:
                    walk(v, saved_items[k], (*path, str(k)))
                else:
                    live_tensors(v, (*path, str(k)))
            if path:  # the root only selects parts ({"model": ...}); below it, all must fit
                for k, v in saved_items.items():
                    if k not in x:
                        saved_tensors(v, (*path, str(k)))
            return
        if isinstance(x, (list, tuple)):
            items = (
                t
                if isinstance(t, list)
                else (t.get("items") if isinstance(t, Mapping) and t.get(TAG) == "tuple" else None)
            )
            if not isinstance(items, list):
                live_tensors(x, path)
                return
            for i, v in enumerate(x):
                if i < len(items):
                    walk(v, items[i], (*path, str(i)))
                else:
                    live_tensors(v, (*path, str(i)))
            for i in range(len(x), len(items)):
                saved_tensors(items[i], (*path, str(i)))

    walk(obj, encoded_tree, ())
    return targets, rep


__all__ += ["match_targets"]
