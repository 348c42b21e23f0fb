"""Replica agreement (issue 26 item 3): the comparison, and what a run does with its record.

The comparison runs here on in-process "ranks" (threads meeting in a tiny collective), so
majority, shard groups and a failed rank are cheap to cover; the real gloo runs are in
``tests/checkpoint/test_replica_ranks.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from threadranks import ThreadRank, on_ranks

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint import replicas
from ckptkit.checkpoint.commit import save_state
from ckptkit.cli import main as cli
from ckptkit.collective import Solo, all_gather_fixed, gather_fixed
from ckptkit.format import records


class Spy:
    """A thread rank (tests/threadranks.py) that counts its gathers, keeps what rank 0
    gathered, and refuses the all-gather the check must not use."""

    def __init__(self, rank: ThreadRank, gathers: list[int], sent: list[list[Any]]) -> None:
        self._r, self.rank, self.world_size = rank, rank.rank, rank.world_size
        self.gathers, self.sent = gathers, sent

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self._r.broadcast(obj, src)

    def all_gather(self, obj: Any) -> list[Any]:
        raise AssertionError("the replica check sends every record to rank 0 alone")

    def gather(self, obj: Any, dst: int = 0) -> list[Any] | None:
        self.gathers[self.rank] += 1
        out = self._r.gather(obj, dst)
        if out is not None:
            self.sent.append(out)
        return out


class World:
    """What the ranks of one check exchanged."""

    def __init__(self, n: int) -> None:
        self.gathers = [0] * n
        self.sent: list[list[Any]] = []
        """What each gather carried to rank 0, rank by rank."""


def check_all(held: list[Any]) -> tuple[list[Any], World]:
    """Run the check on one thread per rank; ``held[r]`` is rank r's tensors or selector."""
    world = World(len(held))

    def one(rank: ThreadRank) -> Any:
        spy = Spy(rank, world.gathers, world.sent)
        return replicas.check(spy, held[rank.rank], policy="warn")

    return on_ranks(len(held), one), world


def flipped(t: torch.Tensor) -> torch.Tensor:
    c = t.clone()
    c.view(-1)[:1].view(torch.int32).bitwise_xor_(1)  # the lowest bit of one float
    return c


STATE = {"model/w": torch.arange(6, dtype=torch.float32), "optimizer/state/0/exp_avg": torch.ones(3)}


def test_three_replicas_name_the_one_that_differs() -> None:
    held = [dict(STATE), dict(STATE), {**STATE, "model/w": flipped(STATE["model/w"])}]
    out, world = check_all(held)
    # One per-tensor table per distinct copy (ranks 0 and 2), not one per rank.
    assert [t is not None for t in world.sent[1]] == [True, False, True]
    assert out[0] == out[1] == out[2]  # every rank knows the same, to act on it alike
    rec = out[0]
    assert (rec.ranks, rec.groups, rec.tensors, rec.agree) == (3, 1, 2, False)
    (d,) = rec.divergent
    assert d.key == "model/w" and d.minority == (2,)
    assert sorted(d.copies.values()) == [(0, 1), (2,)]
    assert "model/w: rank 2 differs from ranks 0, 1" in rec.summary()


def test_agreeing_replicas_exchange_one_fixed_size_record_and_no_table() -> None:
    out, world = check_all([dict(STATE) for _ in range(4)])
    assert all(r is not None and r.agree and r.tensors == 2 for r in out)
    assert world.gathers == [1, 1, 1, 1]  # the per-tensor table travels only on mismatch


def test_shards_are_compared_with_the_ranks_holding_the_same_shard() -> None:
    """HSDP-like: ranks 0/2 hold shard @0, ranks 1/3 shard @4 (different values, rightly)."""
    a = {"dcp/model/w@0": torch.zeros(4), "dcp/optimizer/state/step": torch.tensor(3.0)}
    b = {"dcp/model/w@4": torch.ones(4), "dcp/optimizer/state/step": torch.tensor(3.0)}
    bad = {**b, "dcp/model/w@4": flipped(b["dcp/model/w@4"])}
    out, _ = check_all([a, b, a, bad])
    rec = out[0]
    assert rec.groups == 2 and rec.tensors == 4
    (d,) = rec.divergent
    assert d.key == "dcp/model/w@4" and d.minority is None  # two replicas: no majority
    assert sorted(d.copies.values()) == [(1,), (3,)]
    assert "ranks 1 | 3 hold different copies" in d.describe()


class Unhashable(Mapping[str, torch.Tensor]):
    def __getitem__(self, k: str) -> torch.Tensor:
        raise RuntimeError("device lost")

    def __iter__(self) -> Iterator[str]:
        return iter(["model/w"])

    def __len__(self) -> int:
        return 1


def test_a_rank_that_cannot_hash_skips_the_check_on_every_rank_without_a_hang() -> None:
    out, world = check_all([dict(STATE), Unhashable(), dict(STATE)])
    assert out == [None, None, None]
    assert world.gathers == [1, 1, 1]


def test_a_rank_that_cannot_select_its_replicas_still_joins_the_collective() -> None:
    """The save passes a selector (``replicas.replicated`` over its state): a rank where it
    raises (an unusual DTensor) sends the failed record instead of skipping the gather,
    which left the other ranks waiting in it while that rank entered the commit's."""

    def broken() -> Mapping[str, torch.Tensor]:
        raise RuntimeError("__create_chunk_list__ is not supported here")

    out, world = check_all([lambda: dict(STATE), broken, lambda: dict(STATE)])
    assert out == [None, None, None]
    assert world.gathers == [1, 1, 1]


def test_one_process_has_no_replicas_to_compare() -> None:
    assert replicas.check(Solo(), STATE, policy="raise") is None
    assert all_gather_fixed(Solo(), b"abc") == gather_fixed(Solo(), b"abc") == [b"abc"]


def test_replicated_state_is_the_spread_state_and_dcp_tensors() -> None:
    tensors = {**STATE, "rng/rank0/torch": torch.ones(2), "scaler/scale": torch.ones(1)}
    dcp_state = {"model": {"w": torch.ones(2)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    got = replicas.replicated(tensors, spread=("model", "optimizer"), dcp_state=dcp_state)
    assert sorted(got) == ["dcp/model/w", "model/w", "optimizer/state/0/exp_avg"]


def test_a_digest_covers_dtype_shape_and_every_bit() -> None:
    t = torch.arange(4, dtype=torch.float32)
    assert replicas.tensor_digest(t) != replicas.tensor_digest(flipped(t))
    assert replicas.tensor_digest(t) != replicas.tensor_digest(t.view(2, 2))
    assert replicas.tensor_digest(t) != replicas.tensor_digest(t.view(torch.int32))
    assert replicas.tensor_digest(torch.ones(2, dtype=torch.bfloat16))  # no numpy dtype needed


# --- a run with a replica-divergent checkpoint -------------------------------------------------

DIVERGED = records.Replicas(
    2, 1, 4, "warn",
    divergent=(records.Divergence("model/weight", {"aa" * 16: (0,), "bb" * 16: (1,)}, None),),
)


@pytest.fixture
def run(tmp_path: Path) -> tuple[ckptkit.CheckpointManager, ckptkit.TrainState]:
    """Steps 1 and 2 saved and verified, step 3 committed with replicas that disagreed."""
    ts = ckptkit.TrainState(model=torch.nn.Linear(2, 2))
    mgr = ckptkit.CheckpointManager(tmp_path / "run", keep_last=1, background_verify=False)
    for s in (1, 2):
        ts.step = s
        mgr.save(ts)
    save_state(ts, tmp_path / "run" / "step-00000003", step=3, fields={"replicas": DIVERGED.to_dict()})
    return mgr, ts


def test_divergent_checkpoint_lists_as_such_and_is_never_latest(run: Any) -> None:
    mgr, _ = run
    infos = {c.step: c for c in mgr.list()}
    assert infos[3].status == "replica-divergent"
    assert infos[3].problem.startswith(codes.F120) and "model/weight" in infos[3].problem
    assert mgr.latest().step == 2
    # Verifying it again from its bytes records the outcome; it stays replica-divergent.
    infos = {c.step: c for c in mgr.list(verify=True)}
    assert infos[3].status == "replica-divergent" and mgr.latest().step == 2


def test_restore_passes_over_it_and_refuses_it_by_step(run: Any) -> None:
    mgr, ts = run
    res = mgr.restore(ts)
    assert res.step == 2
    assert any("step-00000003: skipped, replica-divergent" in n for n in res.notes)
    with pytest.raises(ckptkit.ReplicaDivergenceError, match="step 3 is replica-divergent"):
        mgr.restore(ts, step=3)


def test_the_resume_choice_passes_over_it_without_reading_it_again(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its status already says it is not resumable: the choice reads no byte of it (it
    re-read every file only to meet CK-F120 again)."""
    from ckptkit.run import Run

    mgr, _ = run
    read: list[str] = []
    real = Run.reverify
    monkeypatch.setattr(Run, "reverify", lambda self, c: read.append(c.path.name) or real(self, c))
    choice = mgr.run.resume_target()
    assert choice.info is not None and choice.info.step == 2
    assert any("step-00000003: replica-divergent" in p for p in choice.passed)
    assert "step-00000003" not in read


def test_retention_keeps_it_as_evidence_until_asked(run: Any) -> None:
    mgr, _ = run
    plan = {d.ckpt.step: d for d in mgr.plan().decisions}
    assert plan[3].keep and "flagged" in plan[3].reason
    assert plan[2].keep and "newest verified" in plan[2].reason
    mgr.prune(delete_corrupt=True)
    assert [c.step for c in mgr.list()] == [2]


def test_verify_reports_ck_f120_and_exits_1(run: Any) -> None:
    mgr, _ = run
    path = mgr.root / "step-00000003"
    report = ckptkit.verify(path)
    assert [f.code for f in report.findings if f.severity is codes.ERROR] == [codes.F120]
    assert codes.outcome([codes.F120]) == "replica-divergent"
    out = CliRunner().invoke(cli, ["verify", str(path)], catch_exceptions=False)
    assert out.exit_code == 1 and codes.F120 in out.output and "model/weight" in out.output


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_divergence": "ignore"}, "on_divergence must be 'raise' or 'warn'"),
        ({"replica_check_every": -1}, "replica_check_every must be an int >= 0"),
    ],
)
def test_manager_refuses_a_bad_divergence_setting(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ckptkit.CheckpointManager(tmp_path / "run", **kwargs)
