"""The one classifier of failed reads (``ckptkit.codes.transient``), the outcome of a
check, and signed verdicts in the run index (issue 23, item 3)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptkit import codes
from ckptkit.checkpoint.catalog import INDEX, Catalog
from ckptkit.errors import IntegrityError, UnreadableError
from ckptkit.format import signing
from ckptkit.run.rotation import CkptInfo, plan

KEY = b"0123456789abcdef0123"


@pytest.mark.parametrize(
    "name",
    ["EACCES", "EPERM", "EIO", "EMFILE", "ENFILE", "ESTALE", "ETIMEDOUT", "EAGAIN", "ENOMEM",
     "EINTR", "EBUSY", "ECONNRESET", "EREMOTEIO"],
)
def test_errors_that_are_not_damage(name: str) -> None:
    e = OSError(getattr(errno, name), name)
    assert codes.transient(e)
    err = codes.read_error(e, path="model.safetensors")
    assert isinstance(err, UnreadableError) and err.code == "CK-F025"
    assert "now" in err.what and err.path is not None


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        OSError(errno.EISDIR, "Is a directory"),
        OSError(errno.EINVAL, "Invalid argument"),
        OSError("short read at byte 8 (0 of 64)"),  # a truncated object: no errno
        ValueError("not a read error at all"),
    ],
)
def test_errors_that_stay_damage(exc: BaseException) -> None:
    assert not codes.transient(exc)
    err = codes.read_error(exc, path="model.safetensors")
    assert isinstance(err, IntegrityError) and err.code == "CK-F004"
    assert codes.read_error(exc, path="x", damage="CK-F002").code == "CK-F002"


def test_object_store_errors_as_s3fs_raises_them() -> None:
    """s3fs turns S3 error codes into built-in exceptions, most without an errno; the
    transport's own errors come through unconverted after its retries."""
    botocore = pytest.importorskip("botocore.exceptions")
    s3errors = pytest.importorskip("s3fs.errors")

    def s3(code: str) -> BaseException:
        err = botocore.ClientError({"Error": {"Code": code, "Message": code}}, "GetObject")
        return s3errors.translate_boto_error(err)

    for code in ("AccessDenied", "ExpiredToken", "RequestTimeout", "SlowDown",
                 "ServiceUnavailable", "InternalError", "503", "500"):
        assert codes.transient(s3(code)), code
    for code in ("NoSuchKey", "404", "InvalidRange"):
        assert not codes.transient(s3(code)), code
    assert codes.transient(botocore.EndpointConnectionError(endpoint_url="http://x"))
    assert codes.transient(botocore.ReadTimeoutError(endpoint_url="http://x"))
    assert codes.transient(botocore.ConnectTimeoutError(endpoint_url="http://x"))
    aiohttp = pytest.importorskip("aiohttp")
    assert codes.transient(aiohttp.ServerDisconnectedError())
    assert codes.transient(aiohttp.ClientPayloadError("Response payload is not completed"))


def test_a_ckptkit_finding_is_never_reclassified() -> None:
    assert not codes.transient(codes.error("CK-F001", "missing", path="a"))
    assert codes.transient(codes.error("CK-F025", "cannot be read now", path="a"))


def test_outcome_damage_decides() -> None:
    assert codes.outcome([]) == "verified"
    assert codes.outcome(["CK-F025", "CK-F025"]) == "unreadable"
    assert codes.outcome(["CK-F025", "CK-F003"]) == "corrupt"
    assert codes.outcome([None]) == "corrupt"


# --- rotation ---------------------------------------------------------------------------


@st.composite
def _with_unreadable(draw: st.DrawFn) -> list[CkptInfo]:
    steps = draw(st.lists(st.integers(0, 100), unique=True, max_size=10))
    out = []
    for s in steps:
        kind = draw(st.sampled_from(["verified", "committed", "corrupt", "unreadable"]))
        out.append(
            CkptInfo(
                step=s,
                size=draw(st.integers(0, 1000)),
                verified=kind == "verified",
                corrupt=kind == "corrupt",
                unreadable=kind == "unreadable",
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(
    _with_unreadable(),
    st.integers(0, 4),
    st.one_of(st.none(), st.integers(0, 3000)),
    st.booleans(),
)
def test_prop_unreadable_is_never_deleted(
    cks: list[CkptInfo], keep_last: int, max_bytes: int | None, delete_corrupt: bool
) -> None:
    p = plan(cks, keep_last=keep_last, max_bytes=max_bytes, delete_corrupt=delete_corrupt)
    for d in p.decisions:
        if d.ckpt.unreadable:
            assert d.keep and "unreadable" in d.reason
            assert f"last {keep_last}" not in d.reason  # not counted as good
    good = [c.step for c in cks if c.good]
    if good:
        assert p.by_step()[max(good)].keep


# --- verdicts in the run index ----------------------------------------------------------


def test_verdict_mac_covers_the_name_and_every_field() -> None:
    rec = {"digest": "ab", "ok": True, "outcome": "verified", "at": 1.5, "problem": None}
    signed = {**rec, "mac": signing.sign_verdict("step-00000001", rec, KEY)}
    assert signing.check_verdict("step-00000001", signed, KEY) is None
    assert signing.check_verdict("step-00000002", signed, KEY) is not None  # moved
    for field, value in (("outcome", "corrupt"), ("ok", False), ("digest", "cd")):
        assert signing.check_verdict("step-00000001", {**signed, field: value}, KEY)
    assert signing.check_verdict("step-00000001", signed, b"another key 0123456") is not None
    # a manifest MAC of the same bytes is no verdict MAC (its own context)
    assert signing.sign(b"x", KEY).mac != signing.sign_verdict("x", {}, KEY)


def test_catalog_records_and_reads_signed_verdicts(tmp_path: Path) -> None:
    cat = Catalog(tmp_path, key=KEY)
    cat.note("step-00000001", "ab", "unreadable", why="CK-F025 cannot be read now")
    rec = json.loads((tmp_path / INDEX).read_text())["verified"]["step-00000001"]
    assert rec["outcome"] == "unreadable" and rec["ok"] is False and isinstance(rec["mac"], str)
    v = cat.verdict("step-00000001", "ab", rec)
    assert v.outcome == "unreadable" and v.problem == "CK-F025 cannot be read now"
    assert cat.verdict("step-00000001", "other digest", rec).outcome is None
    forged = {**rec, "outcome": "corrupt"}
    v = cat.verdict("step-00000001", "ab", forged)
    assert v.outcome is None and "does not count" in (v.problem or "")
    # without a key, records are read as written; an old boolean record still reads
    plain = Catalog(tmp_path)
    assert plain.verdict("step-00000001", "ab", forged).outcome == "corrupt"
    assert plain.verdict("s", "ab", {"digest": "ab", "ok": True}).outcome == "verified"
    assert plain.verdict("s", "ab", {"digest": "ab", "ok": False}).outcome == "corrupt"
    assert plain.verdict("s", "ab", {"digest": "ab", "ok": "yes"}).outcome is None
