"""The ``ckptkit`` command: parse, call one library function, render, exit.

This module builds the click group, :func:`main` (the ``ckptkit`` console script and
``python -m ckptkit``), from the commands of its modules: ``checkpoint_cmds`` (verify,
inspect, diff), ``run_cmds`` (adopt, ls, prune, scrub, rollback), ``drill_cmd``,
``watch_cmd``; what they share (the error edge, the path and key options) is ``shared``.

Exit codes: 0 clean, 1 error findings (or a failed drill), 2 unreadable input or
usage error (any :class:`~ckptkit.errors.CkptkitError` is converted here, at the edge).
"""

from __future__ import annotations

import click

from ckptkit._version import __version__
from ckptkit.cli.checkpoint_cmds import diff_cmd, inspect, verify
from ckptkit.cli.drill_cmd import drill
from ckptkit.cli.run_cmds import adopt, ls, prune, rollback, scrub
from ckptkit.cli.watch_cmd import watch


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckptkit")
def main() -> None:
    """Trustworthy PyTorch training checkpoints: verify, inspect, drill, rotate."""


for _command in (verify, inspect, diff_cmd, adopt, ls, prune, scrub, drill, watch, rollback):
    main.add_command(_command)

__all__ = ["main"]
