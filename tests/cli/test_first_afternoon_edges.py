"""The rough edges a newcomer hits on a first afternoon (issue 16, item 6), one test each.

Wrong paths named for what they are, short reprs, compact output with ``--verbose`` for
the rest, ``| head`` ending like it ends ``cat``, no box drawing in pipes, progress for
long foreign work, one full stop before "Fix:", no reStructuredText in ``--help``, and a
watch that does not call a run healthy before it judges anything.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

import ckptkit
from ckptkit import codes
from ckptkit.capture.fit import FitReport
from ckptkit.cli import main
from ckptkit.cli.shared import SIGPIPE_EXIT
from ckptkit.cli.watch import not_judging
from ckptkit.errors import CkptkitError, CommittedError, IncompleteCheckpointError
from ckptkit.run import rotation
from ckptkit.run.directory import rollback
from ckptkit.signals.stability import StabilityWatch
from ckptkit.verify import checks as _checks  # noqa: F401  (registers every code)

ROOT = Path(__file__).resolve().parents[2]
BOX = re.compile("[\u2500-\u257f]")
"""Box-drawing characters (rich's table borders)."""


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def _state(step: int = 0) -> ckptkit.TrainState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return ckptkit.TrainState(model=model, optimizer=opt, step=step)


def _run_dir(root: Path, steps: tuple[int, ...] = (10, 20, 30)) -> Path:
    ts = _state()
    with ckptkit.CheckpointManager(root, keep_last=len(steps)) as mgr:
        for s in steps:
            ts.step = s
            mgr.save(ts)
    return root


# --- wrong paths -----------------------------------------------------------------------------


def test_load_on_a_run_directory_names_its_checkpoints(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    with pytest.raises(IncompleteCheckpointError) as ei:
        ckptkit.load(run)
    msg = str(ei.value)
    assert "run directory holding 3 checkpoints" in msg
    assert str(run / "step-00000030") in msg and "(the newest)" in msg
    assert "CheckpointManager(" in msg and "ckptkit ls" in msg
    assert "no manifest" not in msg and "interrupted" not in msg


def test_load_on_a_missing_path_says_so_and_suggests(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", (10,))
    with pytest.raises(FileNotFoundError) as ei:  # still a FileNotFoundError for old excepts
        ckptkit.load(run / "step-0000010")  # one digit short
    msg = str(ei.value)
    assert "no such file or directory" in msg and "did you mean" in msg
    assert str(run / "step-00000010") in msg and "interrupted" not in msg
    with pytest.raises(IncompleteCheckpointError, match=r"check the path"):
        ckptkit.load(tmp_path / "nowhere" / "ckpt")


def test_load_on_other_wrong_things(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", (10,))
    with pytest.raises(CkptkitError, match="pass the directory that holds it"):
        ckptkit.load(run / "step-00000010" / "manifest.json")
    torch.save({"model": {"w": torch.ones(2)}}, tmp_path / "plain.pt")
    with pytest.raises(IncompleteCheckpointError, match=r"torch.save.*'ckptkit verify"):
        ckptkit.load(tmp_path / "plain.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IncompleteCheckpointError, match="an empty directory"):
        ckptkit.load(tmp_path / "empty")
    with pytest.raises(IncompleteCheckpointError, match="a directory of 1 run directory"):
        ckptkit.load(tmp_path)
    # An interrupted save keeps its own code and words.
    (run / "step-00000020").mkdir()
    with pytest.raises(IncompleteCheckpointError, match="CK-M001"):
        ckptkit.load(run / "step-00000020")


def test_inspect_on_a_run_directory_exit_2_names_what_to_pass(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", (10, 20))
    code, out, err = _run("inspect", str(run))
    assert code == 2 and out == ""
    assert "run directory holding 2 checkpoints" in err and "step-00000020" in err
    code, _, err = _run("inspect", str(tmp_path / "nope"))
    assert code == 2 and "no such file or directory" in err


# --- short reprs -----------------------------------------------------------------------------


def test_result_objects_have_short_reprs(tmp_path: Path) -> None:
    ts = _state(step=30)
    mgr = ckptkit.CheckpointManager(tmp_path / "run", keep_last=2)
    for s in (10, 20, 30):
        ts.step = s
        mgr.save(ts)
    mgr.wait()
    res = mgr.restore(ts)
    assert res is not None and res.manifest is not None
    assert len(repr(res.manifest.to_dict())) > 10_000  # the RNG states make it big
    live = {"model": {k: torch.zeros_like(v) for k, v in ts.model.state_dict().items()}}
    live["model"]["extra"] = torch.zeros(3)
    partial = ckptkit.load(res.path, into=live, strict=False)
    many = FitReport(loaded=[f"k{i}" for i in range(5000)], missing=[f"m{i}" for i in range(500)])
    plan = rotation.plan([rotation.CkptInfo(s, 1, True) for s in range(60)], keep_last=3)
    objs = {
        "RestoreResult": res,
        "Manifest": res.manifest,
        "SaveStats": mgr.last_save,
        "VerifyResult": ckptkit.verify(tmp_path / "run"),
        "Report": ckptkit.verify(res.path).reports[0],
        "PartialLoad": partial,
        "FitReport": many,
        "RetentionPlan": plan,
        "RollbackChoice": rollback(tmp_path / "run"),
        "CheckpointInfo": mgr.list()[0],
    }
    for name, obj in objs.items():
        text = repr(obj)
        assert text.startswith(name + "("), text
        assert len(text) < 500, f"{name}: {len(text)} chars"
    assert "step=30" in repr(res) and "step-00000030" in repr(res)
    assert "missing=['m0'" in repr(many) and "loaded=5000" in repr(many)
    mgr.close()


# --- compact output, --verbose ---------------------------------------------------------------


def test_verify_run_dir_is_compact_and_verbose_shows_the_rest(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    code, out, _ = _run("verify", str(run))
    assert code == 0
    assert out.count("component ") == 0, out  # no table per checkpoint
    assert len(out.splitlines()) <= 3 * 4 + 1
    assert out.count("OK ") == 3 and "3 checkpoints, 0 failed" in out
    assert "CK-S003" in out  # findings stay, one line each
    code, verbose, _ = _run("verify", str(run), "--verbose")
    assert code == 0 and verbose.count("component ") == 3
    assert verbose.count("Fix:") >= out.count("CK-")  # every finding with its fix
    # One checkpoint keeps its component table by default.
    code, one, _ = _run("verify", str(run / "step-00000030"))
    assert code == 0 and one.count("component ") == 1


def test_inspect_summarises_tensors_and_verbose_lists_them(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(12)))
    d = tmp_path / "step-00000010"
    with ckptkit.CheckpointManager(tmp_path) as mgr:
        mgr.save(ckptkit.TrainState(model=model, step=10))
    code, out, _ = _run("inspect", str(d))
    assert code == 0 and "11.weight" not in out  # neither tensor keys nor parameter names
    assert re.search(r"tensors: \d+ \(model 24, rng \d+", out), out
    assert len(out.splitlines()) < 40
    code, out, _ = _run("inspect", str(d), "--verbose")
    assert code == 0 and "model/11.weight" in out and "model/0.bias" in out
    code, out, _ = _run("inspect", str(d), "--no-tensors")  # old scripts keep working
    assert code == 0 and "model/11.weight" not in out


def test_no_box_drawing_when_output_is_not_a_terminal(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    bad = run / "step-00000010" / "model.safetensors"
    bad.write_bytes(b"x" * bad.stat().st_size)  # an error finding, with its fix
    for args in (
        ["verify", str(run)],
        ["verify", str(run), "--verbose"],
        ["verify", str(run / "step-00000010")],
        ["inspect", str(run / "step-00000020"), "--verbose"],
        ["ls", str(run)],
    ):
        _, out, _ = _run(*args)
        assert not BOX.search(out), (args, out)
    _, out, _ = _run("verify", str(run))
    # A finding is one line, whole: grep finds it with its message.
    line = next(ln for ln in out.splitlines() if "CK-F003" in ln)
    assert "digest" in line and "model.safetensors" in line


def _ckptkit(*args: str, **kw) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "ckptkit", *args], env=env, **kw)


def test_verify_into_head_ends_like_cat(tmp_path: Path) -> None:
    """``ckptkit verify RUN | head -1``: no 'Broken pipe', no traceback, status 141."""
    root = tmp_path / "run"
    for s in range(60):  # ~80 KB of --verbose output: more than a pipe buffer holds
        ckptkit.save({"model": {"w": torch.ones(2)}}, root / f"step-{s:08d}", step=s)
    p = _ckptkit("verify", str(root), "--verbose", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()  # what head does after its first line
    err = p.stderr.read()
    p.stderr.close()
    p.wait(timeout=60)
    assert first.startswith(b"OK ")
    assert err == b"", err.decode()
    assert p.returncode == SIGPIPE_EXIT


def test_oserror_message_has_no_empty_file_name() -> None:
    @main.command(name="_raise_oserror", hidden=True)
    def _cmd() -> None:
        raise OSError(28, "No space left on device")

    from ckptkit.cli.shared import edge

    wrapped = edge(_cmd.callback)  # type: ignore[arg-type]
    try:
        cmd = click.Command("x", callback=wrapped)
        r = CliRunner().invoke(cmd, [], catch_exceptions=False)
    finally:
        main.commands.pop("_raise_oserror", None)
    assert r.exit_code == 2
    assert r.stderr.strip() == "ckptkit: No space left on device"


# --- progress on long foreign work -----------------------------------------------------------


def test_foreign_verify_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    f = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.randn(256, 256)}, "step": 3}, f)
    code = f"from ckptkit.verify.runner import verify; verify({str(f)!r}, progress=True)"
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CKPTKIT_NO_PROGRESS", None)
    p = subprocess.Popen([sys.executable, "-c", code], stderr=slave, stdout=subprocess.DEVNULL,
                         env=env)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert p.wait(timeout=60) == 0
    assert b"verifying ckpt.pt" in seen


def test_foreign_verify_shows_no_progress_into_a_pipe(tmp_path: Path) -> None:
    f = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.randn(16, 16)}, "step": 3}, f)
    p = _ckptkit("verify", str(f), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=120)
    assert b"verifying ckpt.pt" not in err and b"verifying" not in out


# --- messages and help text ------------------------------------------------------------------

_WHATS = ("the disk is on fire", "the disk is on fire.", "the disk is on fire. ",
          "it broke (see x.)", "is it broken?")


def _no_doubled_stops(text: str) -> None:
    t = text.replace("...", "\u2026")  # an ellipsis is not a doubled full stop
    assert ".." not in t, text
    assert not re.search(r"\.\s+\.", t), text
    assert not re.search(r"[.?!]\s*\.\s*Fix:", text.replace(". Fix:", " Fix:")), text
    assert re.search(r"(\. |\? |! )Fix:", text) or "Fix:" not in text, text


@pytest.mark.parametrize("code", list(codes.CODES), ids=str)
def test_every_code_renders_one_full_stop_before_fix(code: str) -> None:
    for what in _WHATS:
        for hint in (None, "do this.", "do that. "):
            err = codes.error(code, what, path="step-1/model.safetensors", hint=hint)
            text = str(err)
            _no_doubled_stops(text)
            assert text.startswith(f"{code} step-1/model.safetensors: ")
            assert text.endswith(f"See docs/verify-codes.md#{code.lower()}.")


def test_errors_without_code_and_committed_errors_render_cleanly() -> None:
    for what in _WHATS:
        _no_doubled_stops(str(CkptkitError(what, hint="retry.")))
        _no_doubled_stops(str(CommittedError(what, committed="step-1", hint="see the log. ")))
        assert str(CkptkitError(what)).count(".") <= what.count(".") + 1


def _commands(group: click.Group) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += [(name, *sub) for sub in _commands(cmd) if sub]
        out.append((name,))
    return out


@pytest.mark.parametrize("argv", _commands(main), ids=lambda a: " ".join(a) or "ckptkit")
def test_help_is_plain_text(argv: tuple[str, ...]) -> None:
    code, out, _ = _run(*argv, "--help")
    assert code == 0 and "Usage:" in out
    for markup in ("``", ":class:`", ":func:`", ":meth:`", ":mod:`", ":data:`", "\\b"):
        assert markup not in out, f"{' '.join(argv)} --help shows {markup!r}"


# --- watch warm-up ---------------------------------------------------------------------------


def _metrics(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"step": s, "loss": 2.0 + 0.01 * (s % 5),
                                        "grad_norm": 1.0 + 0.01 * (s % 3)}) + "\n"
                            for s in range(1, n + 1)))


def test_watch_does_not_say_ok_before_it_judges(tmp_path: Path) -> None:
    m = tmp_path / "metrics.jsonl"
    _metrics(m, 40)
    code, out, _ = _run("watch", str(m), "--once")
    out = " ".join(out.split())  # the dashboard wraps at 120 columns
    assert code == 0 and "level ok" not in out
    assert "not judged yet" in out and "warming up: 40 of 500 steps" in out
    code, out, _ = _run("watch", str(m), "--once", "--json")
    data = json.loads(out)
    assert data["judging"] is False and "warming up" in data["not_judging"]
    _metrics(m, 700)
    code, out, _ = _run("watch", str(m), "--once")
    out = " ".join(out.split())
    assert code == 0 and "level ok" in out and "not judged" not in out
    assert json.loads(_run("watch", str(m), "--once", "--json")[1])["judging"] is True


def test_not_judging_follows_warmup_and_history() -> None:
    w = StabilityWatch(warmup=5, window=64, min_history=32)
    for s in range(1, 6):
        w.update(s, loss=2.0)
        assert "warming up" in (not_judging(w) or "")
    w.update(6, loss=2.0)
    assert "collecting a baseline" in (not_judging(w) or "")
    for s in range(7, 120):
        w.update(s, loss=2.0 + 0.01 * (s % 5))
    assert not_judging(w) is None
