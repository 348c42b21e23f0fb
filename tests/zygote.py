"""A warmed process that starts fresh test processes: a real process per case, no interpreter start.

A test that needs "a fresh process" (a writer killed mid-save, a restore that must not see
the writer's memory, a training run resumed in a new process) pays ~2-4 s on this machine
for ``python`` to import torch and ckptkit again. A :class:`Zygote` is a separate Python
process that imports them once and then starts each requested run the way ``ckptkit drill``
starts its runs (:mod:`ckptkit.drill.launch`, one mechanism for both): a ``fork`` whose
child resets what a fresh interpreter would not have (environment, working directory,
standard streams, signal handlers, warning filters, logging, ``sys.argv``/``sys.path``) and
runs the script or module as ``__main__``. The child is a new process with its own pid,
session and memory, starting from a state in which nothing was saved or restored.

:meth:`Zygote.ckptkit` runs the CLI that way (``python -m ckptkit ARGS``); :func:`fresh_ckptkit`
is the same run in a new interpreter, for what only a process start shows.

Several runs may be in flight at once (the ranks of a gloo world: ``tests/ranks/_launch.py``);
the zygote answers each start with the child's pid and reaps a child when asked to wait for
it. The zygote stays single-threaded and never touches a process group or CUDA, so forking
it is safe; where a run cannot be forked (see
:func:`ckptkit.drill.launch.can_fork`) it is started as a plain subprocess instead.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

_SERVER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    import ckptkit, ckptkit.run.manager, ckptkit.verify.runner  # noqa: F401  (warm imports)
    from ckptkit.drill.launch import Launch, start
    for name in sys.argv[1:]:
        __import__(name)
    out = os.fdopen(os.dup(1), "w")  # the protocol's own stream: nothing else writes to it
    os.dup2(2, 1)
    children = {}
    for line in sys.stdin:
        req = json.loads(line)
        if "wait" in req:
            print(json.dumps({"rc": children.pop(req["wait"]).wait()}), file=out, flush=True)
            continue
        launch = Launch(req["argv"], req["env"], Path(req["cwd"]), Path(req["stdout"]),
                        Path(req["stderr"]))
        proc = start(launch)
        children[proc.pid] = proc
        print(json.dumps({"pid": proc.pid}), file=out, flush=True)
    os._exit(0)  # stdin closed: done (an interpreter's tear-down with torch loaded takes seconds)
    """
)


Env = dict[str, str | None]
"""Environment additions of a run; None leaves a variable out."""


@dataclass
class Result:
    """What one forked child did."""

    returncode: int
    stdout: str
    stderr: str


class Child:
    """A forked child in flight: its pid (to signal it), then :meth:`wait` for its result."""

    def __init__(self, zygote: Zygote, pid: int, out: Path, err: Path) -> None:
        self.pid = pid
        self._zygote, self._out, self._err = zygote, out, err

    def wait(self, timeout: float = 300.0) -> Result:
        """Wait for the child to end; kill it (and its process group) at ``timeout``."""
        z = self._zygote
        z._send({"wait": self.pid})
        try:
            rc = z._read(time.monotonic() + timeout)["rc"]
        except TimeoutError:
            os.killpg(self.pid, signal.SIGKILL)
            z._read(time.monotonic() + 30)
            raise TimeoutError(
                f"zygote child timed out after {timeout} s; stderr:\n{self._err.read_text()}"
            ) from None
        return Result(rc, self._out.read_text(), self._err.read_text())


class Zygote:
    """A warmed Python process forking one child per :meth:`run` (see the module docstring).

    Args:
        workdir: where the children's output files go.
        preload: modules to import once in the zygote besides torch and ckptkit.
        env: environment of the zygote (and so of every child); default: this process's.
    """

    def __init__(
        self, workdir: Path, *, preload: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._n = 0
        self._buf = b""
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**(env if env is not None else os.environ), "OMP_NUM_THREADS": "1"},
        )

    def run(
        self,
        source: str,
        *argv: str,
        env: Env | None = None,
        cwd: Path | None = None,
        timeout: float = 300.0,
    ) -> Result:
        """Run the Python ``source`` as a script in a fresh process; wait for it (kill it at
        ``timeout``)."""
        return self.start(source, *argv, env=env, cwd=cwd).wait(timeout)

    def start(
        self, source: str, *argv: str, env: Env | None = None, cwd: Path | None = None
    ) -> Child:
        """Start a run of the Python ``source`` as a script and return at once."""
        self._n += 1
        script = self.workdir / f"child-{self._n}.py"
        script.write_text(textwrap.dedent(source))
        return self.start_argv([sys.executable, str(script), *argv], env=env, cwd=cwd)

    def run_module(
        self,
        module: str,
        *argv: str,
        env: Env | None = None,
        cwd: Path | None = None,
        timeout: float = 300.0,
    ) -> Result:
        """``python -m module argv...`` in a fresh process; wait for it."""
        return self.start_argv([sys.executable, "-m", module, *argv], env=env, cwd=cwd).wait(
            timeout
        )

    def ckptkit(
        self,
        *args: str | os.PathLike[str],
        env: Env | None = None,
        cwd: Path | None = None,
        timeout: float = 300.0,
    ) -> Result:
        """``python -m ckptkit ARGS`` in a fresh process (a fork: ~0.1 s instead of 2-4 s).

        The fork runs ``ckptkit.__main__`` (what ``-m ckptkit`` runs) by that name, so the
        child keeps the warmed ``ckptkit`` package instead of re-executing its ``__init__``.
        What a process reads only while it starts (the interpreter's options, a variable
        read at import) is not re-read here: a test of that uses :func:`fresh_ckptkit`.
        """
        return self.run_module(
            "ckptkit.__main__", *map(str, args), env=env, cwd=cwd, timeout=timeout
        )

    def start_argv(
        self, argv: list[str], *, env: Env | None = None, cwd: Path | None = None
    ) -> Child:
        """Start ``argv`` (this interpreter on a script or module) and return at once.

        ``env`` is added to this process's environment at the time of the call, as
        ``subprocess`` would pass it; a key mapped to None is left out.
        """
        self._n += 1
        out = self.workdir / f"child-{self._n}.out"
        err = self.workdir / f"child-{self._n}.err"
        req = {
            "argv": argv,
            "env": {
                k: v
                for k, v in {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}.items()
                if v is not None
            },
            "cwd": str(cwd or self.workdir),
            "stdout": str(out),
            "stderr": str(err),
        }
        self._send(req)
        pid = self._read(time.monotonic() + 120)["pid"]
        return Child(self, pid, out, err)

    def _send(self, req: dict[str, object]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write((json.dumps(req) + "\n").encode())
        self._proc.stdin.flush()

    def _read(self, deadline: float) -> dict[str, int]:
        """The next protocol line, read from the raw pipe (a buffered reader could hold a
        line that ``select`` would then wait for in vain)."""
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("zygote did not answer")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"zygote died (exit {self._proc.wait()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def fresh_ckptkit(
    *args: str | os.PathLike[str],
    env: Env | None = None,
    cwd: Path | None = None,
    timeout: float = 300.0,
) -> Result:
    """``python -m ckptkit ARGS`` in a new interpreter, as a user types it (2-4 s: imports
    torch). :meth:`Zygote.ckptkit` is the same run forked from a warmed process; ``env``
    and ``timeout`` mean the same in both (``cwd=None``: this process's working directory)."""
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    p = subprocess.run(
        [sys.executable, "-m", "ckptkit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        cwd=cwd,
    )
    return Result(p.returncode, p.stdout, p.stderr)
