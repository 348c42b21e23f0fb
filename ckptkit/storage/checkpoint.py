"""Write and read one checkpoint directory: tree -> shards -> manifest, and back.

This is the engine under :func:`ckptkit.save`, :func:`ckptkit.load`, ``TrainState``
and ``CheckpointManager``: data flows capture -> storage -> manifest, and reading
verifies every byte while it streams.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ckptkit import _progress, codes
from ckptkit import manifest as mf
from ckptkit.errors import ManifestError
from ckptkit.storage import atomic, codec, tensors, tree

DEFAULT_SHARD_BYTES = 2 << 30
"""Largest shard file before a group is split (a tensor is never split)."""
IO_WORKERS = 2
"""Files written/read at once: enough to overlap hashing, syscalls and the disk queue."""


@dataclass(frozen=True)
class ShardPlan:
    """Which tensors go to which file."""

    files: dict[str, list[str]]
    """Relative file name -> tensor keys, in write order."""
    component: dict[str, str | None]
    """Relative file name -> component it holds (the group name when it is one)."""


def plan_shards(
    encoded: tree.Encoded,
    *,
    grouper: tree.Grouper = tree.default_group,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    compress: codec.Compression | None = None,
) -> ShardPlan:
    """Group tensors by ``grouper(key)`` and split groups into shards of ``shard_bytes``."""
    groups: dict[str, list[str]] = {}
    for key in encoded.tensors:
        groups.setdefault(grouper(key), []).append(key)
    suffix = ".safetensors" + (codec.SUFFIX[compress] if compress else "")
    files: dict[str, list[str]] = {}
    component: dict[str, str | None] = {}
    for group, keys in groups.items():
        shards: list[list[str]] = [[]]
        size = 0
        for k in keys:
            t = encoded.tensors[k]
            n = t.numel() * t.element_size()
            if shards[-1] and size + n > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(k)
            size += n
        base = group.split("-", 1)[0]
        comp = base if base in mf.COMPONENTS else None
        for i, ks in enumerate(shards):
            name = (
                f"{group}{suffix}"
                if len(shards) == 1
                else f"{group}-{i + 1:05d}-of-{len(shards):05d}{suffix}"
            )
            files[name] = ks
            component[name] = comp
    return ShardPlan(files=files, component=component)


def write_checkpoint(
    obj: Any,
    path: Path | str,
    *,
    encoded: tree.Encoded | None = None,
    compress: codec.Compression | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    grouper: tree.Grouper = tree.default_group,
    components: Callable[[tree.Encoded, ShardPlan], dict[str, mf.Component]] | None = None,
    env: Mapping[str, Any] | None = None,
    step: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    fsync: bool = True,
    manifest_fields: Mapping[str, Any] | None = None,
    before_commit: Callable[[Path], None] | None = None,
) -> mf.Manifest:
    """Write ``obj`` as a committed checkpoint directory at ``path``, atomically.

    Args:
        obj: nested state (dicts, lists, tuples, tensors, plain scalars).
        path: the checkpoint directory to create.
        encoded: ``obj`` already split by :func:`ckptkit.storage.tree.encode` (async saves
            encode the live state, then write a staged copy of its tensors).
        compress: ``"zstd"`` to compress each file (streaming, multithreaded).
        shard_bytes: split a group into several files past this size.
        grouper: tensor key -> file group (default: the top-level key).
        components: builds the component table from the encoded tree and file plan.
        env: environment record (default: captured now).
        step: training step recorded in the manifest.
        overwrite: replace an existing checkpoint at ``path``.
        progress: force the progress bar on/off (default: on a terminal for big saves).
        fsync: flush files and directories (turn off only in tests of other things).
        manifest_fields: extra manifest fields (``lookahead``, ``health``, ``pins``, ``user``).
        before_commit: called with the temporary directory after the manifest is written
            and before the rename (fault-injection tests use it).

    Returns:
        The manifest written.
    """
    if compress is not None and compress not in codec.SUFFIX:
        raise ValueError(f"compress must be None or 'zstd', not {compress!r}")
    if encoded is None:
        encoded = tree.encode(obj)
    plan = plan_shards(encoded, grouper=grouper, shard_bytes=shard_bytes, compress=compress)
    pending = atomic.PendingCheckpoint.create(path, overwrite=overwrite)
    total = sum(t.numel() * t.element_size() for t in encoded.tensors.values())
    try:
        with _progress.bar(f"saving {Path(path).name}", total, progress) as on_bytes:
            files, entries = write_shards(
                encoded, plan, pending.tmp, compress=compress, fsync=fsync, on_bytes=on_bytes
            )
        if env is None:
            from ckptkit.capture import env as env_capture

            env = env_capture.capture()
        comps = components(encoded, plan) if components else infer_components(encoded, plan)
        fields = dict(manifest_fields or {})
        if "pins" in fields:
            fields["pins"] = tuple(fields["pins"])
        manifest = mf.Manifest(
            files=files,
            tensors=entries,
            tree=encoded.tree,
            components=comps,
            env=dict(env),
            step=step,
            **fields,
        )
        mf.write(pending.tmp, manifest, fsync=fsync)
        if before_commit is not None:
            before_commit(pending.tmp)
        pending.finalize() if fsync else _finalize_nosync(pending)
    except BaseException:
        pending.abort()
        raise
    return manifest


def write_shards(
    encoded: tree.Encoded,
    plan: ShardPlan,
    root: Path,
    *,
    names: Sequence[str] | None = None,
    compress: codec.Compression | None = None,
    fsync: bool = True,
    on_bytes: Callable[[int], None] | None = None,
    rank: int | None = None,
) -> tuple[tuple[mf.FileEntry, ...], tuple[mf.TensorEntry, ...]]:
    """Write the planned shard files ``names`` (default: all) into ``root``.

    Each file is hashed while it is written. Multi-rank saves call this on every rank
    with that rank's share of the plan (``rank`` is recorded in each file entry).

    Returns:
        The file entries and tensor entries of the files written.
    """

    def write_one(name: str) -> tuple[mf.FileEntry, list[mf.TensorEntry]]:
        items = [(k, encoded.tensors[k]) for k in plan.files[name]]
        w = tensors.write_file(
            root / name,
            items,
            compress=compress,
            metadata={"format": "pt", "writer": "ckptkit"},
            on_bytes=on_bytes,
            fsync=fsync,
        )
        fe = mf.FileEntry(
            path=name,
            size=w.size,
            xxh3_128=w.digest,
            compression=compress,
            raw_size=w.raw_size if compress else None,
            component=plan.component[name],
            rank=rank,
        )
        tes = [mf.TensorEntry(k, name, e.dtype, e.shape, e.offsets) for k, e in w.header.items()]
        return fe, tes

    todo = list(plan.files) if names is None else list(names)
    if not todo:
        return (), ()
    workers = max(1, min(IO_WORKERS, len(todo)))
    with ThreadPoolExecutor(workers, thread_name_prefix="ckptkit-write") as pool:
        results = list(pool.map(write_one, todo))
    return (
        tuple(fe for fe, _ in results),
        tuple(te for _, tes in results for te in tes),
    )


def _finalize_nosync(p: atomic.PendingCheckpoint) -> None:
    if p.final.exists():
        p.finalize()
        return
    os.rename(p.tmp, p.final)


COMPONENT_ALIASES: dict[str, str] = {
    "model": "model",
    "state_dict": "model",
    "model_state_dict": "model",
    "module": "model",
    "optimizer": "optimizer",
    "optim": "optimizer",
    "optimizer_state_dict": "optimizer",
    "scheduler": "scheduler",
    "lr_scheduler": "scheduler",
    "scaler": "scaler",
    "grad_scaler": "scaler",
    "fp8": "fp8",
    "rng": "rng",
    "rng_state": "rng",
    "rng_states": "rng",
    "sampler": "sampler",
    "dataloader": "sampler",
    "progress": "progress",
    "step": "progress",
    "global_step": "progress",
    "iter_num": "progress",
    "epoch": "progress",
    "parallel": "parallel",
    "data": "data",
    "metrics": "metrics",
}
"""Top-level keys of a plain ``ckptkit.save`` dict recognised as spec §1 components."""


def infer_components(encoded: tree.Encoded, plan: ShardPlan) -> dict[str, mf.Component]:
    """Component table of a plain ``ckptkit.save``: present if a top-level key names it.

    Nothing is *required* of a plain save (the run did not say what it uses);
    ``TrainState`` records requirements.
    """
    where: dict[str, list[str]] = {}
    top = encoded.tree if isinstance(encoded.tree, dict) and tree.TAG not in encoded.tree else {}
    files_by_group: dict[str, list[str]] = {}
    for name, keys in plan.files.items():
        for k in keys:
            files_by_group.setdefault(k.split("/", 1)[0], [])
            if name not in files_by_group[k.split("/", 1)[0]]:
                files_by_group[k.split("/", 1)[0]].append(name)
    for key in top:
        comp = COMPONENT_ALIASES.get(key.lower())
        if comp is None:
            continue
        where.setdefault(comp, []).extend(
            files_by_group.get(tree._seg(key), []) or [f"manifest:tree/{key}"]
        )
    out = {
        name: mf.Component(
            name=name, present=name in where, required=False, where=tuple(where.get(name, ()))
        )
        for name in mf.COMPONENTS
    }
    out["env"] = replace(out["env"], present=True, where=("manifest:env",))
    return out


def fill_where(
    comps: Mapping[str, mf.Component], encoded: tree.Encoded, plan: ShardPlan
) -> dict[str, mf.Component]:
    """Fill each present component's ``where``: its files, else its JSON place in the tree."""
    files_of: dict[str, list[str]] = {}
    for name, keys in plan.files.items():
        for head in {k.split("/", 1)[0] for k in keys}:
            files_of.setdefault(head, []).append(name)
    out: dict[str, mf.Component] = {}
    for name, c in comps.items():
        if c.present and not c.where:
            where = tuple(files_of.get(name, ())) or (f"manifest:tree/{name}",)
            c = replace(c, where=where)
        out[name] = c
    return out


def _max_bytes_default() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def read_checkpoint(
    path: Path | str,
    *,
    targets_from: Any = None,
    map_location: str | torch.device | None = "cpu",
    progress: bool | None = None,
    max_bytes: int | None = None,
    manifest: mf.Manifest | None = None,
) -> tuple[Any, mf.Manifest]:
    """Read a checkpoint, verifying every file's size, header and digest while streaming.

    Args:
        path: the checkpoint directory.
        targets_from: an object of the same structure whose tensors receive the bytes in
            place when dtype and shape match (restore without a second copy in RAM).
        map_location: device for the returned tensors (``None``/``"cpu"``: stay on CPU).
        progress: force the progress bar on/off.
        max_bytes: refuse checkpoints declaring more tensor bytes than this (default:
            physical RAM), before allocating anything.
        manifest: an already read manifest of ``path``.

    Returns:
        ``(object, manifest)``.
    """
    root = Path(path)
    m = manifest or mf.read(root)
    limit = max_bytes if max_bytes is not None else _max_bytes_default()
    need = sum(t.nbytes for t in m.tensors)
    if need > limit:
        raise codes.error(
            "CK-M006",
            f"checkpoint declares {need} bytes of tensors, more than the {limit}-byte limit",
            path=root / atomic.MANIFEST_NAME,
            hint="pass max_bytes= if this size is genuine, otherwise do not load it",
        )
    targets = tree.collect_targets(targets_from, m.tree) if targets_from is not None else {}
    by_file: dict[str, dict[str, tensors.HeaderEntry]] = {f.path: {} for f in m.files}
    for te in m.tensors:
        by_file[te.file][te.key] = te.header_entry()
    # Only tensor shards are read here; other listed files (DCP shards of a multi-rank
    # save) are checked by their own reader path (storage.dist.verify_files) or verify.
    jobs: Sequence[mf.FileEntry] = [f for f in m.files if f.path.endswith(_TENSOR_SUFFIXES)]
    real_root = root.resolve()
    for fe in m.files:
        p = root / fe.path
        if p.is_symlink() or (p.exists() and not p.resolve().is_relative_to(real_root)):
            raise codes.error(
                "CK-F009",
                "file is a symlink or resolves outside the checkpoint directory",
                path=fe.path,
            )
    out: dict[str, torch.Tensor] = {}
    with _progress.bar(f"loading {root.name}", need, progress) as on_bytes:

        def read_one(fe: mf.FileEntry) -> dict[str, torch.Tensor]:
            exp = tensors.Expected(
                rel=str(root / fe.path),
                size=fe.size,
                digest=fe.xxh3_128,
                compression=fe.compression,  # type: ignore[arg-type]
                raw_size=fe.raw_size,
            )
            return tensors.read_file(
                root / fe.path, exp, by_file[fe.path], targets=targets, on_bytes=on_bytes
            )

        workers = max(1, min(IO_WORKERS, len(jobs)))
        with ThreadPoolExecutor(workers, thread_name_prefix="ckptkit-read") as pool:
            for part in pool.map(read_one, jobs):
                out.update(part)
    if map_location is not None and torch.device(map_location).type != "cpu":
        dev = torch.device(map_location)
        moved: dict[int, torch.Tensor] = {}
        for k, t in out.items():
            if id(t) not in moved:
                moved[id(t)] = t.to(dev)
            out[k] = moved[id(t)]
    try:
        return tree.decode(m.tree, out), m
    except ManifestError as e:
        raise ManifestError(
            e.what, path=root / atomic.MANIFEST_NAME, code=e.code, hint=e.hint
        ) from None


_TENSOR_SUFFIXES = (".safetensors", ".safetensors.zst")
