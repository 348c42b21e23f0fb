"""The manifest: what a checkpoint holds, where, and the digests that prove it.

This module is the manifest *format*, and only that: frozen dataclasses, their JSON and
the one parse of a manifest, over bytes already in memory; the checks each manifest
document passes are :mod:`ckptkit.format.validation`, a multi-rank save's per-rank
manifests and their merge :mod:`ckptkit.format.ranks`. It opens no file and imports
nothing from :mod:`ckptkit.storage` (the layers: ``docs/architecture.md``). Reading
``manifest.json`` from a location and writing it there is
:mod:`ckptkit.checkpoint.manifest_io`.

``manifest.json`` is written last and is the commit marker (spec §2). A multi-rank save
writes it as a small root (``schema_version`` 2) over per-rank manifests, which a reader
merges into one :class:`Manifest` with every entry, as from a ``schema_version`` 1
manifest (a world of one, and every checkpoint before v0.3). Every manifest read is
checked once, in order: a regular file, not a symlink (``CK-M008``, by the reader);
strict UTF-8 JSON without duplicate keys or non-finite numbers (``CK-M002``); a known
``schema_version`` (``CK-M004``); the JSON Schema in ``schemas/manifest.schema.json``
(``CK-M003``; ``CK-M005``/``CK-M006`` for its safety rails), validated by
``jsonschema-rs``; nesting depth (``CK-M006``); its own digest (``CK-M007``); its
signature when a key is given (``CK-M010``/``CK-M011``); semantic safety: paths stay
inside the checkpoint (``CK-M005``), sizes and shapes are coherent (``CK-M006``); and
the state tree decodes exactly as ``load`` decodes it (``CK-M009``), so a manifest that
verifies also loads.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import json
import math
import numbers
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

from ckptkit import codes
from ckptkit._repr import brief, short
from ckptkit._version import __version__
from ckptkit.errors import ManifestError, StateError, UnsafeInputError
from ckptkit.format import digest, signing, tree
from ckptkit.format.dtypes import DTYPES, HeaderEntry
from ckptkit.format.ranks import (
    RANK_STATE,
    RANKED_VERSION,
    RANKS_DIR,
    RankFetch,
    RankRef,
    merge_ranks,
    rank_of,
    rank_part,
    sibling_path,
)
from ckptkit.format.signing import Signature
from ckptkit.format.validation import (
    M002_HINT,
    UNSAFE_HINT,
    canonical,
    check_digest,
    check_listing,
    check_schema,
    nesting_error,
    strict_json,
    too_deep,
)

MANIFEST_NAME = "manifest.json"
"""The manifest's file name inside a checkpoint: written last, it is the commit marker."""
ADOPTED_SUFFIX = "ckptkit-manifest.json"
"""The name of a ckptkit manifest inside a checkpoint another tool laid out (a DCP
directory, an HF ``checkpoint-N/``), or the suffix of one beside a single-file checkpoint
(``<file>.ckptkit-manifest.json``): written by ``ckptkit adopt``, the integrations and
:mod:`ckptkit.dcp`; its ``user.adopted`` lists the files' digests."""
SCHEMA_VERSION = 1
"""The version of a manifest holding every entry itself (one process)."""
READ_VERSIONS = (SCHEMA_VERSION, RANKED_VERSION)
FORMAT = "ckptkit"
MAX_MANIFEST_BYTES = 256 << 20
"""A manifest larger than this is refused before parsing (hostile input)."""

COMPONENTS: tuple[str, ...] = (
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "fp8",
    "rng",
    "sampler",
    "progress",
    "parallel",
    "data",
    "env",
    "metrics",
)
"""Resume-critical state, spec §1, in table order."""


STEP_LIMIT = 2**53
"""A recorded step is an integer with ``0 <= step < STEP_LIMIT``: JSON readers count
exactly only below 2**53 (a double's mantissa), and the schema's ``step.maximum`` is
``STEP_LIMIT - 1`` (a test holds the two together)."""


def is_step(value: Any) -> bool:
    """True when ``value`` can be recorded as a manifest's step (a bool is no step).

    Example:
        >>> is_step(1000), is_step(-1), is_step(2**53), is_step(True), is_step(3.0)
        (True, False, False, False, False)
    """
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        and 0 <= int(value) < STEP_LIMIT
    )


def check_step(value: Any) -> int:
    """Return ``value`` as the step to record, or refuse it before anything is written.

    Every save that records a step (``ckptkit.save(step=...)``,
    ``CheckpointManager.save``) checks it here: a step the manifest schema refuses would
    commit a checkpoint that no reader accepts.

    Raises:
        StateError: (a ``ValueError``) not an integer, a bool, negative, or ``>= 2**53``.

    Example:
        >>> check_step(1000)
        1000
        >>> check_step(-1)
        Traceback (most recent call last):
        ...
        ckptkit.errors.StateError: step -1 (int) cannot be recorded: ...
    """
    if not is_step(value):
        raise StateError(
            f"step {short(value)} ({type(value).__name__}) cannot be recorded: a step is "
            f"an int (not a bool) with 0 <= step < 2**53 ({STEP_LIMIT}); nothing was written",
            hint="pass the global step as a non-negative int (step=1000)",
        )
    return int(value)


@dataclass(frozen=True)
class FileEntry:
    """One file of the checkpoint."""

    path: str
    """Relative POSIX path inside the checkpoint directory."""
    size: int
    """Bytes on disk."""
    xxh3_128: str
    """xxh3-128 hex digest of the bytes on disk."""
    compression: str | None = None
    """``"zstd"`` or ``None``."""
    raw_size: int | None = None
    """Decompressed size of a compressed file (the decompression limit)."""
    component: str | None = None
    """Component whose state the file holds, when it holds one only."""
    rank: int | None = None
    """Rank that wrote the file, for per-rank files."""

    @classmethod
    def from_dict(cls, f: Mapping[str, Any]) -> FileEntry:
        """Build from an already validated JSON object (a field with a default may be absent)."""
        given: dict[str, Any] = {
            x.name: f[x.name] if x.default is MISSING else f.get(x.name) for x in fields(cls)
        }
        return cls(**given)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field without a default, the others when not None."""
        return {
            x.name: getattr(self, x.name)
            for x in fields(self)
            if x.default is MISSING or getattr(self, x.name) is not None
        }


@dataclass(frozen=True)
class TensorEntry:
    """One tensor: its key in the state tree, file, dtype, shape and byte range."""

    key: str
    file: str
    dtype: str
    """safetensors dtype name (``BF16``, ``F32`` ...)."""
    shape: tuple[int, ...]
    offsets: tuple[int, int]
    """Byte range inside the file's safetensors data section."""

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]

    def header_entry(self) -> HeaderEntry:
        return HeaderEntry(self.dtype, self.shape, self.offsets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "file": self.file,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offsets": list(self.offsets),
        }


@dataclass(frozen=True)
class Component:
    """Whether a spec §1 component is in the checkpoint, required by the run, and where."""

    name: str
    present: bool
    required: bool
    where: tuple[str, ...] = ()
    """Files, or ``manifest:tree/<key>`` for state kept as JSON in the manifest."""
    summary: Mapping[str, Any] = field(default_factory=dict)
    """Small facts (step counts, scale ...) that verify checks without loading tensors."""
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "present": self.present,
            "required": self.required,
            "where": list(self.where),
        }
        if self.summary:
            out["summary"] = json_safe(dict(self.summary))
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated ``manifest.json``.

    Example:
        >>> m = Manifest(files=(), tensors=(), tree=None, components={}, env={})
        >>> Manifest.from_json(m.to_json()).tree is None
        True
    """

    files: tuple[FileEntry, ...]
    tensors: tuple[TensorEntry, ...]
    tree: Any
    """The saved object as tagged JSON (see ckptkit.format.tree)."""
    components: Mapping[str, Component]
    env: Mapping[str, Any]
    step: int | None = None
    created_at: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")
    )
    ckptkit_version: str = __version__
    schema_version: int = SCHEMA_VERSION
    lookahead: Mapping[str, Any] | None = None
    health: Mapping[str, Any] | None = None
    findings: Mapping[str, Any] | None = None
    """Consistency findings at save and the saver's policy (:mod:`ckptkit.verify.atsave`)."""
    pins: tuple[str, ...] = ()
    user: Mapping[str, Any] | None = None
    recoveries: Mapping[str, Any] | None = None
    """Automatic recoveries in the history of this state (:mod:`ckptkit.signals.recovery`)."""
    replicas: Mapping[str, Any] | None = None
    """The replica agreement check made at save (:class:`ckptkit.format.records.Replicas`)."""
    ranks: tuple[RankRef, ...] = ()
    """A multi-rank save's per-rank manifests (``schema_version`` 2). The root written to
    disk then holds no entries itself; :attr:`files` and :attr:`tensors` of a manifest
    read back hold every rank's (the reader merged them), or those of
    :attr:`read_ranks` only."""
    signature: Signature | None = None
    """HMAC of the canonical content under the user's key (see :mod:`ckptkit.format.signing`)."""
    read_ranks: frozenset[int] | None = field(default=None, compare=False)
    """The ranks whose manifests were read, when not all were (a restoring rank reads
    those it needs: :func:`parse`'s ``only``): :attr:`files` and :attr:`tensors` are
    theirs alone. None: the manifest is complete. Not part of the content."""
    root_tree: Any = field(default=None, compare=False)
    """Of a multi-rank checkpoint read back: the state tree as the root holds it, without
    the ranks' RNG states, which :attr:`tree` has from the rank manifests read
    (:data:`RANK_STATE`). It is what the root's content, digest and signature cover.
    None: :attr:`tree` is the root's own (one rank, or a root being built)."""
    read_later: Callable[[RankRef], tuple[FileEntry, ...]] | None = field(
        default=None, compare=False, repr=False
    )
    """Of a partial manifest: reads the manifest of a rank that was not read, through the
    checks the read made on those it read, and returns its file entries (:meth:`entry`).
    Not part of the content."""
    vouched: str | None = field(default=None, compare=False)
    """The id of the key (:func:`ckptkit.format.signing.key_id`) whose signature this manifest,
    and every rank manifest read with it, was checked under when it was parsed; None when
    it was read without a key. Not part of the content: :meth:`trusted` reads it."""

    @property
    def complete(self) -> bool:
        """Whether :attr:`files` and :attr:`tensors` hold every entry of the checkpoint."""
        return self.read_ranks is None

    @cached_property
    def _unread_files(self) -> dict[str, RankRef]:
        """The files the unread ranks' manifests list, each with the record of its rank."""
        read = self.read_ranks
        if read is None:
            return {}
        return {p: r for r in self.ranks if r.rank not in read for p in r.files or ()}

    def elsewhere(self, file: str) -> bool:
        """Whether ``file`` (a path) is not in this manifest's entries because a rank
        manifest that was not read lists it. Always False for a complete manifest; a
        reader of part of a checkpoint passes over exactly these files (a component's
        ``where`` names every rank's), and treats any other file missing as missing. Its
        :attr:`tree` needs none of them: it holds the RNG states of the ranks read only.

        Example:
            >>> m = Manifest(files=(), tensors=(), tree=None, components={}, env={},
            ...     ranks=(RankRef(1, "ranks/rank-00001.json", 9, "0" * 32, ("rng-1.st",),
            ...     ("rng",)),), read_ranks=frozenset({0}))
            >>> m.elsewhere("rng-1.st"), m.elsewhere("model.safetensors")
            (True, False)
        """
        return file in self._unread_files

    def file_sizes(self) -> dict[str, int] | None:
        """Every file of the checkpoint with the size recorded for it: the files of the
        entries read, each rank manifest (its size in the root), and the files of unread
        rank manifests as the root records them (:attr:`RankRef.sizes`). None when the
        root does not record them for an unread rank (its manifest must be read).

        Example:
            >>> ref = RankRef(1, "ranks/rank-00001.json", 9, "0" * 32, ("a.st",), (), (5,))
            >>> Manifest(files=(), tensors=(), tree=None, components={}, env={},
            ...     ranks=(ref,), read_ranks=frozenset()).file_sizes()
            {'ranks/rank-00001.json': 9, 'a.st': 5}
        """
        out = {r.path: r.size for r in self.ranks}
        out.update((f.path, f.size) for f in self.files)
        read = self.read_ranks
        for r in self.ranks:
            if read is None or r.rank in read:
                continue
            if r.files is None or r.sizes is None:
                return None
            out.update(zip(r.files, r.sizes, strict=True))
        return out

    @cached_property
    def rng_ranks(self) -> frozenset[int]:
        """The ranks whose RNG state the checkpoint holds, as far as a reader of this
        manifest can tell: those its :attr:`tree` holds (``tree/rng/rankNNNNN``), and, of a
        partial manifest, the unread ranks whose manifests the root records as holding RNG
        tensors (:attr:`RankRef.heads`). A rank manifest that was read counts only by the
        state it holds.

        Example:
            >>> ref = RankRef(1, "ranks/rank-00001.json", 9, "0" * 32, (), (RANK_STATE,))
            >>> m = Manifest(files=(), tensors=(), tree={"rng": {"rank00000": {}}},
            ...     components={}, env={}, ranks=(ref,), read_ranks=frozenset({0}))
            >>> sorted(m.rng_ranks), sorted(replace(m, read_ranks=None).rng_ranks)
            ([0, 1], [0])
        """
        held = self.tree.get(RANK_STATE) if isinstance(self.tree, Mapping) else None
        out = {r for r in map(rank_of, held if isinstance(held, Mapping) else ()) if r is not None}
        read = self.read_ranks
        if read is not None:
            out |= {r.rank for r in self.ranks if r.rank not in read and RANK_STATE in (r.heads or ())}
        return frozenset(out)

    @property
    def total_bytes(self) -> int:
        """Bytes on disk of every listed file."""
        return sum(f.size for f in self.files)

    def __repr__(self) -> str:
        # The tree holds every rank's RNG state: name the facts, count the rest.
        return brief(
            "Manifest",
            step=self.step,
            files=len(self.files),
            tensors=len(self.tensors),
            bytes=self.total_bytes,
            components=[n for n, c in self.components.items() if c.present],
            created_at=self.created_at,
        )

    def file(self, path: str) -> FileEntry | None:
        """Return the entry of ``path`` or None."""
        for f in self.files:
            if f.path == path:
                return f
        return None

    def entry(self, path: str) -> FileEntry | None:
        """The entry of ``path``, wherever it is listed: among :attr:`files`, else (a
        partial manifest) in the rank manifest that lists it and was not read, which is
        read now, checked as the ranks read were (the root's record of its size and
        digest, its own digest and signature, its schema), and kept. None: no manifest of
        the checkpoint lists ``path``.

        A reader that finds out which files it needs only as it goes (a DCP load plans its
        reads after the manifests are read) reads the rank manifests of those files alone.

        Raises:
            ManifestError: ``CK-M013`` and the other refusals of a rank manifest (see
                :func:`parse`), when the one that lists ``path`` is refused.

        Example:
            >>> fe = FileEntry("a.st", 5, "0" * 32)
            >>> ref = RankRef(1, "ranks/rank-00001.json", 9, "0" * 32, ("b.st",), ())
            >>> m = Manifest(files=(fe,), tensors=(), tree=None, components={}, env={},
            ...     ranks=(ref,), read_ranks=frozenset({0}),
            ...     read_later=lambda r: (FileEntry("b.st", 7, "1" * 32, rank=r.rank),))
            >>> m.entry("a.st").size, m.entry("b.st").rank, m.entry("c.st")
            (5, 1, None)
        """
        found = self._entries.get(path)
        ref = self._unread_files.get(path)
        if found is not None or ref is None or self.read_later is None:
            return found
        self._entries.update((f.path, f) for f in self.read_later(ref))
        return self._entries.get(path)

    @cached_property
    def _entries(self) -> dict[str, FileEntry]:
        """:attr:`files` by path, and the entries :meth:`entry` read since."""
        return {f.path: f for f in self.files}

    def _content(self) -> dict[str, Any]:
        """The signed and digested content: every field but the digest and the signature.

        With :attr:`ranks`, the root's: the entries and the ranks' RNG states are in the
        rank manifests it lists."""
        ranked = bool(self.ranks)
        out: dict[str, Any] = {
            "schema_version": RANKED_VERSION if ranked else self.schema_version,
            "format": FORMAT,
            "ckptkit_version": self.ckptkit_version,
            "created_at": self.created_at,
            "step": self.step,
            "files": [] if ranked else [f.to_dict() for f in self.files],
            "tensors": [] if ranked else [t.to_dict() for t in self.tensors],
            "tree": self.root_tree if ranked and self.root_tree is not None else self.tree,
            "components": {
                name: self.components[name].to_dict()
                for name in COMPONENTS
                if name in self.components
            },
            "env": dict(self.env),
        }
        for k in ("lookahead", "health", "findings", "user", "recoveries", "replicas"):
            v = getattr(self, k)
            if v is not None:
                out[k] = dict(v)
        if self.pins:
            out["pins"] = list(self.pins)
        if ranked:
            out["ranks"] = [r.to_dict() for r in self.ranks]
        return out

    @cached_property
    def digest(self) -> str:
        """The ``manifest_digest``: xxh3-128 of the canonical content (cached; a parsed
        manifest carries the value it was checked against)."""
        return digest.hexdigest_bytes(canonical(self._content()))

    def signed(self, key: bytes) -> Manifest:
        """Return a copy carrying the HMAC of its canonical content under ``key``.

        Example:
            >>> m = Manifest(files=(), tensors=(), tree=None, components={}, env={})
            >>> s = m.signed(b"0123456789abcdef")
            >>> parse(s.to_json(), key=b"0123456789abcdef")["signature"]["alg"]
            'hmac-sha256'
        """
        return replace(self, signature=signing.sign(canonical(self._content()), key))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object, with ``manifest_digest`` computed over the content."""
        out = self._content()
        if self.signature is not None:
            out["signature"] = self.signature.to_dict()
        out["manifest_digest"] = self.digest
        return out

    def to_json(self) -> str:
        """Serialise (strict JSON: no NaN; the tree encodes non-finite floats as tags).

        Raises:
            StateError: a free-form part (user, env, lookahead, health, a summary) nests
                deeper than a reader accepts; nothing is written that would not read back.
        """
        out = self.to_dict()
        where = too_deep(out)
        if where is not None:
            raise StateError(
                f"manifest field {where!r} nests deeper than {tree.MAX_NESTING} levels",
                hint="flatten it; manifests hold small records",
            )
        return json.dumps(out, indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        """Build from an already validated JSON object."""
        m = cls(
            files=tuple(FileEntry.from_dict(f) for f in d["files"]),
            tensors=tuple(
                TensorEntry(
                    key=t["key"],
                    file=t["file"],
                    dtype=t["dtype"],
                    shape=tuple(t["shape"]),
                    offsets=(t["offsets"][0], t["offsets"][1]),
                )
                for t in d["tensors"]
            ),
            tree=d["tree"],
            components={
                name: Component(
                    name=name,
                    present=c["present"],
                    required=c["required"],
                    where=tuple(c.get("where", ())),
                    summary=c.get("summary", {}),
                    reason=c.get("reason"),
                )
                for name, c in d["components"].items()
            },
            env=d["env"],
            step=d.get("step"),
            created_at=d["created_at"],
            ckptkit_version=d["ckptkit_version"],
            schema_version=d["schema_version"],
            lookahead=d.get("lookahead"),
            health=d.get("health"),
            findings=d.get("findings"),
            pins=tuple(d.get("pins", ())),
            user=d.get("user"),
            recoveries=d.get("recoveries"),
            replicas=d.get("replicas"),
            ranks=tuple(RankRef.from_dict(r) for r in d.get("ranks", ())),
            signature=Signature.from_dict(d["signature"]) if "signature" in d else None,
        )
        if "manifest_digest" in d:
            # The value parse() checked: callers that key on it (the run index) need not
            # serialise the whole manifest again.
            m.__dict__["digest"] = d["manifest_digest"]
        return m

    def trusted(self, key: bytes | None, *, path: object = MANIFEST_NAME) -> Manifest:
        """Return this manifest if ``key`` vouched for it when it was read, else raise.

        The one trust decision is made where a manifest is parsed (:func:`parse` with the
        key: the root's signature and every rank manifest's); a reader handed a manifest
        makes this check so that none ever uses one that was read without the key, or
        under another one. Without a key every manifest passes.

        Raises:
            SignatureError: ``CK-M010``, a key is configured and this manifest was not
                checked under it.

        Example:
            >>> m = Manifest(files=(), tensors=(), tree=None, components={}, env={})
            >>> m.trusted(None) is m
            True
            >>> m.trusted(b"0123456789abcdef")
            Traceback (most recent call last):
            ...
            ckptkit.errors.SignatureError: CK-M010 manifest.json: ...
        """
        if key is None or self.vouched == signing.key_id(key):
            return self
        raise codes.error(
            codes.M010,
            "a key is configured, but this manifest was not checked under it (read without "
            "the key, or with another one): its origin is not proven",
            path=path,
            hint="read the checkpoint with the key (ckptkit.checkpoint.manifest_io.read(path, "
            "key=...)) and pass that manifest on",
        )

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        path: str = MANIFEST_NAME,
        key: bytes | None = None,
        ranks: RankFetch | None = None,
        only: RankSelect | None = None,
    ) -> Manifest:
        """Parse and fully validate manifest text (see :func:`parse`); with ``only``, the
        manifest may be partial (:attr:`Manifest.read_ranks`)."""
        with _gc_paused():
            obj, read, root_tree = _parse(text, path, key, ranks, only)
            m = cls.from_dict(obj)
            read_with: dict[str, Any] = {}
            if key is not None:  # _parse checked the signatures under it, or raised
                read_with["vouched"] = signing.key_id(key)
            if m.ranks:  # a root: what was read of it, and its own tree
                read_with.update(
                    read_ranks=read,
                    root_tree=root_tree,
                    read_later=None if read is None else _later_reader(obj, path, key, ranks),
                )
            if read_with:
                m = replace(m, **read_with)
                m.__dict__["digest"] = obj["manifest_digest"]  # replace() drops the cache
            return m


def adopted_files(m: Manifest, *, path: str = ADOPTED_SUFFIX) -> tuple[FileEntry, ...]:
    """The files an adopted manifest (:data:`ADOPTED_SUFFIX`) records, checked.

    An adopted manifest keeps its files' digests in ``user.adopted.files`` (foreign names
    fall outside the native ``files[].path`` grammar). The one check of that record: verify
    (:mod:`ckptkit.verify.foreign.adopted`) and :mod:`ckptkit.dcp` both call it.

    Raises:
        ManifestError: ``CK-M003`` no ``user.adopted.files`` record, or a malformed entry.
        UnsafeInputError: ``CK-M005`` a path escapes the checkpoint.

    Example:
        >>> m = Manifest(files=(), tensors=(), tree=None, components={}, env={},
        ...     user={"adopted": {"files": [{"path": ".metadata", "size": 3,
        ...     "xxh3_128": "0" * 32}]}})
        >>> adopted_files(m)[0].path
        '.metadata'
    """
    adopted = (m.user or {}).get("adopted")
    if not isinstance(adopted, Mapping) or not isinstance(adopted.get("files"), list):
        raise ManifestError(
            "adopted manifest has no user.adopted.files record", path=path, code=codes.M003,
            hint=M002_HINT,
        )
    out = []
    for f in adopted["files"]:
        ok = (
            isinstance(f, Mapping)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("size"), int)
            and not isinstance(f.get("size"), bool)
            and f["size"] >= 0
            and isinstance(f.get("xxh3_128"), str)
            and _HEX32.match(f["xxh3_128"]) is not None
        )
        if not ok:
            raise ManifestError(
                f"adopted manifest has a malformed file entry: {str(f)[:120]}",
                path=path, code=codes.M003, hint=M002_HINT,
            )
        out.append(FileEntry(path=f["path"], size=f["size"], xxh3_128=f["xxh3_128"]))
    check_listing([fe.path for fe in out], path=path)
    return tuple(out)


_HEX32 = re.compile(r"^[0-9a-f]{32}$")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a manifest is parsed and checked.

    Parsing allocates about ten containers per tensor and creates no reference cycles,
    so the collector finds nothing, but the allocations trigger full collections that
    traverse the whole process heap (torch's included): at 10k tensors that was 3/4 of
    the parse time. Reference counting still frees everything. A collector that was
    off stays off; one that was on is turned back on at the end (so a gc.disable() made
    by another thread during a parse would be undone: a rare race, and a harmless one).
    """
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was and not gc.isenabled():
            gc.enable()


def json_safe(x: Any) -> Any:
    """Return ``x`` with non-finite floats tagged as in the state tree (strict JSON has none).

    Example:
        >>> json_safe({"scale": float("nan"), "ok": [1.0]})
        {'scale': {'$t': 'float', 'v': 'nan'}, 'ok': [1.0]}
    """
    if isinstance(x, float) and not math.isfinite(x):
        return {"$t": "float", "v": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
    if isinstance(x, Mapping):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def content_digest(obj: Mapping[str, Any]) -> str:
    """Return the ``manifest_digest`` of a JSON object: xxh3-128 of :func:`canonical`."""
    return digest.hexdigest_bytes(canonical(obj))


RankSelect = Callable[[Manifest], Collection[int] | None]
"""Given a validated root (a :class:`Manifest` without entries), the ranks whose manifests
a reader needs; None: every rank's. A rank manifest the root does not index
(:attr:`RankRef.indexed`) is read anyway."""


def parse(
    text: str | bytes,
    *,
    path: str = MANIFEST_NAME,
    key: bytes | None = None,
    ranks: RankFetch | None = None,
) -> dict[str, Any]:
    """Parse manifest text and validate it once, completely; return the JSON object.
    (:meth:`Manifest.from_json` with ``only`` reads some ranks' manifests only.)

    A root (``schema_version`` 2) is returned with every rank's entries merged into its
    ``files`` and ``tensors``, and each rank's RNG state into its ``tree``
    (:data:`RANK_STATE`): each rank manifest is fetched with ``ranks``, checked against
    the size and digest the root records, then parsed and validated as strictly as the
    root, and the merged manifest gets the same semantic checks as a single manifest's.

    Args:
        text: the manifest bytes (UTF-8) or text.
        path: how to name the manifest in errors.
        key: an HMAC key (see :mod:`ckptkit.format.signing`): the manifest must carry a valid
            signature under it. None: a signature, if any, is not checked.
        ranks: reads a rank manifest the root lists (needed for a root only).

    Raises:
        ManifestError: ``CK-M002`` not strict JSON (not UTF-8, a BOM, a duplicate key, a
            non-finite number, absurd nesting), ``CK-M004`` unknown schema version,
            ``CK-M003`` schema violation, ``CK-M007`` manifest digest mismatch, ``CK-M009``
            a state tree ``load`` could not rebuild, ``CK-M013`` a rank manifest missing or
            not the one the root lists.
        UnsafeInputError: ``CK-M005`` path escaping the directory, ``CK-M006`` absurd
            or incoherent sizes/shapes or nesting.
        SignatureError: ``CK-M010`` unsigned, ``CK-M011`` signed with another key or
            changed after signing (only with ``key``).

    Example:
        >>> parse("[")
        Traceback (most recent call last):
        ...
        ckptkit.errors.ManifestError: CK-M002 manifest.json: not valid JSON ...
        >>> parse('{"schema_version": 1, "schema_version": 1}')
        Traceback (most recent call last):
        ...
        ckptkit.errors.ManifestError: CK-M002 manifest.json: not valid JSON (duplicate key ...
    """
    with _gc_paused():
        return _parse(text, path, key, ranks, None)[0]


def _parse(
    text: str | bytes,
    path: str,
    key: bytes | None,
    ranks: RankFetch | None,
    only: RankSelect | None,
) -> tuple[dict[str, Any], frozenset[int] | None, Any]:
    """:func:`parse`; of a root also the ranks whose manifests were read when not all were,
    and the root's own tree (the merged object's holds the ranks' RNG states): ``None``,
    ``None``, ``None`` for a manifest of one rank."""
    obj = strict_json(text, path)
    if not isinstance(obj, dict):
        raise ManifestError(
            "not a JSON object",
            path=path,
            code=codes.M003,
            hint="the manifest is damaged; roll back to the previous verified checkpoint",
        )
    version = obj.get("schema_version")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > RANKED_VERSION
        raise ManifestError(
            f"unknown schema_version {version!r} (this ckptkit {__version__} reads "
            f"{', '.join(map(str, READ_VERSIONS))})",
            path=path,
            code=codes.M004,
            hint="upgrade ckptkit to read this checkpoint"
            if newer
            else "the manifest is damaged or not a ckptkit manifest; roll back",
        )
    check_schema(obj, path)
    where = too_deep(obj)
    if where is not None:
        raise nesting_error(where, tree.MAX_NESTING, path)
    check_digest(obj, path, key)
    read: frozenset[int] | None = None
    elsewhere: Callable[[str], bool] | None = None
    root_tree: Any = None
    if version == RANKED_VERSION or "ranks" in obj:
        root_tree = obj["tree"]
        select = None if only is None else lambda r: only(Manifest.from_dict(r))
        obj, read, elsewhere = merge_ranks(obj, path, key, ranks, select)
    check_semantics(obj, path=path)
    try:
        tree.check(
            obj["tree"], {t["key"]: t["dtype"] for t in obj["tensors"]}, elsewhere=elsewhere
        )
    except ManifestError as e:
        raise ManifestError(e.what, path=path, code=e.code, hint=e.hint) from None
    return obj, read, root_tree


def _later_reader(
    root: Mapping[str, Any], path: str, key: bytes | None, fetch: RankFetch | None
) -> Callable[[RankRef], tuple[FileEntry, ...]]:
    """:attr:`Manifest.read_later` of a partial read of ``root``: a rank manifest read later
    goes through :func:`rank_part`, as the merge's did."""

    def entries(ref: RankRef) -> tuple[FileEntry, ...]:
        assert fetch is not None  # a partial read fetched the others with it
        part = rank_part(fetch(ref), ref, root["step"], key, sibling_path(path, ref.path))
        return tuple(map(FileEntry.from_dict, part["files"]))

    return entries


def check_semantics(obj: Mapping[str, Any], *, path: str = MANIFEST_NAME) -> None:
    """Check what the schema cannot: unique paths, coherent tensor sizes, sane totals.

    Raises:
        UnsafeInputError: ``CK-M005`` / ``CK-M006``.
        ManifestError: ``CK-M003`` duplicates or dangling references.
    """
    check_listing([f["path"] for f in obj["files"]], path=path)
    files: dict[str, Mapping[str, Any]] = {}
    for f in obj["files"]:
        p = f["path"]
        if p == MANIFEST_NAME or PurePosixPath(p).parts[0] == RANKS_DIR:
            raise UnsafeInputError(
                f"file path {p!r} is reserved for ckptkit's own files",
                path=path,
                code=codes.M005,
                hint=UNSAFE_HINT,
            )
        if f.get("compression") and "raw_size" not in f:
            raise ManifestError(
                f"compressed file {p!r} has no raw_size",
                path=path,
                code=codes.M003,
                hint="roll back to the previous verified checkpoint",
            )
        files[p] = f
    keys: set[str] = set()
    per_file: dict[str, int] = {}
    for t in obj["tensors"]:
        key, fp = t["key"], t["file"]
        if key in keys:
            raise ManifestError(f"tensor {key!r} listed twice", path=path, code=codes.M003, hint="roll back")
        keys.add(key)
        if fp not in files:
            raise ManifestError(
                f"tensor {key!r} lives in {fp!r}, which the manifest does not list",
                path=path,
                code=codes.M003,
                hint="roll back to the previous verified checkpoint",
            )
        numel = math.prod(t["shape"])
        itemsize = _ITEMSIZE[t["dtype"]]
        b, e = t["offsets"]
        if b > e or numel * itemsize != e - b:
            raise UnsafeInputError(
                f"tensor {key!r}: shape {t['shape']} x {t['dtype']} needs {numel * itemsize} "
                f"bytes but offsets {t['offsets']} span {e - b}",
                path=path,
                code=codes.M006,
                hint="do not load this checkpoint; its manifest is incoherent or hostile",
            )
        per_file[fp] = per_file.get(fp, 0) + (e - b)
    for fp, need in per_file.items():
        f = files[fp]
        room = f.get("raw_size", f["size"]) if f.get("compression") else f["size"]
        if need > room:
            raise UnsafeInputError(
                f"tensors in {fp!r} need {need} bytes but the file holds {room}",
                path=path,
                code=codes.M006,
                hint="do not load this checkpoint; its manifest declares absurd sizes",
            )


_ITEMSIZE = {name: (dt.itemsize if hasattr(dt, "itemsize") else 1) for name, dt in DTYPES.items()}
