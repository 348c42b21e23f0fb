"""verify/inspect on checkpoints written by the real clients, pristine and damaged."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ckptkit.checkpoint import safeload
from ckptkit.verify.foreign import detect
from ckptkit.verify.foreign.report import verify_foreign
from ckptkit.verify.runner import verify

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"
)]


def _codes(report: object, severity: str | None = None) -> list[str]:
    return [
        f.code
        for f in report.findings  # type: ignore[attr-defined]
        if severity is None or str(f.severity) == severity
    ]


def _table(report: object) -> dict[str, tuple[bool, bool]]:
    return {n: (c.present, c.required) for n, c in report.components.items()}  # type: ignore[attr-defined]


def _flip_in_zip_member(path: Path, member_suffix: str = "data/0") -> None:
    """Flip one byte inside a stored member of a torch zip archive (not its header)."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(member_suffix))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        pos = info.header_offset + 30 + n + m + info.file_size // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))


# --- Hugging Face Trainer ------------------------------------------------------------------------


def test_hf_trainer_pristine(hf_ckpt: Path) -> None:
    assert detect(hf_ckpt) == "hf-trainer"
    rep = verify_foreign(hf_ckpt)
    assert rep.ok and rep.format == "hf-trainer" and rep.step == 2
    t = _table(rep)
    for comp in ("model", "optimizer", "scheduler", "rng", "progress", "sampler"):
        assert t[comp] == (True, True), comp
    assert rep.components["model"].where == ("model.safetensors",)
    assert "CK-F107" in _codes(rep, "warning")  # no digests
    # training_args.bin needs transformers classes: reported, never executed, only info.
    ta = [f for f in rep.findings if f.path == "training_args.bin"]
    assert [f.code for f in ta] == ["CK-F103"] and str(ta[0].severity) == "info"
    assert "TrainingArguments" in ta[0].message


def test_hf_run_dir_verifies_each_checkpoint(hf_run: Path) -> None:
    res = verify(hf_run)
    assert [r.path.name for r in res.reports] == ["checkpoint-2", "checkpoint-3"]
    assert res.ok and [r.step for r in res.reports] == [2, 3]


def test_hf_truncated_weights(copy_ckpt: Callable[[Path], Path], hf_ckpt: Path) -> None:
    d = copy_ckpt(hf_ckpt)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    rep = verify_foreign(d)
    assert not rep.ok and "CK-F104" in _codes(rep, "error")


def test_hf_flipped_byte_in_optimizer(copy_ckpt: Callable[[Path], Path], hf_ckpt: Path) -> None:
    d = copy_ckpt(hf_ckpt)
    _flip_in_zip_member(d / "optimizer.pt")
    torch.load(d / "optimizer.pt", weights_only=True)  # torch itself does not notice
    rep = verify_foreign(d)
    f = [f for f in rep.findings if f.code == "CK-F101"]
    assert not rep.ok and f and f[0].path == "optimizer.pt" and "CRC" in f[0].message


def test_hf_missing_rng_and_optimizer(copy_ckpt: Callable[[Path], Path], hf_ckpt: Path) -> None:
    d = copy_ckpt(hf_ckpt)
    (d / "rng_state.pth").unlink()
    rep = verify_foreign(d)
    assert rep.ok  # a warning: the Trainer resumes with one INFO log line
    # Not required (the Trainer resumes without it), so a warning, not a C001 error.
    assert _table(rep)["rng"] == (False, False) and "CK-C103" in _codes(rep, "warning")
    (d / "optimizer.pt").unlink()
    rep = verify_foreign(d)
    # The same code as a native checkpoint missing a required component (was CK-C101).
    opt = [f for f in rep.findings if f.code == "CK-C001" and f.component == "optimizer"]
    assert not rep.ok and opt and "fresh Adam" in opt[0].message


def test_hf_nan_weight(copy_ckpt: Callable[[Path], Path], hf_ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = copy_ckpt(hf_ckpt)
    sd = load_file(str(d / "model.safetensors"))
    key = sorted(k for k in sd if k.endswith("c_attn.weight"))[0]
    sd[key][0, 0] = float("nan")
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    rep = verify_foreign(d)
    f = [f for f in rep.findings if f.code == "CK-S010"]
    assert not rep.ok and f and key in f[0].message


def test_hf_low_bit_flip_in_safetensors_is_undetectable_without_digests(
    copy_ckpt: Callable[[Path], Path], hf_ckpt: Path
) -> None:
    d = copy_ckpt(hf_ckpt)
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-4] ^= 0x01  # lowest mantissa bit of the last float32
    w.write_bytes(bytes(data))
    rep = verify_foreign(d)
    assert rep.ok and "CK-F107" in _codes(rep)  # honest: structure only, no digest


# --- Accelerate ----------------------------------------------------------------------------------


def test_accelerate(copy_ckpt: Callable[[Path], Path], accelerate_ckpt: Path) -> None:
    assert detect(accelerate_ckpt) == "accelerate"
    rep = verify_foreign(accelerate_ckpt)
    assert rep.ok
    t = _table(rep)
    assert t["model"] == t["optimizer"] == t["scheduler"] == t["rng"] == (True, True)
    assert t["sampler"] == (False, False) and "CK-C002" in _codes(rep, "warning")  # was C102
    assert "micro_steps" in rep.components["progress"].summary
    d = copy_ckpt(accelerate_ckpt)
    (d / "optimizer.bin").unlink()
    rep = verify_foreign(d)
    assert not rep.ok and "CK-C001" in _codes(rep, "error")  # was CK-C101


# --- Lightning -----------------------------------------------------------------------------------


def test_lightning_full(lightning_ckpts: dict[str, Path]) -> None:
    ck = lightning_ckpts["full"]
    assert detect(ck) == "lightning"
    rep = verify_foreign(ck)
    t = _table(rep)
    assert rep.ok and rep.step == 2
    assert t["model"] == t["optimizer"] == t["scheduler"] == t["progress"] == (True, True)
    assert t["rng"] == t["sampler"] == (False, False)  # not stored by Lightning: warnings
    assert {"CK-C002", "CK-C103"} <= set(_codes(rep, "warning"))  # C002 was CK-C102
    # ModelCheckpoint state holds +inf (kth_value) legitimately: not a NaN/Inf finding.
    raw, _ = safeload.safe_torch_load(ck)
    cb = [t for _k, t in safeload.iter_tensors(raw["callbacks"])]
    assert any(torch.isinf(t).any() for t in cb)
    assert not {"CK-S010", "CK-S011"} & set(_codes(rep))


def test_lightning_weights_only(lightning_ckpts: dict[str, Path]) -> None:
    rep = verify_foreign(lightning_ckpts["weights"])
    assert not rep.ok
    f = [f for f in rep.findings if f.code == "CK-C001"]  # was CK-C101
    assert f and f[0].component == "optimizer" and "weights-only" in f[0].message


def test_lightning_truncated(
    copy_ckpt: Callable[[Path], Path], lightning_ckpts: dict[str, Path]
) -> None:
    ck = copy_ckpt(lightning_ckpts["full"])
    ck.write_bytes(ck.read_bytes()[:-200])
    rep = verify_foreign(ck)
    assert not rep.ok and "CK-F102" in _codes(rep, "error")


# --- torch.distributed.checkpoint ----------------------------------------------------------------


def test_dcp_pristine(dcp_ckpt: Path) -> None:
    assert detect(dcp_ckpt) == "dcp"
    rep = verify_foreign(dcp_ckpt)
    assert rep.ok and rep.step == 3
    t = _table(rep)
    assert t["model"] == t["optimizer"] == t["progress"] == (True, True)
    assert t["rng"] == (False, False)  # DCP saves only what it is given: a C103 warning


def test_dcp_missing_and_short_shard(copy_ckpt: Callable[[Path], Path], dcp_ckpt: Path) -> None:
    import torch.distributed.checkpoint as dcp

    d = copy_ckpt(dcp_ckpt)
    md, _ = safeload.read_dcp_metadata(d / ".metadata")
    shard = next(i.relative_path for k, i in md.storage_data.items() if k.fqn == "model.weight")
    (d / shard).unlink()
    rep = verify_foreign(d)
    f = [f for f in rep.findings if f.code == "CK-F105"]
    assert not rep.ok and f and f[0].path == shard and "model.weight" in f[0].message
    # What DCP itself does: CheckpointException, which is not an Exception.
    target = {"model": {"weight": torch.empty(2, 4), "bias": torch.empty(2)}}
    with pytest.raises(BaseException) as ei:
        dcp.load(target, checkpoint_id=str(d))
    assert not isinstance(ei.value, Exception)
    other = next(i.relative_path for k, i in md.storage_data.items() if k.fqn == "model.bias")
    p = d / other
    p.write_bytes(p.read_bytes()[:10])
    assert "CK-F106" in _codes(verify_foreign(d), "error")


def test_dcp_nan_in_optimizer(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    m = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters())
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"][0, 0] = float("nan")
    dcp.save(
        {"model": m.state_dict(), "optimizer": sd, "step": 1}, checkpoint_id=str(tmp_path / "c")
    )
    rep = verify_foreign(tmp_path / "c")
    f = [f for f in rep.findings if f.code == "CK-S011"]
    assert f and "exp_avg" in f[0].message


# --- plain torch.save ----------------------------------------------------------------------------


def test_torch_save_key_conventions(tmp_path: Path) -> None:
    import numpy as np

    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    p = tmp_path / "ckpt.pt"
    torch.save(
        {
            "model": m.state_dict(),
            "optimizer": opt.state_dict(),
            "iter_num": 7,
            "rng_state": {"torch": torch.get_rng_state(), "numpy": np.random.get_state()},
            "config": {"lr": 0.1},
            "mystery": [1, 2],
        },
        p,
    )
    rep = verify_foreign(p)
    t = _table(rep)
    assert rep.ok and rep.step == 7 and rep.format == "torch-save"
    assert t["model"] == t["optimizer"] == t["progress"] == t["rng"] == (True, True)
    unrec = [f for f in rep.findings if f.code == "CK-C104"]
    assert unrec and "mystery" in unrec[0].message and "config" not in unrec[0].message
    assert rep.components["progress"].where == ("ckpt.pt:iter_num",)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("EXECUTED",))


def test_pickle_needing_code_is_never_executed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.ones(1)}, "payload": _Evil()}, p)
    rep = verify_foreign(p)
    f = [f for f in rep.findings if f.code == "CK-F103"]
    assert f and "builtins.print" in f[0].message
    assert "EXECUTED" not in capsys.readouterr().out
