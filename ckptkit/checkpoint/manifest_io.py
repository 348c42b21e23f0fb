"""Read ``manifest.json`` from a checkpoint's location, and write it there.

A multi-rank checkpoint's root lists one manifest per rank (``ranks/rank-NNNNN.json``):
:func:`read` reads those too, through the same checks, and returns one manifest with every
entry, or (``only=``) with the entries of the ranks a reader needs (a restoring rank);
:func:`write_rank` is what each rank writes.

The manifest's format (dataclasses, canonical JSON, schema, signature) is
:mod:`ckptkit.format.manifest`, which touches no file; this module moves its bytes through the
one filesystem interface (:mod:`ckptkit.storage.fs`), local directory or object-store
prefix alike, and turns what can go wrong on the way into the manifest's finding codes:
nothing there (``CK-M001``), not a regular file (``CK-M008``), absurdly large
(``CK-M006``), unreadable now (``CK-F025``, or ``CK-M008`` when that is damage).
"""

from __future__ import annotations

from collections import Counter

from ckptkit import codes
from ckptkit.errors import CkptkitError, IncompleteCheckpointError, UnsafeInputError
from ckptkit.format import digest
from ckptkit.format.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    RankSelect,
)
from ckptkit.format.ranks import RankFetch, RankManifest, RankRef
from ckptkit.storage import fs
from ckptkit.storage.fs import Location

rank_reads: Counter[int] = Counter()
"""Rank manifests this process has read, by rank: which ones a restore read, for the
tests and benchmarks that show it (counted only; nothing reads it back)."""

_NOT_REGULAR_HINT = (
    "a manifest is a regular file inside the checkpoint; replace it with the real one or "
    "roll back to the previous verified checkpoint ('ckptkit ls RUN')"
)


def read(
    ckpt_dir: Location | str, *, key: bytes | None = None, only: RankSelect | None = None
) -> Manifest:
    """Read and validate ``ckpt_dir/manifest.json`` (once: pass the result on, do not re-read).

    Args:
        ckpt_dir: the checkpoint directory (or object-store prefix).
        key: an HMAC key the manifest must be signed with (already resolved: see
            :func:`ckptkit.format.signing.resolve_key`); None checks no signature.
        only: of a multi-rank root, which ranks' manifests to read (given the validated
            root); the manifest returned holds their entries only
            (:attr:`~ckptkit.format.manifest.Manifest.read_ranks`). None: every rank's.

    Raises:
        IncompleteCheckpointError: ``CK-M001`` no manifest: an incomplete save.
        UnsafeInputError: ``CK-M008`` the manifest is a symlink, FIFO, directory or device;
            ``CK-M006`` it is larger than :data:`ckptkit.format.manifest.MAX_MANIFEST_BYTES`.
        ManifestError / UnsafeInputError / SignatureError: see :func:`ckptkit.format.manifest.parse`.

    Example:
        >>> read("/nonexistent")
        Traceback (most recent call last):
        ...
        ckptkit.errors.IncompleteCheckpointError: CK-M001 /nonexistent/manifest.json: ...
    """
    return read_path(fs.location(ckpt_dir) / MANIFEST_NAME, key=key, only=only)


def read_path(
    p: Location | str, *, key: bytes | None = None, only: RankSelect | None = None
) -> Manifest:
    """Read and validate a manifest file at ``p`` (any name: adopted manifests too).

    Only a regular file is opened, never following a symlink and never blocking (a FIFO
    named like a manifest is refused, not waited on). On an object store it is one GET.

    Raises:
        As :func:`read`.
    """
    loc = fs.location(p)
    where = fs.url(loc)
    try:
        text = fs.read_small(loc, MAX_MANIFEST_BYTES, code=codes.M008, hint=_NOT_REGULAR_HINT)
    except CkptkitError:
        raise
    except (FileNotFoundError, NotADirectoryError):
        raise IncompleteCheckpointError(
            "no manifest: this is not a committed checkpoint (an interrupted save, or the "
            "wrong directory)",
            path=where,
            code=codes.M001,
            hint="point at a step directory that holds manifest.json, or roll back with "
            "'ckptkit ls RUN'",
        ) from None
    except Exception as e:  # s3fs lets some transport errors through unconverted
        if not isinstance(e, OSError) and not codes.transient(e):
            raise
        raise _unreadable(e, where) from None
    if len(text) > MAX_MANIFEST_BYTES:
        raise UnsafeInputError(
            f"manifest is larger than {MAX_MANIFEST_BYTES} bytes",
            path=where,
            code=codes.M006,
            hint="do not load this checkpoint; its manifest is absurdly large",
        )
    return Manifest.from_json(
        text, path=where, key=key, ranks=_rank_reader(loc.parent), only=only
    )


def parse(
    ckpt_dir: Location, text: bytes, *, key: bytes | None = None, only: RankSelect | None = None
) -> Manifest:
    """Validate the bytes of ``ckpt_dir/manifest.json`` read already (a cache that keys
    on them): as :func:`read`, rank manifests read from ``ckpt_dir``."""
    where = fs.url(ckpt_dir / MANIFEST_NAME)
    return Manifest.from_json(text, path=where, key=key, ranks=_rank_reader(ckpt_dir), only=only)


def _rank_reader(ckpt_dir: Location) -> RankFetch:
    """Reads the rank manifests a root at ``ckpt_dir`` lists, refused as a manifest is."""

    def fetch(ref: RankRef) -> bytes:
        loc = ckpt_dir / ref.path
        where = fs.url(loc)
        rank_reads[ref.rank] += 1
        try:
            return fs.read_small(loc, MAX_MANIFEST_BYTES, code=codes.M008, hint=_NOT_REGULAR_HINT)
        except CkptkitError:
            raise
        except (FileNotFoundError, NotADirectoryError):
            raise codes.error(
                codes.M013,
                f"rank {ref.rank}'s manifest is missing (the root lists it)",
                path=where,
            ) from None
        except Exception as e:
            if not isinstance(e, OSError) and not codes.transient(e):
                raise
            raise _unreadable(e, where) from None

    return fetch


def with_ranks(
    ckpt_dir: Location,
    root: Manifest,
    *,
    key: bytes | None = None,
    only: RankSelect | None = None,
) -> Manifest:
    """``root`` (a multi-rank save's, being committed in ``ckpt_dir``) with the entries of
    the rank manifests it lists (``only``: of those ranks, as :func:`read`), read through
    the checks :func:`read` makes; ``root`` itself when it lists none."""
    if not root.ranks:
        return root
    text = (root.signed(key) if key is not None else root).to_json()
    return Manifest.from_json(
        text,
        path=fs.url(ckpt_dir / MANIFEST_NAME),
        key=key,
        ranks=_rank_reader(ckpt_dir),
        only=only,
    )


def write_rank(
    ckpt_dir: Location, manifest: RankManifest, *, key: bytes | None = None, fsync: bool = True
) -> RankRef:
    """Write one rank's manifest into ``ckpt_dir`` (signed with ``key``); the root's record
    of it."""
    if key is not None:
        manifest = manifest.signed(key)
    text = manifest.to_json().encode()
    ref = manifest.ref(text)
    where = ckpt_dir / ref.path
    fs.make_dirs(where.parent)  # every rank may: exist_ok
    fs.write_new_file(where, text, fsync=fsync)
    if fsync:
        fs.sync_dir(where.parent)
    return ref


def _unreadable(exc: BaseException, where: object) -> CkptkitError:
    """A manifest read that failed: ``CK-F025`` when that is not damage (a permission, an
    I/O error, the store unreachable: :func:`ckptkit.codes.transient`), else ``CK-M008``."""
    return codes.read_error(
        exc,
        path=where,
        damage=codes.M008,
        hint="check the permissions and the disk (or the credentials and the endpoint), "
        "then try again",
    )


def write(ckpt_dir: Location, manifest: Manifest, *, fsync: bool = True) -> FileEntry:
    """Write ``manifest.json`` into ``ckpt_dir`` (the last file of a save) and fsync it.

    On an object store this one PUT is the commit (the store applies it atomically).

    Returns:
        The manifest file's own entry (size and digest of the bytes written).
    """
    text = manifest.to_json().encode()
    fs.write_new_file(ckpt_dir / MANIFEST_NAME, text, fsync=fsync)
    return FileEntry(MANIFEST_NAME, len(text), digest.hexdigest_bytes(text))
