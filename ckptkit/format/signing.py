"""Authenticated checkpoints: an optional HMAC-SHA256 over a manifest's canonical content.

Digests prove the bytes are the ones the manifest lists (rot, truncation, partial
writes); anyone who can write the directory can also rewrite the manifest and its
digests. A signature made with a key the writer of the directory does not hold proves
the manifest, and through its digests every file, came from a key holder. See
docs/security.md for the threat model.

The key comes from the ``key=`` argument (or the CLI's ``--key-file``), else from the
environment: ``CKPTKIT_HMAC_KEY`` (the key itself) or ``CKPTKIT_HMAC_KEY_FILE`` (a file
holding it); :func:`resolve_key` is the one place that looks. A key is at least
:data:`MIN_KEY_BYTES` bytes; surrounding whitespace of a key file or variable is ignored
(``echo $KEY > file`` adds a newline). A variable that is set but empty, or an empty key
file, is an error, never "no key": signatures are off only when nothing names a key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptkit.errors import CkptkitError

ALG = "hmac-sha256"
"""The only signature algorithm (the ``signature.alg`` field)."""
ENV_KEY = "CKPTKIT_HMAC_KEY"
"""Environment variable holding the key itself (UTF-8 text)."""
ENV_KEY_FILE = "CKPTKIT_HMAC_KEY_FILE"
"""Environment variable naming a file that holds the key."""
MIN_KEY_BYTES = 16
"""Shorter keys are refused: an HMAC is only as strong as its key."""
_MAC_CONTEXT = b"ckptkit manifest v1\x00"
_VERDICT_CONTEXT = b"ckptkit run-index verdict v1\x00"
"""A verdict record's MAC is made in its own context: it can never pass as a manifest's."""
_ID_CONTEXT = b"ckptkit key id v1"
_GENERATE = "python -c 'import secrets; print(secrets.token_hex(32))'"

KeyLike = bytes | str


@dataclass(frozen=True)
class Signature:
    """The ``signature`` field of a manifest."""

    key_id: str
    """First 16 hex digits of an HMAC of a constant under the key: names the key (to tell
    "signed with another key" from "changed after signing") without revealing it."""
    mac: str
    """HMAC-SHA256 (hex) of the manifest's canonical content under the key."""
    alg: str = ALG

    def to_dict(self) -> dict[str, str]:
        return {"alg": self.alg, "key_id": self.key_id, "mac": self.mac}

    @classmethod
    def from_dict(cls, d: Any) -> Signature:
        return cls(key_id=d["key_id"], mac=d["mac"], alg=d["alg"])


def _as_key(key: KeyLike, *, source: str, unset: str | None = None) -> bytes:
    """``key`` as key bytes (surrounding whitespace dropped), refused when too short.

    ``unset``: how to stop giving this key (a variable to unset, an option to drop): an
    empty key is a configuration slip (``export CKPTKIT_HMAC_KEY=$UNSET_VAR``, a key file
    not written yet), never a request to turn signatures off, so the fix names both ways out.
    """
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    raw = raw.strip()
    if not raw:
        ways = f"put a key in it, or {unset} to work without signatures" if unset else (
            "pass a key, or None to work without signatures"
        )
        raise CkptkitError(
            f"the HMAC key from {source} is empty; an empty key does not turn signatures off",
            hint=f"{ways} (generate a key with: {_GENERATE})",
        )
    if len(raw) < MIN_KEY_BYTES:
        raise CkptkitError(
            f"HMAC key from {source} is {len(raw)} bytes; at least {MIN_KEY_BYTES} are needed",
            hint=f"generate one with: {_GENERATE}",
        )
    return raw


def key_from_file(path: Path | str, *, unset: str | None = None) -> bytes:
    """Read a key file (surrounding whitespace ignored).

    Args:
        path: the key file.
        unset: how the caller stops naming this file (for the fix of an empty one), e.g.
            ``"unset CKPTKIT_HMAC_KEY_FILE"``; default: drop ``--key-file``.

    Raises:
        CkptkitError: the file cannot be read, is empty, or holds a key that is too short.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "k"; _ = p.write_text("0123456789abcdef\\n")
        >>> key_from_file(p)
        b'0123456789abcdef'
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CkptkitError(
            f"cannot read the HMAC key file ({e.strerror or e})",
            path=path,
            hint=f"point --key-file or {ENV_KEY_FILE} at a readable file holding the key",
        ) from None
    return _as_key(data, source=f"the key file {path}", unset=unset or "drop --key-file")


def resolve_key(
    key: KeyLike | None = None, *, key_file: Path | str | None = None
) -> bytes | None:
    """Return the key to sign and check with: ``key`` or ``key_file`` if given, else the
    environment's.

    The one place a key is looked up: the library's ``key=`` arguments, the CLI's
    ``--key-file`` and the environment all come through here, so an empty or short key is
    refused the same way everywhere.

    Args:
        key: the key (bytes, or text taken as UTF-8); None looks at ``key_file``, then at
            ``CKPTKIT_HMAC_KEY`` and ``CKPTKIT_HMAC_KEY_FILE``.
        key_file: a file holding the key (``--key-file``); ignored when ``key`` is given.

    Returns:
        The key bytes, or None when no key is configured (checkpoints are then neither
        signed nor required to be).

    Raises:
        CkptkitError: the key is empty or too short, both variables are set, a variable is
            set but empty, or the file is unreadable. A variable that is set always means
            "check signatures": an empty one is an error naming it, never "no key".

    Example:
        >>> resolve_key("correct horse battery staple")
        b'correct horse battery staple'
    """
    if key is not None:
        return _as_key(key, source="the key argument")
    if key_file is not None:
        return key_from_file(key_file)
    text, file = os.environ.get(ENV_KEY), os.environ.get(ENV_KEY_FILE)
    if text is not None and file is not None:
        raise CkptkitError(
            f"both {ENV_KEY} and {ENV_KEY_FILE} are set",
            hint="set only one of them",
        )
    if text is not None:
        return _as_key(text, source=ENV_KEY, unset=f"unset {ENV_KEY}")
    if file is not None:
        if not file.strip():
            raise CkptkitError(
                f"{ENV_KEY_FILE} is set but empty; an empty variable does not turn "
                "signatures off",
                hint=f"set it to the path of the key file, or unset {ENV_KEY_FILE} to work "
                "without signatures",
            )
        return key_from_file(file, unset=f"unset {ENV_KEY_FILE}")
    return None


def key_id(key: bytes) -> str:
    """Return the public name of ``key`` (16 hex digits; does not reveal the key).

    Example:
        >>> len(key_id(b"0123456789abcdef"))
        16
    """
    return hmac.new(key, _ID_CONTEXT, hashlib.sha256).hexdigest()[:16]


def sign(content: bytes, key: bytes) -> Signature:
    """Sign canonical manifest content.

    Example:
        >>> s = sign(b"{}", b"0123456789abcdef")
        >>> s.alg, len(s.mac)
        ('hmac-sha256', 64)
    """
    mac = hmac.new(key, _MAC_CONTEXT + content, hashlib.sha256).hexdigest()
    return Signature(key_id=key_id(key), mac=mac)


def check(content: bytes, signature: Signature | None, key: bytes) -> str | None:
    """Return None if ``signature`` is a valid signature of ``content`` under ``key``, else why not.

    The comparison is constant-time (``hmac.compare_digest``).

    Example:
        >>> k = b"0123456789abcdef"
        >>> check(b"{}", sign(b"{}", k), k) is None
        True
        >>> check(b"{ }", sign(b"{}", k), k)
        'the manifest changed after it was signed (the signature does not match its content)'
    """
    if signature is None:
        return "unsigned"
    if signature.alg != ALG:
        return f"signed with an unknown algorithm {signature.alg!r}"
    want = sign(content, key)
    if hmac.compare_digest(want.mac, signature.mac):
        return None
    if signature.key_id != want.key_id:
        return (
            f"signed with another key (key id {signature.key_id}; the key given has id "
            f"{want.key_id})"
        )
    return "the manifest changed after it was signed (the signature does not match its content)"


def _verdict_content(name: str, record: Mapping[str, Any]) -> bytes:
    """What a verdict MAC covers: the checkpoint's name and every field but the MAC."""
    body = {k: v for k, v in record.items() if k != "mac"}
    return json.dumps([name, body], sort_keys=True, separators=(",", ":")).encode()


def sign_verdict(name: str, record: Mapping[str, Any], key: bytes) -> str:
    """Return the MAC (hex) of a run-index verdict ``record`` about checkpoint ``name``.

    The run index records what verify and restore found (``verified``, ``corrupt``,
    ``unreadable``) for a manifest digest; with a key, each record carries this MAC so
    that whoever can write the run directory cannot plant a verdict.

    Example:
        >>> len(sign_verdict("step-00000001", {"digest": "ab", "outcome": "verified"},
        ...                  b"0123456789abcdef"))
        64
    """
    return hmac.new(key, _VERDICT_CONTEXT + _verdict_content(name, record), hashlib.sha256).hexdigest()


def check_verdict(name: str, record: Mapping[str, Any], key: bytes) -> str | None:
    """Return None if ``record`` carries a valid MAC under ``key`` for ``name``, else why not.

    Example:
        >>> k = b"0123456789abcdef"
        >>> rec = {"digest": "ab", "outcome": "corrupt"}
        >>> check_verdict("step-1", {**rec, "mac": sign_verdict("step-1", rec, k)}, k) is None
        True
        >>> check_verdict("step-1", rec, k)
        'unsigned'
    """
    mac = record.get("mac")
    if not isinstance(mac, str):
        return "unsigned"
    if hmac.compare_digest(sign_verdict(name, record, key), mac):
        return None
    return "its MAC does not match (written with another key, or edited after it was signed)"
