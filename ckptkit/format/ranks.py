"""Multi-rank manifests: each rank's own manifest, the root's record of it, rank keys, and
the merge of the ranks' manifests into the root's view.

A multi-rank save writes ``manifest.json`` as a small root (``schema_version`` 2): each
rank's file and tensor entries are in that rank's own manifest (``ranks/rank-NNNNN.json``,
:class:`RankManifest`), which the root lists by size and digest (:class:`RankRef`); a
reader checks each one's bytes against the root before parsing it (:func:`rank_part`) and
gets one :class:`~ckptkit.format.manifest.Manifest` with every entry (:func:`merge_ranks`),
as from a ``schema_version`` 1 manifest. Like the rest of the format layer it opens no
file: :mod:`ckptkit.checkpoint.manifest_io` fetches the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any

import jsonschema_rs

from ckptkit import codes
from ckptkit.errors import ManifestError
from ckptkit.format import digest, signing, tree
from ckptkit.format.signing import Signature
from ckptkit.format.validation import (
    canonical,
    check_digest,
    check_schema,
    nesting_error,
    schema,
    strict_json,
)

if TYPE_CHECKING:
    from ckptkit.format.manifest import FileEntry, TensorEntry

RANKED_VERSION = 2
"""The version of a multi-rank save's root manifest: the entries are in per-rank manifests."""
RANK_FORMAT = "ckptkit-rank"
RANKS_DIR = "ranks"
"""The directory of the per-rank manifests inside a checkpoint."""


@cache
def _rank_validator() -> jsonschema_rs.Draft202012Validator:
    # The rank manifest's definition lives in the one schema file (its entries are the
    # root's own $defs): validate against it as the root of a schema sharing those $defs.
    root = schema()
    return jsonschema_rs.Draft202012Validator(
        {"$ref": "#/$defs/rank_manifest", "$defs": root["$defs"]}, validate_formats=False
    )


def rank_manifest_path(rank: int) -> str:
    """Where rank ``rank``'s manifest lives inside a checkpoint.

    Example:
        >>> rank_manifest_path(3)
        'ranks/rank-00003.json'
    """
    return f"{RANKS_DIR}/rank-{rank:05d}.json"


@dataclass(frozen=True)
class RankRef:
    """The root's record of one rank's manifest: where it is, the bytes it must be, and
    what it holds (so a restoring rank reads only the manifests it needs)."""

    rank: int
    path: str
    size: int
    xxh3_128: str
    files: tuple[str, ...] | None = None
    """The paths of the files its manifest lists, in its order (None: not recorded; such a
    manifest is read by every reader)."""
    heads: tuple[str, ...] | None = None
    """The top-level state keys whose tensors its manifest lists, sorted (None: not
    recorded)."""
    sizes: tuple[int, ...] | None = None
    """The sizes of :attr:`files`, in the same order (None: not recorded): a run's listing
    checks the files are there at these sizes without reading the rank manifest."""

    @property
    def indexed(self) -> bool:
        """Whether the root records what this manifest holds: only then may a reader skip it."""
        return self.files is not None and self.heads is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank, "path": self.path, "size": self.size, "xxh3_128": self.xxh3_128
        }
        if self.files is not None:
            out["files"] = list(self.files)
        if self.heads is not None:
            out["heads"] = list(self.heads)
        if self.sizes is not None:
            out["sizes"] = list(self.sizes)
        return out

    @classmethod
    def from_dict(cls, r: Mapping[str, Any]) -> RankRef:
        """Build from a validated ``ranks[]`` item of a root."""
        files, heads, sizes = r.get("files"), r.get("heads"), r.get("sizes")
        return cls(
            r["rank"],
            r["path"],
            r["size"],
            r["xxh3_128"],
            tuple(files) if files is not None else None,
            tuple(heads) if heads is not None else None,
            tuple(sizes) if sizes is not None else None,
        )


def rank_key(rank: int) -> str:
    """Key of one rank's state inside per-rank components (``rank00003``): where a rank's
    RNG state sits in the state tree (``tree/rng/rank00003``)."""
    return f"rank{rank:05d}"


def rank_of(key: Any) -> int | None:
    """The rank a per-rank key names (``rank00003`` -> 3), else None.

    Example:
        >>> rank_of("rank00003"), rank_of("rank-1"), rank_of(3)
        (3, None, None)
    """
    if isinstance(key, str) and key.startswith("rank") and key[4:].isascii():
        digits = key[4:]
        if digits.isdigit() and len(digits) <= 18:
            return int(digits)
    return None


RANK_STATE = "rng"
"""The top-level state key each rank of a multi-rank save keeps in its own manifest (its
:attr:`RankManifest.rng`), not in the root: the state tree holds it at
``tree/rng/rankNNNNN``, one entry per rank. Sampler cursors stay in the root: a restore at
another world size needs every rank's."""
RANK_BUFFERS = "buffers"
"""The other top-level state key each rank of a multi-rank save may keep in its own
manifest (its :attr:`RankManifest.buffers`): the model's buffers when their copies differ
between the ranks (BatchNorm running statistics under DDP), at ``tree/buffers/rankNNNNN``
(:mod:`ckptkit.capture.perrank`). Absent when every rank's buffers agree: they are then in the
model's shards, once."""
PER_RANK = (RANK_STATE, RANK_BUFFERS)
"""The top-level state keys a rank manifest holds for its rank alone, grafted by a reader
at ``tree/<key>/rankNNNNN``."""
_STATE_NAMES = {RANK_STATE: "RNG state", RANK_BUFFERS: "buffer state"}
"""How messages name each of :data:`PER_RANK`."""


def head_of(key: str) -> str:
    """The top-level state key of a tensor key (``model/a.weight`` -> ``model``)."""
    return key.split("/", 1)[0]


@dataclass(frozen=True)
class RankManifest:
    """What one rank of a multi-rank save wrote: its files and their tensors, and its own
    RNG state (``ranks/rank-NNNNN.json``), signed as the root is when a key is configured.

    Example:
        >>> m = RankManifest(rank=1, step=5, files=(), tensors=())
        >>> ref = m.ref(m.to_json().encode())
        >>> (ref.rank, ref.path)
        (1, 'ranks/rank-00001.json')
    """

    rank: int
    step: int | None
    files: tuple[FileEntry, ...]
    tensors: tuple[TensorEntry, ...]
    signature: Signature | None = None
    rng: Any = None
    """This rank's RNG state as tagged JSON (its tensors are among :attr:`tensors`): the
    entry ``tree/rng/rankNNNNN`` of the checkpoint's state tree, which a reader grafts in
    (:data:`RANK_STATE`). Kept here, not in the root, so the root stays small (about
    12 kB of Python and numpy generator state per rank) and a restoring rank reads only
    the RNG state it restores. None: the rank saved none."""
    buffers: Any = None
    """This rank's own copies of the model's buffers as tagged JSON (its tensors are among
    :attr:`tensors`), the entry ``tree/buffers/rankNNNNN`` (:data:`RANK_BUFFERS`). None:
    the ranks' buffers agreed, and the model's shards hold them once."""

    def _content(self) -> dict[str, Any]:
        out = {
            "schema_version": RANKED_VERSION,
            "format": RANK_FORMAT,
            "rank": self.rank,
            "step": self.step,
            "files": [f.to_dict() for f in self.files],
            "tensors": [t.to_dict() for t in self.tensors],
        }
        if self.rng is not None:
            out[RANK_STATE] = self.rng
        if self.buffers is not None:
            out[RANK_BUFFERS] = self.buffers
        return out

    def signed(self, key: bytes) -> RankManifest:
        """A copy carrying the HMAC of its canonical content under ``key``."""
        return replace(self, signature=signing.sign(canonical(self._content()), key))

    def to_json(self) -> str:
        content = self._content()
        out = dict(content)
        if self.signature is not None:
            out["signature"] = self.signature.to_dict()
        out["manifest_digest"] = digest.hexdigest_bytes(canonical(content))
        # Compact: read by programs only, and json's C encoder runs only without indent
        # (the indented encoder is pure Python: most of a large manifest's write time).
        return json.dumps(out, separators=(",", ":"), allow_nan=False)

    def ref(self, data: bytes) -> RankRef:
        """The root's record of this manifest written as ``data``."""
        return RankRef(
            self.rank,
            rank_manifest_path(self.rank),
            len(data),
            digest.hexdigest_bytes(data),
            files=tuple(f.path for f in self.files),
            heads=tuple(sorted({head_of(t.key) for t in self.tensors})),
            sizes=tuple(f.size for f in self.files),
        )


RankFetch = Callable[[RankRef], bytes]
"""Reads the bytes of the rank manifest a root lists (at most
:data:`~ckptkit.format.manifest.MAX_MANIFEST_BYTES` and one more;
:mod:`ckptkit.checkpoint.manifest_io` reads them from the checkpoint)."""


def merge_ranks(
    root: dict[str, Any],
    path: str,
    key: bytes | None,
    fetch: RankFetch | None,
    only: Callable[[dict[str, Any]], Collection[int] | None] | None,
) -> tuple[dict[str, Any], frozenset[int] | None, Callable[[str], bool] | None]:
    """The root with every rank manifest's entries in its ``files`` and ``tensors`` and
    its RNG state in its ``tree`` (:func:`_grafted`), or (``only``) those of the ranks it
    selects and every rank the root does not index. ``only`` is given the root's JSON
    object (:meth:`ckptkit.format.manifest.Manifest.from_json` builds its ``only`` on it).

    The one merge: a full read and a partial one run the same checks on every manifest
    they read; a partial one also returns the ranks read and the test for a tensor key an
    unread manifest may hold (``None``, ``None`` when every manifest was read). The merged
    tree holds the RNG states of the ranks read only."""
    refs = root.get("ranks")
    if root["schema_version"] != RANKED_VERSION or not refs or root["files"] or root["tensors"]:
        raise ManifestError(
            "a root manifest (schema_version 2) lists its ranks' manifests and holds no "
            "entries itself; this one mixes the two forms",
            path=path,
            code=codes.M003,
            hint="the manifest is damaged or hand-edited; roll back to the previous verified "
            "checkpoint",
        )
    if fetch is None:
        raise ManifestError(
            "a multi-rank root manifest: its entries are in the per-rank manifests it lists",
            path=path,
            code=codes.M013,
            hint="read the checkpoint directory (ckptkit.checkpoint.manifest_io.read), not "
            "the root manifest alone",
        )
    all_refs = [RankRef.from_dict(r) for r in refs]
    wanted = None
    if only is not None:
        chosen = only(root)
        wanted = None if chosen is None else set(chosen)
    files, tensors = [], []
    states: dict[str, dict[str, Any]] = {head: {} for head in PER_RANK}
    seen: set[int] = set()
    indexed: set[str] = set()
    unread: list[RankRef] = []
    for ref in all_refs:
        if ref.sizes is not None and (ref.files is None or len(ref.sizes) != len(ref.files)):
            raise ManifestError(
                f"rank {ref.rank}'s record has {len(ref.sizes)} file sizes for "
                f"{len(ref.files or ())} files",
                path=path,
                code=codes.M003,
                hint="the manifest is damaged or hand-edited; roll back",
            )
        for p in ref.files or ():
            if p in indexed:
                raise ManifestError(
                    f"file {p!r} is listed by two ranks' manifests",
                    path=path,
                    code=codes.M003,
                    hint="the manifest is damaged or hand-edited; roll back",
                )
            indexed.add(p)
        if ref.rank in seen or ref.path != rank_manifest_path(ref.rank):
            raise ManifestError(
                f"rank {ref.rank}'s manifest is listed twice or at {ref.path!r}, not at "
                f"{rank_manifest_path(ref.rank)!r}",
                path=path,
                code=codes.M003,
                hint="the manifest is damaged or hand-edited; roll back",
            )
        seen.add(ref.rank)
        if wanted is not None and ref.rank not in wanted and ref.indexed:
            unread.append(ref)
            continue
        part = rank_part(fetch(ref), ref, root["step"], key, sibling_path(path, ref.path))
        files += part["files"]
        tensors += part["tensors"]
        for head in PER_RANK:
            if head in part:
                states[head][rank_key(ref.rank)] = part[head]
    grafted = root["tree"]
    for head in PER_RANK:
        grafted = _grafted(grafted, states[head], path, head=head)
    merged = {**root, "files": files, "tensors": tensors, "tree": grafted}
    if not unread:
        return merged, None, None
    return (
        merged,
        frozenset(seen - {ref.rank for ref in unread}),
        held_elsewhere(unread, {t["key"] for t in tensors}),
    )


def held_elsewhere(unread: Collection[RankRef], listed: Collection[str]) -> Callable[[str], bool]:
    """The test for a tensor key that a reader of part of a checkpoint does not have
    because a rank manifest it did not read (``unread``) may hold it: not ``listed`` by
    the manifests read, and of a top-level key one of ``unread`` records
    (:attr:`RankRef.heads`). The parse's tree check passes over exactly these (a run's
    listing reads the root alone; a restoring rank reads every manifest its tree needs).

    Example:
        >>> ref = RankRef(1, rank_manifest_path(1), 9, "0" * 32, (), ("rng",))
        >>> held = held_elsewhere([ref], {"rng/rank00000/t"})
        >>> held("rng/rank00001/t"), held("rng/rank00000/t"), held("model/w")
        (True, False, False)
    """
    heads = {h for ref in unread for h in ref.heads or ()}
    return lambda k: k not in listed and head_of(k) in heads


def _grafted(root_tree: Any, states: Mapping[str, Any], path: str, *, head: str = RANK_STATE) -> Any:
    """The root's tree with each rank's state under ``head`` (:data:`PER_RANK`; ``states``:
    rank key -> its rank manifest's ``rng`` or ``buffers``) at ``tree/<head>/<rank key>``:
    the state tree a single manifest would hold. A root of ckptkit 0.3's first per-rank
    layout holds the RNG states itself; a state in both places is refused, as is a root
    tree with no place for them.

    Example:
        >>> _grafted({"step": 3}, {"rank00001": {"rank": 1}}, "manifest.json")
        {'step': 3, 'rng': {'rank00001': {'rank': 1}}}
    """
    if not states:
        return root_tree
    held = root_tree.get(head, {}) if isinstance(root_tree, dict) else None
    twice = sorted(set(states) & set(held)) if isinstance(held, dict) else []
    if not isinstance(held, dict) or twice:
        raise ManifestError(
            f"the root's state tree holds the {_STATE_NAMES[head]} of {', '.join(twice)} too"
            if twice
            else f"the rank manifests hold {_STATE_NAMES[head]}s, but the root's state tree is "
            f"not a mapping with a mapping at '{head}' to hold them",
            path=path,
            code=codes.M003,
            hint="the manifest is damaged or hand-edited; roll back to the previous verified "
            "checkpoint",
        )
    return {**root_tree, head: {**held, **states}}


def sibling_path(path: str, rel: str) -> str:
    """How to name the rank manifest ``rel`` of the root at ``path`` in errors."""
    head, sep, _ = path.rpartition("/")
    return f"{head}{sep}{rel}"


def rank_part(data: bytes, ref: RankRef, step: Any, key: bytes | None, path: str) -> Any:
    """One rank manifest's JSON object: the bytes the root records, then parsed and
    validated as strictly as the root."""
    if len(data) != ref.size or digest.hexdigest_bytes(data) != ref.xxh3_128:
        raise ManifestError(
            f"rank {ref.rank}'s manifest is not the one the root lists ({len(data)} bytes, "
            f"the root records {ref.size} and their digest)",
            path=path,
            code=codes.M013,
            hint="it was replaced, truncated or damaged after the save; restore it from a "
            "copy or roll back to the previous verified checkpoint",
        )
    obj = strict_json(data, path)
    check_schema(obj, path, _rank_validator())
    for head in PER_RANK:
        if tree.nesting_exceeds(obj.get(head), tree.MAX_NESTING - 2):  # at tree/<head>/rankN
            raise nesting_error(head, tree.MAX_NESTING - 2, path)
    check_digest(obj, path, key)
    if obj["rank"] != ref.rank or obj["step"] != step:
        raise ManifestError(
            f"holds rank {obj['rank']} step {obj['step']}, the root lists it as rank "
            f"{ref.rank} of step {step}",
            path=path,
            code=codes.M013,
            hint="a rank manifest of another checkpoint was copied here; roll back",
        )
    if (ref.files is not None and list(ref.files) != [f["path"] for f in obj["files"]]) or (
        ref.sizes is not None and list(ref.sizes) != [f["size"] for f in obj["files"]]
    ):
        raise ManifestError(
            "lists other files (or sizes) than the root records for it",
            path=path,
            code=codes.M013,
            hint="the rank manifest or the root is damaged or hand-edited; roll back",
        )
    if ref.heads is not None and list(ref.heads) != sorted({head_of(t["key"]) for t in obj["tensors"]}):
        raise ManifestError(
            "holds the tensors of other state keys than the root records for it",
            path=path,
            code=codes.M013,
            hint="the rank manifest or the root is damaged or hand-edited; roll back",
        )
    listed = {t["key"] for t in obj["tensors"]}
    for head, k in ((h, k) for h in PER_RANK for _, k in tree.iter_tensor_refs(obj.get(h))):
        if k not in listed:
            raise ManifestError(
                f"its {_STATE_NAMES[head]} references tensor {k!r}, which it does not list",
                path=path,
                code=codes.M009,
                hint="the rank manifest is damaged or hand-edited; roll back",
            )
    for f in obj["files"]:
        if f.get("rank", ref.rank) != ref.rank:
            raise ManifestError(
                f"lists {f['path']!r} as written by rank {f['rank']}",
                path=path,
                code=codes.M013,
                hint="the rank manifest is damaged or hand-edited; roll back",
            )
    return obj


