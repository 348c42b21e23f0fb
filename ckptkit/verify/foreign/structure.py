"""Recognise resume state by the shape of its content, wherever it sits in a nested dict.

Hand-rolled ``torch.save`` dicts, DCP ``Stateful`` wrappers and torchtitan's key names put
the same state under many names and at many depths: the optimizer under ``optim``,
``opt_state``, ``app/optim`` or ``trainer/opt``; the data-loader cursor under ``data``,
``loader`` or ``dataloader``; the step inside ``train_state``. :func:`recognise` walks the
tree and decides per subtree:

- **found** — the key names a component by a common convention (``optimizer``,
  ``lr_scheduler``, ``dataloader``, ``train_state`` …) *and* the content has that
  component's shape;
- **inferred** — the content has the shape (``state`` + ``param_groups`` is an optimizer,
  ``last_epoch`` + ``base_lrs`` a scheduler, a 5056-byte uint8 tensor a torch generator
  state, ``epoch`` + ``batch_idx`` a data cursor …) but no name says so: a guess, reported
  as one (``CK-C012``), never as certainty.

A key whose name suggests a component but whose content does not fit (``"optimizer":
"adamw"`` in a config) is not taken for it. Nothing is loaded here: leaves are tensors,
:class:`TensorMeta` (a DCP item known by its metadata) or :class:`Lazy` (a small DCP item
read only if a rule looks at its value).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

MAX_DEPTH = 12
"""Nesting deeper than this is not walked (hostile input; real state is shallow)."""

TORCH_CPU_RNG_BYTES = 5056
"""``torch.get_rng_state()`` is a uint8 tensor of this many bytes (MT19937 + extras)."""


# --- leaves -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    """A tensor known by its metadata only (a DCP item): shape and dtype, no values."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None
    read: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    """Reads the tensor (used for one-element counters such as a step, never for weights)."""


class _Opaque:
    """A value that could not be decoded safely (pickled bytes that need code ...)."""

    def __repr__(self) -> str:
        return "<opaque>"


OPAQUE: Any = _Opaque()


class Lazy:
    """A value read only when a rule needs it (a small DCP item); cached, OPAQUE on failure."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._done = False
        self._value: Any = None

    def get(self) -> Any:
        if not self._done:
            self._done = True
            try:
                self._value = self._load()
            except Exception:  # untrusted input: an unreadable item is opaque, not a crash
                self._value = OPAQUE
        return self._value


def value(x: Any) -> Any:
    """``x``, or the value of a :class:`Lazy`."""
    return x.get() if isinstance(x, Lazy) else x


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor | TensorMeta)


def shape_of(x: Any) -> tuple[int, ...] | None:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, TensorMeta):
        return x.shape
    return None


def _dtype(x: Any) -> torch.dtype | None:
    return x.dtype if isinstance(x, torch.Tensor | TensorMeta) else None


def is_floating(x: Any) -> bool:
    dt = _dtype(x)
    return dt is not None and (dt.is_floating_point or dt.is_complex)


def as_int(v: Any) -> int | None:
    """An int from an int, a one-element tensor or an integral float; else None.

    Example:
        >>> as_int(torch.tensor(7)), as_int(3.0), as_int(True), as_int("3")
        (7, 3, None, None)
    """
    v = value(v)
    if isinstance(v, TensorMeta) and v.read is not None and v.shape in ((), (1,)):
        try:
            v = v.read()
        except Exception:  # untrusted input: an unreadable counter is no counter
            return None
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, np.integer):
        v = int(v)
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _scalar(v: Any) -> bool:
    v = value(v)
    if v is OPAQUE or isinstance(v, bytes | bytearray | io.BytesIO):
        return True  # a serialised value (a BytesIO of losses ...) is not state of its own
    if isinstance(v, torch.Tensor | TensorMeta):
        return (shape_of(v) or ()) == () or (shape_of(v) == (1,))
    if isinstance(v, list | tuple):
        return len(v) <= 16 and all(isinstance(value(x), int | float | str | bool) for x in v)
    return v is None or isinstance(v, int | float | str | bool | np.number)


# --- names: the common conventions --------------------------------------------------------------

NAMES: dict[str, str] = {
    **dict.fromkeys(
        ("model", "state_dict", "model_state_dict", "model_state", "net", "network", "module",
         "weights", "params", "model_sd"),
        "model",
    ),
    **dict.fromkeys(
        ("optimizer", "optim", "opt", "optimizer_state_dict", "optimizer_state", "optimizers",
         "optimizer_states", "optim_state", "opt_state", "optim_state_dict"),
        "optimizer",
    ),
    **dict.fromkeys(
        ("scheduler", "lr_scheduler", "sched", "scheduler_state_dict", "lr_scheduler_state_dict",
         "lr_schedulers", "schedulers", "lr_sched", "scheduler_state"),
        "scheduler",
    ),
    **dict.fromkeys(
        ("scaler", "grad_scaler", "amp", "scaler_state_dict", "amp_state", "scaler_state",
         "loss_scaler"),
        "scaler",
    ),
    **dict.fromkeys(
        ("rng", "rng_state", "rng_states", "random_state", "random_states", "rng_state_dict",
         "torch_rng_state", "cuda_rng_state", "numpy_rng_state", "python_rng_state",
         "np_rng_state", "cpu_rng_state", "generators", "rngs"),
        "rng",
    ),
    **dict.fromkeys(
        ("sampler", "sampler_state", "dataloader", "data_loader", "dataloader_state",
         "train_loader", "train_dataloader", "loader", "loader_state", "data_iter",
         "data_sampler", "data", "data_state"),
        "sampler",
    ),
    **dict.fromkeys(
        ("progress", "train_state", "trainer_state", "training_state", "counters"), "progress"
    ),
    **dict.fromkeys(
        ("parallel", "dist", "distributed", "topology", "parallelism", "mesh", "parallel_config",
         "parallel_dims", "parallel_state"),
        "parallel",
    ),
    **dict.fromkeys(("fp8", "fp8_meta", "fp8_state"), "fp8"),
    **dict.fromkeys(("torch_version", "versions", "env", "environment"), "env"),
    **dict.fromkeys(("metrics", "history", "log_history", "losses"), "metrics"),
}
"""Key (lower case) → the component the common conventions keep under it (nanoGPT,
torchvision references, fairseq, the DCP tutorial, torchtitan, Lightning ...)."""

CONFIG_KEYS = frozenset(
    {
        "config", "model_args", "args", "hparams", "hyper_parameters", "cfg", "best_val_loss",
        "best_metric", "best_loss", "best_acc", "arch", "model_config", "train_config",
        "hparams_name", "datamodule_hparams_name", "datamodule_hyper_parameters", "opts",
        "options", "settings", "training_args",
    }
)
"""Run configuration and bookkeeping: recognised, not resume state, not walked."""

STEP_KEYS = frozenset(
    {"step", "global_step", "iter_num", "iteration", "iterations", "num_updates", "steps",
     "iter", "global_steps", "num_steps", "optimizer_step", "updates", "train_step"}
)
"""Keys of the optimizer-step counter (the first one found is the checkpoint's step)."""
EPOCH_KEYS = frozenset({"epoch", "epochs", "current_epoch"})
COUNT_KEYS = frozenset(
    {"consumed_samples", "consumed_tokens", "tokens_seen", "ntokens_seen", "num_tokens_seen"}
)
PROGRESS_SCALARS = STEP_KEYS | EPOCH_KEYS | COUNT_KEYS

POSITION_KEYS = frozenset(
    {"batch_idx", "batch_index", "batches_seen", "num_batches_seen", "samples_seen",
     "num_samples_seen", "consumed", "samples_yielded", "position", "cursor", "offset",
     "index", "idx", "step_in_epoch", "iteration_in_epoch", "batch_in_epoch", "sample_idx",
     "start_index", "next_index", "consumed_samples"}
)
"""Where a data loader is inside its epoch."""
CURSOR_KEYS = frozenset(
    {"epoch", "seed", "shuffle_seed", "rng_seed", "shuffle", "num_replicas", "rank",
     "world_size", "num_samples", "data_len", "dataset_len", "total_size", "generator"}
)
STATEFUL_LOADER_KEYS = frozenset(
    {"_num_yielded", "_sampler_iter_yielded", "_sampler_iter_state", "_index_sampler_state",
     "_snapshot", "_main_snapshot", "_worker_snapshots", "_iterator_finished", "fetcher_state",
     "dataset_state", "_steps_since_snapshot"}
)
"""Keys of a torchdata ``StatefulDataLoader`` state dict."""
_AMBIGUOUS_SAMPLER_NAMES = frozenset({"data", "data_state"})
"""Names that hold a data cursor only when the content shows one (``data`` may be config)."""

PARALLEL_SIZES = frozenset(
    {"world_size", "world", "tp", "pp", "dp", "cp", "ep", "tp_size", "pp_size", "dp_size",
     "cp_size", "ep_size", "tensor_parallel_size", "pipeline_parallel_size",
     "data_parallel_size", "context_parallel_size", "expert_parallel_size", "dp_shard",
     "dp_replicate", "tensor_model_parallel_size", "pipeline_model_parallel_size",
     "num_gpus", "nnodes", "num_nodes", "nproc_per_node", "gpus_per_node", "num_ranks"}
)
PARALLEL_KEYS = PARALLEL_SIZES | {"rank", "local_rank", "ranks", "zero_stage", "fsdp", "backend"}

_SCHEDULER_KEYS = frozenset(
    {"base_lrs", "_last_lr", "_step_count", "lr_lambdas", "_schedulers", "total_steps", "T_max",
     "step_size", "milestones", "gamma", "warmup_steps"}
)
_SCALER_KEYS = frozenset({"growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})


# --- shapes of content ----------------------------------------------------------------------------


def _keys(node: Any) -> set[str]:
    return {k for k in node if isinstance(k, str)} if isinstance(node, Mapping) else set()


def _groups(x: Any) -> bool:
    x = value(x)
    return (
        isinstance(x, list | tuple)
        and bool(x)
        and all(isinstance(g, Mapping) and "params" in g for g in x)
    )


def optimizer_shape(node: Any) -> str | None:
    """Evidence that ``node`` is an optimizer state dict, else None.

    Example:
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> optimizer_shape(opt.state_dict())
        "'state' and 'param_groups' with 'params'"
    """
    node = value(node)
    if not isinstance(node, Mapping):
        return None
    if isinstance(value(node.get("state")), Mapping) and _groups(node.get("param_groups")):
        return "'state' and 'param_groups' with 'params'"
    keys = _keys(node)
    flat = bool(keys) and len(keys) == len(node)
    if flat and all(k.startswith(("state.", "param_groups.")) for k in keys) and any(
        k.startswith("state.") for k in keys
    ):
        return "FQN-keyed flat optimizer state ('state.<param>.<moment>')"
    return None


def scheduler_shape(node: Any) -> str | None:
    node = value(node)
    if isinstance(node, Mapping) and as_int(node.get("last_epoch")) is not None:
        extra = sorted(_keys(node) & _SCHEDULER_KEYS)
        if extra:
            return f"'last_epoch' with {', '.join(repr(k) for k in extra[:2])}"
    return None


def scaler_shape(node: Any) -> str | None:
    node = value(node)
    if isinstance(node, Mapping) and "scale" in node and _keys(node) & _SCALER_KEYS:
        return "'scale' with growth/backoff settings"
    return None


def fp8_shape(node: Any) -> str | None:
    node = value(node)
    for k in _keys(node):
        if "amax" in k.lower():
            return f"'{k}' (FP8 amax history)"
    return None


def _rng_leaf(x: Any) -> tuple[str, bool] | None:
    """What RNG state ``x`` is, and whether the evidence is strong (unambiguous)."""
    x = value(x)
    if is_tensor(x) and _dtype(x) == torch.uint8:
        n = 1
        for d in shape_of(x) or ():
            n *= d
        if n == TORCH_CPU_RNG_BYTES:
            return "torch CPU generator state", True
        if n == 16:
            return "CUDA generator state", False
        return None
    if isinstance(x, tuple | list) and len(x) == 5 and x[0] == "MT19937":
        return "NumPy MT19937 state", True
    if isinstance(x, Mapping) and "bit_generator" in x:
        return "NumPy bit-generator state", True
    if (
        isinstance(x, tuple | list)
        and len(x) == 3
        and x[0] == 3
        and isinstance(x[1], tuple | list)
        and len(x[1]) == 625
    ):
        return "Python random state", True
    if (
        isinstance(x, Mapping)
        and isinstance(x.get("state"), tuple | list)
        and len(x["state"]) == 625
        and x.get("version") == 3
    ):
        return "Python random state", True  # ckptkit's capture: random.getstate() as a dict
    return None


def rng_shape(node: Any, depth: int = 0) -> str | None:
    """Evidence that ``node`` is RNG state (one generator, or a container of them)."""
    leaf = _rng_leaf(node)
    if leaf is not None:
        return leaf[0] if leaf[1] else None
    node = value(node)
    children = (
        list(node.values()) if isinstance(node, Mapping)
        else list(node) if isinstance(node, list | tuple) else []
    )
    if not children or depth > 3:
        return None
    kinds: list[str] = []
    strong = False
    for c in children:
        got = _rng_leaf(c)
        if got is None:
            inner = rng_shape(c, depth + 1)
            if inner is None:
                # Seeds and counters may sit beside the states, and empty containers (no
                # named NumPy generators).
                if not _scalar(c) and not (isinstance(value(c), Mapping | list | tuple) and not value(c)):
                    return None
                continue
            got = (inner, True)
        kinds.append(got[0])
        strong = strong or got[1]
    if not strong:
        return None
    return ", ".join(sorted(set(kinds)))


def _int_items(node: Mapping[str, Any], keys: frozenset[str]) -> list[str]:
    return sorted(k for k in _keys(node) & keys if as_int(node[k]) is not None)


def sampler_shape(node: Any) -> str | None:
    """Evidence that ``node`` is a data-loader cursor (or a StatefulDataLoader state)."""
    node = value(node)
    if not isinstance(node, Mapping):
        return None
    keys = _keys(node)
    stateful = sorted(keys & STATEFUL_LOADER_KEYS)
    if stateful:
        return f"StatefulDataLoader state ({', '.join(repr(k) for k in stateful[:2])})"
    if not keys & POSITION_KEYS or keys & STEP_KEYS:
        return None  # no position; or a step counter, which makes it progress
    if any(is_tensor(value(v)) and not _scalar(v) for v in node.values()):
        return None  # big tensors are not a cursor
    pos = _int_items(node, POSITION_KEYS)
    if pos and len(set(pos) | set(_int_items(node, CURSOR_KEYS))) >= 2:
        shown = sorted(set(pos) | set(_int_items(node, CURSOR_KEYS)))
        return "data cursor (" + ", ".join(repr(k) for k in shown[:4]) + ")"
    return None


def parallel_shape(node: Any) -> str | None:
    node = value(node)
    if not isinstance(node, Mapping):
        return None
    sizes = _int_items(node, PARALLEL_SIZES)
    known = sorted(_keys(node) & PARALLEL_KEYS)
    if sizes and len(known) >= 2:
        return "parallel sizes (" + ", ".join(repr(k) for k in known[:4]) + ")"
    return None


def progress_shape(node: Any) -> str | None:
    node = value(node)
    if not isinstance(node, Mapping) or not node:
        return None
    if not _keys(node) & STEP_KEYS:
        return None
    steps = _int_items(node, STEP_KEYS)
    if steps and all(_scalar(v) for v in node.values()):
        return f"a step counter ({steps[0]!r}) among counters"
    return None


def _tensor_leaves(node: Any, depth: int = 0) -> Iterator[Any] | None:
    """All leaves of a nested mapping when every one is a tensor; None otherwise."""
    if isinstance(node, Lazy):
        return None  # a serialised item is never a tensor (DCP tensors are TensorMeta)
    if is_tensor(node):
        return iter([node])
    if not isinstance(node, Mapping) or not node or depth > 4:
        return None
    out: list[Any] = []
    for v in node.values():
        got = _tensor_leaves(v, depth + 1)
        if got is None:
            return None
        out.extend(got)
    return iter(out)


def model_shape(node: Any) -> str | None:
    """Evidence that ``node`` is a model state dict: tensors only, some floating and non-scalar."""
    node = value(node)
    if not isinstance(node, Mapping) or any(k.lower() in NAMES for k in _keys(node)):
        return None  # keys that name components: a container of them, not one state dict
    leaves = _tensor_leaves(node)
    if leaves is None:
        return None
    ts = list(leaves)
    if any(is_floating(t) and len(shape_of(t) or ()) >= 1 for t in ts):
        return f"a mapping of {len(ts)} tensors (a state dict)"
    return None


STRUCTURAL: tuple[tuple[str, Callable[[Any], str | None]], ...] = (
    ("optimizer", optimizer_shape),
    ("scheduler", scheduler_shape),
    ("scaler", scaler_shape),
    ("fp8", fp8_shape),
    ("rng", rng_shape),
    ("parallel", parallel_shape),
    ("sampler", sampler_shape),
    ("progress", progress_shape),
    ("model", model_shape),
)
"""Shape rules, in the order they are tried (the most specific first)."""


def _fits_name(component: str, key: str, node: Any) -> str | None:
    """Evidence that content under a key named for ``component`` is that component.

    Looser than the structural rules (the name already says what it is), but never blind:
    ``"optimizer": "adamw"`` in a config is not an optimizer.
    """
    rule = dict(STRUCTURAL).get(component)
    ev = rule(node) if rule is not None else None
    if ev is not None:
        return ev
    v = value(node)
    keys = _keys(v)
    if component == "model" and _tensor_leaves(v) is not None:
        return "tensors"
    if component == "scheduler" and isinstance(v, Mapping) and "last_epoch" in keys:
        return "'last_epoch'"
    if component == "scaler" and isinstance(v, Mapping) and "scale" in keys:
        return "'scale'"
    if component == "progress":
        if as_int(v) is not None:
            return "an integer counter"
        if isinstance(v, Mapping) and keys & (STEP_KEYS | EPOCH_KEYS):
            return "counters (" + ", ".join(repr(k) for k in sorted(keys & (STEP_KEYS | EPOCH_KEYS))[:3]) + ")"
    if component == "parallel" and isinstance(v, Mapping) and keys & PARALLEL_KEYS:
        return "parallel sizes"
    if component == "sampler":
        serialised = isinstance(v, bytes | bytearray) or v is OPAQUE or (
            isinstance(v, Mapping)
            and any(isinstance(value(x), bytes | bytearray) or value(x) is OPAQUE for x in v.values())
        )
        if serialised and key.lower() not in _AMBIGUOUS_SAMPLER_NAMES:
            return "loader state (serialised, not decoded)"
        if isinstance(v, Mapping) and keys & (POSITION_KEYS | CURSOR_KEYS | STATEFUL_LOADER_KEYS):
            return "data cursor (" + ", ".join(
                repr(k) for k in sorted(keys & (POSITION_KEYS | CURSOR_KEYS | STATEFUL_LOADER_KEYS))[:3]
            ) + ")"
    if component == "rng":
        leaves = (
            list(v.values()) if isinstance(v, Mapping)
            else list(v) if isinstance(v, list) else [v]
        )
        inner = [_rng_leaf(x) for x in leaves]
        if inner and all(i is not None for i in inner):
            return ", ".join(sorted({i[0] for i in inner if i}))
    if component in ("env", "metrics") and v is not None and v is not OPAQUE:
        return "by name"
    return None


# --- the walk -----------------------------------------------------------------------------------

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Part:
    """One subtree recognised as (part of) a component."""

    component: str
    path: Path
    how: Literal["found", "inferred"]
    evidence: str
    node: Any


@dataclass
class Recognised:
    """What :func:`recognise` made of a tree."""

    parts: list[Part] = field(default_factory=list)
    loose: dict[Path, Any] = field(default_factory=dict)
    """Tensors outside every recognised part, by path."""
    unrecognised: list[str] = field(default_factory=list)
    """Top-level keys that hold nothing recognised (for ``CK-C104``)."""

    def of(self, component: str) -> list[Part]:
        return [p for p in self.parts if p.component == component]


def join(path: Path) -> str:
    """``('app', 'optim')`` → ``'app/optim'``."""
    return "/".join(str(p) for p in path)


def recognise(
    root: Any, *, names: Mapping[str, str] = NAMES, ignore: frozenset[str] = CONFIG_KEYS
) -> Recognised:
    """Walk ``root`` and recognise every component in it by name and by structure.

    Args:
        root: a nested dict/list of state (a ``torch.load`` result, a DCP tree).
        names: key (lower case) → component, the conventions that make a find certain.
        ignore: keys (lower case) of configuration, neither walked nor reported.

    Returns:
        The recognised parts (with ``found``/``inferred``), the loose tensors, and the
        top-level keys that hold nothing recognised.

    Example:
        >>> m = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.Adam(m.parameters())
        >>> r = recognise({"net": m.state_dict(), "trainer": {"adam": opt.state_dict()}})
        >>> [(p.component, join(p.path), p.how) for p in r.parts]
        [('model', 'net', 'found'), ('optimizer', 'trainer/adam', 'inferred')]
    """
    out = Recognised()
    _walk(root, (), None, out, names, ignore, 0)
    # Tensors at the top level, outside every part: a flattened model (torchtitan writes
    # the model's parameters as top-level keys beside "optimizer", "train_state" ...).
    top = {p: t for p, t in out.loose.items() if len(p) == 1}
    if any(is_floating(t) and len(shape_of(t) or ()) >= 1 for t in top.values()):
        node = {str(p[0]): t for p, t in top.items()}
        out.parts.append(
            Part("model", (), "inferred", f"{len(top)} tensors at the top level, outside "
                 "every other component (a flattened state dict)", node)
        )
        for p in top:
            del out.loose[p]
    if isinstance(root, Mapping):
        used: set[Any] = {p.path[0] for p in out.parts if p.path}
        for part in out.parts:
            if not part.path and isinstance(part.node, Mapping):
                used |= set(part.node)  # the top-level tensors of a flattened model
        out.unrecognised = sorted(
            str(k) for k in root
            if k not in used and str(k) not in used and str(k).lower() not in ignore
        )
    return out


def _walk(
    node: Any,
    path: Path,
    inherited: str | None,
    out: Recognised,
    names: Mapping[str, str],
    ignore: frozenset[str],
    depth: int,
) -> None:
    key = path[-1] if path else None
    lkey = key.lower() if isinstance(key, str) else None
    if lkey is not None and lkey in ignore:
        return
    named = names.get(lkey) if lkey is not None else None
    if named is None:
        named = inherited
    if named is not None:
        ev = _fits_name(named, str(key) if key is not None else named, node)
        if ev is not None:
            out.parts.append(Part(named, path, "found", ev, node))
            return
    for comp, rule in STRUCTURAL:
        ev = rule(node)
        if ev is not None:
            how: Literal["found", "inferred"] = "found" if named == comp else "inferred"
            out.parts.append(Part(comp, path, how, ev, node))
            return
    if lkey in PROGRESS_SCALARS and as_int(node) is not None:
        out.parts.append(Part("progress", path, "found", "an integer counter", node))
        return
    if depth >= MAX_DEPTH:
        return
    v = value(node)
    # Children of a named container inherit its name: optimizer_states[0], lr_scheduler_0.
    if isinstance(v, Mapping):
        for k, child in v.items():
            _walk(child, (*path, k), named, out, names, ignore, depth + 1)
    elif isinstance(v, list | tuple):
        for i, child in enumerate(v):
            _walk(child, (*path, i), named, out, names, ignore, depth + 1)
    elif is_tensor(v):
        out.loose[path] = v


__all__ = [
    "CONFIG_KEYS",
    "NAMES",
    "OPAQUE",
    "STEP_KEYS",
    "Lazy",
    "Part",
    "Recognised",
    "TensorMeta",
    "as_int",
    "is_floating",
    "is_tensor",
    "join",
    "optimizer_shape",
    "recognise",
    "shape_of",
    "value",
]
