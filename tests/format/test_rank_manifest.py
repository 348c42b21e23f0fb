"""The root and per-rank manifests of a multi-rank save (issue 27 item 1), in memory.

The gloo runs that write them are ``tests/checkpoint/test_rank_manifests.py``;
here each refusal of the reader is cheap to reach: a root with its rank manifests served
from a dict, then changed one way at a time.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ckptkit import codes
from ckptkit.errors import CkptkitError, ManifestError, SignatureError
from ckptkit.format import manifest as mf
from ckptkit.format.ranks import RankManifest, RankRef, rank_key, rank_manifest_path

KEY = b"k" * 32


def rng_state(rank: int) -> dict[str, Any]:
    return {"torch": {"$t": "tensor", "key": f"rng/rank{rank:05d}/torch"}, "rank": rank}


def rank_manifest(rank: int, step: int = 7, *, rng: bool = True) -> RankManifest:
    """Rank ``rank``'s RNG file and state (``rng=False``: the state left to the root, as
    ckptkit 0.3's first per-rank layout wrote it)."""
    f = mf.FileEntry(f"rng-rank{rank:05d}.safetensors", 8, "0" * 32, component="rng", rank=rank)
    t = mf.TensorEntry(f"rng/rank{rank:05d}/torch", f.path, "F32", (2,), (0, 8))
    return RankManifest(rank, step, (f,), (t,), rng=rng_state(rank) if rng else None)


def written(
    world: int = 3, key: bytes | None = None, *, legacy: bool = False
) -> tuple[bytes, dict[str, bytes]]:
    """A root's bytes and its rank manifests' bytes by path, as a save writes them
    (``legacy``: the RNG states in the root's tree)."""
    blobs: dict[str, bytes] = {}
    refs = []
    for r in range(world):
        m = rank_manifest(r, rng=not legacy)
        data = (m.signed(key) if key else m).to_json().encode()
        blobs[rank_manifest_path(r)] = data
        refs.append(m.ref(data))
    tree = {"step": 7, **({"rng": {rank_key(r): rng_state(r) for r in range(world)}}
                          if legacy else {})}
    root = mf.Manifest(
        files=(), tensors=(), tree=tree, components={}, env={}, step=7, ranks=tuple(refs)
    )
    if key:
        root = root.signed(key)
    return root.to_json().encode(), blobs


def read(root: bytes, blobs: dict[str, bytes], key: bytes | None = None) -> mf.Manifest:
    def fetch(ref: RankRef) -> bytes:
        if ref.path not in blobs:
            raise codes.error(codes.M013, "missing", path=ref.path)
        return blobs[ref.path]

    return mf.Manifest.from_json(root, key=key, ranks=fetch)


def test_a_root_reads_back_with_every_ranks_entries() -> None:
    root, blobs = written()
    obj = json.loads(root)
    assert obj["schema_version"] == 2 and obj["files"] == [] and len(obj["ranks"]) == 3
    m = read(root, blobs)
    assert [f.rank for f in m.files] == [0, 1, 2]
    assert len(m.tensors) == 3 and len(m.ranks) == 3
    # Each rank's RNG state is in its own manifest; the reader puts it in the tree.
    assert "rng" not in obj["tree"] and json.loads(blobs[rank_manifest_path(2)])["rng"] == rng_state(2)
    assert m.tree == {"step": 7, "rng": {rank_key(r): rng_state(r) for r in range(3)}}
    assert m.root_tree == obj["tree"]
    # The manifest read back serialises to the root it came from (same digest).
    assert m.to_json().encode() == root
    assert m.digest == obj["manifest_digest"]


def test_a_root_holding_the_rng_states_itself_still_reads() -> None:
    # ckptkit 0.3's first per-rank layout: the same manifest once read.
    root, blobs = written(legacy=True)
    new_root, new_blobs = written()
    assert read(root, blobs).tree == read(new_root, new_blobs).tree
    assert read(root, blobs).to_json().encode() == root


def test_a_rank_state_the_tree_cannot_take_is_refused() -> None:
    root, blobs = written()
    # A state in the root and in its rank manifest: which one is meant is unknowable.
    both = _edited_root(root, lambda o: o["tree"].update(rng={rank_key(1): rng_state(1)}))
    e = _refusal(both, blobs)
    assert e.code == codes.M003 and "RNG state of rank00001 too" in str(e)
    for tree in (None, [], {"rng": None}, {"rng": [1]}):
        e = _refusal(_edited_root(root, lambda o, t=tree: o.update(tree=t)), blobs)
        assert e.code == codes.M003 and "not a mapping" in str(e), (tree, e)


def test_a_rank_state_may_reference_only_its_own_manifests_tensors() -> None:
    # Rank 2's state pointing at rank 1's tensor: listed (a full read), but not its own.
    _, blobs = written()
    bad = replace(rank_manifest(2), rng={**rng_state(2), "torch": rng_state(1)["torch"]})
    blobs[rank_manifest_path(2)] = bad.to_json().encode()
    refs = [rank_manifest(r).ref(blobs[rank_manifest_path(r)]) for r in range(3)]
    root = mf.Manifest(files=(), tensors=(), tree={}, components={}, env={}, step=7,
                       ranks=tuple(refs)).to_json().encode()
    e = _refusal(root, blobs)
    assert e.code == codes.M009 and "rng/rank00001/torch" in str(e) and "rank-00002" in str(e)


def test_a_rank_state_nested_past_the_tree_limit_is_refused_before_its_digest() -> None:
    deep: Any = 0
    for _ in range(mf.tree.MAX_NESTING - 1):  # within the limit alone, not at tree/rng/rankN
        deep = [deep]
    _, blobs = written()
    blobs[rank_manifest_path(1)] = replace(rank_manifest(1), rng=deep).to_json().encode()
    refs = [rank_manifest(r).ref(blobs[rank_manifest_path(r)]) for r in range(3)]
    root = mf.Manifest(files=(), tensors=(), tree={}, components={}, env={}, step=7,
                       ranks=tuple(refs)).to_json().encode()
    e = _refusal(root, blobs)
    assert e.code == codes.M006 and "rank-00001" in str(e)


def test_a_world_of_one_stays_version_1() -> None:
    m = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={})
    assert json.loads(m.to_json())["schema_version"] == 1 and "ranks" not in m.to_dict()


def _refusal(root: bytes, blobs: dict[str, bytes], key: bytes | None = None) -> CkptkitError:
    with pytest.raises(CkptkitError) as info:
        read(root, blobs, key)
    return info.value


def test_rank_manifests_that_are_not_the_ones_the_root_lists_are_refused() -> None:
    root, blobs = written()
    p1 = rank_manifest_path(1)
    missing = {k: v for k, v in blobs.items() if k != p1}
    assert _refusal(root, missing).code == codes.M013
    assert _refusal(root, {**blobs, p1: blobs[p1] + b" "}).code == codes.M013
    assert _refusal(root, {**blobs, p1: blobs[rank_manifest_path(0)]}).code == codes.M013


def test_a_rank_manifest_that_fails_its_schema_is_named() -> None:
    # Its bytes are what a forged root lists: the schema still refuses an escaping path.
    _, blobs = written()
    bad = json.loads(blobs[rank_manifest_path(1)])
    bad["files"][0]["path"] = "../../etc/passwd"
    bad["tensors"][0]["file"] = "../../etc/passwd"
    bad.pop("manifest_digest")
    bad["manifest_digest"] = mf.content_digest(bad)
    blobs[rank_manifest_path(1)] = json.dumps(bad).encode()
    refs = [rank_manifest(r).ref(blobs[rank_manifest_path(r)]) for r in range(3)]
    root = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={}, step=7,
                       ranks=tuple(refs)).to_json().encode()
    e = _refusal(root, blobs)
    assert e.code == codes.M005 and "rank manifest schema" in str(e)
    assert "rank-00001.json" in str(e)


def test_a_rank_manifest_of_another_step_is_refused_even_when_the_root_vouches_for_it() -> None:
    # A root rewritten to list a rank manifest of another checkpoint (its digest recomputed):
    # the manifest says step 8, the root step 7.
    _, blobs = written()
    other = rank_manifest(1, step=8).to_json().encode()
    blobs[rank_manifest_path(1)] = other
    refs = [rank_manifest(r).ref(blobs[rank_manifest_path(r)]) for r in range(3)]
    root = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={}, step=7,
                       ranks=tuple(refs)).to_json().encode()
    e = _refusal(root, blobs)
    assert e.code == codes.M013 and "step 8" in str(e)


def _edited_root(root: bytes, edit: Any) -> bytes:
    """The root with ``edit`` applied and its digest recomputed (a consistent forgery)."""
    obj = json.loads(root)
    edit(obj)
    obj.pop("manifest_digest")
    obj["manifest_digest"] = mf.content_digest(obj)
    return json.dumps(obj).encode()


def test_roots_that_mix_forms_or_misplace_a_rank_are_refused() -> None:
    root, blobs = written()
    moved = _edited_root(root, lambda o: o["ranks"][1].update(path="ranks/rank-00009.json"))
    assert _refusal(moved, blobs).code == codes.M003
    twice = _edited_root(root, lambda o: o["ranks"].append(dict(o["ranks"][0])))
    assert _refusal(twice, blobs).code == codes.M003
    entries = json.loads(blobs[rank_manifest_path(0)])["files"]
    mixed = _edited_root(root, lambda o: o.update(files=entries))
    assert _refusal(mixed, blobs).code == codes.M003
    old = _edited_root(root, lambda o: o.update(schema_version=1))
    assert _refusal(old, blobs).code == codes.M003
    escaping = _edited_root(root, lambda o: o["ranks"][1].update(path="../rank-00001.json"))
    assert _refusal(escaping, blobs).code == codes.M005


def test_a_root_read_alone_names_its_rank_manifests() -> None:
    root, _ = written()
    with pytest.raises(ManifestError) as info:
        mf.Manifest.from_json(root)
    assert info.value.code == codes.M013


def test_signed_rank_manifests_are_checked_with_the_key() -> None:
    root, blobs = written(key=KEY)
    assert read(root, blobs, key=KEY).signature is not None
    with pytest.raises(SignatureError) as info:
        read(root, blobs, key=b"x" * 32)
    assert info.value.code == codes.M011
    # An unsigned rank manifest under a signed root (the root re-signed over its digest):
    unsigned = rank_manifest(2).to_json().encode()
    blobs[rank_manifest_path(2)] = unsigned
    refs = [RankRef(r, rank_manifest_path(r), len(blobs[rank_manifest_path(r)]),
                       mf.digest.hexdigest_bytes(blobs[rank_manifest_path(r)]))
            for r in range(3)]
    forged = replace(mf.Manifest.from_dict(json.loads(root)), ranks=tuple(refs))
    e = _refusal(forged.signed(KEY).to_json().encode(), blobs, key=KEY)
    assert e.code == codes.M010 and "rank-00002" in str(e)
