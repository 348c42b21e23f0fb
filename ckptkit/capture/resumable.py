"""A distributed sampler with a cursor, so a resume continues mid-epoch exactly.

:class:`ResumableSampler` is a drop-in for ``DistributedSampler`` that also remembers how far
into the epoch it is, can be resumed at a different world size without replaying or skipping a
sample, and can bucket samples by length. :meth:`ResumableSampler.batches` iterates a
``torch.utils.data.DataLoader`` built on it so that a resume is exact with worker processes
too (the cursor counts the batches the loop received, not the ones prefetched).
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
import xxhash
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ckptkit.capture import is_int, refuse, show
from ckptkit.errors import StateError

STATE_VERSION = 1

_COUNTERS = ("epoch", "position", "offset", "consumed", "rank", "num_samples", "data_len")
_LOADER_FRAMES = 8
"""Frames walked up from a pass's start to the DataLoader iterator asking for it."""


ORDER_SALT = "ckptkit" + ".sampler"
"""Part of every epoch's order (with the seed and the epoch): saved runs resume into the
order it gave them, so it never changes. It is the module's name when the order was
defined, not a module path (written in two parts so that no rename rewrites it)."""


def loader_iterator(frame: Any = None) -> Any:
    """The ``torch.utils.data`` DataLoader iterator a caller up the stack is, if any.

    A sampler's pass runs inside the iterator's first ``next()`` (or, with workers, its
    prefetch at ``iter()``); the iterator is the ``self`` of a frame a few levels up. No
    other handle reaches it from the sampler (like :func:`ckptkit.signals.observe.calling_scaler`
    for the GradScaler). ``frame``: where to start (default: the caller's frame).

    Example:
        >>> loader_iterator() is None
        True
    """
    frame = frame if frame is not None else sys._getframe(1)
    for _ in range(_LOADER_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, _BaseDataLoaderIter):
            return owner
        frame = frame.f_back
    return None


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Yield this rank's share of a deterministic per-epoch order, and remember the position.

    **Epoch order.** Each epoch has one global order of all ``n`` indices that depends only on
    ``(seed, epoch, shuffle, lengths, bucket_size, batch_size)``, never on the world size. It
    is a permutation drawn from a ``torch.Generator`` seeded with an xxh3 hash of
    ``(seed, epoch)`` (unlike ``seed + epoch``, distinct pairs never share a stream).

    **Bucketing.** With ``lengths`` and ``bucket_size``, the shuffled order is cut into chunks
    of ``bucket_size`` and each chunk is sorted by length. With ``batch_size`` too, each sorted
    chunk is cut into groups of ``batch_size`` and the groups are shuffled, so consecutive
    ``batch_size`` indices of the global order have similar lengths. Set ``batch_size`` to the
    *global* batch (per-rank batch × world size) and make ``bucket_size`` a multiple of it.

    **Rank split.** Like ``DistributedSampler``: the order is padded by repeating its first
    indices (or, with ``drop_last``, its tail is dropped) to a multiple of the world size, and
    rank ``r`` yields positions ``r, r + W, r + 2W...``. So one epoch yields every index
    exactly once across ranks when ``n`` is divisible by ``W``; otherwise, without
    ``drop_last``, up to ``W - 1`` indices twice, with ``drop_last`` up to ``W - 1`` never.

    **Cursor.** ``position`` counts indices already yielded by this rank in the current segment
    of the epoch (counted when handed out, so with a prefetching ``DataLoader`` it runs ahead
    of the training loop by the prefetched batches). Iterating past the end does not advance
    the epoch (as ``DistributedSampler``): a new ``iter()`` on an exhausted epoch starts it
    again (unless nothing was left for this rank after a resume at another world size, then
    it yields nothing); call :meth:`set_epoch` each epoch.

    **Resuming an epoch loop.** A restored cursor (``load_state_dict``) is kept by a
    ``set_epoch`` of the same epoch, and when it is exhausted the next ``iter()`` yields nothing
    (the epoch is done), so the usual loop resumes exactly::

        for epoch in range(sampler.epoch, num_epochs):
            sampler.set_epoch(epoch)     # keeps a restored mid-epoch cursor
            for batch in loader: ...

    **Data loaders.** A ``DataLoader`` with ``num_workers > 0`` fetches indices ahead of the
    loop, so ``position`` (counted when handed out) runs ahead of what was trained on;
    iterate it with :meth:`batches` and the cursor counts only the batches the loop received.

    **Observers.** ``add_observer(fn)`` calls ``fn(epoch, index)`` for every index handed to
    the training loop, and, inside :meth:`batches`, ``fn(epoch, None)`` before each batch is
    fetched (the :class:`~ckptkit.Recorder` bound to a ``TrainState`` records the indices as
    ``sample_ids``, with ``dataset.sample_hash(index)`` as content hash when the dataset given
    to the constructor has such a method, and fingerprints the RNG at the first event of a
    step: before the batch's augmentation draws).

    **Resuming at another world size.** Ranks advance in lockstep, so ``offset + position ×
    world_size`` indices of the epoch order are consumed globally. Loading a state saved at
    world size ``W`` into a sampler at ``W' != W`` makes that count the new ``offset`` and
    splits the *rest* of the epoch order (padded or trimmed for ``W'``) across the new ranks
    from position 0. No index is replayed or skipped globally, apart from the padding or
    drop_last remainder the new split needs. At the same world size the cursor is restored
    as is, so the sequence is identical to an uninterrupted run.

    Args:
        data_source_len_or_dataset: the number of samples, or a sized dataset.
        seed: shuffle seed, the same on every rank.
        shuffle: shuffle each epoch; False keeps ``0..n-1`` (then bucketed, if asked).
        rank: this process's rank.
        world_size: number of ranks.
        drop_last: drop the tail instead of padding when ``n`` is not divisible.
        lengths: per-sample lengths for bucketing.
        bucket_size: sort by length within chunks of this many samples.
        batch_size: shuffle groups of this many samples after bucketing (global batch).

    Example:
        >>> s = ResumableSampler(10, seed=1, world_size=2, rank=0)
        >>> it = iter(s)
        >>> first = [next(it), next(it)]
        >>> state = s.state_dict()
        >>> resumed = ResumableSampler(10, seed=1, world_size=2, rank=0)
        >>> resumed.load_state_dict(state)
        >>> first + list(resumed) == list(ResumableSampler(10, seed=1, world_size=2, rank=0))
        True
    """

    def __init__(
        self,
        data_source_len_or_dataset: int | Sized,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        lengths: Sequence[int] | torch.Tensor | None = None,
        bucket_size: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        super().__init__()
        n = (
            data_source_len_or_dataset
            if isinstance(data_source_len_or_dataset, int)
            else len(data_source_len_or_dataset)
        )
        if n < 0:
            raise ValueError(f"dataset length must be >= 0, got {n}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be >= 1, got {bucket_size}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if bucket_size is not None and lengths is None:
            raise ValueError("bucket_size needs lengths")
        self.data_len = n
        self.dataset: Sized | None = (
            None if isinstance(data_source_len_or_dataset, int) else data_source_len_or_dataset
        )
        """The dataset given to the constructor (None when a length was given)."""
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.rank = rank
        self.world_size = world_size
        self.drop_last = bool(drop_last)
        self.bucket_size = bucket_size
        self.batch_size = batch_size
        self.lengths: torch.Tensor | None = None
        if lengths is not None:
            self.lengths = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1).clone()
            if self.lengths.numel() != n:
                raise ValueError(f"lengths has {self.lengths.numel()} entries for {n} samples")
            if n and int(self.lengths.min()) < 0:
                raise ValueError("lengths must be >= 0")
        self.epoch = 0
        # offset: indices of the epoch order consumed globally before the current world size
        # took over (non-zero only after a resume at another world size).
        self.offset = 0
        self.position = 0
        self._order_cache: tuple[int, torch.Tensor] | None = None
        # A cursor that came from load_state_dict and no iteration has started from yet.
        self._restored = False
        # Indices handed out but not yet received by the training loop (prefetched by a
        # DataLoader's workers or its framework); None when nothing counts deliveries
        # (neither batches() nor track_delivery()).
        self._undelivered: deque[int] | None = None
        # A batches() iteration is running; inside it, while the loader fetches, the loader
        # may call set_epoch itself (Lightning Fabric's _FabricDataLoader does): ignored.
        self._batching = False
        self._fetching = False
        # The global torch RNG state before the first fetch of a batches() pass: the pass's
        # first index puts it back (see _fetch).
        self._rewind: torch.Tensor | None = None
        # The pass (an __iter__ generator) that is running, if any: set_epoch of its own
        # epoch leaves it alone (see set_epoch).
        self._live: object | None = None
        self._observers: list[Callable[[int, int | None], None]] = []
        self.num_workers: int | None = None
        """``num_workers`` of the loader the last :meth:`batches` ran (step records carry
        it: the drill names the workers' RNG from it); None before one."""
        # Called once by the first pass over a restored cursor (see on_resumed_pass).
        self._on_resume: Callable[[ResumableSampler], None] | None = None
        # The last pass was handed to a DataLoader with workers, without delivery tracking
        # (see counts_ahead).
        self._ahead = False

    def __deepcopy__(self, memo: dict[int, Any]) -> ResumableSampler:
        # The dataset is shared (not copied) and observers stay with the original: a copy
        # is a probe of the order, not a second consumer.
        new = copy.copy(self)
        memo[id(self)] = new
        if self.lengths is not None:
            new.lengths = self.lengths.clone()
        new._observers = []
        new._undelivered = None
        new._batching = new._fetching = False
        new._live = new._rewind = None
        new._on_resume = None
        return new

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_observers"] = []
        state["_undelivered"] = None
        state["_batching"] = state["_fetching"] = False
        state["_live"] = state["_rewind"] = None
        state["_on_resume"] = None
        return state

    def add_observer(self, fn: Callable[[int, int | None], None]) -> None:
        """Call ``fn(epoch, index)`` for every index the training loop receives.

        Inside :meth:`batches` also ``fn(epoch, None)`` before each batch is fetched.

        Example:
            >>> s, seen = ResumableSampler(3, shuffle=False), []
            >>> s.add_observer(lambda e, i: seen.append((e, i)))
            >>> _ = list(s); seen
            [(0, 0), (0, 1), (0, 2)]
        """
        if fn not in self._observers:
            self._observers.append(fn)

    @property
    def counts_ahead(self) -> bool:
        """Whether the cursor counts indices a prefetching DataLoader took but the loop may
        not have trained on yet.

        True after a pass handed to a ``DataLoader`` with ``num_workers > 0`` that is
        iterated directly (``for batch in loader``): the workers take indices ahead of the
        loop, so a checkpoint's cursor is ahead of the batches trained on and a resume
        skips the difference. :meth:`batches` and :meth:`track_delivery` count only what
        the loop received. The resume guard reports it (``CK-D002``).

        Example:
            >>> ResumableSampler(4).counts_ahead
            False
        """
        return self._ahead and self._undelivered is None

    @property
    def resumed_pass_hook(self) -> Callable[[ResumableSampler], None] | None:
        """What :meth:`on_resumed_pass` set and the first pass has not called yet, if any.

        Example:
            >>> ResumableSampler(4).resumed_pass_hook is None
            True
        """
        return self._on_resume

    def on_resumed_pass(self, fn: Callable[[ResumableSampler], None] | None) -> None:
        """Call ``fn(self)`` once, when the first pass over the restored cursor starts.

        The resume guard sets it at a restore: the pass starts inside the ``DataLoader``
        iterator that asks for it (its ``iter()`` has drawn its workers' base seed by then),
        before the first index is handed out, so ``fn`` can see whether the global RNG
        moved since the restore and put the loader's draw back. ``set_epoch`` of another
        epoch first drops the restored cursor, and ``fn`` with it (the uninterrupted run
        built a new iterator there too). None clears it.

        Example:
            >>> s, seen = ResumableSampler(4, shuffle=False), []
            >>> s.load_state_dict({**s.state_dict(), "position": 1})
            >>> s.on_resumed_pass(lambda sampler: seen.append(sampler.position))
            >>> list(s), seen
            ([1, 2, 3], [1])
        """
        self._on_resume = fn

    def remove_observer(self, fn: Callable[[int, int | None], None]) -> None:
        """Stop calling ``fn`` (no error when it was not registered).

        Example:
            >>> ResumableSampler(3).remove_observer(print)
        """
        if fn in self._observers:
            self._observers.remove(fn)

    def sample_hash(self, index: int) -> str | None:
        """The dataset's content hash of ``index`` (``dataset.sample_hash``), or None.

        Example:
            >>> ResumableSampler(3).sample_hash(0) is None
            True
        """
        fn = getattr(self.dataset, "sample_hash", None)
        return str(fn(index)) if callable(fn) else None

    # ----- order -----------------------------------------------------------------------------

    def _epoch_order(self) -> torch.Tensor:
        """Return the global order of the current epoch (cached per epoch)."""
        if self._order_cache is not None and self._order_cache[0] == self.epoch:
            return self._order_cache[1]
        gen = torch.Generator()
        gen.manual_seed(
            xxhash.xxh3_64_intdigest(f"{ORDER_SALT}:{self.seed}:{self.epoch}".encode())
        )
        n = self.data_len
        order = torch.randperm(n, generator=gen) if self.shuffle else torch.arange(n)
        if self.lengths is not None and self.bucket_size is not None and n:
            order = self._bucket(order, gen)
        self._order_cache = (self.epoch, order)
        return order

    def _bucket(self, order: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Sort ``order`` by length within chunks, then shuffle ``batch_size`` groups."""
        assert self.lengths is not None and self.bucket_size is not None
        pos = torch.arange(order.numel())
        chunk = pos // self.bucket_size
        # Two stable sorts make a lexicographic (chunk, length) sort without a combined key
        # that could overflow; equal lengths keep their shuffled order, so ties stay random.
        by_len = torch.sort(self.lengths[order], stable=True).indices
        by_chunk = torch.sort(chunk[by_len], stable=True).indices
        order = order[by_len[by_chunk]]
        if self.batch_size and self.shuffle:
            per_chunk = math.ceil(self.bucket_size / self.batch_size)
            group = chunk * per_chunk + (pos % self.bucket_size) // self.batch_size
            _, group = torch.unique_consecutive(group, return_inverse=True)
            num_groups = int(group[-1]) + 1
            new_place = torch.empty(num_groups, dtype=torch.int64)
            new_place[torch.randperm(num_groups, generator=gen)] = torch.arange(num_groups)
            order = order[torch.sort(new_place[group], stable=True).indices]
        return order

    def _rank_indices(self, offset: int) -> torch.Tensor:
        """Return this rank's share of the epoch order after ``offset``."""
        rest = self._epoch_order()[offset:]
        m, w = rest.numel(), self.world_size
        if self.drop_last:
            rest = rest[: (m // w) * w]
        elif m % w:
            # Pad by repeating the segment's first indices, as DistributedSampler does.
            total = math.ceil(m / w) * w
            rest = torch.cat([rest] * math.ceil(total / m))[:total]
        return rest[self.rank :: w]

    def _num_samples(self, offset: int) -> int:
        m, w = self.data_len - offset, self.world_size
        return m // w if self.drop_last else math.ceil(m / w)

    @property
    def num_samples(self) -> int:
        """Indices this rank yields in the current segment of the epoch."""
        return self._num_samples(self.offset)

    def _cursor(self) -> tuple[int, int]:
        """Return the (offset, position) the next ``iter()`` starts from."""
        if self._restored:
            # A restored cursor continues where the saved run stood, exhausted or not: an
            # exhausted one yields nothing (the saved run had finished this epoch).
            return self.offset, self.position
        if self.position >= self.num_samples > 0:
            # Exhausted: the next iter() starts the same epoch again, as DistributedSampler does.
            # An empty segment (a resume at a larger world size with fewer indices left than
            # ranks, under drop_last) is not restarted: that would replay the epoch.
            return 0, 0
        return self.offset, self.position

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        if self._rewind is not None:
            # The first index of a batches() pass: undo what building the loader's
            # iterator drew from the global torch RNG (its workers' base seed; see _fetch).
            torch.set_rng_state(self._rewind)
            self._rewind = None
        self._give_back()  # a new pass: what the last one handed out but never delivered
        hook, self._on_resume = self._on_resume, None
        if hook is not None and self._restored:
            # The first pass over the restored cursor: the DataLoader's iterator that asks
            # for it was just built (its base seed already drawn), no index is out yet.
            hook(self)
        self.offset, self.position = self._cursor()
        self._restored = False
        if self._undelivered is None:
            it = loader_iterator()
            self._ahead = it is not None and int(getattr(it, "_num_workers", 0)) > 0
        indices = self._rank_indices(self.offset).tolist()
        me = self._live = object()
        try:
            while self.position < len(indices):
                index = indices[self.position]
                # Count before yielding: once the consumer holds the index, it is consumed.
                self.position += 1
                if self._undelivered is not None:
                    self._undelivered.append(index)  # reported when the loop receives it
                else:
                    for fn in self._observers:
                        fn(self.epoch, index)
                yield index
        finally:
            if self._live is me:
                self._live = None

    def batches(self, loader: Any) -> Iterator[Any]:
        """Iterate ``loader`` over the rest of this epoch, keeping the cursor exact.

        ``loader`` is a ``torch.utils.data.DataLoader`` whose ``sampler`` is this sampler
        (any ``num_workers``, ``batch_size``, ``drop_last``). When the current epoch is
        done, the next one starts first. Compared with ``for batch in loader``:

        * the cursor (``state_dict``, the resume guard's look-ahead) counts the batches this
          iterator has *returned*, so batches the workers prefetched are not skipped on
          resume;
        * creating the loader's iterator does not move the global torch RNG (its workers'
          base seed is drawn inside ``torch.random.fork_rng``), so a resume mid-epoch sees
          the same random streams as the uninterrupted run;
        * observers see the indices of each batch as the loop receives it.

        Example:
            >>> data = torch.arange(10)
            >>> s = ResumableSampler(data, shuffle=False)
            >>> loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=s)
            >>> it = s.batches(loader)
            >>> next(it).tolist(), s.state_dict()["position"]
            ([0, 1, 2, 3], 4)
        """
        if getattr(loader, "sampler", None) is not self:
            raise ValueError(
                "batches(loader): the loader's sampler is not this ResumableSampler; build "
                "it as DataLoader(dataset, sampler=this_sampler, batch_size=...)"
            )
        size = getattr(loader, "batch_size", None)
        if size is None:
            raise ValueError(
                "batches(loader): the loader has no batch_size (a custom batch_sampler); "
                "batches() needs the DataLoader's own batching to know which indices each "
                "batch holds"
            )
        if self._batching:
            raise RuntimeError("batches(): another batches() iteration of this sampler is running")
        workers = getattr(loader, "num_workers", None)
        self.num_workers = workers if isinstance(workers, int) else None
        self._give_back()
        if self.position >= self.num_samples:
            if self._restored:
                # Restored at the end of an epoch: the saved run had finished it, so this
                # pass is empty and the next call starts the next epoch (as a plain
                # ``set_epoch(epoch); for batch in loader`` loop resumes).
                self._restored = False
                return
            self.set_epoch(self.epoch + 1)
        tracking = self._undelivered is not None  # track_delivery() is on: keep it on
        pending: deque[int] = deque()
        self._undelivered = pending
        self._batching = True
        finished = False
        try:
            # iter() draws its workers' base seed from the global torch RNG (when the
            # loader has no generator): keep the training streams out of it.
            with torch.random.fork_rng(devices=[]), self._fetch():
                it = iter(loader)
            first = True
            while True:
                for fn in self._observers:
                    fn(self.epoch, None)  # a batch is about to be fetched (a step starts)
                try:
                    with self._fetch(rewind=first):
                        batch = next(it)
                except StopIteration:
                    break
                first = False
                self.delivered(int(size))
                yield batch
            finished = True
        finally:
            if not finished:
                # Left early: indices handed out but never received go back to the
                # cursor, so the next iteration (or a checkpoint) hands them out again.
                self._give_back()
            # After a full pass they are consumed (a drop_last tail included).
            self._undelivered = deque() if tracking else None
            self._batching = False

    @contextlib.contextmanager
    def _fetch(self, *, rewind: bool = False) -> Iterator[None]:
        """While the loader fetches inside :meth:`batches`, this sampler owns its epoch.

        A loader wrapper may start its real iterator only at the first ``next()``, and
        call ``set_epoch`` itself then: Lightning Fabric's ``_FabricDataLoader``
        (``fabric.setup_dataloaders``) calls ``set_epoch(n)`` with ``n`` the number of
        ``iter()`` calls *of this process*, which starts again at 0 in a resumed process
        and would restart the run at epoch 0. :meth:`batches` decides the epoch (it
        starts the next one when this one is done), so such calls are ignored.

        With ``rewind`` (the first fetch of a pass), the global torch RNG state is kept
        and put back when the pass's first index is handed out: building the
        ``DataLoader`` iterator draws its workers' base seed from that generator, and
        inside a wrapper that happens here, out of reach of the ``fork_rng`` around
        ``iter(loader)``. Nothing else runs between the two (the dataset is read after
        the batch's indices are drawn), so a resume mid-epoch sees the same training
        streams as the uninterrupted run, wrapper or not.
        """
        self._fetching = True
        if rewind:
            self._rewind = torch.get_rng_state()
        try:
            yield
        finally:
            self._fetching = False
            self._rewind = None

    def track_delivery(self, on: bool = True) -> None:
        """Count the indices handed out as in flight until the loop reports them received.

        For a loop that iterates the ``DataLoader`` itself (a framework's, such as the
        Lightning Trainer's) instead of :meth:`batches`: workers and the framework fetch
        batches ahead of the training step, so the position (counted when an index is
        handed out) runs ahead of what was trained on. With tracking on, each batch the
        step receives is reported with :meth:`delivered`; :meth:`state_dict`, the
        look-ahead and the observers then count only delivered indices, and indices
        handed out but never delivered are handed out again by the next pass.

        Example:
            >>> s = ResumableSampler(8, shuffle=False)
            >>> s.track_delivery()
            >>> it = iter(s); fetched = [next(it) for _ in range(4)]   # prefetched
            >>> s.delivered(2), s.state_dict()["position"]
            ([0, 1], 2)

        ``track_delivery(False)`` turns it off: what is in flight counts as delivered.
        """
        if on and self._undelivered is None:
            self._undelivered = deque()
        elif not on and self._undelivered is not None and not self._batching:
            self.delivered(len(self._undelivered))
            self._undelivered = None

    def delivered(self, count: int) -> list[int]:
        """Report that the training loop received the next ``count`` handed-out indices.

        Observers hear them now (their sample ids belong to the step that receives them).
        Returns them; fewer when fewer are in flight (a short last batch). Without
        tracking (:meth:`track_delivery` or :meth:`batches`) indices count as delivered
        when handed out, and this returns ``[]``.

        Example:
            >>> s = ResumableSampler(4, shuffle=False)
            >>> s.track_delivery(); _ = list(s)
            >>> s.delivered(3), s.delivered(3)
            ([0, 1, 2], [3])
        """
        pending = self._undelivered
        if not pending:
            return []
        got = [pending.popleft() for _ in range(min(int(count), len(pending)))]
        for fn in self._observers:
            for index in got:
                fn(self.epoch, index)
        return got

    def _received(self) -> int:
        """The position of the loop in the current segment: indices handed out minus those
        still in flight (the cursor :meth:`state_dict` saves and the look-ahead starts at)."""
        return self.position - len(self._undelivered or ())

    def _give_back(self) -> None:
        """Put indices handed out but never delivered back under the cursor."""
        if self._undelivered:
            self.position -= len(self._undelivered)
            self._undelivered.clear()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning.

        Example:
            >>> s = ResumableSampler(4)
            >>> s.set_epoch(3)
            >>> s.state_dict()["epoch"], s.state_dict()["position"]
            (3, 0)
        """
        epoch = int(epoch)
        if self._fetching:
            return  # the loader's own call, inside batches(): batches() decides (see _fetch)
        if self._restored and epoch < self.epoch:
            raise StateError(
                f"set_epoch({epoch}) right after restoring a cursor of epoch {self.epoch} "
                f"(position {self.position}): starting over at an earlier epoch replays "
                "samples the saved run had trained on",
                hint="iterate with 'for batch in sampler.batches(loader)' (it keeps the "
                "restored epoch, also when a framework's loader calls set_epoch with its own "
                "count of iter() calls, as Lightning Fabric's setup_dataloaders loader does), "
                "or loop 'for epoch in range(sampler.epoch, num_epochs)'; to start over on "
                "purpose, do not restore the sampler",
            )
        if self._restored and epoch == self.epoch:
            return  # a restored cursor of this epoch: continue it (see "Resuming an epoch loop")
        if epoch == self.epoch and self.position > 0 and (self._live or self._undelivered):
            # A pass of this epoch is under way (a DataLoader's workers pulled indices, maybe
            # all of a short epoch, before the framework set the epoch, as the Lightning
            # Trainer does at its first epoch and at a resume): like DistributedSampler,
            # set_epoch affects the next pass, not the running one.
            return
        self.epoch = epoch
        self.offset = 0
        self.position = 0
        self._restored = False
        self._on_resume = None
        self._ahead = False
        if self._undelivered:
            self._undelivered.clear()  # in flight from the epoch left behind: never trained

    def next_indices(self, k: int) -> list[int]:
        """Return the next ``k`` indices the training loop will receive, without advancing.

        At the end of an epoch these are the first of the next epoch (where a loop goes on,
        with ``set_epoch(epoch + 1)`` or :meth:`batches`); fewer are returned near the end
        of an epoch. Used by resume guards to check that a restored sampler continues where
        the saved run would have.

        Example:
            >>> s = ResumableSampler(6, shuffle=False)
            >>> s.next_indices(2), list(s)[:2]
            ([0, 1], [0, 1])
        """
        position = self._received()
        if position >= self.num_samples > 0:
            probe = copy.deepcopy(self)
            probe._restored = False
            probe.set_epoch(self.epoch + 1)
            return probe.next_indices(k)
        # The loop receives the indices in flight first, then the rest of this segment: the
        # same (offset, position) the next iter() starts from once it has given those back.
        # (_cursor() reads the raw position, which counts them: when the fetch had reached
        # the end of the epoch it answered "start again", and the look-ahead came out empty.)
        return self._rank_indices(self.offset)[position : position + max(k, 0)].tolist()

    def consumed_between(
        self, start: Mapping[str, Any], end: Mapping[str, Any], *, limit: int | None = None
    ) -> list[tuple[int, int]]:
        """Return the ``(epoch, index)`` pairs this rank is handed from cursor ``start`` to ``end``.

        Both cursors are :meth:`state_dict` results of this rank at this world size (an
        automatic recovery records the samples it skips with it). Epochs in between are
        taken whole, as a loop that starts the next epoch when one is done takes them.
        The sampler itself does not move.

        Args:
            start: the earlier cursor.
            end: the later cursor.
            limit: return at most this many pairs (the first ones).

        Raises:
            ValueError: a cursor is from another world size or rank, or ``end`` is before
                ``start``.

        Example:
            >>> s = ResumableSampler(4, shuffle=False)
            >>> a = s.state_dict(); _ = [next(iter(s)) for _ in range(1)]
            >>> s.consumed_between(a, s.state_dict())
            [(0, 0)]
        """
        for c in (start, end):
            if int(c["world_size"]) != self.world_size or int(c["rank"]) != self.rank:
                raise ValueError(
                    "consumed_between: the cursors must be this rank's at this world size "
                    f"(rank {self.rank} of {self.world_size}), got rank {c['rank']} of "
                    f"{c['world_size']}"
                )
        at = (int(start["epoch"]), int(start["position"]))
        stop = (int(end["epoch"]), int(end["position"]))
        if stop < at:
            raise ValueError(f"consumed_between: end {stop} is before start {at} (epoch, position)")
        probe = copy.deepcopy(self)
        out: list[tuple[int, int]] = []
        epoch, offset, position = at[0], int(start["offset"]), at[1]
        while (epoch, position) < stop or epoch < stop[0]:
            probe.epoch = epoch
            order = probe._rank_indices(offset).tolist()
            upto = stop[1] if epoch == stop[0] else len(order)
            out += [(epoch, i) for i in order[position:upto]]
            if limit is not None and len(out) >= limit:
                return out[:limit]
            if epoch >= stop[0]:
                break
            epoch, offset, position = epoch + 1, 0, 0
        return out

    def fingerprint_next(self, k: int) -> str:
        """Return an xxh3-64 hex digest of :meth:`next_indices` ``(k)``.

        Example:
            >>> a, b = ResumableSampler(8, seed=1), ResumableSampler(8, seed=1)
            >>> a.fingerprint_next(4) == b.fingerprint_next(4)
            True
        """
        data = torch.tensor(self.next_indices(k), dtype=torch.int64).numpy().tobytes()
        return xxhash.xxh3_64_hexdigest(data)

    def _bucket_state(self) -> dict[str, Any] | None:
        if self.lengths is None:
            return None
        return {
            "bucket_size": self.bucket_size,
            "batch_size": self.batch_size,
            "lengths_fingerprint": xxhash.xxh3_64_hexdigest(self.lengths.numpy().tobytes()),
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the cursor and the settings that define the order.

        Returns:
            ``version``, ``epoch``, ``position``, ``offset``, ``consumed`` (global count
            ``offset + position × world_size``, capped at ``data_len``), ``seed``, ``rank``,
            ``world_size``, ``num_samples``, ``shuffle``, ``drop_last``, ``bucket`` (None or
            ``{bucket_size, batch_size, lengths_fingerprint}``) and ``data_len``.

        Example:
            >>> ResumableSampler(10).state_dict()["position"]
            0
        """
        # Inside batches(), indices the loop has not received yet are not consumed.
        position = self._received()
        consumed = min(self.offset + position * self.world_size, self.data_len)
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "position": position,
            "offset": self.offset,
            "consumed": consumed,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_samples": self.num_samples,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "bucket": self._bucket_state(),
            "data_len": self.data_len,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved cursor (see the class docstring for world-size changes).

        Args:
            state: a dict from :meth:`state_dict`, from any rank of the saved run.

        Raises:
            StateError: ``CK-S013`` the state is malformed (see :func:`state_problems`);
                the dataset length, seed, shuffle, drop_last or bucketing differ, so the
                saved position would point into a different order.

        Example:
            >>> a = ResumableSampler(10, world_size=2)
            >>> _ = next(iter(a))
            >>> b = ResumableSampler(10, world_size=1)
            >>> b.load_state_dict(a.state_dict())
            >>> len(list(b))
            8
        """
        refuse("sampler", state_problems(state))
        for key, mine in (
            ("data_len", self.data_len),
            ("seed", self.seed),
            ("shuffle", self.shuffle),
            ("drop_last", self.drop_last),
            ("bucket", self._bucket_state()),
        ):
            saved = state[key]
            if saved != mine:
                raise StateError(
                    f"sampler {key} was {saved!r} in the saved run, it is {mine!r} now",
                    hint=f"construct the ResumableSampler with the saved {key} (a different "
                    "value changes the epoch order, so the saved position would replay or "
                    "skip samples)",
                )
        epoch, offset, position = int(state["epoch"]), int(state["offset"]), int(state["position"])
        saved_w = int(state["world_size"])
        if offset < 0 or position < 0 or offset > self.data_len:
            raise StateError(f"sampler cursor offset={offset}, position={position} is invalid")
        self.epoch = epoch
        if saved_w == self.world_size:
            self.offset, self.position = offset, position
            if position > self.num_samples:
                raise StateError(
                    f"sampler position {position} is past the {self.num_samples} samples of "
                    "this rank's epoch",
                    hint="the state is corrupt or from another dataset",
                )
        else:
            self.offset = min(offset + position * saved_w, self.data_len)
            self.position = 0
        self._restored = True
        self._ahead = False
        if self._undelivered:
            self._undelivered.clear()  # handed out before the restore: not of this cursor


def state_problems(state: Any) -> list[str]:
    """Return what in a saved cursor :meth:`ResumableSampler.load_state_dict` could not
    load as saved (empty: nothing).

    Every field :meth:`ResumableSampler.state_dict` writes, typed as it writes it: the
    version, non-negative counters, a world size from 1, a bool ``shuffle`` and
    ``drop_last``, an int seed, ``bucket`` None or its three settings, and an offset
    inside the dataset. What depends on the sampler it is loaded into (the same dataset
    length, seed...) is checked by ``load_state_dict``.

    Example:
        >>> state_problems(ResumableSampler(10, seed=3).state_dict())
        []
        >>> state_problems({**ResumableSampler(10).state_dict(), "position": "x"})
        ["position is 'x', not a non-negative int"]
    """
    if not isinstance(state, Mapping):
        return [f"the cursor is {show(state)}, not an object"]
    keys = {"version", "seed", "world_size", "shuffle", "drop_last", "bucket", *_COUNTERS}
    missing = sorted(keys - set(state))
    if missing:
        return [f"the cursor misses {missing}"]
    out: list[str] = []
    if state["version"] != STATE_VERSION or type(state["version"]) is not int:
        out.append(f"version is {show(state['version'])}, this ckptkit reads {STATE_VERSION}")
    out += [
        f"{key} is {show(state[key])}, not a non-negative int"
        for key in _COUNTERS
        if not is_int(state[key])
    ]
    if not is_int(state["world_size"], lo=1):
        out.append(f"world_size is {show(state['world_size'])}, not an int from 1")
    if type(state["seed"]) is not int:
        out.append(f"seed is {show(state['seed'])}, not an int")
    for key in ("shuffle", "drop_last"):
        if not isinstance(state[key], bool):
            out.append(f"{key} is {show(state[key])}, not true or false")
    bucket = state["bucket"]
    if bucket is not None and not (
        isinstance(bucket, Mapping)
        and set(bucket) == {"bucket_size", "batch_size", "lengths_fingerprint"}
        and (bucket["bucket_size"] is None or is_int(bucket["bucket_size"], lo=1))
        and (bucket["batch_size"] is None or is_int(bucket["batch_size"], lo=1))
        and isinstance(bucket["lengths_fingerprint"], str)
    ):
        out.append(f"bucket is {show(bucket)}, not null or its bucket_size, batch_size and "
                   "lengths_fingerprint")
    if not out and state["offset"] > state["data_len"]:
        out.append(f"offset {state['offset']} is past the {state['data_len']} samples")
    return out


__all__ = ["ResumableSampler", "loader_iterator", "state_problems"]
