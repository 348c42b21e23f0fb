"""The checkpoint format: what the bytes mean, with no I/O.

The lowest layer (``docs/architecture.md``): the dtype table (:mod:`.dtypes`), the state
tree codec (:mod:`.tree`) and the digest the manifest records (:mod:`.digest`), next to
:mod:`ckptkit.format.manifest`, which holds the manifest's dataclasses, canonical JSON, schema
and signature checks. Nothing here opens a file or imports :mod:`ckptkit.storage`.
"""
