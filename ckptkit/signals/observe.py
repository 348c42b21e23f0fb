"""What ckptkit sees of a training step by itself: the facts a step record needs.

A :class:`~ckptkit.Recorder` attached to a :class:`~ckptkit.TrainState` binds a
:class:`StepObserver` to it. The observer watches the objects the state already holds and
fills, in each record the loop logs, every field the loop did not log itself:

======================  ===============================================================
``rng``, ``rng_at``      fingerprint of every global generator at the start of the step:
                         the first index the :class:`~ckptkit.ResumableSampler` hands to
                         the loop (``data``), else the first training forward (``forward``)
``lr``                   the LR of group 0 when the optimizer stepped (the LR used)
``opt_step``             the optimizer's step count after the step
``loss_scale``,          the GradScaler's scale and growth tracker after the step (the
``scale_growth``         ``TrainState``'s scaler, else the one that called ``optimizer.step``)
``batch_hash``           xxh3 of the tensors the model was called with in training mode
``rows``                 a short hash per batch row of those tensors (:func:`row_hashes`):
                         which samples a step saw, without sample ids
``sample_ids``           ``[epoch, id, content hash]`` per sample the sampler handed out in
                         this step (the hash when the dataset has ``sample_hash(index)``)
``cursor``               fingerprint of the sampler's / data loader's ``state_dict()``
``num_workers``          the data loader's worker count, where ckptkit sees the loader
                         (the state's loader, or the one ``ResumableSampler.batches`` runs)
``guard``                resume-guard findings raised since the last record
======================  ===============================================================

Hooks: a forward pre-hook on the model, one process-wide optimizer step pre-hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``, dispatched to live observers),
and an observer on the sampler. The cost per step is two RNG snapshots and a fingerprint,
hashing the model inputs, and a ``state_dict()`` of the sampler: about 0.3 ms on a loaded
2-core machine.

The observer also measures, for the resume guard, which generators drew between the end of
one step (its record) and the start of the next: the look-ahead saved with a checkpoint
carries these patterns, so after a restore the guard can tell draws the uninterrupted run
also made from draws a resumed script added (:mod:`ckptkit.signals.rngtrace`).
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import xxhash
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ckptkit.capture import tree_fingerprint
from ckptkit.capture.resumable import ResumableSampler
from ckptkit.capture.scaler import scaler_state
from ckptkit.checkpoint.lookahead import StepView
from ckptkit.signals import rngtrace

if TYPE_CHECKING:
    from ckptkit.capture.state import TrainState

log = logging.getLogger("ckptkit")

GAP_WINDOW = 8
"""Steps over which the draws between consecutive steps are kept for the look-ahead."""
_HASH_LIMIT = 1 << 24
"""Largest CUDA input (bytes) copied to the host to hash; bigger ones hash by shape only."""
ROWS_LIMIT = 256
"""Most rows per step :func:`row_hashes` hashes (the first ones: a bigger batch keeps its
first ``ROWS_LIMIT``); the record stays small (9 bytes a row in JSON) and the cost bounded."""
_FRAMES = 8
"""How far up the stack ``optimizer.step`` is searched for the GradScaler that called it."""

AUTO_FIELDS = (
    "rng",
    "rng_at",
    "lr",
    "opt_step",
    "loss_scale",
    "scale_growth",
    "batch_hash",
    "rows",
    "sample_ids",
    "cursor",
    "num_workers",
)
"""Record fields a bound observer fills when the loop does not log them."""


class StepListener(Protocol):
    """What the resume guard implements to hear about the first steps after a restore."""

    def on_step_start(self, observer: StepObserver, snapshot: rngtrace.RngSnapshot) -> None: ...

    def on_optimizer_step(
        self, observer: StepObserver, optimizer: torch.optim.Optimizer, scaler: Any
    ) -> None: ...


_LIVE: weakref.WeakSet[StepObserver] = weakref.WeakSet()
_HOOK: Any = None


def _dispatch(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for obs in list(_LIVE):
        obs._on_optimizer_step(optimizer)


def _install_global_hook() -> None:
    global _HOOK
    if _HOOK is None:
        _HOOK = register_optimizer_step_pre_hook(_dispatch)


def calling_scaler() -> Any:
    """The GradScaler whose ``step`` is calling ``optimizer.step`` right now, if any.

    Called from an optimizer step pre-hook (the observer's, the resume guard's own).

    Example:
        >>> calling_scaler() is None
        True
    """
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.amp.GradScaler):
            return owner
        frame = frame.f_back
    return None


def _host_inputs(items: Iterable[Any], out: list[torch.Tensor], depth: int = 0) -> None:
    """Collect the tensors of a model call, on the host, in call order (nested up to 2).

    A CUDA tensor over :data:`_HASH_LIMIT` bytes stays on the device: it is hashed by dtype
    and shape only (the copy would cost more than the step it describes)."""
    for x in items:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type != "cpu" and t.numel() * t.element_size() <= _HASH_LIMIT:
                t = t.cpu()
            out.append(t)
        elif depth < 2 and isinstance(x, list | tuple):
            _host_inputs(x, out, depth + 1)
        elif depth < 2 and isinstance(x, Mapping):
            _host_inputs((x[k] for k in sorted(x, key=str)), out, depth + 1)


def _hash_tensors(h: xxhash.xxh3_64, tensors: Iterable[torch.Tensor]) -> None:
    for t in tensors:
        h.update(f"{t.dtype}:{tuple(t.shape)}|".encode())
        if t.device.type == "cpu" and t.numel():
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtype of each element size: rows are compared bit for bit (bfloat16, NaN)."""


_COMMON_PADS = (0, -100)
"""Pad values preferred when the bytes leave a choice: pad ids and masks of 0, and the
ignore index of labels."""


def _pad_value(a: np.ndarray) -> Any:
    """The value a batch's rows are padded with (rows of ``a`` as integers), or None.

    A candidate ends at least half of the rows and is no row's only value (the longest
    row of a padded batch is not padding). When two remain (a batch of two, one padded),
    0 or -100 is taken if it is one of them; otherwise the batch is hashed uncut, and its
    padded rows differ from the same samples elsewhere (the limit in docs/drills.md)."""
    values, counts = np.unique(a[:, -1], return_counts=True)
    candidates = [
        v for v, c in zip(values, counts, strict=True)
        if c * 2 >= len(a) and not (a == v).all(axis=1).any()
    ]
    if len(candidates) > 1:
        candidates = [v for v in candidates if v in _COMMON_PADS]
    return candidates[0] if len(candidates) == 1 else None


def _row_bytes(t: torch.Tensor, n: int) -> list[bytes]:
    """The first ``n`` rows of ``t`` (dim 0) as bytes, each without its trailing padding.

    Padding depends on the batch a sample lands in (a collate pads to the batch's longest
    sequence), so the same sample must give the same bytes in any batch: a row ending with
    the batch's pad value (:func:`_pad_value`) is cut before that run."""
    flat = t[:n].contiguous().reshape(n, -1)
    width = flat.shape[1]
    a = flat.view(_INT_VIEW.get(flat.element_size(), torch.uint8)).reshape(n, -1).numpy()
    if n < 2 or width < 2:
        return [a[i].tobytes() for i in range(n)]
    pad = _pad_value(a)
    if pad is None:
        return [a[i].tobytes() for i in range(n)]
    body = a != pad
    # index after the last element that is not the pad (0: all padding)
    end = np.where(body.any(axis=1), width - np.argmax(body[:, ::-1], axis=1), 0)
    return [a[i, : end[i]].tobytes() for i in range(n)]


def _rows_of(tensors: Sequence[torch.Tensor], limit: int) -> list[str]:
    """:func:`row_hashes` of tensors already on the host."""
    batch = next((t for t in tensors if t.dim() >= 1), None)
    if batch is None or limit <= 0:
        return []
    size = batch.shape[0]
    n = min(size, limit)
    try:
        parts = [
            (str(t.dtype).encode(), _row_bytes(t, n))
            for t in tensors
            if t.dim() >= 1 and t.shape[0] == size and t.device.type == "cpu"
        ]
    except (RuntimeError, TypeError, ValueError) as e:  # sparse, nested: no rows, no crash
        log.debug("ckptkit: no row hashes: %s", e)
        return []
    if not parts:
        return []  # only device inputs too big to copy: rows would all hash alike
    out = []
    for i in range(n):
        h = xxhash.xxh3_64()
        for dtype, rows in parts:
            h.update(dtype)
            h.update(len(rows[i]).to_bytes(8, "little"))
            h.update(rows[i])
        out.append(h.hexdigest()[:8])
    return out


def row_hashes(inputs: Any, *, limit: int = ROWS_LIMIT) -> list[str]:
    """A short hash of each batch row of a model call's inputs: the ``rows`` record field.

    Row ``i`` hashes the ``i``-th element along dim 0 of every input tensor whose dim 0 is
    the batch size (that of the first tensor with a dim; others, such as shared position
    ids, are left out), each without its trailing padding (see :func:`_row_bytes`).
    8 hex digits of xxh3-64, at most ``limit`` rows (the first ones). The drill matches
    them between two runs to tell a data-order fault (the same rows at other positions)
    from a content fault (rows never seen) without sample ids
    (:func:`ckptkit.drill.exposure.row_evidence`). Every recorder of rows calls this.

    Args:
        inputs: a tensor or a (nested, depth 2) list/tuple/dict of them and other values,
            as the model receives them (a dict's tensors in sorted key order).
        limit: the most rows hashed.

    Returns:
        One hash per row, in batch order; ``[]`` when no input has a batch dim.

    Example:
        >>> a = row_hashes({"input_ids": torch.tensor([[5, 3, 0, 0], [7, 1, 2, 0], [4, 0, 0, 0]])})
        >>> b = row_hashes({"input_ids": torch.tensor([[9, 9, 9], [5, 3, 0]])})
        >>> len(a), a[0] == b[1]
        (3, True)
    """
    tensors: list[torch.Tensor] = []
    _host_inputs(inputs if isinstance(inputs, list | tuple) else [inputs], tensors)
    return _rows_of(tensors, limit)


_NOT_POSITION = frozenset({"_base_seed", "_shared_seed"})
"""State keys that are not the data position: a StatefulDataLoader redraws its workers' base
seed at every ``iter()`` from a generator it does not save, so it differs after a resume
while every batch is the same (worker-side randomness must be a function of the sample)."""


def _position(state: Any) -> Any:
    if isinstance(state, Mapping):
        return {k: _position(v) for k, v in state.items() if k not in _NOT_POSITION}
    if isinstance(state, list | tuple):
        return [_position(v) for v in state]
    return state


def _opt_step(opt: torch.optim.Optimizer) -> int:
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st and "step" in st:
                s = st["step"]
                return int(s.item() if isinstance(s, torch.Tensor) else s)
    return 0


def _no_hook(*args: Any) -> None:
    """What a copy of an observed model gets instead of a :class:`CopySafeHook`."""
    return None


def _detached() -> Any:
    return _no_hook


class CopySafeHook:
    """A module hook that copies of the module do not carry: the one way ckptkit hooks a model.

    A copy of the model (``copy.deepcopy`` for an EMA or a teacher, a pickle of it) gets
    :func:`_no_hook` instead. Copying the hook would copy its owner (the observer, the
    Trainer callback) and with it the Recorder and its open file (``TypeError: cannot
    pickle '_io.TextIOWrapper'``), and a copy's forwards are not the training step anyway.
    The owner is held weakly, so a model outliving it keeps nothing alive; the hook then
    does nothing.

    Args:
        method: the bound method to call with the hook's arguments.

    Example:
        >>> import copy
        >>> class Owner:
        ...     calls = 0
        ...     def on_forward(self, module, args, output):
        ...         self.calls += 1
        >>> m, owner = torch.nn.Linear(1, 1), Owner()
        >>> _ = m.register_forward_hook(CopySafeHook(owner.on_forward))
        >>> _ = m(torch.ones(1)); _ = copy.deepcopy(m)(torch.ones(1)); owner.calls
        1
    """

    def __init__(self, method: Any) -> None:
        self._method = weakref.WeakMethod(method)

    def __call__(self, *args: Any) -> Any:
        method = self._method()
        return method(*args) if method is not None else None

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return _no_hook

    def __reduce__(self) -> tuple[Any, ...]:
        return (_detached, ())


class StepObserver(StepView):
    """Watch one :class:`~ckptkit.TrainState`'s step and fill its record (see the module doc).

    Args:
        state: the training state whose model, optimizer, scaler and sampler are watched.

    Example:
        >>> import ckptkit
        >>> m = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(m.parameters(), lr=0.1)
        >>> rec = ckptkit.Recorder(None)
        >>> ts = ckptkit.TrainState(model=m, optimizer=opt, recorder=rec)
        >>> m(torch.ones(1, 2)).sum().backward(); opt.step(); rec.log(1, loss=0.5)
        >>> sorted(k for k in rec.records[-1] if k in AUTO_FIELDS)
        ['batch_hash', 'lr', 'opt_step', 'rng', 'rng_at', 'rows']
    """

    def __init__(self, state: TrainState) -> None:
        self.state = state
        self.listeners: list[StepListener] = []
        self.scaler: Any = None
        """The GradScaler in use: the state's, or the one seen calling ``optimizer.step``."""
        self.gaps: deque[tuple[rngtrace.RngSnapshot, rngtrace.RngSnapshot]] = deque(
            maxlen=GAP_WINDOW
        )
        self.point: str | None = None
        """Where steps start: ``data`` or ``forward`` (the last one seen)."""
        self.num_workers: int | None = None
        """The training loader's worker count, set by an integration that sees the loader
        (the ``num_workers`` record field; None: found from the state, if it can be)."""
        self._params = {id(p) for p in state.model.parameters()}
        self._findings: list[dict[str, Any]] = []
        self._warned_scaler = False
        self._end: rngtrace.RngSnapshot | None = None
        self._reset()
        self._handles = [
            state.model.register_forward_pre_hook(CopySafeHook(self._on_forward), with_kwargs=True)
        ]
        self._samplers: list[ResumableSampler] = []
        for s in (state.sampler, getattr(state.sampler, "sampler", None)):
            if isinstance(s, ResumableSampler) and s not in self._samplers:
                s.add_observer(self._on_sample)
                self._samplers.append(s)
        _install_global_hook()
        _LIVE.add(self)

    def _reset(self) -> None:
        self.started = False
        self.snapshot: rngtrace.RngSnapshot | None = None
        self._fp: str | None = None
        self._lr_start: float | None = None
        self._lr_used: float | None = None
        self._stepped: torch.optim.Optimizer | None = None
        self._batch: xxhash.xxh3_64 | None = None
        self._rows: list[str] = []
        self._ids: list[list[Any]] = []

    def close(self) -> None:
        """Remove every hook (the record fields are no longer filled).

        Example:
            >>> import ckptkit
            >>> ts = ckptkit.TrainState(model=torch.nn.Linear(1, 1), recorder=ckptkit.Recorder(None))
            >>> ts.recorder.observer.close()
        """
        for h in self._handles:
            h.remove()
        self._handles = []
        for s in self._samplers:
            s.remove_observer(self._on_sample)
        self._samplers = []
        _LIVE.discard(self)

    def add_listener(self, listener: StepListener) -> None:
        """Tell ``listener`` about step starts and optimizer steps (the resume guard).

        A listener of the same type replaces the previous one (a second restore in one
        process checks against the newer checkpoint only).

        Example:
            >>> import ckptkit
            >>> from ckptkit.signals.guard import ResumeGuard
            >>> rec = ckptkit.Recorder(None)
            >>> _ = ckptkit.TrainState(model=torch.nn.Linear(1, 1), recorder=rec)
            >>> rec.observer.add_listener(ResumeGuard({}))
        """
        self.listeners = [x for x in self.listeners if type(x) is not type(listener)]
        self.listeners.append(listener)

    def note(self, findings: Iterable[Any]) -> None:
        """Put resume-guard findings into the next record (``guard`` field).

        Example:
            >>> import ckptkit
            >>> rec = ckptkit.Recorder(None)
            >>> _ = ckptkit.TrainState(model=torch.nn.Linear(1, 1), recorder=rec)
            >>> rec.observer.note([{"code": "CK-D008", "component": "rng", "message": "m"}])
            >>> rec.log(1, loss=1.0); rec.records[-1]["guard"][0]["code"]
            'CK-D008'
        """
        for f in findings:
            d = f.to_dict() if hasattr(f, "to_dict") else dict(f)
            self._findings.append(
                {k: d[k] for k in ("code", "component", "message") if k in d}
            )

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer that stepped last (the state's, or one built over its model)."""
        return self._stepped or self.state.optimizer

    # --- events -------------------------------------------------------------------------

    def _start(self, point: str) -> None:
        self.started = True
        self.point = point
        snap = rngtrace.RngSnapshot.take()
        self.snapshot = snap
        self._fp = snap.fingerprint()
        opt = self.state.optimizer
        if opt is not None and opt.param_groups:
            self._lr_start = float(opt.param_groups[0]["lr"])
        if self._end is not None:
            self.gaps.append((self._end, snap))
        for listener in list(self.listeners):
            listener.on_step_start(self, snap)

    def _on_sample(self, epoch: int, index: int | None) -> None:
        if not self.started:
            self._start("data")
        if index is None:
            return  # ResumableSampler.batches() is about to fetch a batch
        h = self._samplers[0].sample_hash(index) if self._samplers else None
        self._ids.append([epoch, index] if h is None else [epoch, index, h])

    def _on_forward(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation and probes are not the training step
        if not self.started:
            self._start("forward")
        if self._batch is None:
            self._batch = xxhash.xxh3_64()
        tensors: list[torch.Tensor] = []
        _host_inputs((*args, kwargs), tensors)
        _hash_tensors(self._batch, tensors)
        room = ROWS_LIMIT - len(self._rows)
        if room > 0:  # several forwards a step (accumulation): rows of each, in order
            self._rows.extend(_rows_of(tensors, room))

    def _on_optimizer_step(self, opt: torch.optim.Optimizer) -> None:
        mine = opt is self.state.optimizer
        if not mine:
            first = next((p for g in opt.param_groups for p in g["params"]), None)
            if first is None or id(first) not in self._params:
                return  # another model's optimizer
        if self._stepped is not None and (self._stepped is self.state.optimizer or not mine):
            return  # the first step of this record already counted
        if not self.started:
            self._start("optimizer")
        self._stepped = opt
        lr = opt.param_groups[0].get("lr") if opt.param_groups else None
        if lr is not None:  # a wrapper (torchtitan's OptimizersContainer) has none: its own optimizers step next
            self._lr_used = float(lr)
        scaler = calling_scaler()
        if scaler_state(scaler) is None:
            scaler = None  # none, or a disabled one (fp32/bf16 runs keep the call for symmetry)
        if scaler is not None:
            self.scaler = scaler
            if self.state.scaler is None and not self._warned_scaler:
                self._warned_scaler = True
                log.warning(
                    "ckptkit: a GradScaler steps the optimizer but is not in the TrainState: "
                    "its scale and growth tracker are not saved; pass scaler= to TrainState"
                )
        for listener in list(self.listeners):
            listener.on_optimizer_step(self, opt, scaler)

    # --- the record ---------------------------------------------------------------------

    def scaler_in_use(self) -> Any:
        """The TrainState's enabled scaler, else the one seen stepping the optimizer."""
        own = self.state.scaler
        if scaler_state(own) is not None and (self.scaler is None or self.scaler is own):
            return own
        return self.scaler

    def finish(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Return the auto fields for the record being logged (those not in ``given``).

        Ends the step: the next data event or forward starts the next one.
        :meth:`ckptkit.Recorder.log` calls it.

        Example:
            >>> import ckptkit
            >>> rec = ckptkit.Recorder(None)
            >>> m = torch.nn.Linear(1, 1)
            >>> _ = ckptkit.TrainState(model=m, recorder=rec)
            >>> _ = m(torch.ones(1, 1))
            >>> sorted(rec.observer.finish({"loss": 1.0}))
            ['batch_hash', 'rng', 'rng_at', 'rows']
        """
        out: dict[str, Any] = {}

        def put(key: str, value: Any) -> None:
            if value is not None and given.get(key) is None:
                out[key] = value

        if self._fp is not None and given.get("rng") is None:
            out["rng"] = self._fp
            out["rng_at"] = self.point
        put("lr", self._lr_used if self._lr_used is not None else self._lr_start)
        opt = self.optimizer
        if opt is not None:
            put("opt_step", _opt_step(opt))
        st = scaler_state(self.scaler_in_use())
        if st is not None:
            put("loss_scale", st[0])
            put("scale_growth", st[1])
        if self._batch is not None:
            put("batch_hash", self._batch.hexdigest())
        if self._rows:
            put("rows", self._rows)
        if self._ids:
            put("sample_ids", self._ids)
        put("cursor", self.cursor())
        put("num_workers", self.loader_workers())
        if self._findings:
            out["guard"] = self._findings
            self._findings = []
        self._reset()
        self._end = rngtrace.RngSnapshot.take()
        return out

    def cursor(self) -> str | None:
        """Fingerprint of the data cursor (``state_dict()`` of the state's sampler/loader).

        Example:
            >>> import ckptkit
            >>> rec = ckptkit.Recorder(None)
            >>> s = ckptkit.ResumableSampler(4)
            >>> _ = ckptkit.TrainState(model=torch.nn.Linear(1, 1), sampler=s, recorder=rec)
            >>> len(rec.observer.cursor())
            16
        """
        sampler = self.state.sampler
        if sampler is None or not callable(getattr(sampler, "state_dict", None)):
            return None
        if getattr(sampler, "_iterator", False) is None:
            return None  # a StatefulDataLoader not iterated yet: state_dict() would start it
        try:
            with torch.random.fork_rng(devices=[]):
                return tree_fingerprint(_position(sampler.state_dict()))
        except Exception as e:  # an exotic state: the record goes without a cursor
            log.debug("ckptkit: no cursor fingerprint: %s", e)
            return None

    def loader_workers(self) -> int | None:
        """The training DataLoader's ``num_workers``, where ckptkit sees the loader.

        Set by an integration (:attr:`num_workers`), else the state's sampler when it is a
        loader (a StatefulDataLoader), else the loader its ResumableSampler's
        ``batches()`` runs; None when none of them says. The drill names the workers'
        RNG from it (:func:`ckptkit.drill.exposure.row_evidence`).

        Example:
            >>> import ckptkit
            >>> rec = ckptkit.Recorder(None)
            >>> s = ckptkit.ResumableSampler(4)
            >>> _ = ckptkit.TrainState(model=torch.nn.Linear(1, 1), sampler=s, recorder=rec)
            >>> loader = torch.utils.data.DataLoader(range(4), sampler=s, num_workers=0)
            >>> _ = next(s.batches(loader)); rec.observer.loader_workers()
            0
        """
        if self.num_workers is not None:
            return self.num_workers
        for source in (self.state.sampler, *self._samplers):
            n = getattr(source, "num_workers", None)
            if isinstance(n, int) and not isinstance(n, bool):
                return n
        return None

    def gap_patterns(self) -> list[dict[str, int | None]]:
        """The distinct draws made between a step's record and the next step's start.

        Over the last :data:`GAP_WINDOW` steps; ``[{}]`` when nothing drew there.

        Example:
            >>> import ckptkit
            >>> rec = ckptkit.Recorder(None)
            >>> _ = ckptkit.TrainState(model=torch.nn.Linear(1, 1), recorder=rec)
            >>> rec.observer.gap_patterns()
            []
        """
        seen: list[dict[str, int | None]] = []
        for a, b in self.gaps:
            p = rngtrace.pattern(rngtrace.draws_between(a, b))
            if p not in seen:
                seen.append(p)
        return seen


def bind(state: TrainState, recorder: Any) -> StepObserver | None:
    """Bind a new observer of ``state`` to ``recorder`` (replacing an earlier one).

    Returns None when the recorder does not take one (``auto=False``, or not a Recorder).
    :meth:`ckptkit.Recorder.bind` calls it.

    Example:
        >>> import ckptkit
        >>> ts = ckptkit.TrainState(model=torch.nn.Linear(1, 1))
        >>> bind(ts, ckptkit.Recorder(None, auto=False)) is None
        True
    """
    old = getattr(recorder, "observer", None)
    if isinstance(old, StepObserver):
        old.close()
    if not getattr(recorder, "auto", False):
        return None
    obs = StepObserver(state)
    recorder.observer = obs
    return obs


__all__ = [
    "AUTO_FIELDS",
    "GAP_WINDOW",
    "ROWS_LIMIT",
    "CopySafeHook",
    "StepListener",
    "StepObserver",
    "bind",
    "calling_scaler",
    "row_hashes",
    "scaler_state",
]
