"""The checkpoint format: what the bytes mean, with no I/O.

The lowest layer (``docs/architecture.md``): the dtype table (:mod:`.dtypes`), the state
tree codec (:mod:`.tree`) and the digest the manifest records (:mod:`.digest`), next to
:mod:`ckptkit.format.manifest`, which holds the manifest's dataclasses and its parse,
:mod:`ckptkit.format.validation`, the checks each manifest document passes (canonical
JSON, schema, digest, signature), and :mod:`ckptkit.format.ranks`, a multi-rank save's
per-rank manifests and their merge. Nothing here opens a file or imports
:mod:`ckptkit.storage`.
"""
