"""Registered checks, one module per family; importing this package registers them all.

Import order is registration order, which orders findings of equal severity: keep the
families in spec order (integrity, completeness, consistency, compat).
"""

# isort: off
from ckptkit.verify.checks import integrity  # noqa: F401
from ckptkit.verify.checks import replicas  # noqa: F401
from ckptkit.verify.checks import completeness  # noqa: F401
from ckptkit.verify.checks import implied  # noqa: F401
from ckptkit.verify.checks import consistency  # noqa: F401
from ckptkit.verify.checks import compat  # noqa: F401

# isort: on
