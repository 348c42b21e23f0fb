"""``ckptkit.storage.dcp_meta.Listed`` and who checks the shards a load did not read.

A restoring rank's manifest may hold the entries of some ranks only; the DCP load asks
for the entry of each file its plan reads, and the rank manifest listing it is read then
(``Manifest.entry``). Every listed shard is checked by one rank: the rank that wrote it,
modulo the world size, so at the saved size a rank checks the file its own plan read.
The gloo run is ``tests/checkpoint/test_rank_manifests.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ckptkit.format import manifest as mf
from ckptkit.storage import dcp_engine as dcp
from ckptkit.storage import dcp_meta, fs


def _listed(asked: list[str], writers: dict[str, int] | None) -> dcp_meta.Listed:
    names = [f"__{r}_0.distcp" for r in range(12)] + [dcp_meta.METADATA]

    def entry(name: str) -> mf.FileEntry:
        asked.append(name)
        return mf.FileEntry(f"dcp/{name}", 3, "0" * 32)

    return dcp_meta.Listed(dict.fromkeys(names, 3), entry, writers)


def test_sizes_need_no_entry_and_an_entry_is_asked_for_once_used() -> None:
    asked: list[str] = []
    listed = _listed(asked, None)
    assert len(listed) == 13 and "__11_0.distcp" in listed and "__12_0.distcp" not in listed
    assert listed.sizes["__3_0.distcp"] == 3 and asked == []
    assert listed["__3_0.distcp"].path == "dcp/__3_0.distcp" and asked == ["__3_0.distcp"]
    with pytest.raises(KeyError):
        listed["__12_0.distcp"]
    assert listed.get("__12_0.distcp") is None and asked == ["__3_0.distcp"]


@pytest.mark.parametrize("world", [12, 5])
def test_each_unread_shard_is_checked_by_its_writer_modulo_the_world(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, world: int
) -> None:
    checked: dict[int, list[str]] = {}
    writers = {f"__{r}_0.distcp": r for r in range(12)} | {dcp_meta.METADATA: 0}
    for rank in range(world):
        asked: list[str] = []
        mine = checked.setdefault(rank, [])
        monkeypatch.setattr(dcp, "check_file", lambda p, fe, rel, mine=mine: mine.append(p.name))
        reader = SimpleNamespace(checked={f"__{rank}_0.distcp"})  # its plan read its own
        dcp.check_unread(reader, fs.location(tmp_path), _listed(asked, writers), rank=rank, world=world)
        assert sorted(asked) == sorted(mine)  # an entry is read for the files it checks only
    if world == 12:  # the saved size: each rank's plan read its own file, nothing is left
        assert checked == {r: [] for r in range(12)}
    else:
        assert checked[2] == ["__7_0.distcp"]  # written by 7, 7 % 5 == 2; rank 2 read its own
        assert sorted(n for names in checked.values() for n in names) == sorted(
            f"__{r}_0.distcp" for r in range(5, 12)
        )


def test_without_writers_the_shards_go_round_the_ranks_in_name_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[str] = []
    monkeypatch.setattr(dcp, "check_file", lambda p, fe, rel: seen.append(p.name))
    reader = SimpleNamespace(checked=set())
    dcp.check_unread(reader, fs.location(tmp_path), _listed([], None), rank=1, world=5)
    names = sorted(f"__{r}_0.distcp" for r in range(12))
    assert seen == names[1::5]
