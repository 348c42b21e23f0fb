"""Open a checkpoint's files for reading: regular files only, and never block.

A FIFO named ``manifest.json`` or put in place of a shard would make a plain
``open()`` wait forever for a writer; a device node can have side effects on open; a
directory raises ``IsADirectoryError``; a symlink can point anywhere. Every read of a
checkpoint file goes through :func:`open_regular`, which looks before it opens
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
    name = rel if rel is not None else Path(path)
    fix = hint or (
        "replace it with the regular file the manifest lists, or roll back to the previous "
        "verified checkpoint ('ckptkit ls RUN')"
    )

    def refuse(what: str, is_link: bool = False) -> UnsafeInputError:
        return UnsafeInputError(
            f"is {what}, not a regular file; ckptkit never opens it",
            path=name,
            code=(symlink_code or code) if is_link else code,
            hint=fix,
        )

    st = os.lstat(path)
    what = kind(st.st_mode)
    if what is not None:
        raise refuse(what, stat.S_ISLNK(st.st_mode))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # swapped for a symlink after the lstat
            raise refuse("a symlink", True) from None
        raise
    try:
        what = kind(os.fstat(fd).st_mode)
        if what is not None:
            raise refuse(what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise

