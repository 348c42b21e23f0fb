"""A manifest read in part: the root and some ranks' manifests (issue 27 item 3, restore).

A restoring rank reads the root and only the rank manifests it needs
(``Manifest.from_json(..., only=)``); the root records what each rank manifest holds
(``RankRef.files``/``heads``), so the reader knows which files it went without. Each
rank's RNG state is in its own manifest, so the tree read holds the states of the ranks
read and references nothing an unread manifest lists: a tensor it references that no read
manifest lists is refused as in a full read. The gloo runs are
``tests/checkpoint/test_rank_manifests.py``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import replace

import pytest
import torch

from ckptkit import codes
from ckptkit.capture.state import TrainState, manifests_to_read, read_together
from ckptkit.errors import CkptkitError, ManifestError, SignatureError
from ckptkit.format import manifest as mf
from ckptkit.format.ranks import RankManifest, RankRef, rank_manifest_path

WORLD = 4


def rank_manifest(rank: int) -> RankManifest:
    """Rank ``rank``'s RNG file; rank 0 also holds the model (the shared state)."""
    files = [mf.FileEntry(f"rng-rank{rank:05d}.safetensors", 8, "0" * 32, rank=rank)]
    tensors = [mf.TensorEntry(f"rng/rank{rank:05d}/torch", files[0].path, "F32", (2,), (0, 8))]
    if rank == 0:
        files.append(mf.FileEntry("model.safetensors", 16, "1" * 32, rank=0))
        tensors.append(mf.TensorEntry("model/w", "model.safetensors", "F32", (4,), (0, 16)))
    state = {"torch": tensor(f"rng/rank{rank:05d}/torch"), "rank": rank}
    return RankManifest(rank, 7, tuple(files), tuple(tensors), rng=state)


def tensor(key: str) -> dict[str, object]:
    return {"$t": "tensor", "key": key}


def written(tree_extra: dict[str, object] | None = None) -> tuple[bytes, dict[str, bytes]]:
    """A root's bytes and its rank manifests' bytes by path, as a 4-rank save writes them."""
    blobs: dict[str, bytes] = {}
    refs = []
    for r in range(WORLD):
        data = rank_manifest(r).to_json().encode()
        blobs[rank_manifest_path(r)] = data
        refs.append(rank_manifest(r).ref(data))
    tree = {"model": {"w": tensor("model/w")}, **(tree_extra or {})}
    root = mf.Manifest(files=(), tensors=(), tree=tree, components={}, env={}, step=7,
                       ranks=tuple(refs))
    return root.to_json().encode(), blobs


def read(
    root: bytes, blobs: dict[str, bytes], only: Collection[int] | None
) -> tuple[mf.Manifest, list[int]]:
    """Read with ``only`` those ranks; the manifest and the ranks whose bytes were fetched."""
    fetched: list[int] = []

    def fetch(ref: RankRef) -> bytes:
        fetched.append(ref.rank)
        return blobs[ref.path]

    m = mf.Manifest.from_json(root, ranks=fetch, only=lambda _root: only)
    return m, fetched


def test_the_root_records_what_each_rank_manifest_holds() -> None:
    root, _ = written()
    refs = json.loads(root)["ranks"]
    assert refs[0]["files"] == ["rng-rank00000.safetensors", "model.safetensors"]
    assert refs[0]["heads"] == ["model", "rng"] and refs[3]["heads"] == ["rng"]


def test_a_partial_read_fetches_only_the_ranks_asked_for() -> None:
    root, blobs = written()
    m, fetched = read(root, blobs, {0, 2})
    assert fetched == [0, 2]
    assert m.read_ranks == {0, 2} and not m.complete
    assert {t.key for t in m.tensors} == {"model/w", "rng/rank00000/torch", "rng/rank00002/torch"}
    assert m.elsewhere("rng-rank00003.safetensors") and not m.elsewhere("rng-rank00002.safetensors")
    # Its tree: the RNG states of the ranks read, and everything the root holds.
    assert set(m.tree["rng"]) == {"rank00000", "rank00002"} and m.tree["model"] == {"w": tensor("model/w")}
    # The root itself is the same: digest and serialisation as a full read's.
    full, fetched_all = read(root, blobs, None)
    assert fetched_all == [0, 1, 2, 3] and full.complete and full.read_ranks is None
    assert set(full.tree["rng"]) == {f"rank{r:05d}" for r in range(WORLD)}
    assert m.digest == full.digest and m.to_json() == full.to_json() and m.to_json().encode() == root
    assert not full.elsewhere("rng-rank00003.safetensors")


def test_a_needed_tensor_no_read_manifest_lists_is_refused() -> None:
    # "model/ghost": rank 0, read, holds the model; no unread manifest holds "model".
    root, blobs = written({"extra": tensor("model/ghost")})
    with pytest.raises(ManifestError) as info:
        read(root, blobs, {0})
    assert info.value.code == codes.M009 and "model/ghost" in str(info.value)
    # Nor may an unread rank's head cover a key of another head: "opt/x" is nobody's.
    root, blobs = written({"opt": tensor("opt/x")})
    with pytest.raises(ManifestError) as info:
        read(root, blobs, {0, 1})
    assert info.value.code == codes.M009


def test_the_root_alone_reads_and_records_every_files_size() -> None:
    # A run's listing: no rank manifest read; the tree's references to entries the rank
    # manifests hold are not refused, and every file's size is known from the root.
    root, blobs = written()
    m, fetched = read(root, blobs, ())
    assert fetched == [] and m.read_ranks == frozenset() and m.files == ()
    assert m.digest == read(root, blobs, None)[0].digest
    sizes = m.file_sizes()
    assert sizes is not None and sizes == read(root, blobs, None)[0].file_sizes()
    assert sizes["model.safetensors"] == 16 and sizes["ranks/rank-00003.json"] == len(
        blobs["ranks/rank-00003.json"])
    # A root that does not record an unread rank's sizes cannot say.
    obj = json.loads(root)
    del obj["ranks"][2]["sizes"], obj["manifest_digest"]
    m2, _ = read(mf.Manifest.from_dict(obj).to_json().encode(), blobs, ())
    assert m2.file_sizes() is None


def test_a_rank_manifest_whose_sizes_differ_from_its_record_is_refused() -> None:
    root, blobs = written()
    obj = json.loads(root)
    obj["ranks"][1]["sizes"] = [9]
    del obj["manifest_digest"]
    with pytest.raises(ManifestError) as info:
        read(mf.Manifest.from_dict(obj).to_json().encode(), blobs, None)
    assert info.value.code == codes.M013 and "rank-00001" in str(info.value)
    obj["ranks"][1]["sizes"] = [8, 8]  # more sizes than files: the root itself is wrong
    with pytest.raises(ManifestError) as info:
        read(mf.Manifest.from_dict(obj).to_json().encode(), blobs, None)
    assert info.value.code == codes.M003


def test_an_unindexed_rank_manifest_is_always_read() -> None:
    root, blobs = written()
    obj = json.loads(root)
    del obj["ranks"][3]["heads"]  # a root that does not say what rank 3 holds
    del obj["manifest_digest"]  # computed again for the edited content
    edited = mf.Manifest.from_dict(obj)
    m, fetched = read(edited.to_json().encode(), blobs, {0})
    assert fetched == [0, 3] and m.read_ranks == {0, 3}


def test_a_rank_manifest_that_lists_other_files_than_its_ref_is_refused() -> None:
    root, blobs = written()
    obj = json.loads(root)
    obj["ranks"][2]["files"] = ["rng-rank00009.safetensors"]
    del obj["manifest_digest"]
    edited = mf.Manifest.from_dict(obj).to_json().encode()
    with pytest.raises(ManifestError) as info:
        read(edited, blobs, {0, 2})
    assert info.value.code == codes.M013 and "rank-00002" in str(info.value)


def test_each_restoring_rank_reads_the_shared_manifests_and_its_rng_source() -> None:
    root, blobs = written()
    m = read(root, blobs, None)[0]
    assert [sorted(manifests_to_read(m, r) or ()) for r in range(6)] == [
        [0], [0, 1], [0, 2], [0, 3], [0], [0],
    ]
    # Four ranks or more read every rank manifest between them; two do not.
    assert read_together(m, WORLD) and read_together(m, 8) and not read_together(m, 2)
    # DCP storage: the files a rank loads are DCP's plan, and the load reads their
    # manifests; chosen up front are the same as without it.
    dcp_root, dcp_blobs = written({"dcp": {"keys": ["model"]}})
    dcp = read(dcp_root, dcp_blobs, None)[0]
    assert [sorted(manifests_to_read(dcp, r) or ()) for r in range(WORLD)] == [[0], [0, 1], [0, 2], [0, 3]]
    # A root that does not record its files' sizes: the load could not check its plan
    # against them, so every manifest is read.
    obj = json.loads(dcp_root)
    del obj["ranks"][2]["sizes"], obj["manifest_digest"]
    assert manifests_to_read(mf.Manifest.from_dict(obj), 1) is None


def test_a_dcp_restore_proves_a_rank_that_holds_dcp_files_alone() -> None:
    # Every DCP file is read or checked by one restoring rank (check_unread), so a rank
    # manifest listing only DCP files is covered at any world size; one that also lists
    # its RNG file is covered only where a restoring rank takes that state.
    def ref(rank: int, files: tuple[str, ...], heads: tuple[str, ...]) -> RankRef:
        return RankRef(rank, rank_manifest_path(rank), 1, "0" * 32, files, heads,
                          (5,) * len(files))

    def root(*refs: RankRef) -> mf.Manifest:
        return mf.Manifest(files=(), tensors=(), components={}, env={},
                           tree={"dcp": {"keys": ["model"]}}, ranks=refs)

    zero = ref(0, ("dcp/.metadata", "dcp/__0_0.distcp", "rng-rank00000.safetensors"), ("rng",))
    alone = root(zero, ref(1, ("dcp/__1_0.distcp",), ()))
    assert manifests_to_read(alone, 0) == {0} and read_together(alone, 1)
    with_rng = root(zero, ref(1, ("dcp/__1_0.distcp", "rng-rank00001.safetensors"), ("rng",)))
    assert not read_together(with_rng, 1) and read_together(with_rng, 2)


def test_an_entry_an_unread_rank_manifest_lists_is_read_when_asked_for() -> None:
    # A DCP load learns which files it reads from its plan, after the manifests chosen up
    # front were read: Manifest.entry reads the one rank manifest that lists a file, once.
    root, blobs = written()
    m, fetched = read(root, blobs, {0})
    assert fetched == [0] and m.file("rng-rank00002.safetensors") is None
    fe = m.entry("rng-rank00002.safetensors")
    assert fe is not None and fe.rank == 2 and fe.size == 8 and fetched == [0, 2]
    assert m.entry("rng-rank00002.safetensors") == fe and fetched == [0, 2]  # kept
    assert m.entry("model.safetensors") == m.file("model.safetensors") and fetched == [0, 2]
    assert m.entry("nobody.safetensors") is None and fetched == [0, 2]
    # A full read has nothing to fetch.
    whole, fetched = read(root, blobs, None)
    assert whole.read_later is None and whole.entry("rng-rank00002.safetensors") == fe


def test_a_signed_checkpoint_read_in_part_reads_the_rest_with_its_key() -> None:
    key = b"k" * 32
    blobs: dict[str, bytes] = {}
    refs = []
    for r in range(WORLD):
        data = rank_manifest(r).signed(key).to_json().encode()
        blobs[rank_manifest_path(r)] = data
        refs.append(rank_manifest(r).ref(data))
    root = mf.Manifest(files=(), tensors=(), tree={"model": {"w": tensor("model/w")}},
                       components={}, env={}, step=7, ranks=tuple(refs)).signed(key)
    m = mf.Manifest.from_json(root.to_json().encode(), key=key, ranks=lambda ref: blobs[ref.path],
                              only=lambda _root: {0})
    fe = m.entry("rng-rank00003.safetensors")
    assert fe is not None and fe.rank == 3
    # The key travels with the manifest: a rank manifest without a signature (its bytes
    # recorded by a root that is signed) is refused when it is read late, as up front.
    unsigned = rank_manifest(3).to_json().encode()
    blobs[rank_manifest_path(3)] = unsigned
    root = replace(root, ranks=(*refs[:3], rank_manifest(3).ref(unsigned)), signature=None).signed(key)
    m = mf.Manifest.from_json(root.to_json().encode(), key=key, ranks=lambda ref: blobs[ref.path],
                              only=lambda _root: {0})
    with pytest.raises(SignatureError) as info:
        m.entry("rng-rank00003.safetensors")
    assert info.value.code == codes.M010 and "rank-00003" in str(info.value)


def test_a_rank_manifest_read_late_is_checked_as_one_read_up_front() -> None:
    root, blobs = written()
    bad = dict(blobs)
    bad[rank_manifest_path(3)] = blobs[rank_manifest_path(3)].replace(b'"step":7', b'"step":8')
    m, _ = read(root, bad, {0})  # rank 3's manifest is not read yet: no refusal
    with pytest.raises(ManifestError) as info:
        m.entry("rng-rank00003.safetensors")
    assert info.value.code == codes.M013 and "rank-00003" in str(info.value)


def test_a_root_holding_the_rng_states_itself_is_read_whole() -> None:
    # ckptkit 0.3's first per-rank layout: the root's tree references every rank's RNG
    # tensors, so no reader may leave a rank manifest out.
    blobs: dict[str, bytes] = {}
    refs, states = [], {}
    for r in range(WORLD):
        m = replace(rank_manifest(r), rng=None)
        blobs[rank_manifest_path(r)] = m.to_json().encode()
        refs.append(m.ref(blobs[rank_manifest_path(r)]))
        states[f"rank{r:05d}"] = rank_manifest(r).rng
    root = mf.Manifest(files=(), tensors=(), tree={"model": {"w": tensor("model/w")}, "rng": states},
                       components={}, env={}, step=7, ranks=tuple(refs))
    m, fetched = read(root.to_json().encode(), blobs, None)
    assert fetched == [0, 1, 2, 3] and set(m.tree["rng"]) == set(states)
    assert [manifests_to_read(m, r) for r in range(WORLD)] == [None] * WORLD
    assert manifests_to_read(mf.Manifest.from_dict(json.loads(root.to_json())), 2) is None


def test_a_rank_whose_own_rng_state_was_not_read_refuses_the_restore() -> None:
    ts = TrainState(model=torch.nn.Linear(2, 2), step=3)
    tree, _ = ts.capture()
    man = mf.Manifest(files=(), tensors=(), tree={**tree, "rng": {**tree["rng"], "rank00001": {}}},
                      components={}, env={})
    ts.parallel = replace(ts.parallel, rank=1, world_size=2)
    with pytest.raises(CkptkitError) as info:
        ts.restore_tree(tree, man)
    assert info.value.code == codes.M009 and "rank00001" in str(info.value)


def test_a_partial_read_of_a_root_with_a_null_tree_is_still_partial() -> None:
    # A root of a plain multi-rank save of no state tree: what was read is still recorded.
    blobs = {rank_manifest_path(r): replace(rank_manifest(r), rng=None).to_json().encode()
             for r in range(WORLD)}
    refs = tuple(replace(rank_manifest(r), rng=None).ref(blobs[rank_manifest_path(r)])
                 for r in range(WORLD))
    root = mf.Manifest(files=(), tensors=(), tree=None, components={}, env={}, step=7, ranks=refs)
    m, fetched = read(root.to_json().encode(), blobs, {0})
    assert fetched == [0] and m.read_ranks == {0} and not m.complete
    assert m.to_json() == root.to_json()
