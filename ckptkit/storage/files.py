"""Open ckptkit's files: regular files only, and never block.

A FIFO named ``manifest.json`` or put in place of a shard would make a plain
``open()`` wait forever for a writer; a device node can have side effects on open; a
directory raises ``IsADirectoryError``; a symlink can point anywhere. Every open of a
checkpoint file, and of a run-level file (``latest``, the run index, the run lock, the
recoveries log, an adopted manifest), goes through :func:`open_fd` (or
:func:`open_regular`, its read-only file object), which looks before it opens
(``lstat``), opens with ``O_NOFOLLOW | O_NONBLOCK`` (so a file swapped in between still
cannot block or redirect the open) and checks again on the open descriptor (``fstat``).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ckptkit.errors import UnsafeInputError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
)
_FIX = (
    "replace it with the regular file the manifest lists, or roll back to the previous "
    "verified checkpoint ('ckptkit ls RUN')"
)


def kind(mode: int) -> str | None:
    """Return what a non-regular file is (``"a FIFO (named pipe)"`` ...), None for a regular one.

    Example:
        >>> import stat
        >>> kind(stat.S_IFIFO | 0o644), kind(stat.S_IFREG | 0o644)
        ('a FIFO (named pipe)', None)
    """
    if stat.S_ISREG(mode):
        return None
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def refusal(
    what: str, *, path: str | os.PathLike[str], code: str, hint: str | None = None
) -> UnsafeInputError:
    """The error for a path that is ``what`` (``"a FIFO (named pipe)"`` ...), not a regular file.

    One wording for every caller, so a FIFO reads the same wherever it is found.

    Example:
        >>> str(refusal("a FIFO (named pipe)", path="run/latest", code="CK-F022",
        ...             hint="remove it")).split(". Fix")[0]
        'CK-F022 run/latest: is a FIFO (named pipe), not a regular file; ckptkit never opens it'
    """
    return UnsafeInputError(
        f"is {what}, not a regular file; ckptkit never opens it",
        path=path,
        code=code,
        hint=hint or _FIX,
    )


def open_fd(
    path: str | os.PathLike[str],
    flags: int = os.O_RDONLY,
    *,
    code: str,
    rel: str | Path | None = None,
    symlink_code: str | None = None,
    hint: str | None = None,
    mode: int = 0o644,
) -> int:
    """Open ``path`` with ``flags`` (a blocking descriptor) only if it is a regular file.

    ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`` are added to ``flags``; the descriptor is set
    back to blocking once ``fstat`` says it is a regular file. With ``O_CREAT`` the file
    may be absent (it is created); anything else that is already there must be regular.

    Args:
        path: the file to open.
        flags: ``os.O_RDONLY`` (the default), ``os.O_RDWR``, ``os.O_RDWR | os.O_CREAT``...
        code: finding code of the error raised for a non-regular file.
        rel: how to name the file in the error (default: ``path``).
        symlink_code: code for a symlink (default: ``code``).
        hint: the fix to print (default: replace it with the real file).
        mode: permissions of a file ``O_CREAT`` creates.

    Returns:
        The open descriptor; the caller closes it.

    Raises:
        UnsafeInputError: the path is a symlink, FIFO, directory, device or socket.
        FileNotFoundError: it does not exist (and ``flags`` has no ``O_CREAT``).
        OSError: any other failure to open (permissions, I/O).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); os.mkfifo(d / "lock")
        >>> open_fd(d / "lock", os.O_RDWR | os.O_CREAT, code="CK-F022", rel="lock")
        Traceback (most recent call last):
        ...
        ckptkit.errors.UnsafeInputError: CK-F022 lock: is a FIFO (named pipe), not a regular file...
    """
    name = rel if rel is not None else Path(path)

    def refuse(what: str, is_link: bool = False) -> UnsafeInputError:
        return refusal(
            what, path=name, code=(symlink_code or code) if is_link else code, hint=hint
        )

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        what = kind(st.st_mode)
        if what is not None:
            raise refuse(what, stat.S_ISLNK(st.st_mode))
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:  # swapped for a symlink after the lstat
            raise refuse("a symlink", True) from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, swapped in for a write-open
            raise refuse("a FIFO (named pipe)") from None
        raise
    try:
        what = kind(os.fstat(fd).st_mode)
        if what is not None:
            raise refuse(what)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(
    path: str | os.PathLike[str],
    *,
    code: str,
    rel: str | Path | None = None,
    symlink_code: str | None = None,
    hint: str | None = None,
) -> BinaryIO:
    """Open ``path`` for reading (unbuffered) if it is a regular file; never block.

    Args:
        path: the file to open.
        code: finding code of the error raised for a non-regular file.
        rel: how to name the file in the error (default: ``path``).
        symlink_code: code for a symlink (default: ``code``).
        hint: the fix to print (default: replace it with the real file).

    Returns:
        The open file (``buffering=0``); the caller closes it.

    Raises:
        UnsafeInputError: the path is a symlink, FIFO, directory, device or socket.
        FileNotFoundError: it does not exist (callers map this to their own code).
        OSError: any other failure to open (permissions, I/O).

    Example:
        >>> import tempfile, os, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); os.mkfifo(d / "p")
        >>> open_regular(d / "p", code="CK-F022", rel="p")
        Traceback (most recent call last):
        ...
        ckptkit.errors.UnsafeInputError: CK-F022 p: is a FIFO (named pipe), not a regular file...
    """
    fd = open_fd(path, code=code, rel=rel, symlink_code=symlink_code, hint=hint)
    try:
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise

