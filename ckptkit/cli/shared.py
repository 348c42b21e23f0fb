"""What every ``ckptkit`` command shares: the error edge, path and key options, report files.

:func:`edge` is where a :class:`~ckptkit.errors.CkptkitError` (or an OS error) becomes a
one-paragraph message and exit 2, and where a reader that went away ends the command
quietly; :class:`Where` reads a path or URL argument; :func:`key_option` and
:func:`signing_key` are the one ``--key-file`` of every command that reads manifests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from ckptkit.errors import CkptkitError
from ckptkit.format.signing import resolve_key
from ckptkit.storage import fs
from ckptkit.storage.atomic import MANIFEST_NAME

F = TypeVar("F", bound=Callable[..., Any])


def edge(fn: F) -> F:
    """Turn a CkptkitError into a one-paragraph message and exit 2 (no traceback).

    A reader that goes away (``ckptkit verify RUN | head``) ends the command the way it
    ends ``cat`` or ``grep``: silently, with the status of a SIGPIPE death (141).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return fn(*args, **kwargs)
            finally:
                # Flush here, inside the edge: a closed pipe then raises where it is
                # handled below instead of at interpreter exit.
                sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()
        except CkptkitError as e:
            click.echo(f"ckptkit: {e}", err=True)
            sys.exit(2)
        except OSError as e:
            where = f" {e.filename}:" if e.filename else ""
            click.echo(f"ckptkit:{where} {e.strerror or e}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def key_option(fn: F) -> F:
    """``--key-file``: the HMAC key to check (and require) manifest signatures with.

    The one key option of every command that reads manifests or verdicts (``verify``,
    ``inspect``, ``ls``, ``prune``, ``rollback``); the command passes ``signing_key(key_file)``
    to the library.
    """
    return click.option(
        "--key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="HMAC key file: manifests must be signed with this key; a checkpoint that is "
        "not counts as corrupt (default: $CKPTKIT_HMAC_KEY or $CKPTKIT_HMAC_KEY_FILE; see "
        "docs/security.md).",
    )(fn)


def signing_key(key_file: Path | None) -> bytes | None:
    """The key a command checks with: ``--key-file``, else the environment's (an empty
    variable or file is an error, exit 2), through :func:`ckptkit.format.signing.resolve_key`."""
    return resolve_key(key_file=key_file)


def expect_option(fn: F) -> F:
    """``--expect weights|training``: what the checkpoint must be (default: inferred)."""
    return click.option(
        "--expect",
        type=click.Choice(["weights", "training"]),
        default=None,
        help="What PATH must be: 'weights' (only the model is required: inference or "
        "fine-tuning) or 'training' (a resume point). Default: as a native run recorded; "
        "for other formats inferred (weights when it holds model tensors only).",
    )(fn)


SIGPIPE_EXIT = 128 + 13
"""Exit status after the reader of stdout went away: what a shell reports for ``cat``
killed by SIGPIPE (``ckptkit verify RUN | head`` under ``set -o pipefail``)."""


def _reader_gone() -> NoReturn:
    """Exit quietly after EPIPE on stdout: no message, no traceback, no second EPIPE.

    Python ignores SIGPIPE (sockets need EPIPE as an error, and object-store transfers
    use sockets), so the default action cannot end the process as it ends ``cat``; stdout
    is pointed at /dev/null so the interpreter's final flush does not fail again.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(SIGPIPE_EXIT)


def out_file(path: str | Path) -> Path:
    """Return ``path`` after creating its parent directories (for report files)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


class Where(click.ParamType):
    """A local path or an fsspec URL (``s3://bucket/run``), as ckptkit reads it.

    A checkpoint's ``manifest.json`` stands for its directory, which every command reads.
    What the path holds is judged by the command (:func:`must_be_a_run`, or the library
    call), so a wrong path gets the same words everywhere.
    """

    name = "path_or_url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            loc = fs.location(value)
        except CkptkitError as e:
            self.fail(str(e), param, ctx)
        if loc.name == MANIFEST_NAME and fs.kind(loc) == "file":
            return loc.parent
        return loc


def must_be_a_run(path: Path, *, checkpoint_ok: bool = False) -> None:
    """Raise what ``path`` is when a run-level command cannot read it (exit 2 at the edge):
    a typo with the closest names, a file or one checkpoint with the run that holds it, a
    directory above runs with the runs under it (:func:`ckptkit.run.directory.not_a_run`).
    ``checkpoint_ok``: one checkpoint is fine too (``verify``)."""
    from ckptkit.run.directory import not_a_run

    wrong = not_a_run(path, checkpoint_ok=checkpoint_ok)
    if wrong is not None:
        raise wrong


def warn_ignored(strays: list[Any]) -> None:
    """Name, on stderr, what lies in a run directory but is not one of its checkpoints
    (``ckptkit.run.directory.ignored``: strays of another layout, a second directory for a step)."""
    for i in strays:
        click.echo(f"warning: {i.why}", err=True)
