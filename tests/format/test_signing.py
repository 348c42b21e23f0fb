"""Issue 17 item 2: authenticated checkpoints (optional HMAC-SHA256 over the manifest content)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit.cli import main
from ckptkit.format import manifest as mf
from ckptkit.format import signing
from ckptkit.verify.describe import describe

KEY = b"k" * 32
OTHER = b"o" * 32


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(signing.ENV_KEY, raising=False)
    monkeypatch.delenv(signing.ENV_KEY_FILE, raising=False)


def _state() -> dict[str, Any]:
    return {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "step": 7}


def _codes(path: Path, **kw: Any) -> list[str]:
    return [f.code for f in ckptkit.verify(path, **kw).findings]


def _rewrite(d: Path, edit: Any) -> None:
    """What an attacker with write access does: edit, then recompute the unkeyed digest."""
    obj = json.loads((d / "manifest.json").read_text())
    edit(obj)
    obj["manifest_digest"] = mf.content_digest(obj)
    (d / "manifest.json").write_text(json.dumps(obj))


def test_signed_round_trip(tmp_path: Path) -> None:
    m = ckptkit.save(_state(), tmp_path / "c", key=KEY)
    assert m.signature is not None and m.signature.key_id == signing.key_id(KEY)
    on_disk = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert on_disk["signature"] == m.signature.to_dict()
    assert torch.equal(ckptkit.load(tmp_path / "c", key=KEY)["model"]["w"], _state()["model"]["w"])
    assert _codes(tmp_path / "c", key=KEY) == []


def test_without_a_key_a_signed_checkpoint_verifies_and_says_so(tmp_path: Path) -> None:
    ckptkit.save(_state(), tmp_path / "c", key=KEY)
    res = ckptkit.verify(tmp_path / "c")
    assert res.ok
    (f,) = res.findings
    assert f.code == "CK-M012" and f.severity == "info" and signing.key_id(KEY) in f.message
    ckptkit.load(tmp_path / "c")  # digests checked; loads
    info = describe(tmp_path / "c")
    assert info["signature"] == {"alg": "hmac-sha256", "key_id": signing.key_id(KEY),
                                 "status": "not checked"}
    assert describe(tmp_path / "c", key=KEY)["signature"]["status"] == "verified"


def test_unsigned_is_refused_with_a_key(tmp_path: Path) -> None:
    ckptkit.save(_state(), tmp_path / "c")
    with pytest.raises(ckptkit.SignatureError) as ei:
        ckptkit.load(tmp_path / "c", key=KEY)
    assert ei.value.code == "CK-M010" and "manifest.json" in str(ei.value)
    assert _codes(tmp_path / "c", key=KEY) == ["CK-M010"]
    assert _codes(tmp_path / "c") == []


def test_other_key_is_refused_naming_both_key_ids(tmp_path: Path) -> None:
    ckptkit.save(_state(), tmp_path / "c", key=OTHER)
    with pytest.raises(ckptkit.SignatureError) as ei:
        ckptkit.load(tmp_path / "c", key=KEY)
    assert ei.value.code == "CK-M011"
    assert signing.key_id(OTHER) in str(ei.value) and signing.key_id(KEY) in str(ei.value)
    assert _codes(tmp_path / "c", key=KEY) == ["CK-M011"]


@pytest.mark.parametrize("attack", ["edit-step", "swap-shard", "strip-signature", "tree"])
def test_tampering_passes_digests_but_not_the_signature(tmp_path: Path, attack: str) -> None:
    """Someone who can write the directory recomputes every unkeyed digest: only the key sees it."""
    d = tmp_path / "c"
    ckptkit.save(_state(), d, key=KEY)
    if attack == "edit-step":
        _rewrite(d, lambda o: o.update(step=1))
    elif attack == "tree":
        _rewrite(d, lambda o: o["tree"].update(step=0))
    elif attack == "strip-signature":
        _rewrite(d, lambda o: o.pop("signature"))
    else:
        # Replace the weights with the attacker's and fix the file digest in the manifest.
        evil = tmp_path / "evil"
        ckptkit.save({"model": {"w": torch.full((2, 3), 666.0)}, "step": 7}, evil)
        (d / "model.safetensors").write_bytes((evil / "model.safetensors").read_bytes())
        new = json.loads((evil / "manifest.json").read_text())["files"][0]
        _rewrite(d, lambda o: o["files"][0].update(size=new["size"], xxh3_128=new["xxh3_128"]))
    assert ckptkit.verify(d).ok  # digests alone cannot tell
    want = "CK-M010" if attack == "strip-signature" else "CK-M011"
    assert _codes(d, key=KEY) == [want]
    with pytest.raises(ckptkit.SignatureError) as ei:
        ckptkit.load(d, key=KEY)
    assert ei.value.code == want
    if want == "CK-M011":
        assert "changed after it was signed" in str(ei.value)


def test_rot_in_a_signed_checkpoint_is_still_a_digest_finding(tmp_path: Path) -> None:
    d = tmp_path / "c"
    ckptkit.save(_state(), d, key=KEY)
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[-1] ^= 1
    (d / "model.safetensors").write_bytes(bytes(raw))
    assert _codes(d, key=KEY) == ["CK-F003", "CK-C010"]  # C010: the model is not proven


def test_env_key_signs_and_requires(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(signing.ENV_KEY, KEY.decode())
    ckptkit.save(_state(), tmp_path / "c")
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["signature"]["key_id"] == (
        signing.key_id(KEY)
    )
    ckptkit.load(tmp_path / "c")
    monkeypatch.delenv(signing.ENV_KEY)
    ckptkit.save(_state(), tmp_path / "u")
    monkeypatch.setenv(signing.ENV_KEY, KEY.decode())
    with pytest.raises(ckptkit.SignatureError):
        ckptkit.load(tmp_path / "u")
    assert _codes(tmp_path / "u") == ["CK-M010"]


def test_env_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kf = tmp_path / "hmac.key"
    kf.write_bytes(KEY + b"\n")  # echo adds a newline: ignored
    monkeypatch.setenv(signing.ENV_KEY_FILE, str(kf))
    assert signing.resolve_key() == KEY
    monkeypatch.setenv(signing.ENV_KEY, KEY.decode())
    with pytest.raises(ckptkit.CkptkitError, match="both"):
        signing.resolve_key()
    assert signing.resolve_key(OTHER) == OTHER  # an explicit key wins


@pytest.mark.parametrize("bad", [b"short", b"   " + b"x" * 10 + b"  "])
def test_short_keys_are_refused(bad: bytes | str) -> None:
    with pytest.raises(ckptkit.CkptkitError, match="at least 16"):
        signing.resolve_key(bad)


@pytest.mark.parametrize("bad", ["", b"", b" \n"])
def test_empty_key_argument_is_refused(bad: bytes | str) -> None:
    with pytest.raises(ckptkit.CkptkitError, match="is empty"):
        signing.resolve_key(bad)


@pytest.mark.parametrize("value", ["", "  \n"])
def test_empty_key_variable_is_an_error_everywhere_a_key_is_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Issue 23 item 12: ``export CKPTKIT_HMAC_KEY=$UNSET`` used to turn checking off."""
    ckptkit.save(_state(), tmp_path / "c")
    monkeypatch.setenv(signing.ENV_KEY, value)
    calls = {
        "resolve_key": lambda: signing.resolve_key(),
        "save": lambda: ckptkit.save(_state(), tmp_path / "new"),
        "load": lambda: ckptkit.load(tmp_path / "c"),
        "verify": lambda: ckptkit.verify(tmp_path / "c"),
        "describe": lambda: describe(tmp_path / "c"),
        "CheckpointManager": lambda: ckptkit.CheckpointManager(tmp_path / "run"),
    }
    for name, call in calls.items():
        with pytest.raises(ckptkit.CkptkitError) as ei:
            call()
        msg = str(ei.value)
        assert "empty" in msg and f"unset {signing.ENV_KEY}" in msg, (name, msg)
    assert not (tmp_path / "new").exists() and not (tmp_path / "run").exists()


def test_empty_key_file_variable_and_empty_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(signing.ENV_KEY_FILE, "")
    with pytest.raises(ckptkit.CkptkitError, match=f"{signing.ENV_KEY_FILE} is set but empty"):
        signing.resolve_key()
    empty = tmp_path / "hmac.key"
    empty.write_bytes(b"\n")  # created, never filled
    monkeypatch.setenv(signing.ENV_KEY_FILE, str(empty))
    with pytest.raises(ckptkit.CkptkitError) as ei:
        signing.resolve_key()
    assert str(empty) in str(ei.value) and f"unset {signing.ENV_KEY_FILE}" in str(ei.value)
    with pytest.raises(ckptkit.CkptkitError) as ei:
        signing.resolve_key(key_file=empty)
    assert str(empty) in str(ei.value) and "--key-file" in str(ei.value)
    assert signing.resolve_key(KEY) == KEY  # an explicit key wins over the environment


def test_key_file_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ckptkit.CkptkitError, match="cannot read the HMAC key file"):
        signing.key_from_file(tmp_path / "missing")


def test_signature_does_not_change_the_digest(tmp_path: Path) -> None:
    """The digest and the MAC cover the same canonical content: signing adds, never alters."""
    m = ckptkit.save(_state(), tmp_path / "c")
    s = m.signed(KEY)
    assert s.digest == m.digest and s.to_dict()["manifest_digest"] == m.to_dict()["manifest_digest"]
    assert mf.parse(s.to_json(), key=KEY)["signature"] == s.signature.to_dict()  # type: ignore[union-attr]


def test_cli_key_file(tmp_path: Path) -> None:
    d = tmp_path / "c"
    ckptkit.save(_state(), d, key=KEY)
    kf, other = tmp_path / "k", tmp_path / "o"
    kf.write_bytes(KEY)
    other.write_bytes(OTHER)
    run = CliRunner().invoke
    r = run(main, ["verify", str(d), "--key-file", str(kf)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = run(main, ["verify", str(d), "--key-file", str(other)], catch_exceptions=False)
    assert r.exit_code == 1 and "CK-M011" in r.output
    r = run(main, ["verify", str(d)], catch_exceptions=False)
    assert r.exit_code == 0 and "CK-M012" in r.output
    r = run(main, ["inspect", str(d), "--json", "--key-file", str(kf)], catch_exceptions=False)
    info = json.loads(r.output)
    assert info["signature"]["status"] == "verified"
    assert info["manifest_digest"] == json.loads((d / "manifest.json").read_text())["manifest_digest"]
    r = run(main, ["inspect", str(d), "--key-file", str(other)], catch_exceptions=False)
    assert r.exit_code == 2 and "CK-M011" in r.output
    r = run(main, ["verify", str(d), "--key-file", str(tmp_path / "nope")], catch_exceptions=False)
    assert r.exit_code == 2 and "key file" in r.output
