"""Integrations with training frameworks (each import-guarded: the framework is an extra).

``ckptkit.integrations.hf`` (Trainer, Accelerate) and ``ckptkit.integrations.lightning``
(Trainer, Fabric) add what the framework's own checkpointing leaves out: digests and the
component table beside each checkpoint, verify before load, verified rotation, step
records for drills and the stability watch.
"""
