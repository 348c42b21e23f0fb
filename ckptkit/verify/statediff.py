"""Compare the state two checkpoints hold, component by component and tensor by tensor.

``ckptkit diff A B`` and the drill's ``end_state`` check both call :func:`diff`: one
comparison, so a drill and a hand-run triage ("diff the last good and the first bad
checkpoint of a run") cannot disagree about what changed.

What is read, and how:

* a **native** checkpoint (``manifest.json``) through :func:`ckptkit.checkpoint.read.read_checkpoint`,
  which verifies every byte while it streams; its components are the top-level keys of the
  saved tree (``model``, ``optimizer``, ``scheduler``, ``scaler``, ``sampler``, ``rng``,
  ``progress`` ...), and each entry of a ``TrainState``'s ``extra`` is a component of its own
  (an EMA saved as ``extra={"ema": ...}`` is the component ``ema``);
* a **DCP** directory (``.metadata`` and ``.distcp`` shards: written by :mod:`ckptkit.dcp`,
  adopted, a torchtitan ``step-N`` folder, a plain ``dcp.save``; or the ``dcp/`` part of a
  native ``TrainState(storage="dcp")``) through the verifying DCP reader
  (:func:`ckptkit.storage.dcp_engine.read_state`): ``.metadata`` unpickled with its allow-list,
  every shard checked against the manifest's digests as it is read, each item parsed on its
  own (tensors assembled whole on CPU, other values with ``weights_only=True``), never a
  ``.distcp`` as one torch file. Items are keyed by their state-dict name and split into
  components by its first segment (``model``, ``optimizer``, ``lr_scheduler``,
  ``dataloader`` ...); a tensor at the top level is a parameter of a model saved flattened
  (torchtitan's layout), so it is ``model``'s. A DCP directory without a ckptkit manifest
  passes verify's integrity checks first, and its bytes are compared as found;
* a **foreign** checkpoint (Trainer folder, Lightning ``.ckpt``, ``torch.save`` file,
  safetensors) through its format's reader (:mod:`ckptkit.verify.foreign.read`), after the
  integrity checks of ``ckptkit verify`` (an adopted one: every file against the digests
  ``ckptkit adopt`` recorded). Torch files are read with ``weights_only=True`` and the
  reader's allow-list only; nothing is unpickled. Content goes to the component the reader
  found it to be (the names ``ckptkit verify`` shows); content no component claims is
  grouped by its file (``ema.pt`` → ``ema``) or, in a one-file checkpoint, by its top-level
  key (a Lightning callback's state by ``callbacks/<state key>``).

Tensors are compared bitwise by default (``Tolerance()``), else element-wise within
``atol + rtol * |a|``; every changed tensor gets its largest absolute difference and its
relative L2 change ``||b - a|| / ||a||``. Other leaves (a scheduler's ``last_epoch``, a
sampler cursor, RNG words, hyper-parameters) are values, compared exactly (floats within the
tolerance). What cannot be read (a pickle that needs code) is reported as not compared,
never as equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import numpy as np
import torch

from ckptkit import codes
from ckptkit._jsonval import encode_float
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.detect import detect
from ckptkit.checkpoint.read import read_checkpoint
from ckptkit.checkpoint.whatis import not_a_checkpoint
from ckptkit.errors import CkptkitError
from ckptkit.format import digest as content_digest
from ckptkit.format import manifest as mf
from ckptkit.storage import dcp_engine as dcp_store
from ckptkit.storage import dcp_meta, digest, fs
from ckptkit.storage.atomic import MANIFEST_NAME
from ckptkit.verify.foreign.distcp import item_path
from ckptkit.verify.foreign.loads import file_load
from ckptkit.verify.foreign.report import ForeignReport, verify_foreign
from ckptkit.verify.foreign.scan import Scan
from ckptkit.verify.foreign.structure import NAMES

SCHEMA_VERSION = 1
"""Version of :meth:`StateDiff.to_dict` (``schemas/diff-report.schema.json``)."""

CHUNK = 1 << 22
"""Elements compared at once: a large tensor is compared in slices of this many, so the
float64 copies the differences need stay small."""

SHOW_CHARS = 120
"""A value longer than this (as JSON text) is shown by its length and a short prefix."""

TensorStatus = Literal["equal", "changed", "only-a", "only-b", "shape", "dtype"]
ValueStatus = Literal["equal", "changed", "only-a", "only-b"]
ComponentStatus = Literal["compared", "only-a", "only-b", "not-read"]

SPLIT_COMPONENTS = frozenset({"model", "optimizer"})
"""Components of which a checkpoint may hold several distinct objects (see :func:`_claims`)."""

PER_OBJECT_KEYS = frozenset({"callbacks"})
"""Top-level keys of one-file checkpoints that hold one state per named object (Lightning
keeps each callback's state under its state key): unclaimed content under them is grouped
per object, so an EMA callback is its own component rather than part of "callbacks"."""


@dataclass(frozen=True)
class Tolerance:
    """How close two tensors must be to count as equal: ``|b - a| <= atol + rtol * |a|``.

    ``Tolerance()`` (0/0) means bitwise: same dtype, same shape, same bytes (so ``-0.0``
    differs from ``0.0`` and a NaN equals a NaN of the same bits).

    Within a tolerance, element by element (tensors) and value by value (other leaves),
    one rule: two equal numbers are equal (``inf`` and ``inf`` too), two NaNs are equal
    (whatever their bits), and otherwise a non-finite number (NaN, ``inf``, ``-inf``)
    differs from every other number, whatever the tolerance and in both directions
    (``|b - a| <= rtol * |a|`` would call ``a = inf`` close to any finite ``b``, and to
    ``-inf``); two finite numbers are equal within ``atol + rtol * |a|``.

    Example:
        >>> Tolerance().bitwise, Tolerance(atol=1e-6).bitwise
        (True, False)
    """

    atol: float = 0.0
    """Absolute tolerance."""
    rtol: float = 0.0
    """Relative tolerance, against the magnitude of A's element."""

    @property
    def bitwise(self) -> bool:
        return self.atol == 0.0 and self.rtol == 0.0


@dataclass(frozen=True)
class TensorDiff:
    """One tensor in both checkpoints (or in one only)."""

    path: str
    """Where it sits inside its component (``state_dict/state/0/exp_avg``)."""
    status: TensorStatus
    """``equal`` (within the tolerance), ``changed``, ``only-a``/``only-b``, or a ``shape``
    or ``dtype`` mismatch."""
    equal: bool
    bitwise: bool
    """Same dtype, shape and bytes."""
    max_abs: float | None
    """Largest absolute element difference (None: not comparable)."""
    rel_l2: float | None
    """``||b - a||₂ / ||a||₂`` (``inf`` when A is all zeros and B is not)."""
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str | None
    dtype_b: str | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the fields in order, non-finite numbers as strings, shapes as lists."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(max_abs=_num(self.max_abs), rel_l2=_num(self.rel_l2))
        for key in ("shape_a", "shape_b"):
            out[key] = list(out[key]) if out[key] is not None else None
        return out


@dataclass(frozen=True)
class ValueDiff:
    """One non-tensor leaf (a counter, a hyper-parameter, RNG words, a path)."""

    path: str
    status: ValueStatus
    equal: bool
    a: Any
    """A's value as JSON (long values shortened, see :data:`SHOW_CHARS`)."""
    b: Any

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ComponentDiff:
    """One component (``model``, ``optimizer``, ``ema`` ...) of both checkpoints."""

    name: str
    status: ComponentStatus
    """``compared``; ``only-a``/``only-b`` (one checkpoint lacks it); ``not-read``."""
    equal: bool
    """Compared, and every tensor and value equal within the tolerance."""
    tensors: tuple[TensorDiff, ...] = ()
    values: tuple[ValueDiff, ...] = ()
    note: str = ""
    """Why it was not read, or where it was found."""
    restored: bool = True
    """Whether a resume loads it. False for a part the checkpoint's framework never reads
    back (a Trainer's ``training_args.bin``): a difference there cannot be what a resume
    got wrong, so the drill does not hold it against its diagnosis when it is not read."""

    @property
    def changed_tensors(self) -> list[TensorDiff]:
        return [t for t in self.tensors if not t.equal]

    @property
    def changed_values(self) -> list[ValueDiff]:
        return [v for v in self.values if not v.equal]

    def summary(self) -> str:
        """One line: what differs, e.g. ``3/4 tensors changed (max abs 0.02), 1/9 values``.

        Example:
            >>> ComponentDiff("ema", "compared", True).summary()
            'equal (0 tensors, 0 values)'
        """
        if self.status != "compared":
            return {"only-a": "only in A", "only-b": "only in B"}.get(
                self.status, f"not compared: {self.note}"
            )
        if self.equal:
            return f"equal ({len(self.tensors)} tensors, {len(self.values)} values)"
        parts = []
        ct, cv = self.changed_tensors, self.changed_values
        if ct:
            worst = max((t.max_abs for t in ct if t.max_abs is not None), default=None)
            tail = f" (max abs {worst:.3g})" if worst is not None else ""
            parts.append(f"{len(ct)}/{len(self.tensors)} tensors differ{tail}")
        if cv:
            parts.append(f"{len(cv)}/{len(self.values)} values differ")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "equal": self.equal,
            "note": self.note,
            "restored": self.restored,
            "summary": self.summary(),
            "tensors": [t.to_dict() for t in self.tensors],
            "values": [v.to_dict() for v in self.values],
        }


@dataclass(frozen=True)
class StateDiff:
    """Two checkpoints compared: every component, every tensor, every value.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp()
        >>> _ = ckptkit.save({"model": {"w": torch.ones(2)}, "step": 1}, d + "/a")
        >>> _ = ckptkit.save({"model": {"w": torch.tensor([1.0, 1.5])}, "step": 1}, d + "/b")
        >>> sd = diff(d + "/a", d + "/b")
        >>> sd.equal, [c.name for c in sd.components if not c.equal], sd.moved_most(1)[0].path
        (False, ['model'], 'model/w')
    """

    a: str
    b: str
    components: tuple[ComponentDiff, ...]
    tolerance: Tolerance = field(default_factory=Tolerance)
    format_a: str = "ckptkit"
    format_b: str = "ckptkit"
    step_a: int | None = None
    step_b: int | None = None
    top: int = 10
    """How many tensors :meth:`to_dict` lists under ``moved_most``."""

    @property
    def complete(self) -> bool:
        """Every component was read on both sides it exists in."""
        return all(c.status != "not-read" for c in self.components)

    @property
    def equal(self) -> bool:
        """Every component present on both sides, read, and equal within the tolerance."""
        return all(c.status == "compared" and c.equal for c in self.components)

    @property
    def different(self) -> list[ComponentDiff]:
        """The components that differ (only on one side included; not-read excluded)."""
        return [c for c in self.components if c.status != "not-read" and not c.equal]

    def component(self, name: str) -> ComponentDiff | None:
        return next((c for c in self.components if c.name == name), None)

    def only(self, names: Iterable[str]) -> StateDiff:
        """This diff restricted to the components ``names`` (``ckptkit diff --component``).

        Raises:
            CkptkitError: a name is no component of either checkpoint (the message lists
                the components there are).
        """
        want = list(dict.fromkeys(names))
        have = [c.name for c in self.components]
        unknown = [n for n in want if n not in have]
        if unknown:
            raise CkptkitError(
                f"no component {', '.join(map(repr, unknown))} in either checkpoint",
                path=Path(self.a),
                hint=f"choose from: {', '.join(have)}",
            )
        return replace(self, components=tuple(c for c in self.components if c.name in want))

    def moved_most(self, n: int) -> list[TensorDiff]:
        """The ``n`` changed tensors with the largest relative L2 change (then max abs),
        named ``component/path``: the layers that moved most."""
        changed = [
            TensorDiff(**{**_fields(t), "path": f"{c.name}/{t.path}"})
            for c in self.components
            for t in c.tensors
            if t.status == "changed"
        ]
        changed.sort(key=lambda t: (-_key(t.rel_l2), -_key(t.max_abs), t.path))
        return changed[: max(0, n)]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report of ``ckptkit diff --json`` (``schemas/diff-report.schema.json``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "a": {"path": self.a, "format": self.format_a, "step": self.step_a},
            "b": {"path": self.b, "format": self.format_b, "step": self.step_b},
            "tolerance": {"atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                          "bitwise": self.tolerance.bitwise},
            "equal": self.equal,
            "complete": self.complete,
            "different": [c.name for c in self.different],
            "components": [c.to_dict() for c in self.components],
            "moved_most": [t.to_dict() for t in self.moved_most(self.top)],
        }


# ------------------------------------------------------------------------------- reading


@dataclass
class _State:
    """One checkpoint's content, split into components (leaves by path)."""

    path: str
    format: str
    step: int | None
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """component -> {path inside it: tensor or value}."""
    unread: dict[str, str] = field(default_factory=dict)
    """component -> why its content could not be read."""
    not_restored: set[str] = field(default_factory=set)
    """Unread components the checkpoint's framework never loads on resume."""


def _read(path: str | Path, *, key: bytes | None) -> _State:
    """Read one checkpoint's state, verified; raise (exit 2) when it cannot be compared."""
    loc = fs.location(path)
    wrong = not_a_checkpoint(str(path), foreign_ok=True)
    if wrong is not None:
        raise wrong
    if fs.kind(loc / MANIFEST_NAME) == "file":
        return _read_native(loc, key=key)
    if fs.kind(loc / dcp_meta.METADATA) == "file":
        return _read_dcp_dir(loc, key=key)
    p = fs.require_local(loc, needs="reading a foreign checkpoint")
    if detect(p) is None:
        raise CkptkitError(
            "not a checkpoint ckptkit can read (no manifest.json, no foreign layout detected)",
            path=p,
            hint="pass a step-NNNNNNNN directory, a Trainer checkpoint-N folder, a .ckpt, "
            ".pt or .safetensors file ('ckptkit inspect PATH' says what it is)",
        )
    return _read_foreign(p, key=key)


def _read_native(loc: fs.Location, *, key: bytes | None) -> _State:
    m = manifest_io.read(loc, key=key)
    tree, m, _ = read_checkpoint(loc, manifest=m, key=key)
    st = _State(str(loc), "ckptkit", m.step)
    if not isinstance(tree, Mapping):
        st.parts["state"] = dict(_leaves(tree))
        return st
    if isinstance(tree.get("dcp"), Mapping):
        # TrainState(storage="dcp"): model and optimizer lie in dcp/, listed in the manifest.
        md = dcp_meta.read_metadata(loc, m)
        st.parts.update(_dcp_parts(dcp_store.read_state(loc / dcp_meta.DCP_DIR, md, dcp_meta.entries(m)), md))
    for top, node in tree.items():
        if top == "dcp":
            continue
        if top == "extra" and isinstance(node, Mapping):
            # Each extra the user registered (an EMA, a data-loader state) is a component.
            for name, sub in node.items():
                comp = str(name) if str(name) not in tree else f"extra/{name}"
                st.parts[comp] = dict(_leaves(sub))
            continue
        st.parts[str(top)] = dict(_leaves(node))
    return st


def _read_dcp_dir(loc: fs.Location, *, key: bytes | None) -> _State:
    """A DCP directory: written by :mod:`ckptkit.dcp`, adopted, a torchtitan ``step-N``
    folder or a plain ``dcp.save``.

    With a ckptkit manifest (:data:`ckptkit.format.manifest.ADOPTED_SUFFIX`) every byte is read
    against its digest (:func:`ckptkit.dcp.open_checked`, then
    :func:`ckptkit.storage.dcp_engine.read_state`). Without one, nothing vouches for the bytes:
    the directory first passes verify's integrity checks, then its files' digests are taken
    as found, so the read at least proves they did not change while they were compared.
    """
    if fs.kind(loc / mf.ADOPTED_SUFFIX) == "file":
        # Imported here: ckptkit.dcp imports torch.distributed.checkpoint (over a second),
        # which only a DCP directory needs; the drill and `ckptkit diff` start without it.
        from ckptkit.checkpoint.dcp import open_checked

        man, md, listed = open_checked(loc, key=key)
        st = _State(str(loc), "dcp", man.step)
    else:
        p = fs.require_local(loc, needs="reading a DCP directory without a ckptkit manifest")
        report = _verified(p, key=key)
        listed = _listing(p)
        md = dcp_meta.read_metadata_file(
            loc / dcp_meta.METADATA, listed.get(dcp_meta.METADATA), rel=dcp_meta.METADATA
        )
        st = _State(str(loc), "dcp", report.detected_step)
    st.parts.update(_dcp_parts(dcp_store.read_state(loc, md, listed, prefix=""), md))
    return st


def _listing(d: Path, *, prefix: str = "") -> dict[str, mf.FileEntry]:
    """``.metadata`` and every ``.distcp`` shard of the DCP directory ``d``, with the size
    and digest they have now (by name inside it; ``prefix``: where ``d`` lies inside the
    checkpoint, for the paths errors name)."""
    out: dict[str, mf.FileEntry] = {}
    for f in sorted(d.iterdir()):
        if f.name == dcp_meta.METADATA or f.name.endswith(".distcp"):
            hexd, size = digest.hash_file(f)
            out[f.name] = mf.FileEntry(path=f"{prefix}{f.name}", size=size, xxh3_128=hexd)
    return out


def _dcp_parts(state: Mapping[str, Any], md: Any) -> dict[str, dict[str, Any]]:
    """The items of a DCP state dict (:func:`ckptkit.storage.dcp_engine.read_state`) split into
    components by the first segment of their place in the saved nesting (``model``,
    ``optimizer``, ``lr_scheduler``, ``dataloader`` ...).

    A tensor at the top level is a parameter of a model saved flattened beside the other
    components (torchtitan's layout): it belongs to ``model``.
    """
    planner = md.planner_data if isinstance(md.planner_data, dict) else {}
    parts: dict[str, dict[str, Any]] = {}
    for fqn, obj in state.items():
        where = item_path(fqn, planner)
        if len(where) == 1 and isinstance(obj, torch.Tensor):
            comp, inner = "model", fqn
        else:
            comp, inner = str(where[0]), "/".join(str(k) for k in where[1:])
        parts.setdefault(comp, {}).update(_leaves(obj, inner))
    return parts


def _verified(p: Path, *, key: bytes | None) -> ForeignReport:
    """Verify's integrity checks of a foreign checkpoint; raise when it fails them."""
    report = verify_foreign(p, key=key, families=("integrity",))
    damage = [f for f in report.errors if f.code != codes.F103]
    if damage:
        f = damage[0]
        raise CkptkitError(
            f"cannot compare: it fails its verify: {f.code} {f.path or ''}: {f.message}",
            path=p,
            code=f.code,
            hint=f"'ckptkit verify {p}' lists every finding; compare a checkpoint that verifies",
        )
    return report


def _read_foreign(p: Path, *, key: bytes | None) -> _State:
    report = _verified(p, key=key)
    s = report.scan
    assert s is not None
    st = _State(str(p), report.format, report.detected_step)
    claims = _claims(s)
    for rel in s.files:
        if _in_dcp_dir(s, rel):
            continue  # never parsed as a torch file: read below, item by item
        content = s.content(rel)
        if content is None:
            name = _orphan_name(s, rel, ())
            st.unread[name] = s.why_unread(rel)
            load = file_load(s.format, rel)
            if load is not None and not load.on_resume:
                st.not_restored.add(name)
            continue
        for inner, leaf in _leaves(content):
            place = f"{rel}:{inner}" if inner else rel
            comp = _claim(claims, place, rel)
            if comp is None:
                comp = _orphan_name(s, rel, tuple(inner.split("/")) if inner else ())
            # Inside a folder, files are named alike in both checkpoints; a one-file
            # checkpoint's own name (a.ckpt, b.ckpt) is no part of where a tensor sits.
            within = place if s.target.is_dir() else (inner or "<root>")
            st.parts.setdefault(comp, {})[within] = leaf
    for sub in _dcp_dirs(s):
        # A DCP directory inside the checkpoint (an FSDP model or optimizer saved by
        # Accelerate): its items by their own component names, placed under its folder.
        d = s.target / sub
        listed = _listing(d, prefix=f"{sub}/")
        md = dcp_meta.read_metadata_file(
            fs.location(d / dcp_meta.METADATA), listed.get(dcp_meta.METADATA),
            rel=f"{sub}/{dcp_meta.METADATA}",
        )
        state = dcp_store.read_state(fs.location(d), md, listed, prefix=sub)
        for comp, leaves in _dcp_parts(state, md).items():
            st.parts.setdefault(comp, {}).update({f"{sub}:{k}": v for k, v in leaves.items()})
    return st


def _dcp_dirs(s: Scan) -> list[str]:
    """The folders inside a checkpoint folder that hold a DCP ``.metadata``."""
    return sorted({
        str(PurePosixPath(rel).parent) for rel in s.files
        if PurePosixPath(rel).name == dcp_meta.METADATA and "/" in rel
    })


def _in_dcp_dir(s: Scan, rel: str) -> bool:
    """Whether ``rel`` is a DCP file (read only item by item, never as one torch file)."""
    name = PurePosixPath(rel).name
    return name == dcp_meta.METADATA or name.endswith(".distcp")


def _claims(s: Scan) -> list[tuple[str, str]]:
    """``(place, component)`` for every place the reader found a component, longest first.

    A reader files every state-dict-shaped mapping under ``model`` and every
    optimizer-shaped one under ``optimizer``; a second one (an EMA or teacher model, a
    second optimizer) is another object, so a place not named like its component
    (:data:`~ckptkit.verify.foreign.structure.NAMES`) while another place is, is a component of
    its own, named by its key (``ema``).
    """
    out: list[tuple[str, str]] = []
    for name, row in s.rows.items():
        places = list(row.where)
        by_name = [w for w in places if NAMES.get(_last_key(w).lower()) == name]
        for i, w in enumerate(places):
            own = name
            if name in SPLIT_COMPONENTS and len(places) > 1 and w not in by_name and (
                by_name or i > 0
            ):
                own = w.split(":", 1)[1] if ":" in w else _orphan_name(s, w, ())
            out.append((w, own))
    return sorted(out, key=lambda x: -len(x[0]))


def _last_key(where: str) -> str:
    inner = where.split(":", 1)[1] if ":" in where else ""
    return inner.rsplit("/", 1)[-1]


def _claim(claims: list[tuple[str, str]], place: str, rel: str) -> str | None:
    """The component that claims ``place`` (``file:key/path``), or None."""
    for where, name in claims:
        if where == rel and (place == rel or place.startswith(rel + ":")):
            return name
        if place == where or place.startswith(where + "/"):
            return name
    return None


def _orphan_name(s: Scan, rel: str, parts: tuple[str, ...]) -> str:
    """The component name of content no reader claims: its file's stem in a folder, its
    top-level key in a one-file checkpoint (per object under :data:`PER_OBJECT_KEYS`)."""
    if s.target.is_dir():
        name = Path(rel).name
        for suffix in (".safetensors", ".json", ".pth", ".pt", ".bin", ".pkl", ".ckpt"):
            name = name.removesuffix(suffix)
        return name or rel
    if not parts:
        return "state"
    if parts[0] in PER_OBJECT_KEYS and len(parts) > 1:
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every tensor and every plain value of a nested state.

    A list or tuple of plain scalars is one value (an RNG's words, a scheduler's
    ``base_lrs``); numeric numpy arrays are tensors.
    """
    if isinstance(node, np.ndarray) and node.dtype.kind in "biufc":
        node = torch.from_numpy(np.ascontiguousarray(node))
    if isinstance(node, torch.Tensor):
        yield prefix, node
    elif isinstance(node, Mapping):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}/{k}" if prefix else str(k))
    elif isinstance(node, list | tuple) and not _plain_list(node):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}/{i}" if prefix else str(i))
    else:
        yield prefix, _plain(node)


def _plain_list(node: list[Any] | tuple[Any, ...]) -> bool:
    return all(v is None or isinstance(v, bool | int | float | str) for v in node)


def _plain(v: Any) -> Any:
    """A leaf as a comparable plain value (numpy scalars as Python ones, tuples as lists)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, bytes):
        # Compared by their digest (a data loader's pickled state differs anywhere).
        return {"bytes": len(v), "xxh3_128": content_digest.hexdigest_bytes(v)}
    return repr(v)


# ----------------------------------------------------------------------------- comparing


def diff(
    a: str | Path,
    b: str | Path,
    *,
    key: bytes | None = None,
    tolerance: Tolerance | None = None,
    top: int = 10,
    roots: tuple[str, str] | None = None,
) -> StateDiff:
    """Compare the states of checkpoints ``a`` and ``b`` (native, adopted or foreign).

    Args:
        a: the first checkpoint (the reference, the last good one).
        b: the second checkpoint.
        key: an HMAC key native and adopted manifests must be signed with (None: no
            signature is checked).
        tolerance: when tensors and float values count as equal (default: bitwise).
        top: how many of the tensors that moved most the JSON report lists.
        roots: the directories the runs of ``a`` and ``b`` wrote into: a text value naming
            a path under ``a``'s root equals the same path under ``b``'s (a Lightning
            ``ModelCheckpoint`` records its own directory; the drill's runs each have one).

    Returns:
        The :class:`StateDiff` (``equal``, ``different``, ``moved_most(n)``, ``to_dict()``).

    Raises:
        CkptkitError: a path is not a checkpoint, or one fails its verify (a digest, a
            damaged file): the message names the file and the fix.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> d = tempfile.mkdtemp()
        >>> _ = ckptkit.save({"model": {"w": torch.ones(2)}}, d + "/a")
        >>> diff(d + "/a", d + "/a").equal
        True
    """
    tol = tolerance or Tolerance()
    sa, sb = _read(a, key=key), _read(b, key=key)
    return _compare(sa, sb, tol, top=top, roots=roots)


def _compare(
    sa: _State, sb: _State, tol: Tolerance, *, top: int = 10, roots: tuple[str, str] | None = None
) -> StateDiff:
    names = list(dict.fromkeys([*sa.parts, *sa.unread, *sb.parts, *sb.unread]))
    comps: list[ComponentDiff] = []
    for name in names:
        if name in sa.unread or name in sb.unread:
            why = sa.unread.get(name) or sb.unread.get(name) or ""
            restored = name not in sa.not_restored | sb.not_restored
            comps.append(ComponentDiff(name, "not-read", False, note=why, restored=restored))
        elif name not in sb.parts:
            comps.append(ComponentDiff(name, "only-a", False))
        elif name not in sa.parts:
            comps.append(ComponentDiff(name, "only-b", False))
        else:
            comps.append(_component(name, sa.parts[name], sb.parts[name], tol, roots))
    return StateDiff(
        a=sa.path, b=sb.path, components=tuple(comps), tolerance=tol,
        format_a=sa.format, format_b=sb.format, step_a=sa.step, step_b=sb.step, top=top,
    )


def _component(
    name: str,
    la: Mapping[str, Any],
    lb: Mapping[str, Any],
    tol: Tolerance,
    roots: tuple[str, str] | None,
) -> ComponentDiff:
    tensors: list[TensorDiff] = []
    values: list[ValueDiff] = []
    for path in dict.fromkeys([*la, *lb]):
        va, vb = la.get(path, _MISSING), lb.get(path, _MISSING)
        if isinstance(va, torch.Tensor) or isinstance(vb, torch.Tensor):
            tensors.append(tensor_diff(path, va, vb, tol))
        else:
            values.append(_value_diff(path, va, vb, tol, roots))
    equal = all(t.equal for t in tensors) and all(v.equal for v in values)
    return ComponentDiff(name, "compared", equal, tuple(tensors), tuple(values))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def tensor_diff(path: str, a: Any, b: Any, tol: Tolerance | None = None) -> TensorDiff:
    """Compare two tensors (either may be absent or not a tensor).

    Example:
        >>> t = tensor_diff("w", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
        >>> t.status, t.max_abs, round(t.rel_l2, 4)
        ('changed', 0.5, 0.2236)
    """
    tol = tol or Tolerance()
    ta = a if isinstance(a, torch.Tensor) else None
    tb = b if isinstance(b, torch.Tensor) else None
    sha = tuple(ta.shape) if ta is not None else None
    shb = tuple(tb.shape) if tb is not None else None
    dta = str(ta.dtype).removeprefix("torch.") if ta is not None else None
    dtb = str(tb.dtype).removeprefix("torch.") if tb is not None else None

    def out(status: TensorStatus, equal: bool, bitwise: bool, mx: float | None = None,
            rel: float | None = None) -> TensorDiff:
        return TensorDiff(path, status, equal, bitwise, mx, rel, sha, shb, dta, dtb)

    if ta is None or tb is None:
        return out("only-b" if ta is None else "only-a", False, False)
    if sha != shb:
        return out("shape", False, False)
    ta, tb = _dense(ta), _dense(tb)
    bitwise = ta.dtype == tb.dtype and _same_bytes(ta, tb)
    if bitwise:
        return out("equal", True, True, 0.0, 0.0)
    mx, rel, close = _numbers(ta, tb, tol)
    if ta.dtype != tb.dtype:
        return out("dtype", False, False, mx, rel)
    equal = close and not tol.bitwise
    return out("equal" if equal else "changed", equal, False, mx, rel)


def _dense(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.cpu()


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0:
        return True
    try:
        return bool(torch.equal(_bytes(a), _bytes(b)))
    except (RuntimeError, TypeError):  # a dtype without a byte view: compare values
        return bool(torch.equal(a, b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _numbers(a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> tuple[float | None, float | None, bool]:
    """(max abs difference, relative L2 change, every element within the tolerance),
    computed in float64 (complex128) slices of :data:`CHUNK` elements."""
    try:
        fa, fb = a.reshape(-1), b.reshape(-1)
        wide = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
        mx, sq_d, sq_a, close = 0.0, 0.0, 0.0, True
        for i in range(0, fa.numel(), CHUNK):
            x = fa[i : i + CHUNK].to(wide)
            y = fb[i : i + CHUNK].to(wide)
            d = (y - x).abs().to(torch.float64)
            # Tolerance's rule, element-wise (_close_value is the same rule for one value).
            same = (x == y) | (torch.isnan(x.abs()) & torch.isnan(y.abs()))
            d = torch.where(same, torch.zeros_like(d), d)
            d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
            ax = x.abs().to(torch.float64)
            mx = max(mx, float(d.max())) if d.numel() else mx
            sq_d += float((d * d).sum())
            sq_a += float((torch.where(torch.isfinite(ax), ax, torch.zeros_like(ax)) ** 2).sum())
            finite = torch.isfinite(x) & torch.isfinite(y)
            within = finite & (d <= tol.atol + tol.rtol * ax)
            close = close and bool((same | within).all())
    except (RuntimeError, TypeError):  # a dtype without CPU arithmetic: compare nothing
        return None, None, False
    rel = math.sqrt(sq_d) / math.sqrt(sq_a) if sq_a > 0 else (0.0 if sq_d == 0 else math.inf)
    return mx, rel, close


def _value_diff(
    path: str, a: Any, b: Any, tol: Tolerance, roots: tuple[str, str] | None
) -> ValueDiff:
    if a is _MISSING or b is _MISSING:
        status: ValueStatus = "only-b" if a is _MISSING else "only-a"
        return ValueDiff(path, status, False, _show(a), _show(b))
    equal = _same_value(a, b, tol)
    if not equal and roots is not None and isinstance(a, str) and isinstance(b, str):
        ra, rb = roots
        equal = bool(ra and rb and a.replace(ra, "<run>") == b.replace(rb, "<run>"))
    return ValueDiff(path, "equal" if equal else "changed", equal, _show(a), _show(b))


def _same_value(a: Any, b: Any, tol: Tolerance) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y, tol) for x, y in zip(a, b, strict=True))
    if _is_num(a) and _is_num(b):
        if isinstance(a, int) and isinstance(b, int):
            return bool(a == b)
        try:
            return _close_value(float(a), float(b), tol)
        except OverflowError:  # an int past every float: only an exact match is equal
            return bool(a == b)
    return bool(a == b) and type(a) is type(b)


def _close_value(fa: float, fb: float, tol: Tolerance) -> bool:
    """:class:`Tolerance`'s rule for one pair of numbers (``_numbers`` applies it element-wise).

    Example:
        >>> t = Tolerance(rtol=0.5)
        >>> _close_value(math.inf, 1.0, t), _close_value(1.0, math.inf, t)
        (False, False)
        >>> _close_value(math.nan, math.nan, t), _close_value(math.inf, -math.inf, t)
        (True, False)
    """
    if fa == fb or (math.isnan(fa) and math.isnan(fb)):
        return True
    if not (math.isfinite(fa) and math.isfinite(fb)):
        return False
    return abs(fb - fa) <= tol.atol + tol.rtol * abs(fa)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _show(v: Any) -> Any:
    """``v`` as JSON, shortened when long (an RNG's 625 words say only that they differ)."""
    if v is _MISSING:
        return None
    if isinstance(v, float):
        return encode_float(v)
    text = repr(v)
    if len(text) <= SHOW_CHARS:
        return [encode_float(x) if isinstance(x, float) else x for x in v] if isinstance(v, list) else v
    if isinstance(v, list):
        return f"<{len(v)} items: {text[:40]}…>"
    return f"<{len(text)} chars: {text[:40]}…>"


def _num(x: float | None) -> float | str | None:
    return None if x is None else encode_float(x)


def _key(x: float | None) -> float:
    return -1.0 if x is None else (math.inf if math.isnan(x) else x)


def _fields(t: TensorDiff) -> dict[str, Any]:
    return {k: getattr(t, k) for k in TensorDiff.__dataclass_fields__}


__all__ = [
    "SCHEMA_VERSION",
    "ComponentDiff",
    "StateDiff",
    "TensorDiff",
    "Tolerance",
    "ValueDiff",
    "diff",
    "tensor_diff",
]
