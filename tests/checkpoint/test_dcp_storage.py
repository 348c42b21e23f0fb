"""``ckptkit.dcp``: DCP's own save/load calls with ckptkit's writer and reader.

A world of one here (two gloo ranks: ``distributed/test_dcp_ranks.py``). Every refusal is
checked three ways a user meets it: ``ckptkit.dcp.load``, plain ``dcp.load`` with the
reader (DCP wraps the error in its ``CheckpointException``), and ``ckptkit.dcp.check``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hostile_dcp import fresh, train_state
from torch.distributed.checkpoint.api import CheckpointException

import ckptkit.checkpoint.dcp
import ckptkit.checkpoint.lookahead
from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format.digest import hexdigest_bytes
from ckptkit.storage import dcp_write, digest

pytestmark = pytest.mark.integration

KEY = b"a-key-of-sixteen-bytes-or-more"


def plain_load(sd: dict[str, Any], path: Path, **kw: Any) -> None:
    with warnings.catch_warnings():  # DCP: no process group, "a single process"
        warnings.simplefilter("ignore")
        dcp.load(sd, storage_reader=ckptkit.dcp.Reader(path, **kw))


def listed(path: Path) -> dict[str, dict[str, Any]]:
    man = ckptkit.dcp.read_manifest(path)
    return {f["path"]: f for f in man.user["adopted"]["files"]}


def test_writer_hashes_in_the_same_pass_and_commits_the_manifest_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real = dcp_write.HashingFileSystem.create_stream

    def spy(self: Any, path: Any, mode: str) -> Any:
        opened.append(mode)
        return real(self, path, mode)

    def no_read_back(*a: Any, **k: Any) -> Any:
        raise AssertionError("the writer read a file back to hash it")

    monkeypatch.setattr(dcp_write.HashingFileSystem, "create_stream", spy)
    monkeypatch.setattr(digest, "hash_file", no_read_back)
    d = tmp_path / "step-7"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(train_state(), storage_writer=ckptkit.dcp.Writer(d, step=7))
    monkeypatch.undo()

    assert opened and set(opened) == {"wb"}  # every file written once, none read
    files = listed(d)
    assert set(files) == {".metadata", "__0_0.distcp"}
    for name, f in files.items():
        assert digest.hash_file(d / name) == (f["xxh3_128"], f["size"])
    man = ckptkit.dcp.read_manifest(d)
    assert man.step == 7 and man.user["adopted"]["writer"] == ckptkit.dcp.WRITER
    assert (d / ckptkit.dcp.MANIFEST_NAME).stat().st_mtime_ns >= (d / ".metadata").stat().st_mtime_ns
    assert sorted(os.listdir(d)) == [".metadata", "__0_0.distcp", ckptkit.dcp.MANIFEST_NAME]


def test_reader_loads_tensors_and_values_without_an_unrestricted_unpickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = train_state()
    ckptkit.dcp.save(src, tmp_path / "c", step=7)
    calls: list[Any] = []
    real = torch.load

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(k.get("weights_only"))
        return real(*a, **k)

    monkeypatch.setattr(torch, "load", spy)
    for load in (lambda sd: plain_load(sd, tmp_path / "c"), lambda sd: ckptkit.dcp.load(sd, tmp_path / "c")):
        got = fresh()
        load(got)
        assert got["step"] == 7
        assert torch.equal(got["model"]["weight"], src["model"]["weight"])
        assert torch.equal(got["optim"]["state"][0]["exp_avg"], src["optim"]["state"][0]["exp_avg"])
        assert got["optim"]["param_groups"][0]["lr"] == 1e-3
    assert calls and all(w is True for w in calls)


def test_async_save_commits_when_done(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # raised in DCP's background thread, no process group
        ckptkit.dcp.async_save(train_state(), tmp_path / "a", step=9).result()
    assert ckptkit.dcp.check(tmp_path / "a").step == 9
    got = fresh()
    ckptkit.dcp.load(got, tmp_path / "a")
    assert got["step"] == 7


def test_a_writer_sent_to_another_process_still_hashes_and_commits(tmp_path: Path) -> None:
    """DCP's process-based async save (torchtitan's ``async_with_pinned_mem``) pickles the
    storage writer into its worker; unpickling it recursed forever (``RecursionError``)."""
    writer = pickle.loads(pickle.dumps(ckptkit.dcp.Writer(tmp_path / "p", step=3)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(train_state(), storage_writer=writer)
    assert ckptkit.dcp.check(tmp_path / "p").step == 3


def test_a_dcp_save_records_the_look_ahead_verify_reads(tmp_path: Path) -> None:
    """A DCP save records the look-ahead of its step (the resume guard's record, in the
    manifest field the native path writes); verify reads it as the native one's."""
    d = tmp_path / "step-3"
    ckptkit.dcp.save(train_state(), d, step=3)
    guard = ckptkit.dcp.read_manifest(d).lookahead["guard"]
    assert guard["next_step"] == 4 and isinstance(guard["rng"], str)
    assert ckptkit.verify(d).ok

    # What an integration gives (its optimizer's LR) is what the manifest holds, and verify
    # checks it as the guard will read it: a value of the wrong type is CK-S012.
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.25)
    given = ckptkit.checkpoint.lookahead.record(step=5, model=model, optimizer=opt)
    ckptkit.dcp.save(train_state(), tmp_path / "step-5", step=5, lookahead=given)
    assert ckptkit.dcp.read_manifest(tmp_path / "step-5").lookahead["guard"]["lr"] == [0.25]
    bad = {"guard": {**given["guard"], "lr": "fast"}}
    ckptkit.dcp.save(train_state(), tmp_path / "step-6", step=6, lookahead=bad)
    assert codes.S012 in {f.code for f in ckptkit.verify(tmp_path / "step-6").reports[0].findings}


def _flip(p: Path, at: float = 0.5) -> None:
    data = bytearray(p.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 100])


def _unparsable_item(p: Path) -> None:
    """Damage the zip directory of the last tensor item: ``torch.load`` fails on it before
    the shard's last byte is read, so only the digest can say what happened."""
    data = bytearray(p.read_bytes())
    end = data.rindex(b"PK\x05\x06")  # the end-of-central-directory record
    data[end : end + 4] = b"XXXX"
    p.write_bytes(bytes(data))


def _hostile_metadata(d: Path) -> None:
    """Someone rewrites ``.metadata`` with a pickle that runs code, and the (unsigned)
    manifest to match: the digests agree, the unpickler still refuses."""

    class Boom:
        def __reduce__(self) -> Any:
            return (os.system, ("touch " + str(d / "PWNED"),))

    blob = pickle.dumps(Boom())
    (d / ".metadata").write_bytes(blob)
    files = {n: (f["xxh3_128"], f["size"]) for n, f in listed(d).items()}
    files[".metadata"] = (hexdigest_bytes(blob), len(blob))
    ckptkit.dcp.commit(d, files, step=7)


DAMAGE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "flipped shard": (lambda d: _flip(d / "__0_0.distcp"), codes.F003, "__0_0.distcp"),
    "truncated shard": (lambda d: _truncate(d / "__0_0.distcp"), codes.F002, "__0_0.distcp"),
    "missing shard": (lambda d: (d / "__0_0.distcp").unlink(), codes.F001, "__0_0.distcp"),
    "a damaged item torch.load cannot parse": (
        lambda d: _unparsable_item(d / "__0_0.distcp"), codes.F003, "__0_0.distcp"
    ),
    "flipped metadata": (lambda d: _flip(d / ".metadata"), codes.F003, ".metadata"),
    "no manifest (save cut after .metadata)": (
        lambda d: (d / ckptkit.dcp.MANIFEST_NAME).unlink(),
        codes.M001,
        ckptkit.dcp.MANIFEST_NAME,
    ),
    "metadata that runs code": (_hostile_metadata, codes.F023, ".metadata"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_or_incomplete_checkpoint_is_refused_with_its_code(
    tmp_path: Path, case: str
) -> None:
    d = tmp_path / "c"
    ckptkit.dcp.save(train_state(), d, step=7)
    damage, code, where = DAMAGE[case]
    damage(d)
    with pytest.raises(CkptkitError) as e:
        ckptkit.dcp.load(fresh(), d)
    assert e.value.code == code and str(e.value.path).endswith(where)
    with pytest.raises(CkptkitError) as e:
        ckptkit.dcp.check(d)
    assert e.value.code == code
    reader = ckptkit.dcp.Reader(d)
    with pytest.raises(CheckpointException) as ce, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(fresh(), storage_reader=reader)
    assert code in str(ce.value)  # DCP's exception names the finding
    if reader.refusal is not None:  # refused before any shard was read
        assert reader.refusal.code == code
    assert not (d / "PWNED").exists()


def test_signed_manifest_needs_the_key(tmp_path: Path) -> None:
    d = tmp_path / "s"
    man = ckptkit.dcp.save(train_state(), d, step=7, key=KEY)
    assert man is not None and man.signature is not None
    assert ckptkit.dcp.check(d, key=KEY).step == 7
    with pytest.raises(CkptkitError) as e:
        ckptkit.dcp.load(fresh(), d, key=b"another-key-of-sixteen-bytes")
    assert e.value.code == codes.M011
    u = tmp_path / "u"
    ckptkit.dcp.save(train_state(), u, step=7)
    with pytest.raises(CkptkitError) as e:
        ckptkit.dcp.check(u, key=KEY)
    assert e.value.code == codes.M010


def test_an_overwrite_cut_short_leaves_no_stale_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "c"
    ckptkit.dcp.save(train_state(), d, step=7)

    def crash(*a: Any, **k: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckptkit.dcp, "commit", crash)
    with pytest.raises(CkptkitError, match="No space left"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
        ckptkit.dcp.save(train_state(seed=1), d, step=8)
    monkeypatch.undo()
    assert (d / ".metadata").exists()  # DCP finished its part ...
    with pytest.raises(CkptkitError) as e:  # ... but the save is not committed
        ckptkit.dcp.load(fresh(), d)
    assert e.value.code == codes.M001


def test_object_store_round_trip_and_refusal(s3_run: str) -> None:
    import fsspec

    url = s3_run + "/step-3"
    src = train_state()
    man = ckptkit.dcp.save(src, url, step=3)
    assert man is not None and man.step == 3
    got = fresh()
    assert ckptkit.dcp.load(got, url).step == 3
    assert torch.equal(got["model"]["weight"], src["model"]["weight"]) and got["step"] == 7

    s3 = fsspec.filesystem("s3")
    s3.invalidate_cache()
    shard = url + "/__0_0.distcp"
    data = bytearray(s3.cat_file(shard))
    data[len(data) // 2] ^= 0x01
    s3.pipe_file(shard, bytes(data))
    with pytest.raises(CkptkitError) as e:
        ckptkit.dcp.load(fresh(), url)
    assert e.value.code == codes.F003


def test_cli_verify_and_load_understand_a_dcp_directory_with_a_manifest(tmp_path: Path) -> None:
    d = tmp_path / "step-7"
    ckptkit.dcp.save(train_state(), d, step=7)
    env = {**os.environ, "CKPTKIT_NO_PROGRESS": "1"}

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ckptkit", "verify", str(d), "--json"],
            capture_output=True, text=True, timeout=120, env=env,
        )

    report = ckptkit.verify(d)  # the clean case in process; the CLI for the damaged one
    assert report.ok and [(r.format, r.step) for r in report.reports] == [("dcp", 7)]
    _flip(d / "__0_0.distcp")
    bad = verify()
    assert bad.returncode == 1
    assert codes.F003 in {f["code"] for f in json.loads(bad.stdout)["reports"][0]["findings"]}

    # ckptkit.load is the wrong reader for it, and says which one is right.
    with pytest.raises(CkptkitError) as e:
        ckptkit.load(d)
    assert "ckptkit.dcp.load" in str(e.value)


def _bytes_read() -> int:
    """Bytes this process has read through ``read``/``pread`` so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_verify_reads_each_byte_of_a_dcp_directory_once(tmp_path: Path) -> None:
    """``ckptkit verify`` scans the values and checks the manifest's digests in one read of
    each shard (it used to read every shard twice: the value scan, then the digests)."""
    d = tmp_path / "step-1"
    ckptkit.dcp.save({"model": {"w": torch.randn(1 << 20)}, "step": 1}, d, step=1)
    ckptkit.verify(d)  # imports and first-call reads paid
    size = sum(p.stat().st_size for p in d.iterdir() if p.suffix == ".distcp")
    before = _bytes_read()
    report = ckptkit.verify(d)
    read = _bytes_read() - before
    assert not [f for f in report.reports[0].findings if f.code.startswith("CK-F")]
    assert size <= read < 1.5 * size, (read, size)
    _flip(d / "__0_0.distcp")  # the digests read in that pass are the ones compared
    codes_found = {f.code for f in ckptkit.verify(d).reports[0].findings}
    assert codes.F003 in codes_found
