"""ResumableSampler: deterministic order, exact mid-epoch resume, resume at another world size."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptkit.capture.resumable import ResumableSampler
from ckptkit.errors import StateError


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 60))
    cfg: dict[str, Any] = {
        "n": n,
        "seed": draw(st.integers(0, 2**32)),
        "shuffle": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "epoch": draw(st.integers(0, 5)),
    }
    if n and draw(st.booleans()):
        cfg["lengths"] = draw(st.lists(st.integers(1, 50), min_size=n, max_size=n))
        cfg["bucket_size"] = draw(st.integers(1, 16))
        cfg["batch_size"] = draw(st.none() | st.integers(1, 8))
    return cfg


def make(cfg: dict[str, Any], rank: int = 0, world_size: int = 1) -> ResumableSampler:
    s = ResumableSampler(
        cfg["n"],
        seed=cfg["seed"],
        shuffle=cfg["shuffle"],
        drop_last=cfg["drop_last"],
        rank=rank,
        world_size=world_size,
        lengths=cfg.get("lengths"),
        bucket_size=cfg.get("bucket_size"),
        batch_size=cfg.get("batch_size"),
    )
    s.set_epoch(cfg["epoch"])
    return s


def take(s: ResumableSampler, k: int) -> list[int]:
    it = iter(s)
    return [next(it) for _ in range(k)]


@settings(max_examples=60, deadline=None)
@given(cfg=configs(), world_size=st.integers(1, 5), data=st.data())
def test_interrupted_equals_uninterrupted(
    cfg: dict[str, Any], world_size: int, data: st.DataObject
) -> None:
    for rank in range(world_size):
        full = list(make(cfg, rank, world_size))
        stop = data.draw(st.integers(0, max(len(full) - 1, 0)))
        first = make(cfg, rank, world_size)
        head = take(first, stop)
        state = first.state_dict()
        resumed = make(cfg, rank, world_size)
        resumed.set_epoch(99)  # the state must bring back the epoch too
        resumed.load_state_dict(state)
        assert resumed.next_indices(3) == full[stop : stop + 3]
        assert head + list(resumed) == full


@settings(max_examples=60, deadline=None)
@given(cfg=configs(), world_size=st.integers(1, 5))
def test_one_epoch_covers_every_index(cfg: dict[str, Any], world_size: int) -> None:
    n = cfg["n"]
    per_rank = [list(make(cfg, r, world_size)) for r in range(world_size)]
    assert len({len(x) for x in per_rank}) <= 1  # ranks stay in lockstep
    assert all(len(x) == len(make(cfg, r, world_size)) for r, x in enumerate(per_rank))
    counts = Counter(i for x in per_rank for i in x)
    assert set(counts) <= set(range(n))
    if n % world_size == 0:
        assert counts == Counter(range(n))
    elif cfg["drop_last"]:
        assert all(c == 1 for c in counts.values())
        assert len(counts) == n - n % world_size
    else:
        # Padding repeats the first indices of the order: every index, a few twice.
        assert set(counts) == set(range(n))
        assert sum(counts.values()) - n == world_size - n % world_size


@settings(max_examples=80, deadline=None)
@given(cfg=configs(), w1=st.integers(1, 5), w2=st.integers(1, 5), data=st.data())
def test_resume_at_other_world_size_no_replay_no_skip(
    cfg: dict[str, Any], w1: int, w2: int, data: st.DataObject
) -> None:
    n = cfg["n"]
    order = ResumableSampler._epoch_order(make(cfg))  # global order (world-size independent)
    num = len(make(cfg, 0, w1))
    stop = data.draw(st.integers(0, max(num - 1, 0)))
    before: list[int] = []
    states = []
    for r in range(w1):
        s = make(cfg, r, w1)
        before += take(s, stop)
        states.append(s.state_dict())
    after: list[int] = []
    for r in range(w2):
        s = make(cfg, r, w2)
        s.load_state_dict(states[-1 - r % w1])  # any rank's state works (lockstep)
        after += list(s)
    consumed = stop * w1
    assert Counter(before) == Counter(order[:consumed].tolist())
    rest = order[consumed:].tolist()
    counts = Counter(after)
    if cfg["drop_last"]:
        # None repeated; only the final < w2 indices of the remainder may be dropped.
        assert all(c == 1 for c in counts.values())
        assert sorted(counts) == sorted(rest[: len(rest) - len(rest) % w2])
        assert len(set(before) | set(counts)) == n - len(rest) % w2
    else:
        # Every remaining index comes; the only extras are the < w2 padding repeats.
        assert not Counter(rest) - counts
        assert (counts - Counter(rest)).total() == (-len(rest)) % w2
        assert set(before) | set(counts) == set(range(n))


def test_order_is_deterministic_and_epoch_dependent() -> None:
    a = list(ResumableSampler(100, seed=1))
    assert a == list(ResumableSampler(100, seed=1))
    assert sorted(a) == list(range(100))
    s = ResumableSampler(100, seed=1)
    s.set_epoch(1)
    assert list(s) != a
    assert list(ResumableSampler(100, seed=2)) != a
    # seed+epoch collisions (DistributedSampler's scheme) do not happen here.
    t = ResumableSampler(100, seed=0)
    t.set_epoch(1)
    u = ResumableSampler(100, seed=1)
    u.set_epoch(0)
    assert list(t) != list(u)
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_bucketing_groups_similar_lengths() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 1000, (512,), generator=gen).tolist()
    s = ResumableSampler(512, seed=3, lengths=lengths, bucket_size=64, batch_size=8)
    order = list(s)
    assert sorted(order) == list(range(512))
    batches = [order[i : i + 8] for i in range(0, 512, 8)]
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(
        batches
    )
    plain = list(ResumableSampler(512, seed=3))
    plain_batches = [plain[i : i + 8] for i in range(0, 512, 8)]
    plain_spread = sum(
        max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in plain_batches
    ) / len(plain_batches)
    assert spread < plain_spread / 3
    # Batches are shuffled: the first batches are not all the shortest ones.
    firsts = [min(lengths[i] for i in b) for b in batches[:8]]
    assert firsts != sorted(firsts) or max(firsts) > 100


def test_exhausted_epoch_restarts_without_advancing() -> None:
    s = ResumableSampler(10, seed=4, world_size=2)
    first = list(s)
    assert s.state_dict()["position"] == 5
    # The look-ahead predicts the loop's next batch: the next epoch (set_epoch(epoch + 1)).
    nxt = ResumableSampler(10, seed=4, world_size=2)
    nxt.set_epoch(1)
    assert s.next_indices(2) == list(nxt)[:2]
    assert list(s) == first  # a bare re-iteration restarts the epoch, as DistributedSampler
    assert s.state_dict()["epoch"] == 0


def test_state_dict_contents_and_fingerprint() -> None:
    s = ResumableSampler(10, seed=4, world_size=2, rank=1)
    take(s, 3)
    st_ = s.state_dict()
    assert {
        k: st_[k] for k in ("epoch", "position", "offset", "consumed", "num_samples", "data_len")
    } == {
        "epoch": 0,
        "position": 3,
        "offset": 0,
        "consumed": 6,
        "num_samples": 5,
        "data_len": 10,
    }
    other = ResumableSampler(10, seed=4, world_size=2, rank=1)
    other.load_state_dict(st_)
    assert other.fingerprint_next(2) == s.fingerprint_next(2)
    assert other.next_indices(10) == list(s)
    assert len(other) == 5


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"seed": 5}, "seed"),
        ({"shuffle": False}, "shuffle"),
        ({"drop_last": True}, "drop_last"),
        ({"lengths": [1] * 10, "bucket_size": 4}, "bucket"),
    ],
)
def test_config_mismatch_raises(kwargs: dict[str, Any], key: str) -> None:
    state = ResumableSampler(10, seed=4).state_dict()
    with pytest.raises(StateError, match=f"sampler {key} was") as err:
        ResumableSampler(10, **{"seed": 4, **kwargs}).load_state_dict(state)
    assert err.value.hint


def test_dataset_change_and_bad_args() -> None:
    state = ResumableSampler(10).state_dict()
    with pytest.raises(StateError, match="data_len was 10"):
        ResumableSampler(11).load_state_dict(state)
    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        ResumableSampler(10, lengths=[1, 2, 3], bucket_size=2)
    assert len(ResumableSampler(range(7), world_size=2)) == 4
    assert len(ResumableSampler(range(7), world_size=2, drop_last=True)) == 3


def test_works_with_dataloader() -> None:
    data = list(range(20))
    s = ResumableSampler(data, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=s)
    it = iter(loader)
    first = next(it).tolist()
    state = s.state_dict()
    assert state["position"] == 4
    resumed = ResumableSampler(data, seed=0)
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in torch.utils.data.DataLoader(data, batch_size=4, sampler=resumed)]
    assert rest == [b.tolist() for b in it]
    full = list(ResumableSampler(data, seed=0))
    assert first + [i for batch in rest for i in batch] == full


# --- resuming epoch loops and data loaders -----------------------------------------------


def test_set_epoch_keeps_a_restored_cursor_of_that_epoch() -> None:
    a = ResumableSampler(20, seed=1)
    it = iter(a)
    seen = [next(it) for _ in range(7)]
    b = ResumableSampler(20, seed=1)
    b.load_state_dict(a.state_dict())
    b.set_epoch(0)  # the usual `for epoch in range(sampler.epoch, E): sampler.set_epoch(epoch)`
    assert seen + list(b) == list(ResumableSampler(20, seed=1))
    b.set_epoch(0)  # no longer restored: a real restart of the epoch
    assert len(list(b)) == 20


def test_a_restored_exhausted_epoch_yields_nothing_then_the_loop_moves_on() -> None:
    a = ResumableSampler(6, seed=1)
    list(a)
    b = ResumableSampler(6, seed=1)
    b.load_state_dict(a.state_dict())
    b.set_epoch(0)
    assert list(b) == []  # the saved run had finished epoch 0
    b.set_epoch(1)
    want = ResumableSampler(6, seed=1)
    want.set_epoch(1)
    assert list(b) == list(want)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_counts_only_what_the_loop_received(workers: int) -> None:
    data = torch.arange(40)
    s = ResumableSampler(data, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=s, num_workers=workers)
    got: list[int] = []
    for i, batch in enumerate(s.batches(loader)):
        got += batch.tolist()
        if i == 2:
            state = s.state_dict()  # the workers have prefetched further
            assert state["position"] == 12
            break
    assert s.state_dict()["position"] == 12  # leaving early gives the prefetched back
    t = ResumableSampler(data, seed=3)
    t.load_state_dict(state)
    rest = [x for b in t.batches(torch.utils.data.DataLoader(
        data, batch_size=4, sampler=t, num_workers=workers)) for x in b.tolist()]
    assert got + rest == list(ResumableSampler(40, seed=3))


def test_batches_rolls_over_epochs_and_keeps_the_global_rng() -> None:
    data = torch.arange(10)
    s = ResumableSampler(data, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=s, drop_last=True)
    before = torch.get_rng_state()
    first = [b.tolist() for b in s.batches(loader)]
    assert len(first) == 2 and torch.equal(torch.get_rng_state(), before)
    second = [b.tolist() for b in s.batches(loader)]
    assert s.epoch == 1 and len(second) == 2 and second != first


def test_batches_needs_the_loader_built_on_this_sampler() -> None:
    s = ResumableSampler(4)
    with pytest.raises(ValueError, match="sampler is not this ResumableSampler"):
        next(s.batches(torch.utils.data.DataLoader(list(range(4)))))


# --- loaders that set the epoch themselves (issue 24) ------------------------------------------


class _CountingWrapper:
    """What Lightning Fabric's ``_FabricDataLoader`` does: ``set_epoch(n)`` with ``n`` its own
    count of ``iter()`` calls in this process, then builds the real iterator lazily (inside
    the first ``next()``)."""

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:
        self.__dict__.update(loader.__dict__)
        self._loader = loader
        self._calls = 0

    def __iter__(self) -> Any:
        self.sampler.set_epoch(self._calls)
        self._calls += 1
        yield from iter(self._loader)


def _epoch_one_half_done(n: int = 16) -> tuple[dict[str, Any], list[int]]:
    """A cursor saved 4 samples into epoch 1, and what the uninterrupted run yields next."""
    a = ResumableSampler(n, seed=5)
    a.set_epoch(1)
    it = iter(a)
    [next(it) for _ in range(4)]
    return a.state_dict(), list(it)


def test_batches_keeps_a_restored_epoch_when_the_loader_sets_its_own() -> None:
    state, rest = _epoch_one_half_done()
    s = ResumableSampler(16, seed=5)
    s.load_state_dict(state)
    data = torch.arange(16)
    wrapped = _CountingWrapper(torch.utils.data.DataLoader(data, batch_size=4, sampler=s))
    torch.manual_seed(0)
    got = [i for b in s.batches(wrapped) for i in b.tolist()]
    after = torch.rand(2)
    torch.manual_seed(0)
    want_rng = torch.rand(2)  # the iterator's base-seed draw (inside next()) was undone
    assert got == rest
    assert torch.equal(after, want_rng)
    assert s.state_dict()["epoch"] == 1


def test_a_loop_that_sets_an_earlier_epoch_right_after_a_restore_is_refused() -> None:
    state, _ = _epoch_one_half_done()
    s = ResumableSampler(16, seed=5)
    s.load_state_dict(state)
    s.set_epoch(1)  # the loop's own call: keeps the cursor
    wrapped = _CountingWrapper(torch.utils.data.DataLoader(torch.arange(16), batch_size=4,
                                                           sampler=s))
    with pytest.raises(StateError, match=r"set_epoch\(0\).*epoch 1") as e:
        next(iter(wrapped))
    assert "sampler.batches(loader)" in str(e.value)
    assert s.state_dict()["position"] == 4  # nothing moved


def test_set_epoch_of_a_pass_whose_indices_are_in_flight_leaves_it_alone() -> None:
    # The Lightning Trainer builds the loader's iterator (workers pull a whole short epoch)
    # and only then calls set_epoch(0): the pass and its cursor go on.
    s = ResumableSampler(8, shuffle=False)
    s.track_delivery()
    fetched = list(s)  # all of the epoch handed out, none delivered yet
    s.set_epoch(0)
    assert s.delivered(4) == fetched[:4]
    assert s.state_dict()["position"] == 4
    assert s.next_indices(2) == fetched[4:6]
    s.set_epoch(1)  # another epoch: a fresh start, what was in flight is dropped
    assert s.state_dict()["position"] == 0
    assert s.delivered(4) == []


def test_a_new_pass_hands_out_again_what_was_never_delivered() -> None:
    s = ResumableSampler(8, shuffle=False)
    s.track_delivery()
    it = iter(s)
    [next(it) for _ in range(6)]
    s.delivered(2)
    assert list(s) == [2, 3, 4, 5, 6, 7]
    s.track_delivery(False)
    assert s.state_dict()["position"] == 8


def _received_next(n: int, delivered: int, k: int) -> list[int]:
    """The next ``k`` indices a loop that received ``delivered`` of epoch 0 gets: the rest
    of epoch 0, or, once it is done (the loop calls set_epoch(1)), epoch 1's first."""
    ref = ResumableSampler(n, seed=5)
    epoch0 = list(ref)
    ref.set_epoch(1)
    return (epoch0[delivered:] or list(ref))[:k]


def _in_flight(n: int, fetched: int, delivered: int, *, restored: bool) -> ResumableSampler:
    """A tracked sampler whose loader fetched ``fetched`` indices of epoch 0 and whose loop
    received ``delivered`` of them; ``restored``: the first ``delivered`` came from a saved
    cursor (a resume), the rest were fetched by the resumed loader."""
    s = ResumableSampler(n, seed=5)
    s.track_delivery()
    it = iter(s)
    if restored:
        [next(it) for _ in range(delivered)]
        s.delivered(delivered)
        state = s.state_dict()
        s = ResumableSampler(n, seed=5)
        s.track_delivery()
        s.load_state_dict(state)
        it = iter(s)
        [next(it) for _ in range(fetched - delivered)]
    else:
        [next(it) for _ in range(fetched)]
        s.delivered(delivered)
    return s


@pytest.mark.parametrize("restored", [False, True], ids=["live", "restored"])
def test_next_indices_start_at_the_first_index_in_flight(restored: bool) -> None:
    # A framework's loader (the Lightning Trainer, its workers) hands out indices ahead of
    # the step; with delivery tracking the look-ahead starts at the first one not delivered,
    # also when the fetch ran ahead to the end of the epoch. It returned [] there, and the
    # resume guard reported a resume that came back exactly as CK-D002.
    n, k = 10, 4
    for fetched in range(n + 1):
        for delivered in range(fetched + 1):
            s = _in_flight(n, fetched, delivered, restored=restored)
            assert s.next_indices(k) == _received_next(n, delivered, k), (fetched, delivered)
            assert s.state_dict()["position"] == delivered


def test_the_order_of_a_seed_and_epoch_never_changes() -> None:
    """Saved runs resume into the order a seed and an epoch gave them, so the order is part
    of the format: these are the orders ckptkit 0.3 gave (a module move once rewrote the
    salt of the order's generator, and a version-1 checkpoint resumed into other samples)."""
    s = ResumableSampler(12, seed=1)
    assert list(s) == [2, 9, 1, 8, 0, 7, 3, 5, 4, 11, 10, 6]
    s.set_epoch(3)
    assert list(s) == [3, 6, 5, 9, 2, 4, 7, 10, 11, 0, 8, 1]
    assert list(ResumableSampler(10, seed=7, rank=1, world_size=2)) == [3, 0, 2, 8, 4]
