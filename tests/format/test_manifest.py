"""The manifest schema is a tested artifact: packaged copy, metaschema, examples, round trip."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

import ckptkit
from ckptkit.checkpoint import manifest_io
from ckptkit.format import manifest as mf
from ckptkit.format import validation

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "manifests"
SCHEMAS = [
    "manifest.schema.json",
    "verify-report.schema.json",
    "drill-report.schema.json",
    "diff-report.schema.json",
]


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
    props = validation.schema()["properties"]["components"]["properties"]
    assert tuple(props) == mf.COMPONENTS


def test_written_manifest_validates_and_round_trips(saved_ckpt) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    obj = json.loads((d / "manifest.json").read_text())
    jsonschema.Draft202012Validator(validation.schema()).validate(obj)
    m = manifest_io.read(d)
    assert m.to_dict() == obj
    assert m.step == 3 and obj["schema_version"] == mf.SCHEMA_VERSION


def test_every_manifest_read_is_validated_once(saved_ckpt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    d = saved_ckpt()
    calls = []
    real = validation.check_schema

    def spy(obj, path):  # type: ignore[no-untyped-def]
        calls.append(path)
        return real(obj, path)

    monkeypatch.setattr(mf, "check_schema", spy)  # the name the root's parse calls
    ckptkit.load(d)
    assert len(calls) == 1
    ckptkit.verify(d)
    assert len(calls) == 2
    from ckptkit.verify.describe import describe

    describe(d)
    assert len(calls) == 3


def _example(case: Path) -> tuple[dict, str | None, bytes | None]:
    """An example manifest, its expected code (``$expect``) and the key to read it with."""
    obj = json.loads(case.read_text())
    expect = obj.pop("$expect", None)
    key = obj.pop("$key", None)
    obj["manifest_digest"] = mf.content_digest(obj)
    return obj, expect, key.encode() if key is not None else None


@pytest.mark.parametrize("case", sorted((DATA / "valid").glob("*.json")), ids=lambda p: p.stem)
def test_valid_examples(case: Path) -> None:
    obj, _, key = _example(case)
    m = mf.Manifest.from_json(json.dumps(obj), key=key)
    assert m.to_dict() == obj  # round trip, signature included


@pytest.mark.parametrize("case", sorted((DATA / "invalid").glob("*.json")), ids=lambda p: p.stem)
def test_invalid_examples(case: Path) -> None:
    obj, expect, key = _example(case)
    with pytest.raises(ckptkit.ManifestError) as ei:
        mf.parse(json.dumps(obj), key=key)
    assert ei.value.code == expect


@pytest.mark.parametrize(
    "case", sorted(DATA.glob("*/*.json")), ids=lambda p: f"{p.parent.name}-{p.stem}"
)
def test_both_validators_agree_on_the_schema(case: Path) -> None:
    """The schema means the same to Python's jsonschema and to jsonschema-rs (the reader).

    Python's ``re`` lets ``$`` match before a final newline; the patterns end in
    ``$(?!\\n)`` so a path like ``"model.safetensors\\n"`` fails in both.
    """
    obj, _, _ = _example(case)
    py = jsonschema.Draft202012Validator(validation.schema()).is_valid(obj)
    try:
        rs = validation._validator().is_valid(obj)
    except ValueError:  # jsonschema-rs's recursion limit (the reader maps it to CK-M006)
        return
    assert py == rs


def test_examples_exist() -> None:
    assert len(list((DATA / "valid").glob("*.json"))) >= 4
    assert len(list((DATA / "invalid").glob("*.json"))) >= 20


def test_components_recorded_for_plain_save(tmp_path: Path) -> None:
    m = ckptkit.save(
        {"model": {"w": torch.ones(1)}, "optimizer": {"state": {}}, "lr_scheduler": {"last_epoch": 3}},
        tmp_path / "c",
    )
    assert m.components["model"].present and m.components["model"].where == ("model.safetensors",)
    assert m.components["scheduler"].where == ("manifest:tree/lr_scheduler",)
    assert m.components["env"].present and not m.components["rng"].present
    assert "torch" in m.env
