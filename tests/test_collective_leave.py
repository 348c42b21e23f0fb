"""``collective.leave``: a finished gloo rank ends with its status and its output, without
the interpreter's teardown (pytorch/pytorch#179291)."""

from __future__ import annotations

import subprocess
import sys


def test_leave_ends_with_the_status_and_flushes_what_was_printed() -> None:
    code = (
        "import atexit, logging, sys\n"
        "from ckptkit.collective import leave\n"
        "atexit.register(lambda: print('teardown ran'))\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "print('report', end='')  # unflushed: leave flushes it\n"
        "logging.getLogger('x').warning('logged')\n"
        "leave(3)\n"
        "print('after leave')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 3, p.stderr
    assert p.stdout == "report"  # no "teardown ran", nothing after leave
    assert "logged" in p.stderr
