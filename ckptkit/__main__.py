"""``python -m ckptkit`` runs the CLI."""

from ckptkit.cli import main

main()
