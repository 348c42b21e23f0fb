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
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from threadranks import ThreadRank, on_ranks

import ckptkit
from ckptkit import codes
from ckptkit import manifest as mf
from ckptkit.capture.state import TrainState
from ckptkit.commit import save_state
from ckptkit.errors import SignatureError
from ckptkit.format import digest as fdigest
from ckptkit.restore import Skip, restore_candidate
from ckptkit.storage import digest, fs

KEY = b"k" * 32
NEWEST = "step-00000030"


def _state(fill: float | None = None) -> ckptkit.TrainState:
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4)
    if fill is not None:
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(fill)
    return ckptkit.TrainState(model=m, step=0)


def _weights(ts: ckptkit.TrainState) -> float:
    return float(ts.model.weight.detach()[0, 0])  # type: ignore[union-attr,index]


def _signed_run(tmp: Path) -> Path:
    run = tmp / "run"
    with ckptkit.CheckpointManager(run, keep_last=5, key=KEY) as mgr:
        for s, fill in ((10, 1.0), (20, 2.0), (30, 3.0)):
            ts = _state(fill)
            ts.step = s
            mgr.save(ts)
    return run


def _manifest(d: Path) -> dict[str, Any]:
    return json.loads((d / "manifest.json").read_text())  # type: ignore[no-any-return]


def _rewrite(d: Path, obj: dict[str, Any]) -> None:
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))


def _keyless_writer(run: Path, tmp: Path) -> None:
    """Step 30 as a writer without the key saved it (weights 9.0): saved elsewhere, moved in
    (a key-less manager is refused at open in a signed run)."""
    side = tmp / "side"
    with ckptkit.CheckpointManager(side, keep_last=5) as mgr:
        ts = _state(9.0)
        ts.step = 30
        mgr.save(ts)
    shutil.rmtree(run / NEWEST)
    shutil.copytree(side / NEWEST, run / NEWEST)


def _weights_replaced(run: Path, tmp: Path) -> None:
    """Step 30's weights replaced by 9.0 and its unkeyed digests recomputed; the old
    signature kept."""
    d = run / NEWEST
    obj = _manifest(d)
    ckptkit.save({"w": _state(9.0).model.state_dict()}, tmp / "evil")  # type: ignore[union-attr]
    shard = next(f["path"] for f in obj["files"] if f["path"].startswith("model"))
    data = (d / shard).read_bytes()
    forged = torch.full((4, 4), 9.0).numpy().tobytes()
    header = 8 + int.from_bytes(data[:8], "little")
    w = next(t for t in obj["tensors"] if t["key"].endswith("weight"))
    b0, b1 = w["offsets"]
    data = data[: header + b0] + forged + data[header + b1 :]
    (d / shard).write_bytes(data)
    hexd, size = digest.hash_file(d / shard)
    for f in obj["files"]:
        if f["path"] == shard:
            f["xxh3_128"], f["size"] = hexd, size
    _rewrite(d, obj)


def _signature_stripped(run: Path, tmp: Path) -> None:
    d = run / NEWEST
    obj = _manifest(d)
    del obj["signature"]
    _rewrite(d, obj)


def _replicas_deleted(run: Path, tmp: Path) -> None:
    """A replica-divergent step 30 (signed with the key) whose ``replicas`` record someone
    without the key deleted: the divergence guard bypassed."""
    d = run / NEWEST
    obj = _manifest(d)
    obj["replicas"] = {
        "ranks": 2, "groups": 1, "tensors": 2, "policy": "warn",
        "divergent": [{"key": "model/weight", "copies": {"aa": [0], "bb": [1]}, "minority": None}],
    }
    obj.pop("signature")
    signed = mf.Manifest.from_json(json.dumps({**obj, "manifest_digest": mf.content_digest(obj)}))
    (d / "manifest.json").write_text(signed.signed(KEY).to_json())
    assert ckptkit.CheckpointManager(run, key=KEY, readonly=True).list()[-1].status == (
        "replica-divergent"
    )
    obj = _manifest(d)
    del obj["replicas"]
    _rewrite(d, obj)


TAMPERS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "keyless-writer": (_keyless_writer, codes.M010),
    "weights-replaced-digests-recomputed": (_weights_replaced, codes.M011),
    "signature-stripped": (_signature_stripped, codes.M010),
    "replicas-record-deleted": (_replicas_deleted, codes.M011),
}


@pytest.mark.parametrize("readonly", [True, False], ids=["readonly", "writable"])
@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_keyed_restore_never_loads_what_the_key_does_not_vouch_for(
    tmp_path: Path, tamper: str, readonly: bool
) -> None:
    run = _signed_run(tmp_path)
    damage, code = TAMPERS[tamper]
    damage(run, tmp_path)

    with ckptkit.CheckpointManager(run, key=KEY, readonly=readonly) as mgr:
        rows = {c.path.name: c for c in mgr.list()}
        assert rows[NEWEST].status == "untrusted", rows[NEWEST]
        assert code in (rows[NEWEST].problem or "")

        ts = _state(0.0)
        r = mgr.restore(ts)
        assert r is not None and r.step == 20 and _weights(ts) == 2.0
        assert any(NEWEST in n and code in n for n in r.notes), r.notes

        with pytest.raises(SignatureError) as e:
            mgr.restore(_state(0.0), step=30)
        assert e.value.code == code
    # The library load and the CLI agree.
    with pytest.raises(SignatureError):
        ckptkit.load(run / NEWEST, key=KEY)


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_retention_neither_counts_nor_deletes_an_untrusted_checkpoint(
    tmp_path: Path, tamper: str
) -> None:
    run = _signed_run(tmp_path)
    TAMPERS[tamper][0](run, tmp_path)
    with ckptkit.CheckpointManager(run, key=KEY, keep_last=1) as mgr:
        mgr.prune(keep_last=1, delete_corrupt=True)
        left = {c.path.name: c.status for c in mgr.list()}
    # Step 20 is the newest checkpoint the key vouches for: it is kept; step 30 has intact
    # bytes the key does not vouch for: no option deletes it, and it never counted.
    assert left == {"step-00000020": "verified", NEWEST: "untrusted"}, left


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
    rank1 = ckpt / mf.rank_manifest_path(1)
    obj = json.loads(rank1.read_text())
    obj["rng"]["rank"] = 0  # rank 0's state in rank 1's place: the same RNG on both
    obj["manifest_digest"] = mf.content_digest(obj)
    text = json.dumps(obj).encode()
    rank1.write_bytes(text)
    root = _manifest(ckpt)
    for r in root["ranks"]:
        if r["rank"] == 1:
            r["size"], r["xxh3_128"] = len(text), fdigest.hexdigest_bytes(text)
    _rewrite(ckpt, root)

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

    run = _signed_run(tmp_path)
    loc = fs.location(run / NEWEST)
    with pytest.raises(SignatureError):
        read_checkpoint(loc, manifest=manifest_io.read(loc), key=KEY)
    obj, _, _ = read_checkpoint(loc, manifest=manifest_io.read(loc, key=KEY), key=KEY)
    assert float(obj["model"]["weight"][0, 0]) == 3.0


@pytest.mark.parametrize("other", [None, b"o" * 32], ids=["no-key", "another-key"])
def test_a_signed_run_refuses_a_writer_without_its_key(tmp_path: Path, other: bytes | None) -> None:
    """A key-less writer used to save into a signed run without a word, and its rotation
    (``keep_last=1``) deleted every signed checkpoint."""
    from click.testing import CliRunner

    from ckptkit.cli import main

    run = _signed_run(tmp_path)
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
    run = _signed_run(tmp_path)
    (run / ".ckptkit-index.json").unlink()
    with pytest.raises(SignatureError):
        ckptkit.CheckpointManager(run)
    with ckptkit.CheckpointManager(run, key=KEY) as mgr:  # the key holder marks it again
        assert mgr.run.catalog.signed_by() is not None
