"""Where checkpoints live: a local directory, or any fsspec URL (``s3://``, ``gs://``, ...).

Every public entry point turns what it is given into a *location* with
:func:`location`: a :class:`pathlib.Path` for local paths (and ``file://`` URLs), a
:class:`upath.UPath` (universal-pathlib, the pathlib API over fsspec) for anything else.
Code that lists, stats and reads through the pathlib API works on both; the few
operations whose meaning differs between a POSIX filesystem and an object store go
through the functions here:

* a remote file's bytes in bulk (a streamed upload or download, parallel ranges) move
  through :mod:`ckptkit.storage.transfer` (local: the callers keep their own
  O_DIRECT/fsync path);
* small files that must change atomically (``latest``, the run index):
  :func:`replace_bytes` (local: temp file, fsync, rename; remote: one PUT, which object
  stores apply atomically), read back with :func:`read_small` (local: a regular file only,
  never blocking on a FIFO put in its place; :func:`check_regular` looks without reading);
* the run lock: :func:`put_if_absent` (remote: a conditional create, ``If-None-Match``),
  then :func:`read_tagged` / :func:`replace_if_match` / :func:`remove_if_match` (S3: a
  conditional PUT or DELETE, ``If-Match: <etag>``) so a lease holder never overwrites or
  deletes a lease another writer has taken over since it last read it.
* a file inside a directory being committed: :func:`write_new_file`;
* what a checkpoint may not hold: :func:`escapes` (a symlink, or a path resolving outside
  it: never, on an object store) and :func:`walk_entries` (every entry but a directory);
* :func:`resolved` (a location for another process) and :func:`local_path` (the
  :class:`~pathlib.Path`, for what exists only on a POSIX filesystem), or
  :func:`require_local` (that Path, or an error naming the remote location and the fix);
* :func:`reads_back_cheaply`: whether a save can read its own files back.

This module and the rest of :mod:`ckptkit.storage` are the only code that asks
:func:`is_local`; the layers above call the function that does what they need
(``docs/architecture.md``).

A URL whose filesystem is not installed is a clear error naming the package to install,
never a local directory with a colon in its name (``./s3:/bucket/run``).

Credentials and endpoints are standard fsspec / boto / gcloud configuration
(``AWS_ENDPOINT_URL``, ``~/.aws/credentials``, ...): ckptkit adds nothing of its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeAlias

from upath import UPath

from ckptkit import codes, crashpoints
from ckptkit.errors import CkptkitError
from ckptkit.storage import files

Location: TypeAlias = Path | UPath
"""A local path or a remote fsspec location."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_LOCAL = ("file", "local")

Kind = Literal["file", "dir", "symlink", "other"]


def location(x: str | os.PathLike[str] | Location) -> Location:
    """The location ``x`` names: a local :class:`Path` or a remote :class:`UPath`.

    Raises:
        CkptkitError: ``x`` is a URL whose protocol is unknown, whose filesystem package is
            not installed (the message names it), or that is malformed (``s3:bucket``).

    Example:
        >>> location("/tmp/run"), type(location("memory://bucket/run")).__name__
        (PosixPath('/tmp/run'), 'MemoryPath')
        >>> location("nosuch://bucket/run")
        Traceback (most recent call last):
        ...
        ckptkit.errors.CkptkitError: nosuch://bucket/run: unknown storage protocol 'nosuch'...
    """
    if isinstance(x, UPath):
        return Path(x.path) if x.protocol in ("", *_LOCAL) else x
    if isinstance(x, Path):
        return x
    s = os.fspath(x)
    m = _SCHEME.match(s)
    if m is None or len(m.group(1)) == 1:  # no scheme, or a drive letter (C:/...)
        return Path(s)
    proto = m.group(1).lower()
    if proto in _LOCAL:
        return Path(re.sub(r"^[A-Za-z]+://", "", s) or "/")
    from fsspec.registry import known_implementations, registry

    if proto not in known_implementations and proto not in registry:
        raise CkptkitError(
            f"unknown storage protocol {proto!r}",
            path=s,
            hint="use a local path or an fsspec URL (s3://, gs://, az://, memory://, "
            "file://); install the fsspec filesystem package that provides this protocol",
        )
    if not s[len(proto) + 1 :].startswith("//"):
        raise CkptkitError(
            f"malformed URL: expected {proto}://BUCKET/PATH",
            path=s,
            hint=f"write it as {proto}://{s[len(proto) + 1:].lstrip('/')}",
        )
    try:
        p = UPath(s)
        _ = p.fs  # instantiating the filesystem is what needs its package
    except ImportError as e:
        err = known_implementations.get(proto, {}).get("err") or str(e)
        pkg = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
               "abfs": "adlfs", "abfss": "adlfs"}.get(proto)
        raise CkptkitError(
            f"the filesystem for {proto}:// is not installed ({err})",
            path=s,
            hint=f"pip install {pkg or 'the fsspec package for ' + proto}"
            + (" (or: pip install 'ckptkit[s3]')" if pkg == "s3fs" else ""),
        ) from None
    return p


def is_local(p: Location) -> bool:
    """True for a local POSIX path (where rename, fsync, flock and O_DIRECT exist)."""
    return (isinstance(p, Path) and not isinstance(p, UPath)) or (
        isinstance(p, UPath) and p.protocol in ("", *_LOCAL)
    )


def local_path(p: Location) -> Path | None:
    """The local :class:`Path` at ``p``, or None when ``p`` is in an object store.

    For what exists only on a POSIX filesystem and has no object-store counterpart (a
    foreign checkpoint read by its framework's files, an ``lstat``, the closest names in a
    directory): the caller does that and nothing else when None.

    Example:
        >>> local_path(location("/tmp/run")), local_path(location("memory://bucket/run"))
        (PosixPath('/tmp/run'), None)
    """
    return _lp(p) if is_local(p) else None


def require_local(x: str | os.PathLike[str] | Location, *, needs: str) -> Path:
    """The local :class:`Path` that ``x`` names; an error naming it when it is remote.

    For code that works on local files only (a framework's layout, a foreign format's
    reader, adopting a foreign checkpoint) and has no object-store counterpart: it is never
    handed a bogus relative path made of a URL (``s3:/bucket/run``).

    Args:
        x: a path, a URL or a location.
        needs: what works on local files only, as the message names it (``"adopting a
            foreign checkpoint"``).

    Raises:
        CkptkitError: ``x`` is in an object store (the message names it and the fix), or is
            a URL :func:`location` refuses.

    Example:
        >>> require_local("/tmp/run", needs="reading a framework's run")
        PosixPath('/tmp/run')
        >>> require_local("memory://bucket/run", needs="reading a framework's run")
        Traceback (most recent call last):
        ...
        ckptkit.errors.CkptkitError: memory://bucket/run: reading a framework's run works on a local filesystem only, not on an object store. Fix: ...
    """
    loc = location(x)
    local = local_path(loc)
    if local is None:
        raise CkptkitError(
            f"{needs} works on a local filesystem only, not on an object store",
            path=url(loc),
            hint=f"copy it to a local directory first (fsspec's get('{url(loc)}', DIR, "
            "recursive=True); for s3://, 'aws s3 sync URL DIR') and pass that directory",
        )
    return local


def reads_back_cheaply(p: Location) -> bool:
    """Whether files just written under ``p`` can be read back cheaply (a local disk: yes;
    an object store: every read is a request over the network).

    A save asks this before it reads its own files back (to count what a value scan found).

    Example:
        >>> reads_back_cheaply(location("/tmp/run")), reads_back_cheaply(location("memory://b/run"))
        (True, False)
    """
    return is_local(p)


def resolved(p: Location) -> Location:
    """``p`` made absolute, with symlinks resolved (a URL is absolute already: as it is).

    For a location handed to another process, which may run in another directory.

    Example:
        >>> str(resolved(location("memory://bucket/run")))
        'memory://bucket/run'
    """
    return _lp(p).resolve() if is_local(p) else p


def escapes(root: Location, rel: str) -> bool:
    """True when ``root/rel`` is a symlink or resolves outside ``root``.

    A checkpoint's files are read only from inside it. Keys in an object store are neither
    links nor relative: there, nothing escapes.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "ln").symlink_to("/etc/hostname")
        >>> escapes(d, "ln"), escapes(d, "absent")
        (True, False)
    """
    if not is_local(root):
        return False
    base = _lp(root)
    p = base / rel
    return p.is_symlink() or (os.path.lexists(p) and not p.resolve().is_relative_to(base.resolve()))


def walk_entries(root: Location) -> Iterator[str]:
    """The path (relative to ``root``, ``/``-separated) of every entry under ``root`` that
    is not a plain directory, sorted: files, symlinks (to a directory too: not followed),
    FIFOs and devices.

    What a checkpoint holds beyond its manifest's list is found with this (an object store
    holds only objects: their keys).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "a").mkdir(); _ = (d / "a/f").write_text("x")
        >>> (d / "ln").symlink_to(d / "a"); list(walk_entries(d))
        ['a/f', 'ln']
    """
    if not is_local(root):
        yield from (rel for rel, _size in walk_files(root))
        return
    base = _lp(root)
    for p in sorted(base.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            continue
        yield p.relative_to(base).as_posix()


def make_dirs(p: Location) -> None:
    """Create the directory ``p`` and its parents (an object store has no directories:
    nothing to do there)."""
    if is_local(p):
        _lp(p).mkdir(parents=True, exist_ok=True)


def sync_dir(p: Location) -> None:
    """Flush the entries of directory ``p`` (a rename or create in it) to disk; an object
    store applies each request durably, so there is nothing to flush."""
    if is_local(p):
        fd = os.open(_lp(p), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def commits_in_place(p: Location) -> bool:
    """Whether a checkpoint under ``p`` is written straight to its final prefix (an
    object store: no rename; its marker file, written last, says it is whole) rather than
    into a temporary sibling renamed into place (a local disk)."""
    return not is_local(p)


def remove_dir_aside(p: Location, *, marker: str, aside: str) -> bool:
    """Delete directory ``p`` so that it never looks whole half-deleted; False if gone.

    Local: renamed to ``NAME + aside + random`` first (a crash leaves a marked leftover,
    never a directory that looks whole), then removed. Object store: ``marker`` (the file
    that says the directory is whole, written last) goes first, then the rest.
    """
    if kind(p) is None:
        return False
    if not is_local(p):
        remove_file(p / marker)
        remove_tree(p)
        return True
    path = _lp(p)
    doomed = path.with_name(f"{path.name}{aside}{uuid.uuid4().hex[:8]}")
    os.rename(path, doomed)
    sync_dir(location(path.parent))
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def url(p: Location) -> str:
    """How ``p`` is written in messages and reports (a path, or a full URL)."""
    return str(p)


def kind(p: Location, *, fresh: bool = False) -> Kind | None:
    """What is at ``p`` without following a symlink: file, dir, symlink, other, or None.

    ``fresh``: on an object store, ask the store itself, not a listing this process cached
    earlier (another process may have deleted ``p`` since: a live run rotating).
    """
    if is_local(p):
        import stat as st

        try:
            mode = os.lstat(_lp(p)).st_mode
        except OSError:
            return None
        if st.S_ISLNK(mode):
            return "symlink"
        if st.S_ISREG(mode):
            return "file"
        if st.S_ISDIR(mode):
            return "dir"
        return "other"
    fs, path = remote_fs(p)
    if fresh:
        fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except (FileNotFoundError, OSError):
        return None
    t = info.get("type")
    return "dir" if t == "directory" else "file" if t == "file" else "other"


def size(p: Location) -> int:
    """Size in bytes of the file at ``p``."""
    if is_local(p):
        return os.stat(_lp(p)).st_size
    fs, path = remote_fs(p)
    return int(fs.info(path)["size"])


def mtime(p: Location) -> float:
    """Modification time of ``p`` (Unix seconds; 0.0 when the store does not say)."""
    if is_local(p):
        return os.stat(_lp(p)).st_mtime
    fs, path = remote_fs(p)
    info = fs.info(path)
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        v = info.get(key)
        if isinstance(v, (int, float)):
            return float(v)
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
    return 0.0


def fingerprint(p: Location) -> tuple[Any, ...] | None:
    """Something that changes whenever the file at ``p`` is rewritten (for caches)."""
    if is_local(p):
        try:
            st = os.lstat(_lp(p))
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    fs, path = remote_fs(p)
    try:
        info = fs.info(path)
    except (FileNotFoundError, OSError):
        return None
    return (info.get("size"), info.get("ETag") or info.get("etag") or info.get("mtime")
            or str(info.get("LastModified")))


def walk_files(root: Location) -> Iterator[tuple[str, int]]:
    """``(path relative to root, size)`` of every file under ``root`` (not following links)."""
    if is_local(root):
        base = _lp(root)
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                full = os.path.join(dirpath, f)
                with contextlib.suppress(FileNotFoundError):
                    yield os.path.relpath(full, base).replace(os.sep, "/"), os.lstat(full).st_size
        return
    fs, prefix = remote_fs(root)
    try:
        found = fs.find(prefix, detail=True)
    except FileNotFoundError:
        return
    for full, info in sorted(found.items()):
        rel = PurePosixPath(full).relative_to(PurePosixPath(prefix)).as_posix()
        yield rel, int(info.get("size") or 0)


def remove_tree(p: Location) -> None:
    """Delete ``p`` and everything under it (no error when it is already gone)."""
    if is_local(p):
        import shutil

        shutil.rmtree(_lp(p), ignore_errors=True)
        return
    fs, path = remote_fs(p)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)


def copy_tree(src: Location, dst: Location) -> None:
    """Copy every file under ``src`` to the same relative path under ``dst``.

    For stores without a rename (an object store); locally, a rename is what moves a tree.
    """
    for rel, _ in walk_files(src):
        if is_local(src):
            target = _lp(dst / rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_lp(src / rel), target)
            continue
        fs, s = remote_fs(src / rel)
        _, d = remote_fs(dst / rel)
        fs.copy(s, d)


def remove_file(p: Location) -> None:
    """Delete one file (no error when it is already gone)."""
    if is_local(p):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_lp(p))
        return
    fs, path = remote_fs(p)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


def replace_bytes(target: Location, data: bytes) -> None:
    """Replace the file at ``target`` with ``data`` atomically.

    Local: a temporary sibling, fsync, rename (no temporary left behind on failure).
    Remote: one PUT; object stores apply a PUT atomically (readers see the old or the new
    object, never a mix).
    """
    if not is_local(target):
        fs, path = remote_fs(target)
        fs.pipe_file(path, data)
        return
    local = _lp(target)
    tmp = local.with_name(f"{local.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        crashpoints.reached("index.tmp_written")
        os.replace(tmp, local)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def put_if_absent(target: Location, data: bytes) -> bool:
    """Create ``target`` holding ``data`` only if nothing is there; True when created.

    Remote: a conditional create (``If-None-Match: *`` on S3, ``ifGenerationMatch=0`` on
    GCS) — the store decides, so two writers racing cannot both win. Local: ``O_EXCL``.
    """
    if is_local(target):
        try:
            fd = os.open(_lp(target), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    fs, path = remote_fs(target)
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    except (TypeError, NotImplementedError) as e:  # a filesystem without conditional writes
        raise CkptkitError(
            f"this filesystem ({type(fs).__name__}) cannot create an object only if absent",
            path=str(target),
            hint="the run lock needs a conditional create (S3 If-None-Match, GCS "
            "generation match); use a store that has one, or a local run directory",
        ) from e
    return True


def read_tagged(p: Location, limit: int) -> tuple[bytes, str] | None:
    """A small file's bytes and a *tag* naming this version of it; None when nothing is there.

    The tag is what :func:`replace_if_match` and :func:`remove_if_match` compare. On S3 it
    is the object's ETag, returned by the same GET as the bytes (so the two always belong
    together); elsewhere it is a digest of the bytes.

    Args:
        p: the file.
        limit: the most bytes read (a longer file is cut: callers keep such files tiny).

    Example:
        >>> loc = location("memory://doc-tagged/lock")
        >>> put_if_absent(loc, b"one")
        True
        >>> data, tag = read_tagged(loc, 64)
        >>> data, read_tagged(location("memory://doc-tagged/none"), 64)
        (b'one', None)
    """
    if not is_local(p):
        fs, path = remote_fs(p)
        if is_s3(fs):
            return _s3_get_tagged(fs, path, limit)
    try:
        data = read_small(p, limit)
    except FileNotFoundError:
        return None
    return data, _content_tag(data)


def replace_if_match(p: Location, data: bytes, tag: str) -> str | None:
    """Replace the file at ``p`` with ``data`` only if it still holds version ``tag``.

    S3: a PUT with ``If-Match: <tag>``: the store decides, atomically, so a writer that
    replaced the object since ``tag`` was read always wins over this call. Elsewhere (local
    files, memory://, stores without conditional writes) a *generation check*: re-read,
    compare, then write; a writer that replaces the file between that re-read and this
    write (one round trip) is overwritten, a window the S3 path does not have.

    Returns:
        The new version's tag, or None: the file changed since ``tag`` or is gone.

    Example:
        >>> loc = location("memory://doc-cas/lock")
        >>> _ = put_if_absent(loc, b"one"); _, tag = read_tagged(loc, 64)
        >>> replace_if_match(loc, b"two", tag) is not None
        True
        >>> replace_if_match(loc, b"three", tag) is None  # tag names the old version
        True
    """
    if not is_local(p):
        fs, path = remote_fs(p)
        if is_s3(fs):
            with contextlib.suppress(_NoConditionalWrites):
                return _s3_put_if_match(fs, path, data, tag)
    now = read_tagged(p, max(len(data), 64 << 10))
    if now is None or now[1] != tag:
        return None
    replace_bytes(p, data)
    return _content_tag(data)


def remove_if_match(p: Location, tag: str) -> bool:
    """Delete the file at ``p`` only if it still holds version ``tag``; True when deleted.

    S3: a DELETE with ``If-Match: <tag>`` (atomic). Elsewhere a generation check, with
    the same window as :func:`replace_if_match`.

    Example:
        >>> loc = location("memory://doc-cad/lock")
        >>> _ = put_if_absent(loc, b"one"); _, tag = read_tagged(loc, 64)
        >>> remove_if_match(loc, "stale-tag"), remove_if_match(loc, tag)
        (False, True)
    """
    if not is_local(p):
        fs, path = remote_fs(p)
        if is_s3(fs):
            with contextlib.suppress(_NoConditionalWrites):
                return _s3_delete_if_match(fs, path, tag)
    now = read_tagged(p, 64 << 10)
    if now is None or now[1] != tag:
        return False
    remove_file(p)
    return True


def _content_tag(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs's filesystem (which lets a request carry S3's own headers)."""
    return type(fs).__name__ == "S3FileSystem" and hasattr(fs, "_call_s3")


# S3 answers a failed condition with 412 PreconditionFailed, or 409
# ConditionalRequestConflict when two conditional writes to one key race; an If-Match on a
# key that is gone answers NoSuchKey. Each means "the version you named is not there".
_LOST_CONDITION = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"})


class _NoConditionalWrites(Exception):
    """The S3-compatible store refused the ``If-Match`` header (it has no conditional writes)."""


def _s3_code(e: BaseException) -> str | None:
    """The S3 error code behind an exception s3fs translated (it keeps the boto error as cause)."""
    for err in (e, e.__cause__):
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code is not None else None
    return None


def _s3_get_tagged(fs: Any, path: str, limit: int) -> tuple[bytes, str] | None:
    from fsspec.asyn import sync

    bucket, _, key = path.partition("/")

    async def get() -> tuple[bytes, str]:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{limit}")
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data), str(resp["ETag"])

    try:
        return sync(fs.loop, get)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


class _ConditionLost(Exception):
    """The stored object is not the version the tag names (or is gone): nothing was written."""


@contextlib.contextmanager
def _s3_conditional(fs: Any, path: str) -> Iterator[None]:
    """Run one conditional S3 request on ``path``: a failed condition (or the object gone)
    raises :class:`_ConditionLost`, a store without conditional writes
    :class:`_NoConditionalWrites`; the listing cache forgets ``path`` either way."""
    try:
        yield
    except (OSError, ValueError) as e:
        if isinstance(e, FileNotFoundError) or _s3_code(e) in _LOST_CONDITION:
            raise _ConditionLost from e
        if _s3_code(e) == "NotImplemented":
            raise _NoConditionalWrites from e
        raise
    finally:
        fs.invalidate_cache(path)


def _s3_put_if_match(fs: Any, path: str, data: bytes, tag: str) -> str | None:
    bucket, _, key = path.partition("/")
    try:
        with _s3_conditional(fs, path):
            resp = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=tag)
    except _ConditionLost:
        return None
    return str(resp["ETag"])


def _s3_delete_if_match(fs: Any, path: str, tag: str) -> bool:
    bucket, _, key = path.partition("/")
    try:
        with _s3_conditional(fs, path):
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=tag)
    except _ConditionLost:
        return False
    return True


def read_small(
    p: Location, limit: int, *, hint: str | None = None, code: str = codes.F022
) -> bytes:
    """Read a whole small file: at most ``limit + 1`` bytes (the caller refuses more).

    Locally only a regular file is opened, never following a symlink and never blocking
    (:func:`ckptkit.storage.files.open_fd`): a FIFO put where a run keeps ``latest``, its
    index or its lock would otherwise hang every command that reads it. Remote: one GET.

    Args:
        p: the file.
        limit: the most bytes the caller accepts.
        hint: the fix printed when ``p`` is not a regular file (default: remove it).
        code: the finding code of that refusal (a manifest's is ``CK-M008``).

    Raises:
        UnsafeInputError: ``code``, ``p`` is a FIFO, device, socket, directory or symlink.
        FileNotFoundError: nothing is at ``p`` (``NotADirectoryError`` when a parent is a
            file).
        OSError: any other failure to read (a remote store may raise its own transport
            errors too: :func:`ckptkit.codes.transient` tells them apart).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); os.mkfifo(d / "latest")
        >>> read_small(d / "latest", 4096)
        Traceback (most recent call last):
        ...
        ckptkit.errors.UnsafeInputError: CK-F022 .../latest: is a FIFO (named pipe), not a regular file...
    """
    if is_local(p):
        with files.open_regular(_lp(p), code=code, hint=hint or _run_file_fix(p)) as f:
            chunks: list[bytes] = []
            n = 0
            while n <= limit:  # an unbuffered read may return less than asked
                b = f.read(limit + 1 - n)
                if not b:
                    break
                chunks.append(b)
                n += len(b)
            return b"".join(chunks)
    fs, path = remote_fs(p)
    return bytes(fs.cat_file(path, start=0, end=limit + 1))


def write_new_file(p: Location, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` as the whole file at ``p``, for a file inside a directory being committed.

    No temporary and no rename: the directory around it is not visible yet (its own
    commit, :mod:`ckptkit.storage.atomic`, is the atomic step). Local: written in full and
    fsynced when ``fsync``; remote: one PUT (the store applies it atomically, and on an
    object store that PUT is the commit of a manifest).
    """
    if not is_local(p):
        fs, path = remote_fs(p)
        fs.pipe_file(path, data)
        return
    fd = os.open(_lp(p), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(data)
        while mv:
            mv = mv[os.write(fd, mv) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def check_regular(p: Location, *, hint: str | None = None) -> bool:
    """Return whether a regular file is at ``p`` (False: nothing is); refuse anything else.

    For a file that is not read now but must not be of the wrong kind (``latest``, before
    a restore or a prune starts work that ends by rewriting it).

    Raises:
        UnsafeInputError: ``CK-F022``, as :func:`read_small`.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> check_regular(d / "latest")
        False
        >>> (d / "latest").mkdir(); check_regular(d / "latest")
        Traceback (most recent call last):
        ...
        ckptkit.errors.UnsafeInputError: CK-F022 .../latest: is a directory, not a regular file...
    """
    if is_local(p):
        try:
            what = files.kind(os.lstat(_lp(p)).st_mode)
        except FileNotFoundError:
            return False
    else:
        k = kind(p)
        if k is None:
            return False
        what = None if k == "file" else "a directory" if k == "dir" else "not a regular file"
    if what is None:
        return True
    raise files.refusal(what, path=url(p), code=codes.F022, hint=hint or _run_file_fix(p))


def _run_file_fix(p: Location) -> str:
    return (
        "ckptkit keeps a regular file of its own here and never writes anything else; "
        f"move it away or remove it (rm '{url(p)}') while no ckptkit process writes to "
        "this run"
    )


def _lp(p: Location) -> Path:
    """``p`` as the local Path it is (callers checked :func:`is_local`)."""
    return p if isinstance(p, Path) and not isinstance(p, UPath) else Path(str(p))


def remote_fs(p: Location) -> tuple[Any, str]:
    """The fsspec filesystem of a remote ``p`` and the path within it."""
    assert isinstance(p, UPath), p
    return p.fs, p.path


__all__ = [
    "Kind",
    "Location",
    "check_regular",
    "commits_in_place",
    "escapes",
    "fingerprint",
    "is_local",
    "is_s3",
    "kind",
    "local_path",
    "location",
    "make_dirs",
    "mtime",
    "put_if_absent",
    "read_small",
    "read_tagged",
    "reads_back_cheaply",
    "remote_fs",
    "remove_dir_aside",
    "remove_file",
    "remove_if_match",
    "remove_tree",
    "replace_bytes",
    "replace_if_match",
    "require_local",
    "resolved",
    "size",
    "sync_dir",
    "url",
    "walk_entries",
    "walk_files",
    "write_new_file",
]
