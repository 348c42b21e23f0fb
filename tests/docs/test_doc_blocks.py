"""Every fenced code block of README.md and docs/*.md runs, or says why it cannot here.

Blocks are found automatically (:mod:`docblocks`): a new ```python, ```bash, ```sh or
```console block without a mark is run as it stands, so a broken example fails here. A
block that cannot run here says why in an HTML comment right above its fence (invisible on
GitHub)::

    <!-- doc-test: skip — needs a CUDA GPU -->
    <!-- doc-test: prelude=tiny_loop env=CKPTKIT_DRILL_STOP_AT=4 -->

``prelude=`` names the tiny model/optimizer/dataset the block assumes (:mod:`preludes`);
the other marks are listed in :mod:`docblocks`. Python blocks run in-process (or, with
``isolate``, in a fresh interpreter) with a tmp dir as the working directory. Shell blocks
run line by line in that tmp dir: ``ckptkit ...`` through the CLI in-process (pipes into
grep/jq/less/head and ``> file`` work), ``python ...`` in a subprocess, ``export`` sets the
environment; each command must exit 0, or 1 where its own comment says "exit 1". The
checkpoints they name (``runs/exp1/ckpt/step-00001000``, ``model.safetensors``...) are
prepared by the ``workspace`` fixture. ``json``/``yaml`` blocks are parsed. Blocks marked
``slow`` (drills, real framework runs) carry ``pytest.mark.slow``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from docblocks import PARSED, PYTHON, ROOT, SHELL, Block, all_blocks
from preludes import PRELUDES

import ckptkit
from ckptkit.cli import main

BLOCKS = all_blocks()
RUN = PYTHON + SHELL
FILTERS = ("grep", "jq", "less", "head", "tail", "wc")
"""Programs a documented ``ckptkit ... | PROGRAM`` may pipe into (run for real)."""
HMAC_KEY = b"k" * 32


def _params(kinds: tuple[str, ...]) -> list[object]:
    out = []
    for b in BLOCKS:
        if b.lang not in kinds:
            continue
        marks = []
        if b.skip:
            marks.append(pytest.mark.skip(reason=b.skip))
        if "slow" in b.marks:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def test_blocks_are_found() -> None:
    # A parser that found nothing would pass every test below.
    assert len([b for b in BLOCKS if b.lang in RUN]) > 40
    assert {b.path.name for b in BLOCKS} >= {"README.md", "cli.md", "stability.md"}


def test_untagged_fences_hold_no_commands() -> None:
    """A command in a fence without a language would escape these tests: tag it."""
    looks_runnable = re.compile(r"^\s*(\$ |ckptkit |python |import |from \S+ import )")
    bad = [b.id for b in BLOCKS if b.lang not in (*RUN, *PARSED)
           and any(looks_runnable.match(line) for line in b.code.splitlines())]
    assert not bad, f"tag these fences (```bash, ```python or ```console): {bad}"


def test_marks_only_on_blocks_that_use_them() -> None:
    for b in BLOCKS:
        for name in b.marks.get("prelude", []):
            assert name in PRELUDES, f"{b.id}: no prelude {name!r} (known: {sorted(PRELUDES)})"
        if "continues" in b.marks:
            assert b.lang in PYTHON, f"{b.id}: only Python blocks continue"


# --- Python ----------------------------------------------------------------------------------


def _rewrite(b: Block, code: str) -> str:
    for rule in b.marks.get("rewrite", []):
        old, _, new = rule.partition("->")
        code = code.replace(old, new)
    return code


def _python_source(b: Block) -> str:
    chain = [b]
    while "continues" in chain[0].marks:
        prev = [p for p in BLOCKS if p.path == b.path and p.lang in PYTHON
                and p.line < chain[0].line]
        assert prev, f"{chain[0].id} continues no earlier Python block"
        chain.insert(0, prev[-1])
    prelude = "".join(PRELUDES[n] for n in chain[0].marks.get("prelude", []))
    return prelude + "".join(_rewrite(c, c.code) for c in chain)


def _env(b: Block, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("HOME", str(home))
    # `python` in a documented command is the interpreter running the tests (an activated venv).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CKPTKIT_NO_PROGRESS", "1")
    monkeypatch.setenv("TMPDIR", str(home))  # a drill keeps a failed run's files there
    for name in ("CKPTKIT_HMAC_KEY", "CKPTKIT_HMAC_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    for item in b.marks.get("env", []):
        name, _, value = item.partition("=")
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("block", _params(PYTHON))
def test_python_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _python_source(block)
    compile(source, block.id, "exec")  # a syntax error names the block
    _env(block, monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    if "isolate" in block.marks:
        proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 0, f"{block.id} failed:\n{proc.stderr[-4000:]}"
        return
    threads = torch.get_num_threads()
    try:
        exec(compile(source, block.id, "exec"), {"__name__": "__doc_block__"})
    finally:
        torch.set_num_threads(threads)


# --- shell -----------------------------------------------------------------------------------


def _build_workspace(root: Path) -> None:
    """The checkpoints and files the documented commands name, written by ckptkit itself."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "drills", root / "drills")
    (root / ".ckptkit").mkdir()
    (root / ".ckptkit" / "hmac.key").write_bytes(HMAC_KEY)
    (root / "secrets").mkdir()
    (root / "secrets" / "ckptkit-hmac").write_bytes(HMAC_KEY)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 2))
    sampler = ckptkit.ResumableSampler(data, seed=0)
    rec = ckptkit.Recorder(root / "runs/exp1/metrics.jsonl")
    ts = ckptkit.TrainState(model=model, optimizer=opt, sampler=sampler, recorder=rec)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
    # Signed with the key the docs pass (~/.ckptkit/hmac.key, /run/secrets/ckptkit-hmac).
    with ckptkit.CheckpointManager(root / "runs/exp1/ckpt", keep_last=3, key=HMAC_KEY) as mgr:
        while ts.step < 2000:
            for x, y in sampler.batches(loader):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                ts.step += 1
                rec.log(ts.step, loss=loss.item())
                if ts.step in (1000, 2000):
                    mgr.save(ts)
                if ts.step >= 2000:
                    break
    rec.close()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, root / "model.safetensors")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 2000},
               root / "ckpt.pt")


@pytest.fixture(scope="session")
def workspace_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-workspace") / "ws"
    _build_workspace(root)
    return root


FOREIGN = textwrap.dedent('''\
    import os, subprocess, sys, torch
    import torch.distributed.checkpoint as dcp
    scripts = sys.argv[1]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    def run(*args):
        subprocess.run([sys.executable, os.path.join(scripts, args[0]), *args[1:]], check=True,
                       env=env, stdout=subprocess.DEVNULL)
    run("hf_trainer_train.py", "--output-dir", "out", "--steps", "8", "--save-steps", "4")
    run("lit_tiny.py", "--out", "lightning_logs/version_0", "--steps", "6")
    run("hf_accelerate_train.py", "--project-dir", "proj", "--steps", "6")
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    for step in (10, 20):
        dcp.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": step},
                 checkpoint_id=f"outputs/checkpoint/step-{step}")
    ''')


@pytest.fixture(scope="session")
def foreign_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trainer, Lightning, Accelerate and DCP checkpoints written by the real clients."""
    root = tmp_path_factory.mktemp("docs-foreign")
    scripts = ROOT / "tests/scripts"
    proc = subprocess.run([sys.executable, "-c", FOREIGN, str(scripts)], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CKPTKIT_NO_PROGRESS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpts = sorted((root / "lightning_logs/version_0/checkpoints").glob("*.ckpt"))
    assert ckpts, sorted(str(p) for p in root.rglob("*"))
    last = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    shutil.copy2(last if last.exists() else ckpts[-1], root / "last.ckpt")
    return root


def _commands(b: Block) -> list[tuple[str, str]]:
    """(command, its comment) for each logical line; console blocks: the ``$ `` lines."""
    text = _rewrite(b, b.code).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if b.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.search(r"\s#\s?(.*)$", line)
        out.append((line[: m.start()] if m else line, m.group(1) if m else ""))
    return out


DRILL_FILES = ("--json", "--junit", "--plot")
"""The options naming a file a drill writes: two documented drills that differ only there
are one drill, written under both names."""
_DRILLS: dict[tuple[str, ...], tuple[int, str, str, dict[str, bytes]]] = {}
"""Each documented drill run in this pytest process, by its arguments (file names aside):
the same drill documented on three pages runs once (a tiny-LM drill is deterministic)."""


def _drill(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run ``ckptkit drill ARGS`` as its own process, as typed, or replay an identical one."""
    files = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i] in DRILL_FILES}
    # A file name is not part of what the drill does; "-" (the report on stdout) is.
    key = tuple("FILE" if i and args[i - 1] in DRILL_FILES and a != "-" else a
                for i, a in enumerate(args))
    if key not in _DRILLS:
        proc = subprocess.run([sys.executable, "-m", "ckptkit", *args], capture_output=True,
                              text=True, timeout=900, cwd=cwd)
        wrote = {opt: (cwd / name).read_bytes() for opt, name in files.items()
                 if name != "-" and (cwd / name).is_file()}
        _DRILLS[key] = (proc.returncode, proc.stdout, proc.stderr, wrote)
    code, out, err, wrote = _DRILLS[key]
    for opt, data in wrote.items():
        dst = cwd / files[opt]
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            dst.write_bytes(data)
    return code, out, err


def _ckptkit(args: list[str], b: Block, cwd: Path) -> tuple[int, str, str]:
    for rule in b.marks.get("add", []):
        cmd, _, arg = rule.partition(":")
        if args and args[0] == cmd:
            args = [*args, arg]
    if args and args[0] == "drill":
        # A drill starts (or forks) training processes: its own process, as typed.
        return _drill(args, cwd)
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def _run_line(line: str, comment: str, b: Block, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    words = [os.path.expanduser(os.path.expandvars(w)) for w in shlex.split(line)]
    where = f"{b.id}: {line.strip()}"
    if words[0] == "export":
        for item in words[1:]:
            name, _, value = item.partition("=")
            monkeypatch.setenv(name, value)
        return
    out_file = None
    if ">" in words:
        i = words.index(">")
        out_file, words = words[i + 1], words[:i]
    stages, cur = [], []
    for w in words:
        if w == "|":
            stages.append(cur)
            cur = []
        else:
            cur.append(w)
    stages.append(cur)
    head, filters = stages[0], stages[1:]
    if head[0] == "ckptkit":
        code, out, err = _ckptkit(head[1:], b, cwd)
    elif head[0] == "python":
        proc = subprocess.run([sys.executable, *head[1:]], capture_output=True, text=True,
                              cwd=cwd, timeout=900)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        raise AssertionError(f"{where}: doc-test runs only ckptkit/python/export lines; "
                             "mark the block skip with a reason")
    allowed = {0, 1} if "exit 1" in comment else {0}
    assert code in allowed, f"{where}: exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{where}:\n{err[-3000:]}"
    for f in filters:
        assert f[0] in FILTERS, f"{where}: pipes into {f[0]!r}, not one of {FILTERS}"
        proc = subprocess.run(f, input=out, capture_output=True, text=True, cwd=cwd, timeout=60)
        # grep -c prints 0 and exits 1 when nothing matched: a count, not a failure.
        assert proc.returncode == 0 or f[:1] == ["grep"], f"{where}: {proc.stderr}"
        out = proc.stdout
    if out_file:
        (cwd / out_file).write_text(out)
    i = head.index("--json") if "--json" in head else -1
    json_to_stdout = i >= 0 and (i + 1 == len(head) or head[i + 1].startswith("-"))
    if json_to_stdout and not filters and not out_file:
        json.loads(out)  # documented --json output is JSON


@pytest.mark.parametrize("block", _params(SHELL))
def test_shell_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     request: pytest.FixtureRequest) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(request.getfixturevalue("workspace_template"), ws)
    if block.mark("workspace") == "foreign":
        shutil.copytree(request.getfixturevalue("foreign_template"), ws, dirs_exist_ok=True)
    _env(block, monkeypatch, ws)
    monkeypatch.chdir(ws)
    commands = _commands(block)
    assert commands, f"{block.id}: no command found"
    for line, comment in commands:
        _run_line(line, comment, block, ws, monkeypatch)


# --- data ------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", _params(PARSED))
def test_data_block_parses(block: Block) -> None:
    if block.lang == "json":
        text = block.code.strip()
        # A member shown on its own ("key": value) is a fragment of an object.
        json.loads("{" + text + "}" if text.startswith('"') else text)
    else:
        yaml = pytest.importorskip("yaml")
        yaml.safe_load(block.code)
