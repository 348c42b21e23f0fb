"""Integrity family: the manifest, and every byte it lists (spec §4)."""

from __future__ import annotations

from collections.abc import Iterator

from ckptkit import codes
from ckptkit.codes import UNREADABLE
from ckptkit.errors import CkptkitError
from ckptkit.storage import atomic, dcp_items, dcp_meta, fs
from ckptkit.verify.checks import _state as st
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, ERROR, Finding, check

# --- manifest ------------------------------------------------------------------------------
# The manifest is read once by the runner; each of these reports one way it can fail.

_MANIFEST_CODES = tuple(
    c for c in CODES if c.startswith("CK-M") and CODES[c].severity is ERROR
)
"""Manifest codes raised by the manifest reader (``CK-M012`` is a note, made below)."""


def _manifest_check(code: str) -> None:
    @check(code, needs=())
    def _fn(ctx: CheckContext) -> Iterator[Finding]:
        e = ctx.manifest_error
        if e is not None and e.code == code:
            yield CODES[code].finding(e.what, path=atomic.MANIFEST_NAME, hint=e.hint)

    _fn.__name__ = f"manifest_{code[-3:]}"


for _code in _MANIFEST_CODES:
    _manifest_check(_code)


@check(codes.M012)
def signature_unchecked(ctx: CheckContext) -> Iterator[Finding]:
    sig = ctx.manifest.signature if ctx.manifest is not None else None
    if sig is not None and not ctx.signature_checked:
        yield CODES[codes.M012].finding(
            f"the manifest is signed (key id {sig.key_id}) but no key was given: its digests "
            "were checked, its origin was not",
            path=atomic.MANIFEST_NAME,
        )


# --- files ---------------------------------------------------------------------------------


@check(codes.F001, needs=("files",))
def file_missing(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if not s.exists:
            who = f" (written by rank {s.entry.rank})" if s.entry.rank is not None else ""
            yield s.finding(codes.F001, f"file listed in the manifest is missing{who}")


@check(codes.F002, needs=("files",))
def file_size(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.exists and s.size is not None and s.size != s.entry.size:
            how = "truncated" if s.size < s.entry.size else "grown"
            yield s.finding(
                codes.F002, f"size is {s.size} bytes, the manifest records {s.entry.size} ({how})"
            )


@check(codes.F003, needs=("files",))
def file_digest(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.digest is not None and s.size == s.entry.size and s.digest != s.entry.xxh3_128:
            yield s.finding(
                codes.F003,
                f"digest mismatch (expected {s.entry.xxh3_128[:12]}…, got {s.digest[:12]}…)",
            )


@check(codes.F004)
def file_header(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.header_error is not None and s.header_error_code != codes.F008:
            yield s.finding(codes.F004, s.header_error)
        if s.io_error is not None and s.io_error_code != UNREADABLE:
            yield s.finding(
                codes.F004, s.io_error, hint="check permissions and the disk, then verify again"
            )


@check(UNREADABLE, needs=())
def unreadable_now(ctx: CheckContext) -> Iterator[Finding]:
    """A read that failed for a reason that is not damage (:func:`ckptkit.codes.transient`)."""
    e = ctx.manifest_error
    if e is not None and e.code == UNREADABLE:
        yield CODES[UNREADABLE].finding(e.what, path=atomic.MANIFEST_NAME)
    if "files" not in ctx.has:
        return
    for s in ctx.scan_all().values():
        if s.io_error is not None and s.io_error_code == UNREADABLE:
            yield s.finding(UNREADABLE, s.io_error)


@check(codes.F005)
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
            yield CODES[codes.F005].finding(
                f"tensor '{te.key}' is missing from the file header", path=te.file
            )
        elif got != te.header_entry():
            yield CODES[codes.F005].finding(
                f"tensor '{te.key}' is {got.dtype}{list(got.shape)} at {list(got.offsets)} in "
                f"the file but {te.dtype}{list(te.shape)} at {list(te.offsets)} in the manifest",
                path=te.file,
            )
    for path, s in scans.items():
        if s.header is not None:
            extra = sorted(set(s.header) - listed.get(path, set()))
            if extra:
                yield CODES[codes.F005].finding(
                    f"file header holds {len(extra)} tensor(s) the manifest does not list "
                    f"(e.g. '{extra[0]}')",
                    path=path,
                )


@check(codes.F006)
def unlisted_files(ctx: CheckContext) -> Iterator[Finding]:
    assert ctx.manifest is not None
    man = ctx.manifest
    listed = {f.path for f in man.files} | {atomic.MANIFEST_NAME} | {r.path for r in man.ranks}
    for rel in fs.walk_entries(ctx.root):
        if rel not in listed:
            yield CODES[codes.F006].finding("file is not listed in the manifest", path=rel)


@check(codes.F007, needs=())
def leftover_tmp(ctx: CheckContext) -> Iterator[Finding]:
    # Leftovers of *this* checkpoint's saves sit beside it; inside, none should exist.
    for p in atomic.unfinished_saves(ctx.root):
        yield CODES[codes.F007].finding("temporary directory of an unfinished save", path=str(p))


@check(codes.F008)
def decompression(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.header_error is not None and s.header_error_code == codes.F008:
            yield CODES[codes.F008].finding(s.header_error, path=s.entry.path)


@check(codes.F009, needs=("files",))
def outside(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.outside:
            yield CODES[codes.F009].finding(
                "file is a symlink or resolves outside the checkpoint directory",
                path=s.entry.path,
            )


# --- DCP storage ---------------------------------------------------------------------------
# What the DCP reader refuses, verify refuses: both ask dcp_items.coverage, once per checkpoint
# here, and each check below reports the problems of its own code.


def _dcp_problems(ctx: CheckContext) -> list[CkptkitError]:
    return ctx.memo("dcp.coverage", lambda: _dcp_coverage(ctx))  # type: ignore[no-any-return]


def _dcp_coverage(ctx: CheckContext) -> list[CkptkitError]:
    """What a DCP load of this checkpoint would refuse (nothing when it has no DCP files).

    Only proven bytes are parsed: ``.metadata`` and each non-tensor item are read only
    when the file scan found their file's digest matching the manifest.
    """
    m = ctx.manifest
    assert m is not None
    scans = ctx.scan_all()
    scan = scans.get(dcp_meta.METADATA_REL)
    if scan is None or scan.digest != scan.entry.xxh3_128:
        return []  # unlisted (CK-F021 below) or damaged (file findings): never parsed
    md = st.dcp_metadata(ctx)
    if isinstance(md, CkptkitError):
        return [md]

    def proven_bytes(it: dcp_items.Item) -> bytes | None:
        s = scans.get(it.rel)
        if s is None or s.digest is None or s.digest != s.entry.xxh3_128:
            return None
        try:
            return dcp_items.read_item(ctx.root, it)
        except OSError:
            return None  # read a moment ago; the load re-checks these bytes anyway
        except CkptkitError:
            return None  # swapped since the scan: the load refuses it with this finding

    return dcp_items.coverage(md, dcp_meta.entries(m), item_bytes=proven_bytes)


def _dcp_findings(ctx: CheckContext, code: str) -> Iterator[Finding]:
    for e in _dcp_problems(ctx):
        if e.code == code:
            yield CODES[code].finding(
                e.what, path=str(e.path) if e.path is not None else dcp_meta.METADATA_REL
            )


@check(codes.F021)
def dcp_metadata_listed(ctx: CheckContext) -> Iterator[Finding]:
    """Every DCP file a load reads is listed: the metadata, and each shard it names."""
    m = ctx.manifest
    assert m is not None
    claims = isinstance(m.tree, dict) and isinstance(m.tree.get("dcp"), dict)
    if claims and m.file(dcp_meta.METADATA_REL) is None:
        yield CODES[codes.F021].finding(
            "the state tree says model/optimizer are stored with DCP, but "
            f"{dcp_meta.METADATA_REL} is not listed: a load would have to read an "
            "unlisted file, and refuses to",
            path=dcp_meta.METADATA_REL,
        )
    yield from _dcp_findings(ctx, codes.F021)


_DCP_CHECKS = (
    (codes.F023, "dcp_metadata_safe",
     "The DCP metadata and its non-tensor items unpickle without any other global."),
    (codes.F105, "dcp_items_stored", "Every item of the DCP state dict has a storage entry."),
    (codes.F106, "dcp_items_inside", "Every DCP item's byte range lies inside its shard."),
    (codes.F026, "dcp_chunks_fit",
     "Every DCP tensor chunk lies inside its tensor, and its storage entry holds its bytes."),
    (codes.F027, "dcp_metadata_bounded", "The DCP metadata declares no more chunks than its size allows."),
    (codes.F108, "dcp_readable",
     "The DCP metadata and its non-tensor items parse (damage, unexpected structure)."),
)
"""The checks of the codes the one reading of the DCP metadata reports (code, name, what
the check holds), in registration (and run) order."""


def _dcp_check(code: str, name: str, doc: str) -> None:
    @check(code)
    def _fn(ctx: CheckContext) -> Iterator[Finding]:
        yield from _dcp_findings(ctx, code)

    _fn.__name__ = name
    _fn.__doc__ = doc


for _code, _name, _doc in _DCP_CHECKS:
    _dcp_check(_code, _name, _doc)


@check(codes.F022, needs=("files",))
def not_regular(ctx: CheckContext) -> Iterator[Finding]:
    for s in ctx.scan_all().values():
        if s.not_regular is not None:
            yield s.finding(codes.F022, f"is {s.not_regular}, not a regular file; it was not opened")
