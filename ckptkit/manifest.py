"""The manifest: what a checkpoint holds, where, and the digests that prove it.

``manifest.json`` is written last and is the commit marker (spec §2). Every manifest
read is checked, in order: valid JSON (``CK-M002``), known ``schema_version``
(``CK-M004``), the JSON Schema in ``schemas/manifest.schema.json`` (``CK-M003``), its
own digest (``CK-M007``), then semantic safety: paths stay inside the checkpoint
(``CK-M005``), sizes and shapes are coherent and not absurd (``CK-M006``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema

from ckptkit._repr import brief
from ckptkit._version import __version__
from ckptkit.errors import IncompleteCheckpointError, ManifestError, UnsafeInputError
from ckptkit.storage import digest
from ckptkit.storage.atomic import MANIFEST_NAME
from ckptkit.storage.tensors import DTYPES, HeaderEntry

SCHEMA_VERSION = 1
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


@cache
def schema(name: str = "manifest.schema.json") -> dict[str, Any]:
    """Return a packaged JSON schema (a byte-identical copy of top-level ``schemas/``).

    Example:
        >>> schema()["properties"]["schema_version"]["const"]
        1
    """
    text = resources.files("ckptkit").joinpath("_schemas", name).read_text("utf-8")
    return dict(json.loads(text))


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "xxh3_128": self.xxh3_128}
        for k in ("compression", "raw_size", "component", "rank"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


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
    """The saved object as tagged JSON (see ckptkit.storage.tree)."""
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

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object, with ``manifest_digest`` computed over the rest."""
        out: dict[str, Any] = {
            "schema_version": self.schema_version,
            "format": FORMAT,
            "ckptkit_version": self.ckptkit_version,
            "created_at": self.created_at,
            "step": self.step,
            "files": [f.to_dict() for f in self.files],
            "tensors": [t.to_dict() for t in self.tensors],
            "tree": self.tree,
            "components": {
                name: self.components[name].to_dict()
                for name in COMPONENTS
                if name in self.components
            },
            "env": dict(self.env),
        }
        for k in ("lookahead", "health", "findings", "user"):
            v = getattr(self, k)
            if v is not None:
                out[k] = dict(v)
        if self.pins:
            out["pins"] = list(self.pins)
        out["manifest_digest"] = content_digest(out)
        return out

    def to_json(self) -> str:
        """Serialise (strict JSON: no NaN; the tree encodes non-finite floats as tags)."""
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        """Build from an already validated JSON object."""
        return cls(
            files=tuple(
                FileEntry(
                    path=f["path"],
                    size=f["size"],
                    xxh3_128=f["xxh3_128"],
                    compression=f.get("compression"),
                    raw_size=f.get("raw_size"),
                    component=f.get("component"),
                    rank=f.get("rank"),
                )
                for f in d["files"]
            ),
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
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, path: str = MANIFEST_NAME) -> Manifest:
        """Parse and fully validate manifest text (see :func:`parse`)."""
        return cls.from_dict(parse(text, path=path))


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
    """Return the xxh3-128 of the canonical JSON of ``obj`` without ``manifest_digest``."""
    body = {k: v for k, v in obj.items() if k != "manifest_digest"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return digest.hexdigest_bytes(canon.encode())


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def parse(text: str | bytes, *, path: str = MANIFEST_NAME) -> dict[str, Any]:
    """Parse manifest text and validate it; return the JSON object.

    Raises:
        ManifestError: ``CK-M002`` not JSON, ``CK-M004`` unknown schema version,
            ``CK-M003`` schema violation, ``CK-M007`` manifest digest mismatch.
        UnsafeInputError: ``CK-M005`` path escaping the directory, ``CK-M006`` absurd
            or incoherent sizes/shapes.

    Example:
        >>> parse("[")
        Traceback (most recent call last):
        ...
        ckptkit.errors.ManifestError: CK-M002 manifest.json: not valid JSON ...
    """
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ManifestError(
            f"not valid JSON ({_short(e)})",
            path=path,
            code="CK-M002",
            hint="the manifest is damaged; this checkpoint cannot be trusted; roll back to the "
            "previous verified checkpoint ('ckptkit ls RUN')",
        ) from None
    if not isinstance(obj, dict):
        raise ManifestError(
            "not a JSON object",
            path=path,
            code="CK-M003",
            hint="the manifest is damaged; roll back to the previous verified checkpoint",
        )
    version = obj.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        raise ManifestError(
            f"unknown schema_version {version!r} (this ckptkit {__version__} reads "
            f"{SCHEMA_VERSION})",
            path=path,
            code="CK-M004",
            hint="upgrade ckptkit to read this checkpoint"
            if newer
            else "the manifest is damaged or not a ckptkit manifest; roll back",
        )
    errs = sorted(_validator().iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errs:
        e0 = errs[0]
        where = "/".join(str(p) for p in e0.absolute_path) or "<root>"
        code, cls = _classify_schema_error(e0)
        raise cls(
            f"fails the manifest schema at '{where}': {_short(e0.message)}"
            + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""),
            path=path,
            code=code,
            hint="the manifest is damaged or hand-edited; roll back to the previous verified "
            "checkpoint"
            if code == "CK-M003"
            else "do not load this checkpoint: its manifest points outside the checkpoint or "
            "declares absurd sizes; it may be hostile",
        )
    if content_digest(obj) != obj["manifest_digest"]:
        raise ManifestError(
            "manifest digest mismatch (the manifest changed after it was written)",
            path=path,
            code="CK-M007",
            hint="the manifest was edited or damaged; roll back to the previous verified "
            "checkpoint",
        )
    check_semantics(obj, path=path)
    return dict(obj)


def _short(x: object, n: int = 160) -> str:
    s = str(x)
    return s if len(s) <= n else s[: n - 1] + "…"


def _classify_schema_error(e: jsonschema.ValidationError) -> tuple[str, type[ManifestError]]:
    # Path patterns and size maxima are the safety rails: report them as unsafe input.
    last = e.absolute_path[-1] if e.absolute_path else None
    if e.validator == "pattern" and last in ("path", "file"):
        return "CK-M005", UnsafeInputError
    if e.validator in ("maximum", "maxItems", "maxLength") and last is not None:
        return "CK-M006", UnsafeInputError
    return "CK-M003", ManifestError


def check_semantics(obj: Mapping[str, Any], *, path: str = MANIFEST_NAME) -> None:
    """Check what the schema cannot: unique paths, coherent tensor sizes, sane totals.

    Raises:
        UnsafeInputError: ``CK-M005`` / ``CK-M006``.
        ManifestError: ``CK-M003`` duplicates or dangling references.
    """
    files: dict[str, Mapping[str, Any]] = {}
    for f in obj["files"]:
        p = f["path"]
        if PurePosixPath(p).is_absolute() or ".." in PurePosixPath(p).parts or p == MANIFEST_NAME:
            raise UnsafeInputError(
                f"file path {p!r} escapes the checkpoint directory",
                path=path,
                code="CK-M005",
                hint="do not load this checkpoint; its manifest may be hostile",
            )
        if p in files:
            raise ManifestError(
                f"file {p!r} listed twice", path=path, code="CK-M003", hint="roll back"
            )
        if f.get("compression") and "raw_size" not in f:
            raise ManifestError(
                f"compressed file {p!r} has no raw_size",
                path=path,
                code="CK-M003",
                hint="roll back to the previous verified checkpoint",
            )
        files[p] = f
    keys: set[str] = set()
    per_file: dict[str, int] = {}
    for t in obj["tensors"]:
        key, fp = t["key"], t["file"]
        if key in keys:
            raise ManifestError(f"tensor {key!r} listed twice", path=path, code="CK-M003", hint="roll back")
        keys.add(key)
        if fp not in files:
            raise ManifestError(
                f"tensor {key!r} lives in {fp!r}, which the manifest does not list",
                path=path,
                code="CK-M003",
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
                code="CK-M006",
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
                code="CK-M006",
                hint="do not load this checkpoint; its manifest declares absurd sizes",
            )


_ITEMSIZE = {name: (dt.itemsize if hasattr(dt, "itemsize") else 1) for name, dt in DTYPES.items()}


def read(ckpt_dir: Path | str) -> Manifest:
    """Read and validate ``ckpt_dir/manifest.json``.

    Raises:
        IncompleteCheckpointError: ``CK-M001`` no manifest: an incomplete save.
        ManifestError / UnsafeInputError: see :func:`parse`.

    Example:
        >>> read("/nonexistent")
        Traceback (most recent call last):
        ...
        ckptkit.errors.IncompleteCheckpointError: CK-M001 /nonexistent/manifest.json: ...
    """
    p = Path(ckpt_dir) / MANIFEST_NAME
    try:
        fd = os.open(p, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        raise IncompleteCheckpointError(
            "no manifest: this is not a committed checkpoint (an interrupted save, or the "
            "wrong directory)",
            path=p,
            code="CK-M001",
            hint="point at a step directory that holds manifest.json, or roll back with "
            "'ckptkit ls RUN'",
        ) from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_MANIFEST_BYTES:
            raise UnsafeInputError(
                f"manifest is {size} bytes (limit {MAX_MANIFEST_BYTES})",
                path=p,
                code="CK-M006",
                hint="do not load this checkpoint; its manifest is absurdly large",
            )
        text = f.read()
    return Manifest.from_json(text, path=str(p))


def write(ckpt_dir: Path, manifest: Manifest, *, fsync: bool = True) -> FileEntry:
    """Write ``manifest.json`` into ``ckpt_dir`` (the last file of a save) and fsync it."""
    text = manifest.to_json().encode()
    p = ckpt_dir / MANIFEST_NAME
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(text)
        while mv:
            mv = mv[os.write(fd, mv) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return FileEntry(MANIFEST_NAME, len(text), digest.hexdigest_bytes(text))
