"""Signals: what a running job observes about itself, step by step.

The step records (:mod:`ckptkit.signals.recorder`, filled by :mod:`ckptkit.signals.observe`),
the RNG's draws between steps (:mod:`ckptkit.signals.rngtrace`), the resume guard that checks
a restored run against the look-ahead its checkpoint recorded (:mod:`ckptkit.signals.guard`),
the stability watch that judges loss and gradients (:mod:`ckptkit.signals.stability`), and
automatic recovery from what it sees (:mod:`ckptkit.signals.recovery`, with its log). This
layer reads checkpoints (through ``checkpoint/`` and ``verify/``) but never manages a run
directory: that is ``run/``, one floor up.
"""
