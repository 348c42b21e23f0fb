"""The checks every manifest document passes over its bytes in memory: strict JSON, the JSON
Schema, nesting, the path rule, its own digest and its signature.

One set of checks for the root manifest (:mod:`ckptkit.format.manifest`) and for each
rank's manifest (:mod:`ckptkit.format.ranks`), with the canonical JSON that the digest and
the signature cover. Like the rest of the format layer it opens no file: the bytes are
already in memory.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import PurePosixPath
from typing import Any

import jsonschema_rs

from ckptkit import codes
from ckptkit.errors import ManifestError, SignatureError, UnsafeInputError
from ckptkit.format import digest, signing, tree
from ckptkit.format.signing import Signature

_FREE_FORM = ("tree", "env", "lookahead", "health", "user", "recoveries")
"""Top-level fields the schema leaves free-form: their nesting is bounded by
:data:`ckptkit.format.tree.MAX_NESTING` (as are component summaries), checked before
anything recursive (the digest, the tree decoder) runs."""


@cache
def schema(name: str = "manifest.schema.json") -> dict[str, Any]:
    """Return a packaged JSON schema (a byte-identical copy of top-level ``schemas/``).

    Example:
        >>> schema()["properties"]["schema_version"]["enum"]
        [1, 2]
    """
    text = resources.files("ckptkit").joinpath("_schemas", name).read_text("utf-8")
    return dict(json.loads(text))


@cache
def _validator() -> jsonschema_rs.Draft202012Validator:
    # jsonschema-rs: ~100x faster than the pure-Python jsonschema on large manifests.
    # Formats stay annotations (as 2020-12 says by default and as jsonschema did).
    return jsonschema_rs.Draft202012Validator(schema(), validate_formats=False)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def path_problem(p: str) -> str | None:
    """Why ``p`` may not name a file of a checkpoint, or None: the one path rule of every
    manifest, native and adopted (the native schema's pattern is narrower still).

    A path is not empty, relative, stays inside the checkpoint (no ``..`` part) and holds
    no NUL or other control character (the OS refuses a NUL with ``ValueError``; a
    newline forges lines in a listing).

    Example:
        >>> path_problem("dcp/__0_0.distcp") is None, path_problem("a" + chr(0) + "b")
        (True, 'holds the control character U+0000')
        >>> path_problem("../x"), path_problem("/x")
        ('escapes the checkpoint', 'escapes the checkpoint')
    """
    bad = _CONTROL.search(p)
    if bad is not None:
        return f"holds the control character U+{ord(bad.group()):04X}"
    pp = PurePosixPath(p)
    if not p or pp.is_absolute() or ".." in pp.parts:
        return "escapes the checkpoint"
    return None


def check_listing(paths: Iterable[str], *, path: str) -> None:
    """Check the file paths a manifest lists: each by :func:`path_problem`, none twice.

    Raises:
        UnsafeInputError: ``CK-M005`` a path breaks the path rule.
        ManifestError: ``CK-M003`` a path is listed twice.
    """
    seen: set[str] = set()
    for p in paths:
        why = path_problem(p)
        if why is not None:
            raise UnsafeInputError(
                f"file path {p!r} {why}", path=path, code=codes.M005, hint=UNSAFE_HINT
            )
        if p in seen:
            raise ManifestError(
                f"file {p!r} listed twice: which entry a reader would check is not for a "
                "dict build to decide",
                path=path,
                code=codes.M003,
                hint="the manifest was damaged or hand-edited; " + codes.ROLLBACK,
            )
        seen.add(p)


def canonical(obj: Mapping[str, Any]) -> bytes:
    """Return the canonical JSON of a manifest's content: what its digest and signature cover.

    Every field but ``manifest_digest`` and ``signature``, keys sorted, no whitespace,
    ASCII. The file digests are in it, so the signature covers every file's bytes.

    Example:
        >>> canonical({"b": 1, "a": [1.5], "manifest_digest": "x", "signature": {}})
        b'{"a":[1.5],"b":1}'
    """
    body = {k: v for k, v in obj.items() if k not in _NOT_CONTENT}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


_NOT_CONTENT = frozenset({"manifest_digest", "signature"})


M002_HINT = (
    "the manifest is damaged or was not written by ckptkit; this checkpoint cannot be "
    "trusted; roll back to the previous verified checkpoint ('ckptkit ls RUN')"
)
"""The hint of a manifest that is not strict JSON or not ckptkit's (``CK-M002``)."""
UNSAFE_HINT = (
    "do not load this checkpoint: its manifest points outside the checkpoint or declares "
    "absurd sizes; it may be hostile"
)
"""The hint of a manifest that is unsafe to act on (``CK-M005``, ``CK-M006``)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {_short(text, 40)} is out of range (it reads as {v})")
    return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(
                    f"duplicate key {_short(k, 60)!r} in one object (readers disagree on "
                    "which value counts)"
                )
            seen.add(k)
    return d


def strict_json(text: str | bytes, path: str) -> Any:
    """Parse strict JSON: UTF-8 without BOM, no duplicate keys, finite numbers only."""

    def bad(why: str) -> ManifestError:
        return ManifestError(f"not valid JSON ({why})", path=path, code=codes.M002, hint=M002_HINT)

    if isinstance(text, str):
        s = text
    else:
        try:
            s = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad(f"not UTF-8: byte {e.start} is {bytes(text)[e.start:e.start + 1]!r}") from None
    if s.startswith("\ufeff"):
        raise bad("starts with a byte-order mark; manifests are UTF-8 without one")
    if "\x00" in s:  # never in JSON text; UTF-16/32 without a BOM decodes to ASCII + NULs
        raise bad("contains NUL characters: UTF-16 or UTF-32 text, not UTF-8")
    try:
        return json.loads(
            s,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    except RecursionError:
        raise bad("nested too deeply") from None
    except ValueError as e:
        raise bad(_short(e)) from None


def check_digest(obj: Mapping[str, Any], path: str, key: bytes | None) -> None:
    """A manifest's (root or rank) own digest, then its signature when ``key`` is given."""
    canon = canonical(obj)
    if digest.hexdigest_bytes(canon) != obj["manifest_digest"]:
        raise ManifestError(
            "manifest digest mismatch (the manifest changed after it was written)",
            path=path,
            code=codes.M007,
            hint="the manifest was edited or damaged; roll back to the previous verified "
            "checkpoint",
        )
    if key is not None:
        _check_signature(obj, canon, key, path)


def check_schema(
    obj: Any, path: str, v: jsonschema_rs.Draft202012Validator | None = None
) -> None:
    """Validate ``obj`` against the manifest schema (``v``: a rank manifest's validator)."""
    v = v or _validator()
    what = "rank manifest" if v is not _validator() else "manifest"
    try:
        if v.is_valid(obj):
            return
        errs = list(v.iter_errors(obj))
    except ValueError as e:  # jsonschema-rs stops at its own recursion limit
        raise UnsafeInputError(
            f"nested too deeply to validate ({_short(e)})",
            path=path,
            code=codes.M006,
            hint=UNSAFE_HINT,
        ) from None
    errs.sort(key=lambda e: [str(p) for p in e.instance_path])
    e0 = errs[0]
    where = "/".join(str(p) for p in e0.instance_path) or "<root>"
    code, cls = _classify_schema_error(e0)
    raise cls(
        f"fails the {what} schema at '{where}': {_short(e0.message)}"
        + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""),
        path=path,
        code=code,
        hint="the manifest is damaged or hand-edited; roll back to the previous verified "
        "checkpoint"
        if code == codes.M003
        else UNSAFE_HINT,
    )


def too_deep(obj: Mapping[str, Any]) -> str | None:
    """Name the first free-form part nesting deeper than tree.MAX_NESTING, or None."""
    for k in _FREE_FORM:
        if k in obj and tree.nesting_exceeds(obj[k], tree.MAX_NESTING):
            return k
    comps = obj.get("components")
    if isinstance(comps, Mapping):
        for name, c in comps.items():
            if isinstance(c, Mapping) and tree.nesting_exceeds(c.get("summary"), tree.MAX_NESTING):
                return f"components/{name}/summary"
    return None


def nesting_error(where: str, limit: int, path: str) -> UnsafeInputError:
    """The ``CK-M006`` refusal of a manifest whose part ``where`` nests deeper than ``limit``
    levels (:func:`too_deep`, and a rank manifest's per-rank parts).

    Example:
        >>> print(nesting_error("user", 64, "step-1/manifest.json"))
        CK-M006 step-1/manifest.json: 'user' nests deeper than 64 levels...
    """
    return UnsafeInputError(
        f"'{where}' nests deeper than {limit} levels", path=path, code=codes.M006, hint=UNSAFE_HINT
    )


def _check_signature(obj: Mapping[str, Any], canon: bytes, key: bytes, path: str) -> None:
    raw = obj.get("signature")
    why = signing.check(canon, Signature.from_dict(raw) if raw is not None else None, key)
    if why is None:
        return
    if why == "unsigned":
        raise SignatureError(
            "the manifest is not signed, and a key was given: its origin cannot be proven",
            path=path,
            code=codes.M010,
            hint="if you wrote it without a key, sign it again from a trusted copy; "
            "otherwise do not load it (anyone who can write the directory could have "
            "written it)",
        )
    raise SignatureError(
        why,
        path=path,
        code=codes.M011,
        hint="do not load this checkpoint unless you know why: it was written with another "
        "key or altered after signing; check which key signed it (its key id) or roll back "
        "to the previous verified checkpoint",
    )


def _short(x: object, n: int = 160) -> str:
    s = str(x)
    return s if len(s) <= n else s[: n - 1] + "…"


def _classify_schema_error(e: jsonschema_rs.ValidationError) -> tuple[str, type[ManifestError]]:
    # Path patterns and size maxima are the safety rails: report them as unsafe input.
    path = list(e.instance_path)
    last = path[-1] if path else None
    keyword = e.kind.name
    if keyword == "pattern" and last in ("path", "file"):
        return codes.M005, UnsafeInputError
    if keyword in ("maximum", "maxItems", "maxLength") and last is not None:
        return codes.M006, UnsafeInputError
    return codes.M003, ManifestError


