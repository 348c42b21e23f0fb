"""Reading and writing one checkpoint at a location: the layer above storage.

:mod:`.manifest_io` reads ``manifest.json`` from a directory or prefix (local or object
store, through :mod:`ckptkit.storage.fs`) and writes it as a save's commit marker;
:mod:`.read` streams a checkpoint's tensors back, verifying every byte. The format they
read and write is :mod:`ckptkit.format.manifest`, which does no I/O.
"""
