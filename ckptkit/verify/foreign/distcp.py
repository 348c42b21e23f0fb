"""PyTorch Distributed Checkpoint directories: ``.metadata`` plus ``*.distcp`` shards.

``.metadata`` (a pickle, written last by the coordinator) lists every item of the state
dict, its chunks and, in ``storage_data``, the shard file and byte range of each. ckptkit
reads it with a restricted unpickler, then checks that every item is covered by a present
shard long enough for its byte range, naming missing shards (``dcp.load`` would raise
``CheckpointException``, which does not derive from ``Exception``). Each item of the
default ``torch.save`` serialisation is a small zip archive: its CRCs are checked too, and
model/optimizer tensors scanned for NaN/Inf.

Components are recognised in the state dict's own nesting (``planner_data`` keeps it): a
DCP-tutorial ``Stateful`` wrapper (``app/model``, ``app/optim``), torchtitan's layout (the
model's parameters flattened to the top level beside ``optimizer``, ``lr_scheduler``,
``dataloader`` and ``train_state``), or anything else, by name or by the shape of the
content (:mod:`ckptkit.verify.foreign.structure`). Small non-tensor items are read only when a
rule needs their value (a step, a ``last_epoch``). DCP saves only what it is given: RNG,
sampler and progress are present only when the caller put them in the state dict.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

from ckptkit import codes
from ckptkit.checkpoint import safeload
from ckptkit.errors import CkptkitError
from ckptkit.format import digest
from ckptkit.format import manifest as mf
from ckptkit.storage import dcp_engine as dcp
from ckptkit.storage import dcp_items, dcp_meta, dcp_shard, fs
from ckptkit.verify.foreign.scan import ADOPTED_SUFFIX, Scan
from ckptkit.verify.foreign.structure import Lazy, TensorMeta
from ckptkit.verify.foreign.torch_save import scan_tree

META = ".metadata"


def scan(s: Scan) -> None:
    """Fill ``s`` for a DCP directory.

    With an adopted manifest (``ckptkit adopt``'s, or the one :mod:`ckptkit.dcp` commits)
    the directory is read as ``ckptkit.dcp.check`` reads it: ``.metadata`` listed and
    digest-checked (:func:`ckptkit.storage.dcp_meta.read_metadata_file`), coverage against the
    manifest's list, every shard read once with each item parsed and held to its chunk
    (:func:`ckptkit.storage.dcp_engine.check_shards`); so verify, ``check`` and a load refuse the
    same directories with the same codes. Without one, coverage is held to the files
    present, and a ``.metadata`` that :class:`ckptkit.dcp.Writer` marked is a save that
    did not commit (``CK-M001``, as ``ckptkit.dcp.load`` says).
    """
    listing = s.listing()
    if not s.readable(META):
        shards = s.glob("*.distcp")
        if s.has(META):
            s.absent("model", ".metadata is a symlink or resolves outside the checkpoint: not read")
            return
        s.add(
            codes.F105,
            ".metadata missing: DCP writes it last, so the save did not finish "
            f"(or it was not copied); {len(shards)} shard(s) are unusable without it",
            path=META,
        )
        s.absent("model", ".metadata is missing: no item of the checkpoint can be located")
        return
    md = _metadata(s, listing)
    if md is None:
        return
    unmanifested = listing is None and not os.path.lexists(s.target / ADOPTED_SUFFIX)
    if unmanifested and dcp_meta.written_here(md):
        s.add(
            codes.M001,
            f"written by ckptkit.dcp, but its manifest ({ADOPTED_SUFFIX}) is missing: the "
            "save did not commit (it died after .metadata), and ckptkit.dcp.load refuses it",
            path=ADOPTED_SUFFIX,
        )
    try:
        lay = dcp_items.layout(md, prefix="")
        sd_meta, planner = _walk(md)
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        s.add(
            codes.F108,
            f".metadata has an unexpected structure: {safeload.errname(e)}: {safeload.first_line(e)}",
            path=META,
        )
        s.absent("model", ".metadata has an unexpected structure")
        return
    entries = lay.items

    # What .metadata asks a load to read, held to the manifest's list (or, with none, to
    # the files present): the one coverage rule of every DCP reader.
    files = (
        dcp_meta.Listed.whole(listing)
        if listing is not None
        else dcp_meta.Listed.directory(
            {f: s.path(f).stat().st_size for f in s.files if s.readable(f)}
        )
    )
    bad_files = {
        ent.name
        for ent in entries
        if dcp_items.entry_problem(ent, files.sizes, unlisted=files.unlisted) is not None
    }
    named = {ent.name for ent in entries}
    s.unrecognised(
        "shards (not referenced by .metadata)", [f for f in s.glob("*.distcp") if f not in named]
    )

    # The state dict's tree, with tensors known by metadata and small items read lazily.
    first: dict[str, dcp_items.Item] = {}
    for ent in entries:
        first.setdefault(ent.fqn, ent)
    reader = _Reader(s, bad_files)
    tree: dict[Any, Any] = {}
    for fqn, meta in sd_meta.items():
        where = first.get(fqn)
        leaf: Any
        if isinstance(meta, tuple):  # a tensor: (shape, dtype)
            shape, dtype = meta
            leaf = TensorMeta(shape, dtype, read=reader.reader(where) if where is not None else None)
        else:
            leaf = Lazy(reader.reader(where)) if where is not None else None
        _insert(tree, item_path(fqn, planner), leaf)
    tree = _listify(tree)
    scan_tree(s, tree, file=META, what="the DCP state dict")

    model_keys = _keys_of(s, "model")
    opt_keys = _keys_of(s, "optimizer")

    def component(ent: dcp_items.Item) -> tuple[str | None, tuple[Any, ...]]:
        path = item_path(ent.fqn, planner)
        if _under(path, model_keys):
            return "model", path
        return ("optimizer" if _under(path, opt_keys) else None), path

    if listing is not None:
        # Each listed shard read once, as check reads it: its digest for the file check
        # (no second read), every tensor parsed and held to its chunk (and scanned for
        # NaN/Inf), every non-tensor item parsed once its shard's digest matched.
        def scan_value(ent: dcp_items.Item, t: torch.Tensor) -> None:
            comp, path = component(ent)
            if comp is not None and s.scan_values:
                reader.scan(comp, path, t)

        read = dcp.check_shards(
            fs.location(s.root), md, dcp_meta.Listed.whole(listing), prefix="", on_tensor=scan_value
        )
        s.digests.update(read.digests)  # file problems: the file check reports them
        found = [
            *read.problems,
            *dcp_items.coverage(md, files, prefix="", item_bytes=read.item_bytes),
        ]
    else:
        found = dcp_items.coverage(md, files, prefix="")
    for problem in found:
        s.add(
            problem.code or codes.F108,
            problem.what,
            path=str(problem.path) if problem.path is not None else META,
        )
    if listing is not None or not s.scan_values:
        return

    # Values: per-item CRCs and NaN/Inf in model/optimizer tensors, each shard read once
    # and hashed in the same pass.
    wanted: dict[str, list[tuple[dcp_items.Item, str, tuple[Any, ...]]]] = {}
    for ent in entries:
        if ent.name in bad_files:
            continue
        todo = wanted.setdefault(ent.rel, [])  # every good shard is hashed, values or not
        if ent.descriptors:
            continue
        comp, path = component(ent)
        if comp is None or not isinstance(sd_meta.get(ent.fqn), tuple):
            continue
        todo.append((ent, comp, path))
    for rel, todo in wanted.items():
        reader.scan_shard(rel, todo)


def _metadata(s: Scan, listing: dict[str, mf.FileEntry] | None) -> Any:
    """``.metadata``, unpickled with the allow-list and bounded (:func:`ckptkit.storage.dcp_meta.
    loads_metadata`): with an adopted ``listing``, only once it is listed and its digest
    matched, as every reader opens it. None (with a finding) when it cannot be used."""
    problem: safeload.Problem | None
    if listing is not None:
        try:
            md = dcp_meta.read_metadata_file(fs.location(s.path(META)), listing.get(META), rel=META)
        except CkptkitError as e:
            if e.code not in _FILE_CHECK:  # those the file check reports, once
                s.add(e.code or codes.F108, e.what, path=META)
            s.absent("model", f".metadata could not be read ({e.code})")
            return None
        fe = listing[META]
        s.digests[META] = (fe.xxh3_128, fe.size)  # read and matched: no second read
        return md
    try:
        data = s.path(META).read_bytes()
    except OSError as e:
        problem = safeload.failed_read(e, codes.F108, "cannot be read")
        md = None
    else:
        s.digests[META] = (digest.hexdigest_bytes(data), len(data))  # read once
        md, problem = safeload.loads_dcp_metadata(data)
    if problem is not None and problem.code == codes.F103:
        s.refused_pickle(META, f".metadata {problem.message}")
        s.absent("model", f".metadata could not be read ({problem.code})")
        return None
    if problem is not None:
        s.add(problem.code, f".metadata {problem.message}", path=META)
        s.absent("model", f".metadata could not be read ({problem.code})")
        return None
    return md


_FILE_CHECK = frozenset({codes.F001, codes.F002, codes.F003, codes.F022, codes.UNREADABLE})
"""Codes of a listed file's own check (present, regular, its size and digest): reported by
the file check against the adopted manifest, not again by the reader."""


class _Reader:
    """Reads single DCP items safely (CRC-checked, weights-only), recording findings."""

    def __init__(self, s: Scan, bad_files: set[str]) -> None:
        self._s = s
        self._bad = bad_files

    def reader(self, ent: dcp_items.Item) -> Any:
        return lambda: self.read(ent, component="checkpoint", critical=False)

    def read(self, ent: dcp_items.Item, *, component: str, critical: bool = True) -> Any:
        s, rel, fqn = self._s, ent.rel, ent.fqn
        if ent.name in self._bad or ent.descriptors:
            raise ValueError("item not readable")
        try:
            with open(s.path(rel), "rb") as f:
                f.seek(ent.offset)
                blob = f.read(ent.length)
        except OSError as e:
            s.add(codes.F108, f"item {fqn} cannot be read: {e}", path=rel, component=component)
            return None
        return self.parse(ent, blob, component=component, critical=critical)

    def scan_shard(self, rel: str, todo: list[tuple[dcp_items.Item, str, tuple[Any, ...]]]) -> None:
        """Read shard ``rel`` once, in file order (:class:`ckptkit.storage.dcp_shard.Shard`, the
        reader ``ckptkit.dcp`` loads and checks with): scan the values of ``todo``'s items
        for NaN/Inf as their bytes go by, and keep the file's digest (:attr:`Scan.digests`)
        for the adopted manifest's check, so no byte is read twice.

        A file that cannot be read here gets no digest (the file check reads it and says
        why), and its remaining items are read one by one, each failure a finding.
        """
        s = self._s
        todo = sorted(todo, key=lambda t: (t[0].offset, t[0].length))
        done = 0
        try:
            with dcp_shard.open_shard(s.path(rel), rel=rel, expected_size=None) as shard:
                for ent, comp, path in todo:
                    blob = bytearray(ent.length)
                    shard.read_into(ent.offset, memoryview(blob))
                    done += 1
                    self.scan(comp, path, self.parse(ent, bytes(blob), component=comp))
                s.digests[rel] = (shard.hexdigest(), shard.size)
        except CkptkitError:
            for ent, comp, path in todo[done:]:
                self.scan(comp, path, self.read(ent, component=comp))

    def scan(self, comp: str, path: tuple[Any, ...], obj: Any) -> None:
        """Count NaN/Inf in ``obj`` when it is a tensor of ``comp`` at ``path``."""
        if isinstance(obj, torch.Tensor):
            self._s.scan_tensor(comp, "/".join(str(p) for p in path), obj)

    def parse(
        self, ent: dcp_items.Item, blob: bytes, *, component: str, critical: bool = True
    ) -> Any:
        """One item's bytes: zip CRCs checked, then ``torch.load(weights_only=True)``."""
        s, rel, fqn = self._s, ent.rel, ent.fqn
        if blob[:4] == b"PK\x03\x04":
            zf, why = safeload.open_zip(io.BytesIO(blob))
            if zf is None:
                s.add(codes.F102, f"item {fqn} is damaged ({why})", path=rel, component=component)
                return None
            big = safeload.check_zip_sizes(zf, archive_size=len(blob))
            if big is not None:
                zf.close()
                s.add(big.code, f"item {fqn}: {big.message}", path=rel, component=component)
                return None
            try:
                with zf:
                    bad = zf.testzip()
            except safeload.ZIP_READ_ERRORS as e:
                s.add(codes.F102, f"item {fqn} is damaged ({e})", path=rel, component=component)
                return None
            if bad is not None:
                s.add(
                    codes.F101,
                    f"item {fqn}: member {bad!r} fails its CRC-32",
                    path=rel,
                    component=component,
                )
                return None
        try:
            with torch.serialization.safe_globals(safeload.SAFE_GLOBALS):
                return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            if critical:
                s.add(
                    codes.F108,
                    f"item {fqn} cannot be read: {safeload.errname(e)}",
                    path=rel,
                    component=component,
                )
            else:  # a pickled object: dcp.load would unpickle it with weights_only=False
                s.refused_pickle(
                    rel,
                    f"item {fqn} needs code to unpickle (not on the allow-list); not executed",
                    component=component,
                )
            return None
        except Exception as e:  # not a torch.save blob (another serialisation)
            s.add(
                codes.F108, f"item {fqn} cannot be read: {safeload.errname(e)}", path=rel,
                component=component,
            )
            return None


def _walk(md: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the component scan needs from ``.metadata`` beyond its storage entries
    (:func:`ckptkit.storage.dcp_items.layout`, which checked the structure first).

    Returns:
        ``({fqn: (shape, dtype) for a tensor, else None}, planner_data)``.

    Raises:
        AttributeError, TypeError, ValueError, KeyError: an unexpected structure.
    """
    sd_meta: dict[str, Any] = {}
    for fqn, m in md.state_dict_metadata.items():
        size = getattr(m, "size", None)
        dtype = getattr(getattr(m, "properties", None), "dtype", None)
        sd_meta[fqn] = (tuple(int(d) for d in size), dtype) if size is not None else None
    planner = dict(getattr(md, "planner_data", None) or {})
    return sd_meta, planner


def item_path(fqn: str, planner: dict[str, Any]) -> tuple[Any, ...]:
    """The item's place in the saved state dict (``planner_data``), else its dotted name."""
    p = planner.get(fqn)
    if isinstance(p, tuple | list) and p and all(isinstance(x, str | int) for x in p):
        return tuple(p)
    return tuple(fqn.split("."))


def _insert(tree: dict[Any, Any], path: tuple[Any, ...], leaf: Any) -> None:
    node = tree
    for k in path[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = node[k] = {}
        node = nxt
    node[path[-1]] = leaf


def _listify(node: Any) -> Any:
    """Dicts keyed 0..n-1 (DCP flattens lists that way) back into lists."""
    if not isinstance(node, dict):
        return node
    out = {k: _listify(v) for k, v in node.items()}
    keys = list(out)
    if keys and all(isinstance(k, int) for k in keys) and sorted(keys) == list(range(len(keys))):
        return [out[i] for i in range(len(keys))]
    return out


def _keys_of(s: Scan, component: str) -> list[tuple[str, ...]]:
    """Paths (inside the state dict) where ``component`` was found."""
    out: list[tuple[str, ...]] = []
    row = s.rows.get(component)
    for w in row.where if row is not None else []:
        if w == META:
            out.append(())  # the state dict's top level (a flattened model)
        elif w.startswith(META + ":"):
            out.append(tuple(w[len(META) + 1 :].split("/")))
    return out


def _under(path: tuple[Any, ...], prefixes: list[tuple[str, ...]]) -> bool:
    sp = tuple(str(p) for p in path)
    for pre in prefixes:
        if not pre:
            # The top-level flattened model: a one-segment path not under another component.
            if len(sp) == 1:
                return True
        elif sp[: len(pre)] == pre:
            return True
    return False
