"""``storage.dcp.Shard``: one read of a DCP file, every byte hashed once, in file order.

The reader of a load (``torch.load`` parsing each item) reads where it likes: the zip
directory at an item's end first, headers, then the data. Whatever the order, the digest
must be the file's, the bytes handed out must be the file's, and no byte may be read many
times over.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from ckptkit import codes
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format.digest import hexdigest_bytes
from ckptkit.storage import dcp_shard, fs


def _counting(data: bytes) -> tuple[dcp_shard.Shard, list[int]]:
    """A shard over ``data`` that counts the bytes it reads from its source."""
    read: list[int] = [0]

    def read_at(pos: int, dst: memoryview) -> int:
        n = max(0, min(len(dst), len(data) - pos))
        dst[:n] = data[pos : pos + n]
        read[0] += n
        return n

    return dcp_shard.Shard(read_at, len(data), rel="__0_0.distcp"), read


def _entry(data: bytes) -> mf.FileEntry:
    return mf.FileEntry(path="__0_0.distcp", size=len(data), xxh3_128=hexdigest_bytes(data))


@pytest.mark.parametrize("seed", range(6))
def test_any_read_order_gives_the_files_bytes_and_digest(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dcp_shard, "SHARD_CHUNK", 4096)  # many chunks per read
    monkeypatch.setattr(dcp_shard, "READ_GAP", 512)
    rng = random.Random(seed)
    data = rng.randbytes(200_000)
    shard, read = _counting(data)
    asked = 0
    for _ in range(40):
        pos = rng.randrange(len(data))
        n = rng.choice([1, 30, 600, 5000, 50_000])
        buf = bytearray(n)
        got = shard.read_into(pos, memoryview(buf))
        assert got == min(n, len(data) - pos)
        assert bytes(buf[:got]) == data[pos : pos + got]
        asked += got
    shard.verify(_entry(data))  # raises on a wrong digest
    assert read[0] <= asked + len(data)  # a byte read ahead is read again once, at most


def test_an_item_read_as_torch_load_reads_it_is_hashed_in_the_same_pass() -> None:
    """The order ``torch.load`` reads a ``torch.save`` blob: the directory at the end
    first, then the headers and records from the front. Only the directory, read ahead of
    the hashed prefix, is read a second time."""
    data = os.urandom(100_000)
    shard, read = _counting(data)
    item = shard.item(0, len(data))
    item.seek(-2000, os.SEEK_END)
    assert item.read(2000) == data[-2000:]
    item.seek(0)
    assert item.read(64) == data[:64]
    item.seek(640)  # past a small gap: the gap is hashed, the read follows
    assert item.read() == data[640:]
    shard.verify(_entry(data))
    assert read[0] == len(data) + 2000


def test_a_changed_byte_is_a_digest_mismatch() -> None:
    data = os.urandom(10_000)
    shard, _ = _counting(data)
    shard.read_into(0, memoryview(bytearray(5000)))
    bad = mf.FileEntry(path="__0_0.distcp", size=len(data), xxh3_128="0" * 32)
    with pytest.raises(CkptkitError) as e:
        shard.verify(bad)
    assert e.value.code == codes.F003


def test_a_file_cut_short_while_it_is_read_is_refused_not_a_crash(tmp_path: Path) -> None:
    """Another process truncates the shard while it is loaded (a save overwriting the
    step): a memory map would die of SIGBUS here; the read is refused with ``CK-F002``."""
    p = tmp_path / "__0_0.distcp"
    data = os.urandom(1 << 20)
    p.write_bytes(data)
    with dcp_shard.open_shard(fs.location(p), rel=p.name, expected_size=len(data)) as shard:
        os.truncate(p, len(data) // 2)
        with pytest.raises(CkptkitError) as e:
            shard.read_into(0, memoryview(bytearray(len(data))))
    assert e.value.code == codes.F002 and str(e.value.path) == p.name


def test_the_manifests_size_is_checked_before_any_read(tmp_path: Path) -> None:
    p = tmp_path / "__0_0.distcp"
    p.write_bytes(b"x" * 100)
    with (
        pytest.raises(CkptkitError) as e,
        dcp_shard.open_shard(fs.location(p), rel=p.name, expected_size=101),
    ):
        pass
    assert e.value.code == codes.F002
