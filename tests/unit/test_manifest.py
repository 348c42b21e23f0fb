"""The manifest schema is a tested artifact: packaged copy, metaschema, examples, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

import ckptkit
from ckptkit import manifest as mf

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "manifests"
SCHEMAS = ["manifest.schema.json", "verify-report.schema.json", "drill-report.schema.json"]


@pytest.mark.parametrize("name", SCHEMAS)
def test_packaged_schema_is_the_committed_one(name: str) -> None:
    from importlib import resources

    packaged = resources.files("ckptkit").joinpath("_schemas", name).read_bytes()
    assert packaged == (ROOT / "schemas" / name).read_bytes()


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_is_valid_2020_12(name: str) -> None:
    schema = json.loads((ROOT / "schemas" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")


def test_schema_covers_every_component() -> None:
    props = mf.schema()["properties"]["components"]["properties"]
    assert tuple(props) == mf.COMPONENTS


def test_written_manifest_validates_and_round_trips(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    obj = json.loads((d / "manifest.json").read_text())
    jsonschema.Draft202012Validator(mf.schema()).validate(obj)
    m = mf.read(d)
    assert m.to_dict() == obj
    assert m.step == 3 and obj["schema_version"] == mf.SCHEMA_VERSION


def test_every_manifest_read_is_validated(saved_ckpt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    calls = []
    real = mf._validator

    def spy():  # type: ignore[no-untyped-def]
        calls.append(1)
        return real()

    monkeypatch.setattr(mf, "_validator", spy)
    ckptkit.load(d)
    ckptkit.verify(d)
    assert len(calls) >= 2


@pytest.mark.parametrize("case", sorted((DATA / "valid").glob("*.json")), ids=lambda p: p.stem)
def test_valid_examples(case: Path) -> None:
    obj = json.loads(case.read_text())
    obj["manifest_digest"] = mf.content_digest(obj)
    mf.parse(json.dumps(obj))


@pytest.mark.parametrize("case", sorted((DATA / "invalid").glob("*.json")), ids=lambda p: p.stem)
def test_invalid_examples(case: Path) -> None:
    obj = json.loads(case.read_text())
    expect = obj.pop("$expect")
    if isinstance(obj, dict):
        obj["manifest_digest"] = mf.content_digest(obj)
    with pytest.raises(ckptkit.ManifestError) as ei:
        mf.parse(json.dumps(obj))
    assert ei.value.code == expect


def test_examples_exist() -> None:
    assert len(list((DATA / "valid").glob("*.json"))) >= 2
    assert len(list((DATA / "invalid").glob("*.json"))) >= 5


def test_components_recorded_for_plain_save(tmp_path: Path) -> None:
    m = ckptkit.save(
        {"model": {"w": torch.ones(1)}, "optimizer": {"state": {}}, "lr_scheduler": {"last_epoch": 3}},
        tmp_path / "c",
    )
    assert m.components["model"].present and m.components["model"].where == ("model.safetensors",)
    assert m.components["scheduler"].where == ("manifest:tree/lr_scheduler",)
    assert m.components["env"].present and not m.components["rng"].present
    assert "torch" in m.env
