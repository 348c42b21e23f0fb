"""``ckptkit.storage.dcp_items.coverage``: each thing a DCP load refuses, as one finding code.

The reader raises the first problem before DCP plans a read and native verify reports
each (``tests/checkpoint/test_dcp_coverage.py`` runs both on hostile checkpoints); here
every refusal is driven directly on real DCP metadata.
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.storage import dcp_items, dcp_meta, dcp_write, digest


class _Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("true",))


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Any, dict[str, mf.FileEntry]]:
    """A one-process DCP save of a tensor and a plain value, its metadata and listing."""
    import torch.distributed.checkpoint as dcp_api

    dcp_write.save({"w": torch.arange(6.0), "extra": {"lr": 0.5}}, tmp_path, fsync=False)
    d = tmp_path / dcp_meta.DCP_DIR
    listed = {}
    for p in d.iterdir():
        hexd, size = digest.hash_file(p)
        listed[p.name] = mf.FileEntry(path=f"{dcp_meta.DCP_DIR}/{p.name}", size=size, xxh3_128=hexd)
    md = dcp_api.FileSystemReader(str(d)).read_metadata()
    return tmp_path, md, listed


def _replace(md: Any, fqn: str, **changes: Any) -> Any:
    idx = next(k for k in md.storage_data if k.fqn == fqn)
    md.storage_data[idx] = dataclasses.replace(md.storage_data[idx], **changes)
    return md


def _codes(problems: list[Any]) -> list[str]:
    return [p.code for p in problems]


def test_an_intact_save_has_no_problem_and_its_values_parse(saved: Any) -> None:
    root, md, listed = saved
    read: list[str] = []

    def item_bytes(it: dcp_items.Item) -> bytes:
        read.append(it.fqn)
        return dcp_items.read_item(root, it)

    assert dcp_items.coverage(md, listed, item_bytes=item_bytes) == []
    assert read == ["extra.lr"]  # only non-tensor items are parsed


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"offset": 1 << 20}, "CK-F106"),
        ({"offset": -1}, "CK-F106"),
        ({"length": 1 << 20}, "CK-F106"),
        ({"offset": 1.5}, "CK-F108"),
        ({"offset": True}, "CK-F108"),
        ({"relative_path": "__9_0.distcp"}, "CK-F021"),
        ({"relative_path": "../outside.distcp"}, "CK-F021"),
        ({"relative_path": ".metadata"}, "CK-F021"),
        ({"relative_path": 7}, "CK-F108"),
        ({"transform_descriptors": ["no-such-transform/1"]}, "CK-F108"),
    ],
    ids=lambda v: str(v),
)
def test_a_hostile_storage_entry_is_refused_with_its_code(
    saved: Any, change: dict[str, Any], code: str
) -> None:
    _root, md, listed = saved
    assert _codes(dcp_items.coverage(_replace(md, "w", **change), listed)) == [code]


def test_an_item_without_storage_is_refused(saved: Any) -> None:
    _root, md, listed = saved
    idx = next(k for k in md.storage_data if k.fqn == "w")
    del md.storage_data[idx]
    problems = dcp_items.coverage(md, listed)
    assert _codes(problems) == ["CK-F105"] and "w" in problems[0].what


def test_metadata_of_another_structure_is_damage(saved: Any) -> None:
    _root, md, listed = saved
    assert _codes(dcp_items.coverage(torch.Size([3]), listed)) == ["CK-F108"]
    md.storage_data = [1, 2]
    assert _codes(dcp_items.coverage(md, listed)) == ["CK-F108"]


@pytest.mark.parametrize(
    ("blob", "code"),
    [(_Payload(), "CK-F023"), (None, "CK-F108")],
    ids=["needs-a-global", "not-a-torch-save-blob"],
)
def test_a_non_tensor_item_parses_as_the_reader_parses_it(
    saved: Any, blob: Any, code: str
) -> None:
    _root, md, listed = saved
    if blob is None:
        data = b"\x00not a torch.save blob"
    else:
        buf = io.BytesIO()
        torch.save({"lr": blob}, buf)
        data = buf.getvalue()
    problems = dcp_items.coverage(md, listed, item_bytes=lambda it: data if it.byte_io else None)
    assert _codes(problems) == [code], problems
    with pytest.raises(CkptkitError, match=code):  # the reader's own parse, the same verdict
        dcp_items.load_byte_item(data, fqn="extra.lr", rel="dcp/x.distcp")
