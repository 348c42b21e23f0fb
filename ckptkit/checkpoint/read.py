"""Read one checkpoint directory (verifying every byte while it streams), and name its parts.

Writing is :mod:`ckptkit.checkpoint.commit` (one protocol for every world size); this module reads
what it wrote: :func:`read_checkpoint` under :func:`ckptkit.load` and restore, and the
component tables of plain saves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from ckptkit import _progress, codes
from ckptkit.capture.fit import FitReport, match_targets
from ckptkit.errors import ManifestError
from ckptkit.format import dtypes, tree
from ckptkit.format import manifest as mf
from ckptkit.storage import atomic, fs, shards, tensors
from ckptkit.storage.fs import Location

IO_WORKERS = 2
"""Files read at once: enough to overlap hashing, syscalls and the disk queue."""

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


def files_by_head(entries: Iterable[mf.TensorEntry]) -> dict[str, list[str]]:
    """Top-level tree key -> the files holding its tensors, in first-seen order.

    Example:
        >>> e = mf.TensorEntry("model/w", "model.safetensors", "F32", (1,), (0, 4))
        >>> files_by_head([e])
        {'model': ['model.safetensors']}
    """
    out: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for te in entries:
        head = te.key.split("/", 1)[0]
        if (head, te.file) not in seen:  # a set: one file per rank under "rng" at 4096 ranks
            seen.add((head, te.file))
            out.setdefault(head, []).append(te.file)
    return out


def infer_components(state_tree: Any, entries: Iterable[mf.TensorEntry]) -> dict[str, mf.Component]:
    """Component table of a plain ``ckptkit.save``: present if a top-level key names it.

    Nothing is *required* of a plain save (the run did not say what it uses);
    ``TrainState`` records requirements.
    """
    where: dict[str, list[str]] = {}
    top = state_tree if isinstance(state_tree, dict) and tree.TAG not in state_tree else {}
    by_head = files_by_head(entries)
    for key in top:
        comp = COMPONENT_ALIASES.get(key.lower())
        if comp is None:
            continue
        where.setdefault(comp, []).extend(
            by_head.get(tree.key_segment(key), []) or [f"manifest:tree/{key}"]
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
    comps: Mapping[str, mf.Component], by_head: Mapping[str, Sequence[str]]
) -> dict[str, mf.Component]:
    """Fill each present component's ``where``: its files (``by_head``: the files of each
    top-level key, :func:`files_by_head`), else its JSON place in the tree."""
    out: dict[str, mf.Component] = {}
    for name, c in comps.items():
        if c.present and not c.where:
            c = replace(c, where=tuple(by_head.get(name, ())) or (f"manifest:tree/{name}",))
        out[name] = c
    return out


def _max_bytes_default() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def read_checkpoint(
    path: Location | str,
    *,
    targets_from: Any = None,
    strict: bool = True,
    map_location: str | torch.device | None = "cpu",
    progress: bool | None = None,
    max_bytes: int | None = None,
    manifest: mf.Manifest,
    key: bytes | None,
) -> tuple[Any, mf.Manifest, FitReport | None]:
    """Read a checkpoint, verifying every file's size, header and digest while streaming.

    Args:
        path: the checkpoint directory.
        targets_from: an object shaped like (part of) the saved state whose tensors receive
            the bytes (in place, without a second copy in RAM, when they live on the CPU).
        strict: with ``targets_from``, refuse before reading anything when a target has no
            saved tensor, a saved tensor inside a mapping of ``targets_from`` has no target,
            or shapes/dtypes differ (``CK-R010``, each named); False loads what fits and
            the returned report names the rest.
        map_location: device for the returned tensors (``None``/``"cpu"``: stay on CPU).
        progress: force the progress bar on/off.
        max_bytes: refuse checkpoints declaring more tensor bytes than this (default:
            physical RAM), before allocating anything.
        manifest: the manifest of ``path``, read by the caller
            (:func:`ckptkit.checkpoint.manifest_io.read`, with ``key``): this reader never
            reads one itself, so none is ever read here without the key. A partial one (a
            restoring rank's, :attr:`~ckptkit.format.manifest.Manifest.read_ranks`) reads the
            files of its ranks and rebuilds its tree (the RNG states of those ranks only).
        key: the key configured for this read (None: none): ``manifest`` must have been
            checked under it (:meth:`~ckptkit.format.manifest.Manifest.trusted`).

    Returns:
        ``(object, manifest, fit report or None without targets)``.

    Raises:
        StateError: ``CK-R010`` a target does not fit (``strict``).
        SignatureError: ``CK-M010``, ``key`` is given and ``manifest`` was not read under it.
    """
    root = fs.location(path)
    m = manifest.trusted(key, path=fs.url(root / atomic.MANIFEST_NAME))
    limit = max_bytes if max_bytes is not None else _max_bytes_default()
    need = sum(t.nbytes for t in m.tensors)
    if need > limit:
        raise codes.error(
            codes.M006,
            f"checkpoint declares {need} bytes of tensors, more than the {limit}-byte limit",
            path=root / atomic.MANIFEST_NAME,
            hint="pass max_bytes= if this size is genuine, otherwise do not load it",
        )
    state_tree = m.tree
    targets: dict[str, torch.Tensor] = {}
    fit: FitReport | None = None
    if targets_from is not None:
        saved = {te.key: (dtypes.DTYPES[te.dtype], tuple(te.shape)) for te in m.tensors}
        targets, fit = match_targets(targets_from, state_tree, saved)
        if strict and not fit.ok:
            raise codes.error(
                codes.R010,
                f"the tensors to load into do not fit the checkpoint: {fit.summary()}",
                path=root,
                hint="load into a state of the saved architecture and dtype, or pass "
                "strict=False to load what fits and get a report of the rest",
            )
    by_file: dict[str, dict[str, dtypes.HeaderEntry]] = {f.path: {} for f in m.files}
    for te in m.tensors:
        by_file[te.file][te.key] = te.header_entry()
    # Only tensor shards are read here; other listed files (DCP shards of a multi-rank
    # save) are checked by their own reader path (storage.dist.verify_files) or verify.
    jobs: Sequence[mf.FileEntry] = [f for f in m.files if f.path.endswith(_TENSOR_SUFFIXES)]
    for fe in m.files:
        if fs.escapes(root, fe.path):
            raise codes.error(
                codes.F009,
                "file is a symlink or resolves outside the checkpoint directory",
                path=fe.path,
            )
    out: dict[str, torch.Tensor] = {}
    with _progress.bar(f"loading {root.name}", need, progress) as on_bytes:

        def read_one(fe: mf.FileEntry) -> dict[str, torch.Tensor]:
            exp = tensors.Expected.of(fe, rel=str(root / fe.path))
            return shards.read_file(
                root / fe.path, exp, by_file[fe.path], targets=targets, on_bytes=on_bytes
            )

        workers = max(1, min(IO_WORKERS, len(jobs)))
        with ThreadPoolExecutor(workers, thread_name_prefix="ckptkit-read") as pool:
            for part in pool.map(read_one, jobs):
                out.update(part)
    for k, tgt in targets.items():
        got = out.get(k)
        if got is not None and got is not tgt:  # a CUDA or strided target: copy it in
            with torch.no_grad():
                tgt.copy_(got)
            out[k] = tgt
    if map_location is not None and torch.device(map_location).type != "cpu":
        dev = torch.device(map_location)
        moved: dict[int, torch.Tensor] = {}
        for k, t in out.items():
            if k in targets:
                continue  # the caller's own tensor stays where the caller keeps it
            if id(t) not in moved:
                moved[id(t)] = t.to(dev)
            out[k] = moved[id(t)]
    try:
        return tree.decode(state_tree, out), m, fit
    except ManifestError as e:
        raise ManifestError(
            e.what, path=root / atomic.MANIFEST_NAME, code=e.code, hint=e.hint
        ) from None


_TENSOR_SUFFIXES = (".safetensors", ".safetensors.zst")
