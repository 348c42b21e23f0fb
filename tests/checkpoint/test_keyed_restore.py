"""A configured key is enforced on every path (issue 39, items 1-3).

Each case is a reproduction from outside: a signed run whose newest step the key does not
vouch for (a key-less writer saved it; its weights were replaced and its digests
recomputed under the old signature; its signature was stripped; a replica-divergent
checkpoint's ``replicas`` record was deleted; a 2-rank run's rank 1 RNG state was edited
with the root's record fixed up). ``CheckpointManager(key=K)``, read-only or writable,
must never restore it, ``restore(step=N)`` must refuse it with the signature's code, the
listing must call it ``untrusted`` and no retention option may delete it or count it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hostile import CASES, KEY, STEPS, make_run, rewrite, train_state
from threadranks import ThreadRank, on_ranks

import ckptkit
from ckptkit import codes
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.checkpoint.commit import save_state
from ckptkit.errors import SignatureError
from ckptkit.format import digest
from ckptkit.format import manifest as mf
from ckptkit.format.ranks import rank_manifest_path
from ckptkit.run.restore import Skip, restore_candidate
from ckptkit.storage import fs

pytestmark = pytest.mark.integration

NEWEST = step_dir_name(STEPS[-1])
TAMPERS: dict[str, str] = {
    "key:keyless-writer": codes.M010,
    "key:keyless-writer-dcp": codes.M010,
    "key:weights-replaced-digests-recomputed": codes.M011,
    "key:signature-stripped": codes.M010,
    "key:replicas-record-deleted": codes.M011,
}
"""The tampers of the hostile catalogue that only a key tells, and the code each gets."""


def _signed_run(tmp: Path, tamper: str) -> Path:
    case = CASES[tamper]
    run = make_run(tmp / "run", storage=case.storage, key=KEY)
    case.damage(run / NEWEST, run)
    return run


def _model_bytes(ts: ckptkit.TrainState) -> list[bytes]:
    return [t.detach().numpy().tobytes() for t in ts.model.state_dict().values()]  # type: ignore[union-attr]


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writable"])
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_keyed_restore_never_loads_what_the_key_does_not_vouch_for(
    tmp_path: Path, tamper: str, readonly: bool
) -> None:
    run = _signed_run(tmp_path, tamper)
    code, storage = TAMPERS[tamper], CASES[tamper].storage
    with ckptkit.CheckpointManager(run, key=KEY, readonly=True) as mgr:
        good = train_state(seed=5, storage=storage)
        assert mgr.restore(good, step=STEPS[0]) is not None  # what step 10 holds

    with ckptkit.CheckpointManager(run, key=KEY, readonly=readonly) as mgr:
        ts = train_state(seed=7, storage=storage)
        r = mgr.restore(ts)
        assert r is not None and r.step == STEPS[0] and _model_bytes(ts) == _model_bytes(good)
        assert any(NEWEST in n and code in n for n in r.notes), r.notes

        with pytest.raises(SignatureError) as e:
            mgr.restore(train_state(seed=7, storage=storage), step=STEPS[-1])
        assert e.value.code == code

        rows = {c.path.name: c for c in mgr.list()}
        assert rows[NEWEST].status == "untrusted", rows[NEWEST]
        assert code in (rows[NEWEST].problem or "")
    with pytest.raises(SignatureError):
        ckptkit.load(run / NEWEST, key=KEY)


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_retention_neither_counts_nor_deletes_an_untrusted_checkpoint(
    tmp_path: Path, tamper: str
) -> None:
    run = _signed_run(tmp_path, tamper)
    with ckptkit.CheckpointManager(run, key=KEY, keep_last=1) as mgr:
        mgr.prune(keep_last=1, delete_corrupt=True)
        left = {c.path.name: c.status for c in mgr.list()}
    # Step 10 is the newest checkpoint the key vouches for: it is kept; the newest has intact
    # bytes the key does not vouch for: no option deletes it, and it never counted.
    assert left == {step_dir_name(STEPS[0]): "verified", NEWEST: "untrusted"}, left


def _two_rank_signed(root: Path) -> None:
    def one(rank: ThreadRank) -> None:
        torch.manual_seed(rank.rank)
        ts = TrainState(
            model=torch.nn.Linear(4, 4),
            step=3,
            parallel=ckptkit.ParallelConfig(world_size=2, rank=rank.rank),
        )
        save_state(ts, root, coll=rank, fsync=False, key=KEY)

    on_ranks(2, one)


def test_a_rank_manifest_edited_with_the_roots_record_fixed_up_is_refused(
    tmp_path: Path,
) -> None:
    """Rank 1's RNG state edited; the root's size and digest record of that rank manifest
    made to match, the root's digest recomputed (its signature cannot be)."""
    ckpt = tmp_path / "step-00000003"
    _two_rank_signed(ckpt)
    rank1 = ckpt / rank_manifest_path(1)
    obj = json.loads(rank1.read_text())
    obj["rng"]["rank"] = 0  # rank 0's state in rank 1's place: the same RNG on both
    obj["manifest_digest"] = mf.content_digest(obj)
    text = json.dumps(obj).encode()
    rank1.write_bytes(text)
    root = json.loads((ckpt / "manifest.json").read_text())
    for r in root["ranks"]:
        if r["rank"] == 1:
            r["size"], r["xxh3_128"] = len(text), digest.hexdigest_bytes(text)
    rewrite(ckpt, root)

    with pytest.raises(SignatureError):
        ckptkit.load(ckpt, key=KEY)

    def restore(rank: ThreadRank) -> str:
        ts = TrainState(
            model=torch.nn.Linear(4, 4),
            step=0,
            parallel=ckptkit.ParallelConfig(world_size=2, rank=rank.rank),
        )
        try:
            restore_candidate(ts, fs.location(ckpt), strict=True, coll=rank, key=KEY)
        except Skip as s:
            return s.error.code or "?"
        return "restored"

    got = on_ranks(2, restore)
    assert got[0] == got[1] and got[0] in (codes.M010, codes.M011), got


def test_a_manifest_read_without_the_key_is_refused_by_the_reader(tmp_path: Path) -> None:
    """The reader a restore hands the manifest to never takes one read without the key."""
    from ckptkit.checkpoint import manifest_io
    from ckptkit.checkpoint.read import read_checkpoint

    run = make_run(tmp_path / "run", key=KEY)
    loc = fs.location(run / NEWEST)
    with pytest.raises(SignatureError):
        read_checkpoint(loc, manifest=manifest_io.read(loc), key=KEY)
    obj, _, _ = read_checkpoint(loc, manifest=manifest_io.read(loc, key=KEY), key=KEY)
    model = train_state().model.state_dict()  # type: ignore[union-attr]
    assert set(obj["model"]) == set(model)


@pytest.mark.parametrize("other", [None, b"o" * 32], ids=["no-key", "another-key"])
def test_a_signed_run_refuses_a_writer_without_its_key(tmp_path: Path, other: bytes | None) -> None:
    """A key-less writer used to save into a signed run without a word, and its rotation
    (``keep_last=1``) deleted every signed checkpoint."""
    from click.testing import CliRunner

    from ckptkit.cli import main

    run = make_run(tmp_path / "run", key=KEY)
    before = sorted(p.name for p in run.iterdir() if p.name.startswith("step-"))
    with pytest.raises(SignatureError) as e:
        ckptkit.CheckpointManager(run, keep_last=1, key=other)
    assert e.value.code == codes.R012 and "signed" in str(e.value)
    # Nothing was written or deleted, and the CLI's writers are refused the same way.
    key_args: list[str] = []
    if other is not None:
        (tmp_path / "other.key").write_bytes(other)
        key_args = ["--key-file", str(tmp_path / "other.key")]
    res = CliRunner().invoke(main, ["prune", "--keep-last", "1", *key_args, str(run)])
    assert res.exit_code == 2 and codes.R012 in res.output, res.output
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("step-")) == before
    # Read-only use still works, and says the run is signed.
    if other is None:
        res = CliRunner().invoke(main, ["ls", str(run)])
        assert res.exit_code == 0 and "signed run" in res.output, res.output


def test_a_signed_run_whose_index_lost_its_record_is_known_by_its_manifests(
    tmp_path: Path,
) -> None:
    run = make_run(tmp_path / "run", key=KEY)
    (run / ".ckptkit-index.json").unlink()
    with pytest.raises(SignatureError):
        ckptkit.CheckpointManager(run)
    with ckptkit.CheckpointManager(run, key=KEY) as mgr:  # the key holder marks it again
        assert mgr.run.catalog.signed_by() is not None
