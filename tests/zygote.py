"""A warmed process that forks fresh test processes: a real process per case, no interpreter start.

A test that needs "a fresh process" (a writer killed mid-save, a restore that must not see
the writer's memory) pays ~2-4 s on this machine for ``python -c`` to import torch and
ckptkit again. A :class:`Zygote` imports them once, then forks one child per request: the
child is a new process with its own pid, memory and file descriptors, starting from a state
in which nothing was saved or restored, at the cost of a ``fork``.

The child runs a Python source string with the request's ``argv``, working directory and
environment (the caller's at the time of the request, plus additions, as ``subprocess``
would give it); its stdout and stderr go to files; its exit status comes back as a
``subprocess``-style return code (``-9`` for SIGKILL). A request can be killed at a deadline.
The zygote itself stays single-threaded and never touches a process group or CUDA, so
forking it is safe.
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
    import json, os, sys, traceback
    import torch
    torch.set_num_threads(1)
    import ckptkit, ckptkit.manager, ckptkit.verify.runner  # noqa: F401  (warm imports)
    for name in sys.argv[1:]:
        __import__(name)
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing a child prints may reach the protocol stream
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)
                sys.stdin.close()
                for fd, name in ((1, req["stdout"]), (2, req["stderr"])):
                    f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(f, fd)
                    os.close(f)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                os.chdir(req["cwd"])
                os.environ.clear()
                os.environ.update(req["env"])
                sys.argv = ["-c", *req["argv"]]
                exec(compile(req["source"], "<zygote child>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), file=out, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=out, flush=True)
    """
)


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
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 300.0,
    ) -> Result:
        """Fork a child that runs ``source`` as ``__main__``; wait for it (kill it at ``timeout``)."""
        return self.start(source, *argv, env=env, cwd=cwd).wait(timeout)

    def start(
        self, source: str, *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Child:
        """Fork a child that runs ``source`` as ``__main__`` and return at once (one at a time)."""
        assert self._proc.stdin is not None
        self._n += 1
        out = self.workdir / f"child-{self._n}.out"
        err = self.workdir / f"child-{self._n}.err"
        req = {
            "source": textwrap.dedent(source),
            "argv": list(argv),
            "env": {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
            "cwd": str(cwd or self.workdir),
            "stdout": str(out),
            "stderr": str(err),
        }
        self._proc.stdin.write((json.dumps(req) + "\n").encode())
        self._proc.stdin.flush()
        pid = self._read(time.monotonic() + 60)["pid"]
        return Child(self, pid, out, err)

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
