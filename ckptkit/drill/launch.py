"""Start one run of a drill: a subprocess, or a fork of this already warmed interpreter.

A drill's wall time for a small model is mostly interpreter start-up (importing torch takes
seconds) and tear-down, not training. When the command is ``python -m MODULE ...`` or
``python SCRIPT.py ...`` for this very interpreter, the run can instead be a ``fork()`` of
the drill process, which has torch and ckptkit imported already: the child resets what a
fresh interpreter would not have (environment, working directory, standard streams, signal
handlers, warning filters, logging handlers, ``atexit`` functions, ``sys.argv``/``sys.path``),
then runs the module or script with :mod:`runpy` and ends with ``os._exit`` after its own
``atexit`` functions, skipping the interpreter's slow tear-down.

Before the first fork the drill process *warms* itself: it imports what every run would
import first (``torch._dynamo``, which torch imports on the first optimizer it builds, and
the modules the script imports at its top level), so each fork starts with them loaded.

A fork is used only where it is as good as a fresh process: a POSIX system, one intra-op
thread (``--threads 1``: OpenMP does not survive a fork once its pool started), CUDA not
initialised in the drill process, and no ``PYTHONWARNINGS``. ``method="spawn"`` forces a
subprocess, ``"fork"`` insists on a fork where the command allows one.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import faulthandler
import importlib
import importlib.util
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import psutil
import torch

Method = Literal["auto", "fork", "spawn"]


@dataclass(frozen=True)
class Launch:
    """What to run and where its output goes."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    stdout: Path
    stderr: Path
    threads: int = 1


class Proc:
    """A started run: poll it, wait for it, kill its whole process group.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> p = start(Launch([sys.executable, "-c", "print(1)"], dict(os.environ), None,
        ...                  d / "o", d / "e"), method="spawn")
        >>> p.wait(60), (d / "o").read_text()
        (0, '1\\n')
    """

    def __init__(self, pid: int, method: str, popen: subprocess.Popen[bytes] | None) -> None:
        self.pid = pid
        self.method = method
        """``fork`` or ``spawn``."""
        self.launched_at = time.time()
        self.returncode: int | None = None
        self.warm_s = 0.0
        """Seconds this start spent warming the drill process first (:func:`warm`)."""
        self._popen = popen

    def poll(self) -> int | None:
        """The exit status once the run ended (negative: killed by that signal), else None."""
        if self.returncode is not None:
            return self.returncode
        if self._popen is not None:
            self.returncode = self._popen.poll()
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.returncode = -9
            return self.returncode
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end (killing the group after ``timeout`` seconds: status -9)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                return -9
            time.sleep(0.02)
        return rc

    def kill(self) -> None:
        """SIGKILL the run's process group (it leads its own session), every process it
        started in a session of its own (torchrun's workers), and reap it."""
        try:
            # Listed before the kill: a killed parent's children are re-parented away.
            strays = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            strays = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for p in strays:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self._popen is not None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()
            self._popen.wait()
            self.returncode = -9
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.returncode = -9


def fork_target(argv: list[str]) -> tuple[Literal["module", "path"], str, list[str]] | None:
    """``(kind, module or script, arguments)`` when ``argv`` runs this interpreter on Python
    code with no interpreter options, else None.

    Example:
        >>> fork_target([sys.executable, "-m", "ckptkit.examples.tiny_lm", "--steps", "4"])
        ('module', 'ckptkit.examples.tiny_lm', ['--steps', '4'])
        >>> fork_target(["torchrun", "train.py"]) is None
        True
    """
    if len(argv) < 2 or not _same_interpreter(argv[0]):
        return None
    if argv[1] == "-m" and len(argv) >= 3 and not argv[2].startswith("-"):
        return "module", argv[2], argv[3:]
    if argv[1].endswith(".py") and Path(argv[1]).is_file():
        return "path", argv[1], argv[2:]
    return None


def _same_interpreter(exe: str) -> bool:
    try:
        return os.path.realpath(exe) == os.path.realpath(sys.executable)
    except OSError:
        return False


def can_fork(launch: Launch) -> bool:
    """Whether ``launch`` can run as a fork of this process (see the module docstring).

    Example:
        >>> can_fork(Launch(["bash", "-c", "true"], {}, None, Path("o"), Path("e")))
        False
    """
    return (
        hasattr(os, "fork")
        and fork_target(launch.argv) is not None
        and launch.threads == 1
        and not (torch.cuda.is_available() and torch.cuda.is_initialized())
        and not launch.env.get("PYTHONWARNINGS")
    )


def start(launch: Launch, *, method: Method = "auto") -> Proc:
    """Start ``launch`` as a fork (when allowed and not ``spawn``) or a subprocess.

    Raises:
        OSError: the command cannot be started.
        ValueError: ``method="fork"`` for a command that cannot be forked.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> p = start(Launch(["true"], dict(os.environ), None, d / "o", d / "e"))
        >>> p.method, p.wait(60)
        ('spawn', 0)
    """
    forkable = can_fork(launch)
    if method == "fork" and not forkable:
        raise ValueError(
            "launch='fork' needs 'python -m MODULE ...' or 'python SCRIPT.py ...' for this "
            "interpreter, --threads 1, CUDA not initialised and no PYTHONWARNINGS"
        )
    if method != "spawn" and forkable:
        warm_s = warm(launch)
        proc = _fork(launch)
        proc.warm_s = warm_s
        return proc
    with open(launch.stdout, "wb") as out, open(launch.stderr, "wb") as err:
        # Its own session (process group): on a timeout the whole group is killed, so
        # workers the script started (DataLoader workers, torchrun ranks) die with it.
        popen = subprocess.Popen(
            launch.argv,
            stdout=out,
            stderr=err,
            env=launch.env,
            cwd=launch.cwd,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Proc(popen.pid, "spawn", popen)


_WARMED: set[str] = set()


def warm(launch: Launch) -> float:
    """Import here what a forked run of ``launch`` would import first (once per target).

    ``torch._dynamo`` (torch imports it when the first optimizer is built: seconds), then
    every module the script imports at its top level; a module that fails to import is
    skipped (the run imports it itself and reports its own error).

    Returns:
        The seconds it took (0 when this target was warmed before).

    Example:
        >>> s = warm(Launch([sys.executable, "-m", "json.tool"], {}, None, Path("o"), Path("e")))
    """
    target = fork_target(launch.argv)
    if target is None or target[1] in _WARMED:
        return 0.0
    t0 = time.perf_counter()
    _WARMED.add(target[1])
    for name in ("torch._dynamo", *_top_level_imports(target[0], target[1])):
        with warnings.catch_warnings(), contextlib.suppress(Exception):
            warnings.simplefilter("ignore")
            importlib.import_module(name)
    return time.perf_counter() - t0


def _top_level_imports(kind: str, target: str) -> list[str]:
    try:
        if kind == "module":
            spec = importlib.util.find_spec(target)
            origin = spec.origin if spec is not None else None
        else:
            origin = target
        if not origin or not origin.endswith(".py"):
            return []
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (ImportError, OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    body = list(tree.body)
    for node in body:
        if isinstance(node, ast.Try):
            body.extend(node.body)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n for n in dict.fromkeys(names) if n != "__future__"]


def _fork(launch: Launch) -> Proc:
    target = fork_target(launch.argv)
    assert target is not None
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
        pid = os.fork()
    if pid == 0:
        _child(launch, *target)
    return Proc(pid, "fork", None)


_FRESH_FILTERS: tuple[tuple[str, type[Warning], str], ...] = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)
"""A fresh interpreter's warning filters (no -W, no dev mode), first match first."""


def _child(launch: Launch, kind: str, target: str, args: list[str]) -> NoReturn:
    code = 1
    try:
        os.setsid()
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, launch.stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, launch.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            new = os.open(path, flags, 0o644)
            os.dup2(new, fd)
            os.close(new)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8")  # noqa: SIM115
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        atexit._clear()
        os.environ.clear()
        os.environ.update(launch.env)
        # The parent's fault handler (pytest enables one) writes to the parent's stderr; a
        # fresh interpreter has one only when asked, writing to its own.
        faulthandler.disable()
        if launch.env.get("PYTHONFAULTHANDLER"):
            faulthandler.enable()
        if launch.cwd is not None:
            os.chdir(launch.cwd)
        warnings.resetwarnings()
        for action, category, module in reversed(_FRESH_FILTERS):
            warnings.filterwarnings(action, category=category, module=module)  # type: ignore[arg-type]
        logging.root.handlers.clear()
        logging.root.setLevel(logging.WARNING)
        for lg in logging.Logger.manager.loggerDict.values():
            if isinstance(lg, logging.Logger):
                lg.handlers.clear()
                lg.setLevel(logging.NOTSET)
                lg.propagate, lg.disabled = True, False
        torch.set_num_threads(launch.threads)
        extra = [p for p in launch.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        here = os.getcwd() if kind == "module" else os.path.dirname(os.path.abspath(target))
        sys.path[:0] = [here, *extra]
        if kind == "module":
            sys.modules.pop(target, None)  # run it fresh as __main__, not the imported copy
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = int(e.code or 0)
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            for t in threading.enumerate():
                if t is not threading.main_thread() and not t.daemon:
                    t.join()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


__all__ = ["Launch", "Method", "Proc", "can_fork", "fork_target", "start", "warm"]
