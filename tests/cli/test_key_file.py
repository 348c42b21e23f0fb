"""Issue 23 item 12: every command that reads manifests or verdicts takes the same key options,
and a key that is configured but empty is an error, never "signatures off".

The run-level commands run in processes of their own, as a user runs them: forks of a
warmed zygote (tests/zygote.py), and a new ``python -m ckptkit`` where the key comes from the
environment.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
import torch
from zygote import Env, Result, Zygote, fresh_ckptkit

import ckptkit
from ckptkit.checkpoint.catalog import step_dir_name
from ckptkit.cli import main
from ckptkit.format import signing

KEY = b"k" * 32
KEY_COMMANDS = ("verify", "inspect", "ls", "prune", "rollback", "scrub", "diff")
"""Every command that reads manifests or the verdicts listed from them."""
SIGNING_COMMANDS = ("adopt",)
"""Commands that take the key to sign what they write (issue 24: one trust domain)."""


def _env(**extra: str) -> Env:
    """No key variables but ``extra``'s (a key in the test's own environment must not count)."""
    return {signing.ENV_KEY: None, signing.ENV_KEY_FILE: None, "CKPTKIT_NO_PROGRESS": "1",
            **extra}


def _operands(command: str, run: Path) -> list[str]:
    """What ``command`` is given besides the key: a checkpoint, two, or the run."""
    if command == "inspect":
        return [str(run / step_dir_name(20))]
    if command == "diff":
        return [str(run / step_dir_name(10)), str(run / step_dir_name(20))]
    if command == "prune":
        return [str(run), "--keep-last", "1", "--dry-run"]
    return [str(run)]


def _ckptkit(z: Zygote, *args: str, **env: str) -> Result:
    return z.ckptkit(*args, env=_env(**env), timeout=300)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 10 and 20 signed with KEY; step 30 (the newest) unsigned: written by someone
    without the key (what a planted checkpoint looks like). Saved once per module."""
    root = tmp_path_factory.mktemp("saved") / "run"
    ts = ckptkit.TrainState(model=torch.nn.Linear(4, 4))
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(signing.ENV_KEY, raising=False)
        mp.delenv(signing.ENV_KEY_FILE, raising=False)
        with ckptkit.CheckpointManager(root, keep_last=10, key=KEY) as mgr:
            for s in (10, 20):
                ts.step = s
                mgr.save(ts)
        # A writer without the key is refused in a signed run (CK-R012): the planted
        # checkpoint is saved elsewhere and moved in, as someone who can write the
        # directory would.
        side = root.parent / "side"
        with ckptkit.CheckpointManager(side, keep_last=10) as mgr:
            ts.step = 30
            mgr.save(ts)
        shutil.move(str(side / "step-00000030"), str(root / "step-00000030"))
    return root


@pytest.fixture
def run(saved_run: Path, tmp_path: Path) -> Path:
    """A copy of :func:`saved_run` (commands prune it)."""
    return Path(shutil.copytree(saved_run, tmp_path / "run"))


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    kf = tmp_path / "hmac.key"
    kf.write_bytes(KEY + b"\n")
    return kf


def test_every_command_that_reads_verdicts_takes_the_same_key_option() -> None:
    """One shared option (same name, type and help) on each command, never a copy."""
    seen = []
    for name in KEY_COMMANDS:
        cmd = main.commands[name]
        (opt,) = [p for p in cmd.params if "--key-file" in getattr(p, "opts", ())]
        assert isinstance(opt, click.Option)
        seen.append((opt.name, opt.help, type(opt.type)))
    assert len(set(seen)) == 1, seen


def test_ls_with_key_file_marks_the_unsigned_checkpoint(
    run: Path, key_file: Path, cli_zygote: Zygote
) -> None:
    p = _ckptkit(cli_zygote, "ls", str(run), "--json")
    assert p.returncode == 0, p.stderr
    assert {c["step"]: c["status"] for c in json.loads(p.stdout)["checkpoints"]} == {
        10: "verified", 20: "verified", 30: "committed"  # moved in: never verified here
    }
    p = _ckptkit(cli_zygote, "ls", str(run), "--json", "--key-file", str(key_file))
    assert p.returncode == 1, p.stderr
    st = {c["step"]: c["status"] for c in json.loads(p.stdout)["checkpoints"]}
    assert st == {10: "verified", 20: "verified", 30: "untrusted"}
    # The environment's key file gives the same verdicts as the option (in a new interpreter:
    # the variable is there from the start, as a user sets it).
    q = fresh_ckptkit("ls", run, "--json", env=_env(CKPTKIT_HMAC_KEY_FILE=str(key_file)))
    assert q.returncode == 1 and json.loads(q.stdout)["checkpoints"] == json.loads(p.stdout)[
        "checkpoints"
    ]


def test_rollback_with_key_file_passes_over_the_unsigned_checkpoint(
    run: Path, key_file: Path, cli_zygote: Zygote
) -> None:
    p = _ckptkit(cli_zygote, "rollback", str(run), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["checkpoint"]["step"] == 30
    p = _ckptkit(cli_zygote, "rollback", str(run), "--json", "--key-file", str(key_file))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["checkpoint"]["step"] == 20


def test_prune_with_key_file_keeps_the_newest_signed_checkpoint(
    run: Path, key_file: Path, cli_zygote: Zygote
) -> None:
    p = _ckptkit(
        cli_zygote, "prune", str(run), "--keep-last", "1", "--json", "--key-file", str(key_file)
    )
    assert p.returncode == 0, p.stderr
    kept = {d["step"] for d in json.loads(p.stdout)["decisions"] if d["keep"]}
    assert 20 in kept  # the newest checkpoint signed with the key is what a restore can use
    assert (run / step_dir_name(20)).is_dir() and not (run / step_dir_name(10)).exists()


@pytest.mark.parametrize("command", KEY_COMMANDS)
def test_empty_key_file_option_is_an_error_naming_the_file(
    run: Path, tmp_path: Path, command: str, cli_zygote: Zygote
) -> None:
    empty = tmp_path / "empty.key"
    empty.write_bytes(b"\n")
    p = _ckptkit(cli_zygote, command, *_operands(command, run), "--key-file", str(empty))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert str(empty) in p.stderr and "empty" in p.stderr and "--key-file" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("command", KEY_COMMANDS)
@pytest.mark.parametrize("variable", [signing.ENV_KEY, signing.ENV_KEY_FILE])
def test_empty_key_variable_is_an_error_not_signatures_off(
    run: Path, command: str, variable: str, cli_zygote: Zygote
) -> None:
    """Before: an empty variable read as "no key"; ls/verify said all verified, the
    unsigned step 30 included."""
    p = _ckptkit(cli_zygote, command, *_operands(command, run), **{variable: ""})
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert variable in p.stderr and f"unset {variable}" in p.stderr
    assert "Traceback" not in p.stderr


def test_security_page_names_every_command_that_takes_the_key() -> None:
    """docs/security.md says where a key is taken; a command that gains --key-file is named."""
    takes = {name for name, cmd in main.commands.items()
             if any("--key-file" in getattr(p, "opts", ()) for p in cmd.params)}
    assert takes == set(KEY_COMMANDS) | set(SIGNING_COMMANDS)
    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    keys = page.split("## Keys", 1)[1].split("\n## ", 1)[0]
    for name in sorted(takes):
        assert f"`{name}`" in keys, name
    assert "An empty key is an error" in keys
