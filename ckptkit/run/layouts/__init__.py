"""Framework run layouts: how a framework lays out its checkpoints in a run directory.

Each module here recognises one framework's run directory (a Trainer ``output_dir`` with
``checkpoint-N/``, an Accelerate ``checkpoints/``, a Lightning ``checkpoints/`` of
``*.ckpt``) and returns a :class:`ckptkit.run.Run` with its layout strategy for it
(:mod:`ckptkit.run.layout`: how files map to checkpoints, how to read one; the run owns the
lock, the index and retention), registered with :func:`ckptkit.run.registry.register` at
import. They read files only: no framework is imported, so ``ckptkit ls`` works on a
machine without it. :func:`ckptkit.run.directory.open_run` imports
the modules named in :data:`ckptkit.run.directory.BUILTIN_LAYOUTS` before it asks the detectors.
"""
