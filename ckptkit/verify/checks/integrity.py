"""Integrity family: the manifest, and every byte it lists (spec §4)."""

from __future__ import annotations

from collections.abc import Iterator

from ckptkit.errors import IncompleteCheckpointError, SignatureError, UnsafeInputError
from ckptkit.storage import atomic
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, ERROR, INFO, WARNING, Finding, check

ROLLBACK = "roll back to the previous verified checkpoint ('ckptkit ls RUN' lists them)"

# --- manifest ------------------------------------------------------------------------------
# The manifest is read once by the runner; each of these reports one way it can fail.

_MANIFEST_CODES = {
    "CK-M001": (
        "manifest missing: incomplete checkpoint",
        "the save was interrupted before its commit marker; " + ROLLBACK,
        IncompleteCheckpointError,
    ),
    "CK-M002": ("manifest is not valid JSON", "the manifest is damaged; " + ROLLBACK, None),
    "CK-M003": (
        "manifest fails its schema",
        "the manifest was damaged or hand-edited; " + ROLLBACK,
        None,
    ),
    "CK-M004": (
        "unknown manifest schema_version",
        "upgrade ckptkit if the checkpoint is newer; otherwise " + ROLLBACK,
        None,
    ),
    "CK-M005": (
        "manifest path escapes the checkpoint directory",
        "do not load this checkpoint: its manifest may be hostile",
        UnsafeInputError,
    ),
    "CK-M006": (
        "absurd or incoherent sizes or shapes in the manifest",
        "do not load this checkpoint: its manifest is incoherent or hostile",
        UnsafeInputError,
    ),
    "CK-M007": (
        "manifest digest mismatch",
        "the manifest changed after it was written; " + ROLLBACK,
        None,
    ),
    "CK-M008": (
        "manifest is not a readable regular file",
        "a manifest is a regular file inside the checkpoint (not a symlink, FIFO, directory "
        "or device); replace it with the real one or " + ROLLBACK,
        UnsafeInputError,
    ),
    "CK-M009": (
        "state tree cannot be rebuilt",
        "load would refuse it: the manifest was damaged, edited or written by a newer "
        "ckptkit; upgrade ckptkit or " + ROLLBACK,
        None,
    ),
    "CK-M010": (
        "manifest unsigned but a key was given",
        "its origin cannot be proven; do not load it unless you wrote it without a key",
        SignatureError,
    ),
    "CK-M011": (
        "manifest signature does not match the key",
        "signed with another key or altered after signing; do not load it unless you know "
        "why, or " + ROLLBACK,
        SignatureError,
    ),
}


def _manifest_check(code: str) -> None:
    title, hint, err = _MANIFEST_CODES[code]

    @check(
        code, family="integrity", severity=ERROR, title=title, hint=hint, needs=(), error_class=err
    )
    def _fn(ctx: CheckContext) -> Iterator[Finding]:
        e = ctx.manifest_error
        if e is not None and e.code == code:
            yield CODES[code].finding(e.what, path=atomic.MANIFEST_NAME, hint=e.hint)

    _fn.__name__ = f"manifest_{code[-3:]}"


for _code in _MANIFEST_CODES:
    _manifest_check(_code)


@check(
    "CK-M012",
    family="integrity",
    severity=INFO,
    title="signature not checked",
    hint="pass the key (key=, --key-file or CKPTKIT_HMAC_KEY) to check who wrote it",
)
def signature_unchecked(ctx: CheckContext) -> Iterator[Finding]:
    sig = ctx.manifest.signature if ctx.manifest is not None else None
    if sig is not None and not ctx.signature_checked:
        yield CODES["CK-M012"].finding(
            f"the manifest is signed (key id {sig.key_id}) but no key was given: its digests "
            "were checked, its origin was not",
            path=atomic.MANIFEST_NAME,
        )


# --- files ---------------------------------------------------------------------------------


@check(
    "CK-F001",
    family="integrity",
    severity=ERROR,
    title="listed file missing",
    hint="restore the file from a replica or " + ROLLBACK,
    error_class=IncompleteCheckpointError,
)
def file_missing(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if not s.exists:
            who = f" (written by rank {s.entry.rank})" if s.entry.rank is not None else ""
            yield CODES["CK-F001"].finding(
                f"file listed in the manifest is missing{who}",
                path=s.entry.path,
                component=s.entry.component or "checkpoint",
            )


@check(
    "CK-F002",
    family="integrity",
    severity=ERROR,
    title="file size mismatch",
    hint="the file was truncated or rewritten; restore it or " + ROLLBACK,
)
def file_size(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.exists and s.size is not None and s.size != s.entry.size:
            how = "truncated" if s.size < s.entry.size else "grown"
            yield CODES["CK-F002"].finding(
                f"size is {s.size} bytes, the manifest records {s.entry.size} ({how})",
                path=s.entry.path,
                component=s.entry.component or "checkpoint",
            )


@check(
    "CK-F003",
    family="integrity",
    severity=ERROR,
    title="file digest mismatch",
    hint="the bytes changed after the save (bit flip, partial overwrite); restore the file "
    "from a replica or " + ROLLBACK,
)
def file_digest(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.digest is not None and s.size == s.entry.size and s.digest != s.entry.xxh3_128:
            yield CODES["CK-F003"].finding(
                f"digest mismatch (expected {s.entry.xxh3_128[:12]}…, got {s.digest[:12]}…)",
                path=s.entry.path,
                component=s.entry.component or "checkpoint",
            )


@check(
    "CK-F004",
    family="integrity",
    severity=ERROR,
    title="safetensors header invalid",
    hint="the file is damaged or not a safetensors file; restore it or " + ROLLBACK,
)
def file_header(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.header_error is not None and s.header_error_code != "CK-F008":
            yield CODES["CK-F004"].finding(
                s.header_error, path=s.entry.path, component=s.entry.component or "checkpoint"
            )
        if s.io_error is not None:
            yield CODES["CK-F004"].finding(
                f"cannot be read: {s.io_error}",
                path=s.entry.path,
                component=s.entry.component or "checkpoint",
                hint="check permissions and the disk, then verify again",
            )


@check(
    "CK-F005",
    family="integrity",
    severity=ERROR,
    title="tensor disagrees with file header",
    hint="the file and manifest disagree (file replaced or manifest edited); " + ROLLBACK,
)
def tensor_layout(ctx: CheckContext) -> Iterator[Finding]:
    assert ctx.manifest is not None
    scans = ctx.scan_all()
    listed: dict[str, set[str]] = {}
    for te in ctx.manifest.tensors:
        listed.setdefault(te.file, set()).add(te.key)
        s = scans.get(te.file)
        if s is None or s.header is None:
            continue
        got = s.header.get(te.key)
        if got is None:
            yield CODES["CK-F005"].finding(
                f"tensor '{te.key}' is missing from the file header", path=te.file
            )
        elif got != te.header_entry():
            yield CODES["CK-F005"].finding(
                f"tensor '{te.key}' is {got.dtype}{list(got.shape)} at {list(got.offsets)} in "
                f"the file but {te.dtype}{list(te.shape)} at {list(te.offsets)} in the manifest",
                path=te.file,
            )
    for path, s in scans.items():
        if s.header is not None:
            extra = sorted(set(s.header) - listed.get(path, set()))
            if extra:
                yield CODES["CK-F005"].finding(
                    f"file header holds {len(extra)} tensor(s) the manifest does not list "
                    f"(e.g. '{extra[0]}')",
                    path=path,
                )


@check(
    "CK-F006",
    family="integrity",
    severity=WARNING,
    title="unlisted file in checkpoint",
    hint="a file not covered by the manifest is not protected by digests and is never "
    "loaded; remove it or move it out of the checkpoint directory",
)
def unlisted_files(ctx: CheckContext) -> Iterator[Finding]:
    assert ctx.manifest is not None
    listed = {f.path for f in ctx.manifest.files} | {atomic.MANIFEST_NAME}
    for p in sorted(ctx.root.rglob("*")):
        rel = ctx.rel(p)
        if p.is_dir() and not p.is_symlink():
            continue
        if rel not in listed:
            yield CODES["CK-F006"].finding("file is not listed in the manifest", path=rel)


@check(
    "CK-F007",
    family="integrity",
    severity=WARNING,
    title="leftover temporary directory",
    hint="an interrupted save left it; it is never loaded; delete it, or let "
    "CheckpointManager clean it on open",
    needs=(),
)
def leftover_tmp(ctx: CheckContext) -> Iterator[Finding]:
    # Leftovers of *this* checkpoint's saves sit beside it; inside, none should exist.
    name = ctx.root.name
    candidates = [p for p in atomic.leftovers(ctx.root.parent) if p.name.startswith(name + ".")]
    if ctx.root.is_dir():
        candidates += [p for p in ctx.root.rglob("*") if p.is_dir() and atomic.is_temporary(p)]
    for p in candidates:
        yield CODES["CK-F007"].finding("temporary directory of an unfinished save", path=str(p))


@check(
    "CK-F008",
    family="integrity",
    severity=ERROR,
    title="compressed file will not decompress",
    hint="the compressed file is damaged or a decompression bomb; restore it or " + ROLLBACK,
    error_class=UnsafeInputError,
)
def decompression(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.header_error is not None and s.header_error_code == "CK-F008":
            yield CODES["CK-F008"].finding(s.header_error, path=s.entry.path)


@check(
    "CK-F009",
    family="integrity",
    severity=ERROR,
    title="listed file resolves outside",
    hint="a listed file is a symlink or resolves outside the checkpoint directory; it is "
    "never read; replace it with the real file",
    error_class=UnsafeInputError,
)
def outside(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.outside:
            yield CODES["CK-F009"].finding(
                "file is a symlink or resolves outside the checkpoint directory",
                path=s.entry.path,
            )


@check(
    "CK-F010",
    family="integrity",
    severity=ERROR,
    title="listed file is not a regular file",
    hint="a FIFO, directory or device sits where the manifest lists a file; it is never "
    "opened; replace it with the real file or " + ROLLBACK,
    error_class=UnsafeInputError,
)
def not_regular(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.not_regular is not None:
            yield CODES["CK-F010"].finding(
                f"is {s.not_regular}, not a regular file; it was not opened",
                path=s.entry.path,
                component=s.entry.component or "checkpoint",
            )
