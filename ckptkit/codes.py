"""The one registry of finding codes: title, severity, hint, error class and docs anchor.

Every code (``CK-F003``) is declared here once, below storage, so that the storage layer,
``verify`` and the foreign readers speak of the same thing with the same words: a raise
site calls :func:`error` (the registered exception class, the registered fix), a check
emits :meth:`Code.finding`. Codes are never reused; every one is documented in
``docs/verify-codes.md`` (a test holds the two together).

Families and prefixes (``style.md``): ``CK-M`` manifest, ``CK-F`` files and digests,
``CK-C`` completeness, ``CK-S`` state consistency, ``CK-R`` resume compatibility, ``CK-D``
drill and resume-guard verdicts. ``1xx`` codes are about checkpoints of other tools.

Code outside this module names a code by its constant, never by the string:
``codes.F003`` is ``"CK-F003"`` (a plain ``str``, so findings, sets, JSON and comparisons
with codes read from a manifest or a report work unchanged). The rule for the name is the
code without ``CK-``, not its title: codes are the stable identity (never reused, the
anchor of their docs entry, what a user sees in a report and greps for), while titles are
prose that gets reworded; one mechanical rule gives unique names nobody has to pick, and
``grep F003`` finds the constant, its uses and its docs. :data:`UNREADABLE` stays as the
name of the one code other code reasons about by meaning. The constants are written out
in the generated block below (visible to mypy and IDEs); ``tools/codes_to_constants.py``
writes that block from the ``register_code`` calls and rewrites literals elsewhere, and
``tests/test_codes_by_constant.py`` holds block, registry and call sites together.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ckptkit import errors

Family = Literal["integrity", "completeness", "consistency", "compat", "drill"]

FAMILY_PREFIXES: dict[str, tuple[str, ...]] = {
    "integrity": ("CK-M", "CK-F"),
    "completeness": ("CK-C",),
    "consistency": ("CK-S",),
    "compat": ("CK-R",),
    "drill": ("CK-D",),
}
"""Which code prefixes each family may use."""
FAMILY_ORDER: tuple[str, ...] = ("integrity", "completeness", "consistency", "compat", "drill")

DOCS = "docs/verify-codes.md"
"""Where every code is documented; each has the anchor ``#ck-xnnn``."""

ROLLBACK = "roll back to the previous verified checkpoint ('ckptkit ls RUN' lists them)"
"""The fix shared by most damage findings."""
RESTORE = "restore the file from a replica, or resume from an earlier checkpoint"
"""The fix shared by foreign damage findings."""
ADOPT = "run 'ckptkit adopt PATH' on a known-good copy so later verifies can detect corruption"


class Severity(enum.StrEnum):
    """How bad a finding is. Only ``error`` makes verify exit 1 (``--strict``: warnings too)."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


ERROR = Severity.ERROR
WARNING = Severity.WARNING
INFO = Severity.INFO


@dataclass(frozen=True)
class Finding:
    """One thing verify (or a reader, or the resume guard) found.

    Example:
        >>> f = CODES["CK-F003"].finding("digest mismatch", path="model.safetensors")
        >>> f.severity
        <Severity.ERROR: 'error'>
    """

    code: str
    """Stable code, e.g. ``CK-F003``; documented in docs/verify-codes.md."""
    severity: Severity
    """error / warning / info."""
    component: str
    """Spec §1 component concerned (``model``, ``rng`` ...) or ``checkpoint``."""
    message: str
    """What is wrong, naming the file or key."""
    hint: str
    """How to fix it."""
    path: str | None = None
    """File concerned, relative to the checkpoint directory when inside it."""

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used by ``verify --json`` (schemas/verify-report.schema.json)."""
        out: dict[str, Any] = {
            "code": self.code,
            "severity": str(self.severity),
            "component": self.component,
            "message": self.message,
            "hint": self.hint,
        }
        if self.path is not None:
            out["path"] = self.path
        return out

    def to_error(self, base: str | Path | None = None) -> errors.CkptkitError:
        """Return the exception ``load`` raises for this finding (same code, path and hint)."""
        cls = CODES[self.code].error_class if self.code in CODES else errors.CkptkitError
        path = self.path if base is None or self.path is None else f"{base}/{self.path}"
        return cls(self.message, path=path, code=self.code, hint=self.hint)


@dataclass(frozen=True)
class Code:
    """A registered finding code: its family, severity, title, default fix and error class."""

    code: str
    family: Family
    severity: Severity
    title: str
    """A few words, used as the heading in docs/verify-codes.md."""
    hint: str
    """The default fix, shown after ``Fix:``."""
    component: str = "checkpoint"
    error_class: type[errors.CkptkitError] = errors.CkptkitError
    """What a raise site (and ``load`` after a failed check) raises for this code."""

    @property
    def anchor(self) -> str:
        """Link to this code's entry in the docs (``docs/verify-codes.md#ck-f003``)."""
        return f"{DOCS}#{self.code.lower()}"

    def finding(
        self,
        message: str,
        *,
        component: str | None = None,
        path: str | None = None,
        hint: str | None = None,
        severity: Severity | None = None,
    ) -> Finding:
        """Build a finding of this code; ``hint``/``component`` default to the registered ones."""
        return Finding(
            code=self.code,
            severity=severity or self.severity,
            component=component or self.component,
            message=message,
            hint=hint or self.hint,
            path=path,
        )

    def error(
        self, what: str, *, path: object = None, hint: str | None = None
    ) -> errors.CkptkitError:
        """Build the exception of this code (see :func:`error`)."""
        return self.error_class(what, path=path, code=self.code, hint=hint or self.hint)


CODES: dict[str, Code] = {}
"""Every registered code, by code string, in declaration order."""


def register_code(
    code: str,
    *,
    family: Family,
    severity: Severity,
    title: str,
    hint: str,
    component: str = "checkpoint",
    error_class: type[errors.CkptkitError] | None = None,
) -> Code:
    """Register a finding code; raise at import time on a duplicate or a wrong family prefix.

    Example:
        >>> register_code("CK-X999", family="integrity", severity=ERROR, title="t", hint="h")
        Traceback (most recent call last):
        ...
        ValueError: CK-X999: family 'integrity' codes start with ('CK-M', 'CK-F')
    """
    if code in CODES:
        raise ValueError(f"{code}: finding code registered twice (codes are never reused)")
    prefixes = FAMILY_PREFIXES[family]
    if not code.startswith(prefixes):
        raise ValueError(f"{code}: family {family!r} codes start with {prefixes}")
    spec = Code(
        code=code,
        family=family,
        severity=severity,
        title=title,
        hint=hint,
        component=component,
        error_class=error_class or _default_error_class(code),
    )
    CODES[code] = spec
    return spec


def _default_error_class(code: str) -> type[errors.CkptkitError]:
    if code.startswith("CK-M"):
        return errors.ManifestError
    if code.startswith("CK-F"):
        return errors.IntegrityError
    if code.startswith("CK-C"):
        return errors.IncompleteCheckpointError
    if code.startswith(("CK-S", "CK-R")):
        return errors.StateError
    return errors.CkptkitError


def error(
    code: str, what: str, *, path: object = None, hint: str | None = None
) -> errors.CkptkitError:
    """The exception a raise site raises for ``code``: registered class, code and fix.

    Args:
        code: a registered code.
        what: what is wrong, naming the specifics (sizes, keys, digests).
        path: the file or directory concerned.
        hint: a fix more specific than the registered one (rarely needed).

    Example:
        >>> e = error("CK-F002", "size is 3 bytes, the manifest records 8", path="m.safetensors")
        >>> type(e).__name__, e.code, e.hint == CODES["CK-F002"].hint
        ('IntegrityError', 'CK-F002', True)
    """
    return CODES[code].error(what, path=path, hint=hint)


# --- transient is not corrupt ----------------------------------------------------------------
# One classifier for every place where a failed read becomes a verdict (verify's file scans,
# the readers a restore uses, the manifest reader, the catalog): a failure that says nothing
# about the bytes makes the checkpoint ``unreadable`` (CK-F025), tried again later and never
# deleted as corrupt. A missing listed file, a short file or a wrong digest stay damage.

UNREADABLE = "CK-F025"
"""The code of a read that failed for a reason that is not evidence of damage."""

TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EACCES", "EPERM",  # permissions: fixed by a chmod, not by a replica
        "EIO", "EREMOTEIO",  # the device or the remote end failed this read
        "EMFILE", "ENFILE", "ENOMEM", "ENOBUFS",  # this process or host ran short
        "ESTALE", "ETIMEDOUT", "EAGAIN", "EWOULDBLOCK", "EINTR", "EBUSY",
        "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "EPIPE",
        "ENETDOWN", "ENETUNREACH", "ENETRESET", "EHOSTDOWN", "EHOSTUNREACH", "ENOLINK",
    )
    if hasattr(errno, name)
)
"""``errno`` values of a read failure that do not show the file's bytes are damaged."""

_TRANSIENT_TYPES = (PermissionError, TimeoutError, ConnectionError, BlockingIOError,
                    InterruptedError)
"""Built-in types s3fs and other fsspec stores raise *without* an errno (``AccessDenied``
becomes ``PermissionError(message)``, ``RequestTimeout`` a ``TimeoutError``)."""

_TRANSIENT_FOREIGN = frozenset({
    # botocore (its own hierarchy, not OSError): connection and timeout failures
    ("botocore", "HTTPClientError"),
    ("botocore", "ConnectionError"),
    ("botocore", "ResponseStreamingError"),
    # aiohttp / urllib3 / http.client: the transport under s3fs, gcsfs, adlfs
    ("aiohttp", "ClientConnectionError"),
    ("aiohttp", "ClientPayloadError"),
    ("aiohttp", "ServerTimeoutError"),
    ("urllib3", "HTTPError"),
    ("http", "IncompleteRead"),
    ("http", "RemoteDisconnected"),
})
"""``(top-level module, class name)`` of transport errors the object-store clients let
through unconverted (after their own retries); matched along the class hierarchy by name
so that no optional client is imported here."""


def transient(exc: BaseException) -> bool:
    """Return whether a failed read is *not* evidence that the file's bytes are damaged.

    True for permission errors, I/O errors, exhausted descriptors or memory, stale NFS
    handles, interrupted or timed-out calls and every connection or timeout error of an
    object-store client; those make a checkpoint ``unreadable`` (try again later). False
    for everything else, a missing file (``ENOENT``) included: that stays damage.

    Example:
        >>> import errno
        >>> transient(PermissionError(errno.EACCES, "Permission denied"))
        True
        >>> transient(OSError(errno.EIO, "Input/output error"))
        True
        >>> transient(FileNotFoundError(errno.ENOENT, "No such file"))
        False
    """
    if isinstance(exc, errors.UnreadableError):
        return True
    if isinstance(exc, errors.CkptkitError):
        return False  # a ckptkit finding already says what it is
    if isinstance(exc, FileNotFoundError):
        return False
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    if isinstance(exc, _TRANSIENT_TYPES):
        return True
    for cls in type(exc).__mro__:
        if (cls.__module__.split(".", 1)[0], cls.__name__) in _TRANSIENT_FOREIGN:
            return True
    return False


def read_error(
    exc: BaseException,
    *,
    path: object,
    damage: str = "CK-F004",
    what: str = "cannot be read",
    hint: str | None = None,
) -> errors.CkptkitError:
    """The ckptkit error for a failed read of a listed file: ``CK-F025`` or ``damage``.

    Every read site calls this instead of choosing a code itself, so that verify, the
    restore's readers and the catalog agree on what a failed read means.

    Args:
        exc: what the read raised.
        path: the file, relative to the checkpoint when inside it.
        damage: the code when the failure is evidence of damage.
        what: the start of the message (the exception's text follows).
        hint: a fix for the damage case more specific than the registered one.

    Example:
        >>> import errno
        >>> read_error(PermissionError(errno.EACCES, "Permission denied"), path="a").code
        'CK-F025'
        >>> read_error(OSError(errno.EISDIR, "Is a directory"), path="a").code
        'CK-F004'
    """
    why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if transient(exc):
        return error(UNREADABLE, f"{what} now: {why}", path=path)
    return error(damage, f"{what}: {why}", path=path, hint=hint)


Outcome = Literal["verified", "corrupt", "unreadable", "replica-divergent", "untrusted", "unsound"]
"""What one verify (or restore) established about a checkpoint, as the run index records it."""

TRUST_CODES: frozenset[str] = frozenset({"CK-M010", "CK-M011"})
"""Findings of the trust decision: the key in use does not vouch for the manifest (unsigned,
signed with another key, or changed after signing). They say who wrote it, not that its
bytes are damaged."""

WHOLE_CODES: frozenset[str] = frozenset({"CK-F103", "CK-S020"})
"""Integrity findings about checkpoints whose bytes are intact but that no resume may use: a
framework file that needs code to load (``CK-F103``), a manifest that records another step
than its directory's name (``CK-S020``: a copy, or a rename that may be the only copy)."""


def damage(code: str | None) -> bool:
    """Whether an error finding is evidence that a checkpoint's bytes are damaged: they do
    not match their digests, cannot be parsed, or are missing.

    Integrity findings (``CK-M``, ``CK-F``) are, except an unreadable file (``CK-F025``:
    try again), replicas that disagreed at save (``CK-F120``: whole bytes of a suspect
    state), the trust findings (:data:`TRUST_CODES`) and :data:`WHOLE_CODES`.
    Completeness, consistency and compatibility findings (``CK-C``, ``CK-S``, ``CK-R``)
    are about the state that intact bytes hold, never damage, except ``CK-C010`` (a
    component's bytes are absent: the files that hold it are missing or damaged, which a
    restore that checks files by their sizes only reports first). ``None`` (an error
    without a code) counts as damage: nothing says the bytes are whole.

    Example:
        >>> damage("CK-F003"), damage("CK-C001"), damage("CK-M011"), damage("CK-F025")
        (True, False, False, False)
    """
    if code is None:
        return True
    if code in TRUST_CODES or code in WHOLE_CODES or code in (UNREADABLE, "CK-F120"):
        return False
    return code.startswith(("CK-M", "CK-F")) or code == "CK-C010"


def outcome(error_codes: Iterable[str | None]) -> Outcome:
    """The outcome of a check from the codes of its error findings.

    No error: ``verified``. Any finding of damage (:func:`damage`): ``corrupt``, the only
    outcome retention may delete a checkpoint for. Otherwise, in this order: the key does
    not vouch for it (:data:`TRUST_CODES`): ``untrusted``; only unreadable files
    (``CK-F025``): ``unreadable``, neither good nor damaged; only replicas that disagreed at
    save (``CK-F120``): ``replica-divergent``; else its bytes are intact but the state they
    hold cannot be resumed (a component missing, values inconsistent, a file that needs
    code): ``unsound``.

    Example:
        >>> outcome([]), outcome(["CK-F025"]), outcome(["CK-F025", "CK-F003"])
        ('verified', 'unreadable', 'corrupt')
        >>> outcome(["CK-F120"]), outcome(["CK-M010", "CK-C001"]), outcome(["CK-C001"])
        ('replica-divergent', 'untrusted', 'unsound')
    """
    found = list(error_codes)
    if not found:
        return "verified"
    if any(damage(c) for c in found):
        return "corrupt"
    if any(c in TRUST_CODES for c in found):
        return "untrusted"
    if all(c == UNREADABLE for c in found):
        return "unreadable"
    if all(c in (UNREADABLE, "CK-F120") for c in found):
        return "replica-divergent"
    return "unsound"


# --- constants: generated by tools/codes_to_constants.py, do not edit by hand ---
# One constant per registered code, named by the code without ``CK-`` (see the module
# docstring); tests/test_codes_by_constant.py keeps this block and the registry
# in sync. Regenerate after adding a code: python tools/codes_to_constants.py

M001: Final = "CK-M001"
M002: Final = "CK-M002"
M003: Final = "CK-M003"
M004: Final = "CK-M004"
M005: Final = "CK-M005"
M006: Final = "CK-M006"
M007: Final = "CK-M007"
M008: Final = "CK-M008"
M009: Final = "CK-M009"
M010: Final = "CK-M010"
M011: Final = "CK-M011"
M012: Final = "CK-M012"
M013: Final = "CK-M013"
F001: Final = "CK-F001"
F002: Final = "CK-F002"
F003: Final = "CK-F003"
F004: Final = "CK-F004"
F005: Final = "CK-F005"
F006: Final = "CK-F006"
F007: Final = "CK-F007"
F008: Final = "CK-F008"
F009: Final = "CK-F009"
F020: Final = "CK-F020"
F021: Final = "CK-F021"
F022: Final = "CK-F022"
F023: Final = "CK-F023"
F024: Final = "CK-F024"
F025: Final = "CK-F025"
F026: Final = "CK-F026"
F027: Final = "CK-F027"
F101: Final = "CK-F101"
F102: Final = "CK-F102"
F103: Final = "CK-F103"
F104: Final = "CK-F104"
F105: Final = "CK-F105"
F106: Final = "CK-F106"
F107: Final = "CK-F107"
F108: Final = "CK-F108"
F109: Final = "CK-F109"
F120: Final = "CK-F120"
C001: Final = "CK-C001"
C002: Final = "CK-C002"
C003: Final = "CK-C003"
C010: Final = "CK-C010"
C011: Final = "CK-C011"
C012: Final = "CK-C012"
C020: Final = "CK-C020"
C101: Final = "CK-C101"
C102: Final = "CK-C102"
C103: Final = "CK-C103"
C104: Final = "CK-C104"
C105: Final = "CK-C105"
S001: Final = "CK-S001"
S002: Final = "CK-S002"
S003: Final = "CK-S003"
S004: Final = "CK-S004"
S005: Final = "CK-S005"
S006: Final = "CK-S006"
S007: Final = "CK-S007"
S008: Final = "CK-S008"
S009: Final = "CK-S009"
S010: Final = "CK-S010"
S011: Final = "CK-S011"
S012: Final = "CK-S012"
S013: Final = "CK-S013"
S020: Final = "CK-S020"
S021: Final = "CK-S021"
S022: Final = "CK-S022"
S030: Final = "CK-S030"
S031: Final = "CK-S031"
R001: Final = "CK-R001"
R002: Final = "CK-R002"
R003: Final = "CK-R003"
R010: Final = "CK-R010"
R011: Final = "CK-R011"
R012: Final = "CK-R012"
D001: Final = "CK-D001"
D002: Final = "CK-D002"
D003: Final = "CK-D003"
D004: Final = "CK-D004"
D005: Final = "CK-D005"
D006: Final = "CK-D006"
D007: Final = "CK-D007"
D008: Final = "CK-D008"
D009: Final = "CK-D009"
D090: Final = "CK-D090"
D091: Final = "CK-D091"
D092: Final = "CK-D092"
D010: Final = "CK-D010"
D011: Final = "CK-D011"

# --- end of generated constants ---


# --- the codes ------------------------------------------------------------------------------
# Grouped by family; the order here is the order of findings in a report and in the docs.

register_code(
    "CK-M001",
    family="integrity",
    severity=ERROR,
    title="manifest missing: incomplete checkpoint",
    hint="the save was interrupted before its commit marker; " + ROLLBACK,
    error_class=errors.IncompleteCheckpointError,
)
register_code(
    "CK-M002",
    family="integrity",
    severity=ERROR,
    title="manifest is not valid JSON",
    hint="the manifest is damaged; " + ROLLBACK,
)
register_code(
    "CK-M003",
    family="integrity",
    severity=ERROR,
    title="manifest fails its schema",
    hint="the manifest was damaged or hand-edited; " + ROLLBACK,
)
register_code(
    "CK-M004",
    family="integrity",
    severity=ERROR,
    title="unknown manifest schema_version",
    hint="upgrade ckptkit if the checkpoint is newer; otherwise " + ROLLBACK,
)
register_code(
    "CK-M005",
    family="integrity",
    severity=ERROR,
    title="manifest path escapes the checkpoint directory",
    hint="do not load this checkpoint: its manifest may be hostile",
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-M006",
    family="integrity",
    severity=ERROR,
    title="absurd or incoherent sizes or shapes in the manifest",
    hint="do not load this checkpoint: its manifest is incoherent or hostile",
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-M007",
    family="integrity",
    severity=ERROR,
    title="manifest digest mismatch",
    hint="the manifest changed after it was written; " + ROLLBACK,
)
register_code(
    "CK-M008",
    family="integrity",
    severity=ERROR,
    title="manifest is not a readable regular file",
    hint="a manifest is a regular file inside the checkpoint (not a symlink, FIFO, directory "
    "or device); replace it with the real one or " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-M009",
    family="integrity",
    severity=ERROR,
    title="state tree cannot be rebuilt",
    hint="load would refuse it: the manifest was damaged, edited or written by a newer "
    "ckptkit; upgrade ckptkit or " + ROLLBACK,
)
register_code(
    "CK-M010",
    family="integrity",
    severity=ERROR,
    title="manifest unsigned but a key was given",
    hint="its origin cannot be proven; do not load it unless you wrote it without a key "
    "(docs/security.md)",
    error_class=errors.SignatureError,
)
register_code(
    "CK-M011",
    family="integrity",
    severity=ERROR,
    title="manifest signature does not match the key",
    hint="signed with another key or altered after signing; do not load it unless you know "
    "why, or " + ROLLBACK,
    error_class=errors.SignatureError,
)
register_code(
    "CK-M012",
    family="integrity",
    severity=INFO,
    title="signature not checked",
    hint="pass the key (key=, --key-file or CKPTKIT_HMAC_KEY) to check who wrote it",
)
register_code(
    "CK-M013",
    family="integrity",
    severity=ERROR,
    title="a rank manifest is missing or not the one the root lists",
    hint="a multi-rank checkpoint's per-rank manifest was deleted, replaced or damaged "
    "after the save; restore it from a copy or " + ROLLBACK,
)
register_code(
    "CK-F001",
    family="integrity",
    severity=ERROR,
    title="listed file missing",
    hint="restore the file from a replica or " + ROLLBACK,
    error_class=errors.IncompleteCheckpointError,
)
register_code(
    "CK-F002",
    family="integrity",
    severity=ERROR,
    title="file size mismatch",
    hint="the file was truncated or rewritten; restore it or " + ROLLBACK,
)
register_code(
    "CK-F003",
    family="integrity",
    severity=ERROR,
    title="file digest mismatch",
    hint="the bytes changed after the save (bit flip, partial overwrite); restore the file from a replica or "
    + ROLLBACK,
)
register_code(
    "CK-F004",
    family="integrity",
    severity=ERROR,
    title="safetensors header invalid",
    hint="the file is damaged or not a safetensors file; restore it or " + ROLLBACK,
)
register_code(
    "CK-F005",
    family="integrity",
    severity=ERROR,
    title="tensor disagrees with file header",
    hint="the file and manifest disagree (file replaced or manifest edited); " + ROLLBACK,
)
register_code(
    "CK-F006",
    family="integrity",
    severity=WARNING,
    title="unlisted file in checkpoint",
    hint="a file not covered by the manifest is not protected by digests and is never loaded; remove it or move it out of the checkpoint directory",
)
register_code(
    "CK-F007",
    family="integrity",
    severity=WARNING,
    title="leftover temporary directory",
    hint="an interrupted save left it; it is never loaded; delete it, or let CheckpointManager clean it on open",
)
register_code(
    "CK-F008",
    family="integrity",
    severity=ERROR,
    title="compressed file will not decompress",
    hint="the compressed file is damaged or a decompression bomb; restore it or " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F009",
    family="integrity",
    severity=ERROR,
    title="listed file resolves outside",
    hint="a listed file is a symlink or resolves outside the checkpoint directory; it is never read; replace it with the real file",
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F020",
    family="integrity",
    severity=INFO,
    title="checkpoint deleted during the check",
    hint="rotation of a live run deleted it while it was being read; nothing is wrong "
    "with it or the run; run the check again to see the checkpoints that exist now",
)
register_code(
    "CK-F021",
    family="integrity",
    severity=ERROR,
    title="a file the checkpoint reads is not listed in the manifest",
    hint="every file a load reads must be listed with a digest that is checked before it "
    "is parsed; this checkpoint asks to read one that is not, so it was refused unread. "
    "Do not load it: it may be hostile; " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F022",
    family="integrity",
    severity=ERROR,
    title="not a regular file",
    hint="a FIFO, device, directory or symlink sits where the manifest lists a file; it is "
    "never opened (a FIFO would block every reader); replace it with the real file or " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F023",
    family="integrity",
    severity=ERROR,
    title="pickle names a global outside the allow-list",
    hint="DCP metadata is unpickled with an allow-list of its own classes, and DCP's "
    "non-tensor items with torch's weights-only one; this file names another global (code "
    "that would run on a plain pickle.load), so it was not executed. "
    "Do not load this checkpoint: it may be hostile; " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F024",
    family="integrity",
    severity=ERROR,
    title="checkpoint cannot be read",
    hint="reading it failed in a way no other finding names (a malformed state tree, a "
    "value of the wrong type, an unparsable device); the message says what; " + ROLLBACK,
)
register_code(
    UNREADABLE,
    family="integrity",
    severity=ERROR,
    title="file cannot be read now",
    hint="the read failed for a reason that is not damage (permissions, an I/O error, too "
    "many open files, a stale handle, the store busy or unreachable); the checkpoint is "
    "'unreadable', not corrupt: it is tried again later and never deleted as corrupt. "
    "Fix the cause (chmod, the mount, the credentials or the network), then verify again",
    error_class=errors.UnreadableError,
)
register_code(
    "CK-F026",
    family="integrity",
    severity=ERROR,
    title="DCP item does not fit its chunk",
    hint="DCP's .metadata declares each tensor's size and the chunks it is stored in; here a "
    "chunk lies outside its tensor, needs more bytes than its storage entry holds, or the "
    "tensor stored for it has another shape or dtype (items that swap storage). A load "
    "would fill the tensor with the wrong bytes or fail part-way, so it was refused. "
    "Do not load it: it may be hostile; " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F027",
    family="integrity",
    severity=ERROR,
    title="DCP metadata declares more chunks than its size allows",
    hint="a genuine .metadata takes about 100 bytes of pickle per chunk and storage entry; "
    "this one declares far more (pickle references repeating one object), which would "
    "take a load minutes and gigabytes to plan, so it was refused before any of that work. "
    "Do not load it: it may be hostile; " + ROLLBACK,
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F101",
    family="integrity",
    severity=ERROR,
    title="zip archive CRC mismatch",
    hint="a byte changed after the save (torch.load would not notice); restore the file from a replica, or resume from an earlier checkpoint",
)
register_code(
    "CK-F102",
    family="integrity",
    severity=ERROR,
    title="torch file truncated or not a valid archive",
    hint="the file is cut short or damaged (interrupted copy, disk full); restore the file from a replica, or resume from an earlier checkpoint",
)
register_code(
    "CK-F103",
    family="integrity",
    # An error in any file a resume loads, info in one none does: the severity of each
    # finding comes from ckptkit.verify.foreign.loads.needs_code_verdict. Also an error for a file
    # ckptkit read whose framework load has a narrower list (loads.refused_by_load).
    severity=ERROR,
    title="pickle needs code to load: not read",
    hint="ckptkit loads with weights_only=True and a narrow allow-list and never runs pickled code; the file could not be checked. Resume from an earlier checkpoint; re-save that state as plain tensors/dicts if it matters for resume",
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F104",
    family="integrity",
    severity=ERROR,
    title="safetensors header or size inconsistent with file length",
    hint="the weights file is truncated or damaged; restore the file from a replica, or resume from an earlier checkpoint",
)
register_code(
    "CK-F105",
    family="integrity",
    severity=ERROR,
    title="DCP shard missing",
    hint="a .distcp file named in .metadata is absent (partial copy, lost rank); torch.distributed.checkpoint.load would raise CheckpointException. restore the file from a replica, or resume from an earlier checkpoint",
    error_class=errors.IncompleteCheckpointError,
)
register_code(
    "CK-F106",
    family="integrity",
    severity=ERROR,
    title="DCP shard smaller than its items",
    hint="a .distcp file ends before the byte ranges .metadata records (truncated copy); restore the file from a replica, or resume from an earlier checkpoint",
)
register_code(
    "CK-F107",
    family="integrity",
    severity=WARNING,
    title="no digests: silent corruption cannot be detected",
    hint="run 'ckptkit adopt PATH' on a known-good copy so later verifies can detect corruption",
)
register_code(
    "CK-F108",
    family="integrity",
    severity=ERROR,
    title="foreign file unreadable",
    hint="the file is damaged or not what its name says; restore the file from a replica, or resume from an earlier checkpoint",
)
register_code(
    "CK-F109",
    family="integrity",
    severity=ERROR,
    title="foreign archive inflates past the limit: not read",
    hint="torch.save never compresses its members, so a deflated member this large is hostile "
    "or re-packed; if you trust the file, raise the limit with CKPTKIT_MAX_INFLATED_BYTES=N "
    "(bytes) and verify again",
    error_class=errors.UnsafeInputError,
)
register_code(
    "CK-F120",
    family="integrity",
    severity=ERROR,
    title="replicas disagree: a tensor differs between ranks that hold the same copy",
    hint="a rank's copy of replicated state changed silently (a faulty accelerator, memory "
    "corruption, a non-deterministic kernel): do not resume from this checkpoint; resume "
    "from the newest verified one ('ckptkit ls RUN'), and check the minority rank's host "
    "and device",
    error_class=errors.ReplicaDivergenceError,
)
register_code(
    "CK-C001",
    family="completeness",
    severity=ERROR,
    title="required component missing",
    hint="the run uses this state but the checkpoint lacks it, so a resume would start it "
    "fresh; save it with the rest (ckptkit: pass it to TrainState, e.g. scaler=, "
    "scheduler=; another tool: the message says what it does without it) and save again, "
    "resume from a checkpoint that has it, or, for a weights-only checkpoint, verify with "
    "--expect weights; otherwise " + ROLLBACK,
)
register_code(
    "CK-C002",
    family="completeness",
    severity=WARNING,
    title="training state without a sampler cursor",
    hint="the data order restarts at the beginning of the epoch on resume (samples are replayed) unless the loader is stateless; pass sampler= a ckptkit.capture.resumable.ResumableSampler or a torchdata StatefulDataLoader",
    component="sampler",
)
register_code(
    "CK-C003",
    family="completeness",
    severity=ERROR,
    title="RNG states do not match the recorded world size",
    hint="every rank must save its own RNG state; a resume on the missing ranks starts fresh streams (different dropout and augmentation), so the curve drifts; save from every rank (spec §7), or "
    + ROLLBACK,
    component="rng",
)
register_code(
    "CK-C010",
    family="completeness",
    severity=ERROR,
    title="component claimed present but its bytes are absent",
    hint="the component table says the state is there, but the files or keys that hold it "
    "are missing, unlisted or fail their digests, so a resume would not find it; save "
    "again, or " + ROLLBACK,
)
register_code(
    "CK-C011",
    family="completeness",
    severity=INFO,
    title="checked as a weights-only checkpoint",
    hint="the checkpoint holds model weights and nothing of a training run, so verify "
    "checked it as a weights (inference / fine-tuning) checkpoint; pass --expect training "
    "(expect='training') to require the optimizer, progress and the rest of a resume",
    component="model",
)
register_code(
    "CK-C012",
    family="completeness",
    severity=INFO,
    title="component inferred from structure",
    hint="no key or file name says what this state is; ckptkit recognised it by the shape "
    "of its content (e.g. 'state' and 'param_groups' make an optimizer). Check the guess "
    "with 'ckptkit inspect'; a conventional key (model, optimizer, scheduler, sampler, "
    "rng, step, parallel) makes it certain",
)
register_code(
    "CK-C020",
    family="completeness",
    severity=WARNING,
    title="a component the checkpoint's content implies is absent",
    hint="the state that is saved shows the run used this component (an LR scheduler "
    "writes 'initial_lr' into the optimizer's param groups when it is attached), but its "
    "own state is not in the checkpoint, so a resume starts it over (the schedule from its "
    "first step: warmup replays, or the LR jumps back); save it with the rest "
    "(ckptkit: TrainState(scheduler=...); a torch.save dict: ckpt['lr_scheduler'] = "
    "sched.state_dict()) and save again, or resume from a checkpoint that has it",
)
register_code(
    "CK-C101",
    family="completeness",
    severity=ERROR,
    title="retired: now CK-C001",
    hint="no longer reported: a required component missing from a foreign checkpoint is "
    "CK-C001, as for a native one (the message says what the tool does without it)",
)
register_code(
    "CK-C102",
    family="completeness",
    severity=WARNING,
    title="retired: now CK-C002",
    hint="no longer reported: a foreign checkpoint with optimizer state and no data-loader "
    "position is CK-C002, as a native one",
)
register_code(
    "CK-C103",
    family="completeness",
    severity=WARNING,
    title="training state without RNG state",
    hint="resume runs on fresh RNG streams (dropout, shuffling, augmentation differ); save "
    "torch/numpy/python RNG state per rank (ckptkit.TrainState does; for another tool, "
    "the message says how)",
    component="rng",
)
register_code(
    "CK-C104",
    family="completeness",
    severity=INFO,
    title="content not recognised",
    hint="ckptkit did not map these keys/files to a spec component; rename them to a common key (model, optimizer, scheduler, scaler, step, rng, sampler) or ignore this if they are not resume state",
)
register_code(
    "CK-C105",
    family="completeness",
    severity=WARNING,
    title="data position is a batch count, not the sampler's state",
    hint="the loader saved how many batches it yielded but not its sampler's order, so the "
    "resumed epoch is re-drawn: exact only when the order is a function of (seed, epoch). "
    "Use a seedable sampler (Accelerate: DataLoaderConfiguration(use_seedable_sampler=True)) "
    "and call dl.set_epoch(epoch) every epoch; prove it with 'ckptkit drill' (docs/hf.md)",
    component="sampler",
)
register_code(
    "CK-S001",
    family="consistency",
    severity=ERROR,
    title="optimizer moments missing",
    hint="a resume would restart these parameters' moments from zero (a loss spike and a different trajectory); save the optimizer after it has stepped, or "
    + ROLLBACK,
    component="optimizer",
)
register_code(
    "CK-S002",
    family="consistency",
    severity=ERROR,
    title="optimizer state shape differs from its parameter",
    hint="the optimizer state belongs to another model configuration or is corrupt; resuming would fail in load_state_dict or apply wrong moments; "
    + ROLLBACK,
    component="optimizer",
)
register_code(
    "CK-S003",
    family="consistency",
    severity=WARNING,
    title="optimizer step and global step disagree",
    hint="one of them came back from another checkpoint or was not saved with the rest: Adam's bias correction, the LR schedule and the data position then disagree on resume; make sure progress (step=) and the optimizer are captured together",
    component="optimizer",
)
register_code(
    "CK-S004",
    family="consistency",
    severity=WARNING,
    title="scheduler position and global step disagree",
    hint="the learning rate after resume follows another point of the schedule (warmup again, or a jump ahead); save the scheduler and progress together, and step the scheduler once per optimizer step (or per epoch)",
    component="scheduler",
)
register_code(
    "CK-S005",
    family="consistency",
    severity=WARNING,
    title="sampler position and global step × global batch disagree",
    hint="on resume the data cursor replays samples already trained on (behind) or skips unseen ones (ahead); capture the sampler and progress in the same save, and count consumed samples per optimizer step. Runs with a batch-size ramp-up can ignore this",
    component="sampler",
)
register_code(
    "CK-S006",
    family="consistency",
    severity=WARNING,
    title="identical RNG states on several ranks",
    hint="ranks that should draw different dropout masks and augmentations resume on the same stream; seed each data-parallel rank differently (seed + rank), and make sure each rank saves its own state rather than a copy of rank 0's. Ignore if every rank is seeded identically on purpose",
    component="rng",
)
register_code(
    "CK-S007",
    family="consistency",
    severity=ERROR,
    title="parallel layout inconsistent",
    hint="the recorded degrees do not describe a valid layout (dp×tp×pp×cp must equal the world size), so shards and RNG streams cannot be mapped back to ranks on resume; pass the real ParallelConfig to TrainState(parallel=...)",
    component="parallel",
)
register_code(
    "CK-S008",
    family="consistency",
    severity=ERROR,
    title="loss scale unusable",
    hint="a resumed fp16 run with this scale skips every step (non-finite or zero scale) or underflows gradients to zero; "
    + ROLLBACK
    + ", or restore with a fresh GradScaler",
    component="scaler",
)
register_code(
    "CK-S009",
    family="consistency",
    severity=ERROR,
    title="FP8 scaling state unusable",
    hint="FP8 casts with a non-finite or zero scale turn activations into NaN or zero after resume; "
    + ROLLBACK,
    component="fp8",
)
register_code(
    "CK-S010",
    family="consistency",
    severity=ERROR,
    title="NaN/Inf in model tensors",
    hint="the model diverged before this save; resuming continues from NaN weights. "
    + ROLLBACK
    + " (an earlier one: check the loss curve for the first spike)",
    component="model",
)
register_code(
    "CK-S011",
    family="consistency",
    severity=ERROR,
    title="NaN/Inf in optimizer tensors",
    hint="the next optimizer step after resume writes NaN into the weights; "
    + ROLLBACK
    + " (an earlier one), or restart the optimizer state",
    component="optimizer",
)
register_code(
    "CK-S012",
    family="consistency",
    severity=ERROR,
    title="a value the resume guard reads is malformed",
    hint="the checkpoint was edited or damaged where it records its look-ahead or its "
    "scheduler/optimizer state (restore skips it); " + ROLLBACK,
)
register_code(
    "CK-S013",
    family="consistency",
    severity=ERROR,
    title="a saved component cannot be restored as saved",
    hint="the checkpoint was edited or damaged inside its optimizer, scheduler, RNG, "
    "progress, sampler, scaler or fp8 state (a value of the wrong type, out of range, or a "
    "structure load_state_dict would refuse); restore skips it; " + ROLLBACK,
)
register_code(
    "CK-S020",
    family="consistency",
    severity=ERROR,
    title="manifest step differs from its directory",
    hint="this is a copy or rename of another step's checkpoint, not a checkpoint of the "
    "step its name says; it is never restored or counted as the newest: rename it to the "
    "step its manifest records (step-NNNNNNNN, 8 digits) or remove it",
)
register_code(
    "CK-S021",
    family="consistency",
    severity=WARNING,
    title="second directory for one step",
    hint="the run uses the directory named step-NNNNNNNN (8 digits) and ignores this one: "
    "it is never restored or pruned; compare the two and remove or move out the one you "
    "do not want",
)
register_code(
    "CK-S022",
    family="consistency",
    severity=ERROR,
    title="ranks hold different model/optimizer state",
    hint="every rank of a data-parallel save must hold the same parameters, buffers and "
    "optimizer state (DDP replicas do): register the tensor on every rank (or on none), "
    "build the optimizer after the model is complete, and save again; nothing was written",
    error_class=errors.StateError,
)
register_code(
    "CK-S030",
    family="consistency",
    severity=ERROR,
    title="stability watch state malformed",
    hint="the watch state saved with the checkpoint was edited or damaged (a value of the "
    "wrong type, or one no watch writes: a zero spread, a level past the float range); the "
    "watch starts afresh and warms up again, so health is 'not judged' for its warm-up. "
    "Nothing else is lost; if it recurs, roll back to the previous verified checkpoint",
    component="progress",
)
register_code(
    "CK-S031",
    family="consistency",
    severity=ERROR,
    title="recovery record malformed",
    hint="the record of automatic recoveries (a manifest's 'recoveries', or an entry of the "
    "run's .ckptkit-recoveries.json) holds a value of the wrong type or out of range (an LR "
    "scale that is not a number in (0, 1], a data skip without its step or cursor): the "
    "checkpoint or log was edited or damaged. Restore skips such a checkpoint; "
    + ROLLBACK,
    component="progress",
)
register_code(
    "CK-R001",
    family="compat",
    severity=WARNING,
    title="software environment changed",
    hint="resume with the versions of the save for an exact continuation; otherwise expect the drift the message names and watch the first steps after resume",
    component="env",
)
register_code(
    "CK-R002",
    family="compat",
    severity=WARNING,
    title="parallel layout changed",
    hint="launch with the saved layout for an exact resume; a deliberate change needs resharded model/optimizer state and a sampler that can re-split the epoch (ckptkit.capture.resumable.ResumableSampler)",
    component="parallel",
)
register_code(
    "CK-R003",
    family="compat",
    severity=WARNING,
    title="data identity changed",
    hint="resume on the saved data snapshot and tokenizer; if the change is deliberate, expect a step in the loss curve and treat the resume as a new run segment",
    component="data",
)
register_code(
    "CK-R010",
    family="compat",
    severity=ERROR,
    title="the run does not fit the checkpoint",
    hint="the checkpoint is fine but this run differs from the one that wrote it (a "
    "component it passes is not saved, or the model's keys, shapes or dtypes differ); an "
    "older checkpoint of the run would not fit either, so restore stops here. Build the run "
    "as it was saved, or restore with strict=False and read what was not restored",
)
register_code(
    "CK-R011",
    family="compat",
    severity=ERROR,
    title="checkpoint of another kind",
    hint="this checkpoint was not written for a run like this one (a plain ckptkit.save "
    "directory, or model/optimizer stored with DCP for a run that does not use DCP); "
    "restore skips it and takes an older one; restore it with the matching TrainState "
    "(storage='dcp') or read it with ckptkit.load",
)
register_code(
    "CK-R012",
    family="compat",
    severity=ERROR,
    title="signed run: a writer without its key is refused",
    hint="open the run with its key (key=, --key-file, CKPTKIT_HMAC_KEY or "
    "CKPTKIT_HMAC_KEY_FILE); a run saved with a key stays signed, and a writer without it "
    "(or with another key) could neither sign its saves nor be trusted to rotate; to sign "
    "with a new key, start a new run directory",
    error_class=errors.SignatureError,
)
register_code(
    "CK-D001",
    family="drill",
    severity=WARNING,
    title="resume guard: step label differs",
    hint="restore progress (TrainState step=) and do not reset the step counter after restore",
    component="progress",
)
register_code(
    "CK-D002",
    family="drill",
    severity=WARNING,
    title="resume guard: next sample ids differ",
    hint="the data order did not come back: restore the sampler (pass sampler= to TrainState) and do not rebuild or re-seed it after restore",
    component="sampler",
)
register_code(
    "CK-D003",
    family="drill",
    severity=WARNING,
    title="resume guard: learning rate differs",
    hint="restore the scheduler (pass scheduler=) and do not step it or change param-group LRs after restore",
    component="scheduler",
)
register_code(
    "CK-D004",
    family="drill",
    severity=WARNING,
    title="resume guard: loss scale differs",
    hint="restore the GradScaler (pass scaler=)",
    component="scaler",
)
register_code(
    "CK-D005",
    family="drill",
    severity=WARNING,
    title="resume guard: optimizer step count differs",
    hint="restore the optimizer state (pass optimizer=); a fresh optimizer has empty Adam moments",
    component="optimizer",
)
register_code(
    "CK-D006",
    family="drill",
    severity=WARNING,
    title="resume guard: RNG state differs",
    hint="do not seed after restore; TrainState restores every generator (Python, NumPy, torch CPU/CUDA) per rank",
    component="rng",
)
register_code(
    "CK-D007",
    family="drill",
    severity=WARNING,
    title="resume guard: probe loss differs",
    hint="the weights are not what was saved (model not restored, restored into another architecture, or changed after restore)",
    component="model",
)
register_code(
    "CK-D008",
    family="drill",
    severity=WARNING,
    title="resume guard: RNG drawn between restore and the first step",
    hint="draw nothing from the global generators between mgr.restore() and the first step: "
    "give the DataLoader a generator= (or iterate it with ResumableSampler.batches), seed "
    "before restoring, not after",
    component="rng",
)
register_code(
    "CK-D009",
    family="drill",
    severity=WARNING,
    title="resume guard: the data loader cannot resume its order exactly",
    hint="give the StatefulDataLoader's sampler a generator of its own "
    "(sampler=RandomSampler(ds, generator=g1)) and the loader another (generator=g2)",
    component="sampler",
)
register_code(
    "CK-D090",
    family="drill",
    severity=WARNING,
    title="resume guard: the DataLoader workers' RNG differs after a mid-epoch resume",
    hint="draw augmentation from a generator seeded by the sample (in __getitem__: "
    "g = torch.Generator().manual_seed(seed * 1_000_003 + index), then torch.rand(..., "
    "generator=g)), or resume at epoch boundaries, or use num_workers=0: the workers' "
    "streams depend on where each worker was in the epoch, which no checkpoint can restore",
    component="rng",
)
register_code(
    "CK-D091",
    family="drill",
    severity=WARNING,
    title="resume guard: the first step trains objects that were not restored",
    hint="build the model and optimizer once, pass them to TrainState, restore, and train "
    "those very objects: a model or optimizer built after mgr.restore() starts from scratch",
    component="model",
)
register_code(
    "CK-D092",
    family="drill",
    severity=WARNING,
    title="resume guard: model weights changed between the restore and the first step",
    hint="change nothing in the model between mgr.restore() and the first step: load other "
    "weights (pretrained, a frozen part) and cast the model before the restore, or save "
    "the model as it trains",
    component="model",
)
register_code(
    "CK-D010",
    family="drill",
    severity=ERROR,
    title="automatic recovery refused: a limit was reached",
    hint="the instability came back after the recoveries allowed (or too soon after the last "
    "one): a lower LR only postponed it. Find the cause before resuming: the recovery records "
    "('ckptkit ls RUN') name the signals, the checkpoints set aside and the skipped samples",
    component="progress",
    error_class=errors.RecoveryError,
)
register_code(
    "CK-D011",
    family="drill",
    severity=ERROR,
    title="automatic recovery failed",
    hint="no healthy checkpoint could be restored (none saved with health ok, or every one "
    "failed to read), or a recovery action raised; the run stops where it failed. Save "
    "checkpoints with a StabilityWatch attached before the instability begins",
    component="progress",
    error_class=errors.RecoveryError,
)
