"""Resume drills: run a training entrypoint twice (reference and resumed) and compare.

The environment-variable contract a training script follows lives in
:mod:`ckptkit.integrations.drill_env`.
"""
