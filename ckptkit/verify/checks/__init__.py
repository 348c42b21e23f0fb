"""Registered checks, one module per family; importing this package registers them all."""

from ckptkit.verify.checks import integrity  # noqa: F401
