"""Completeness family: every component the run requires (spec §1) is in the checkpoint.

What a run *requires* is recorded at save time (``TrainState`` derives it from what was
passed: a scaler makes the scaler required, a world size W means W RNG states); a plain
``ckptkit.save`` requires nothing, so these checks stay silent on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ckptkit import codes
from ckptkit.codes import UNREADABLE
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format import tree as tree_mod
from ckptkit.storage import fs
from ckptkit.storage.dcp_meta import DCP_DIR, METADATA
from ckptkit.verify.checks import _state as st
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, WARNING, Finding, check

# Components whose state lives in the tree under their own name in a TrainState save.
_IN_TREE = tuple(n for n in mf.COMPONENTS if n not in ("env",))


@check(codes.C001, needs=("state",))
def required_missing(ctx: CheckContext) -> Iterator[Finding]:
    comps = st.view(ctx).components()
    m = ctx.manifest
    tree = st.mapping(m.tree) if m is not None else {}
    trainstate = "model" in tree and st.present(ctx, "model")
    for name in mf.COMPONENTS:
        c = st.component(ctx, name)
        if c is None or c.required is not True:
            continue
        why = f" ({c.reason})" if c.reason else ""
        if c.present is not True:
            yield CODES[codes.C001].finding(
                f"{name} state is required{why} but missing", component=name
            )
        elif trainstate and name in _IN_TREE and name not in tree and _recorded_required(m, name):
            # The table says present, but the state itself is gone (edited or damaged).
            yield CODES[codes.C001].finding(
                f"{name} is marked present{why} but the state tree holds no '{name}'",
                component=name,
            )
    env = comps.get("env")
    if m is not None and env is not None and env.required and not m.env:
        yield CODES[codes.C001].finding(
            "env is required (always recorded) but the manifest's env record is empty",
            component="env",
        )


def _recorded_required(m: mf.Manifest | None, name: str) -> bool:
    """The run itself (not ``--expect``) recorded ``name`` as required: a TrainState save,
    which keeps each component under its own name in the tree."""
    c = m.components.get(name) if m is not None else None
    return isinstance(c, mf.Component) and c.required is True


def _training(ctx: CheckContext) -> bool:
    """The checkpoint holds training state: an optimizer the run requires, present."""
    opt = st.component(ctx, "optimizer")
    return opt is not None and opt.required is True and opt.present is True


def _absent_unrequired(ctx: CheckContext, name: str) -> mf.Component | None:
    """The component when it is absent and not required (else None: nothing to add)."""
    c = st.component(ctx, name)
    if c is None:
        return mf.Component(name=name, present=False, required=False)
    if c.present is True or c.required is True:
        return None  # present, or CK-C001 reports it
    return c


@check(codes.C002, needs=("state",))
def sampler_missing(ctx: CheckContext) -> Iterator[Finding]:
    if not _training(ctx):
        return  # not a training resume (or a plain save): nothing to say
    samp = _absent_unrequired(ctx, "sampler")
    if samp is not None:
        why = f" ({samp.reason})" if samp.reason else ""
        yield CODES[codes.C002].finding(
            f"the checkpoint holds optimizer state but no data-loader cursor{why}",
            component="sampler",
        )


@check(codes.C003, needs=("state",))
def rng_ranks(ctx: CheckContext) -> Iterator[Finding]:
    if not st.present(ctx, "rng"):
        return
    summ = st.summary(ctx, "rng")
    world = st.integer(summ.get("world_size"))
    par_world = st.integer(st.summary(ctx, "parallel").get("world_size"))
    if world is None:
        world = par_world
    if world is None or world < 1:
        return  # a plain save: no recorded world size to hold the states against
    if par_world is not None and par_world != world:
        yield CODES[codes.C003].finding(
            f"the RNG record says world size {world}, the parallel layout {par_world}"
        )
    ranks: set[int] = set()
    rng_tree = st.tree_part(ctx, "rng")
    for key, _ in st.items(rng_tree):
        rank = st.decimal(key[4:]) if isinstance(key, str) and key.startswith("rank") else None
        if rank is not None:
            ranks.add(rank)
    if ctx.manifest is not None:
        ranks |= ctx.manifest.rng_ranks  # of a restoring rank's manifest, the unread ranks' too
    if not ranks:
        return  # nothing recorded per rank (not a TrainState layout)
    inside = {r for r in ranks if r < world}
    extra = sorted(ranks - inside)
    if len(inside) < world:
        # Never materialise range(world): a damaged manifest may claim any world size.
        first: list[int] = []
        r = 0
        while len(first) < 8 and r < world:
            if r not in inside:
                first.append(r)
            r += 1
        n = world - len(inside)
        more = f" … (+{n - len(first)})" if n > len(first) else ""
        yield CODES[codes.C003].finding(
            f"RNG state for {n} of {world} rank(s) missing: ranks "
            f"{', '.join(map(str, first))}{more}"
        )
    if extra:
        yield CODES[codes.C003].finding(
            f"RNG state for rank(s) {_few(extra)} outside the recorded world size {world}",
            severity=WARNING,
            hint="the checkpoint mixes states of two layouts; check which run wrote it",
        )


def _few(xs: list[int], n: int = 8) -> str:
    head = ", ".join(str(x) for x in xs[:n])
    return head + (f" … (+{len(xs) - n})" if len(xs) > n else "")


@check(codes.C103, needs=("state",))
def rng_missing(ctx: CheckContext) -> Iterator[Finding]:
    if not _training(ctx):
        return
    rng = _absent_unrequired(ctx, "rng")
    if rng is not None:
        why = f" ({rng.reason})" if rng.reason else ""
        yield CODES[codes.C103].finding(
            f"the checkpoint holds optimizer state but no RNG state{why}", component="rng"
        )


@check(codes.C011, needs=("state",))
def expectation_inferred(ctx: CheckContext) -> Iterator[Finding]:
    expect, why = st.view(ctx).expectation()
    if expect == "weights" and why:
        yield CODES[codes.C011].finding(
            f"checked as a weights checkpoint: {why}; only the model is required",
            component="model",
        )


@check(codes.C012, needs=("state",))
def components_inferred(ctx: CheckContext) -> Iterator[Finding]:
    for name, found in st.view(ctx).found().items():
        if found.how == "inferred":
            yield CODES[codes.C012].finding(
                f"{name}: {found.describe()}; no key or file names it as such", component=name
            )


# --- components proven from bytes -----------------------------------------------------------

_FILE_DAMAGE = frozenset(
    {codes.F001, codes.F002, codes.F003, codes.F004, codes.F005, codes.F008, codes.F009, codes.F022}
)
"""Integrity codes that mean a file does not hold what the manifest says."""


def _file_problem(ctx: CheckContext, rel: str) -> str | None:
    """Why the listed file ``rel`` does not prove anything (None when it is whole).

    With ``options["read_files"] = False`` (restore, whose reader checks every digest as it
    reads) only the listing, the file's kind and its size are checked here.
    """
    if ctx.options.get("read_files", True) is False:
        return _file_stat_problem(ctx, rel)
    scan = ctx.scan_all().get(rel)
    if scan is None:
        return "is not listed in the manifest"
    if not scan.exists:
        return "is missing"
    if scan.outside:
        return "resolves outside the checkpoint"
    if scan.io_error is not None and scan.io_error_code == UNREADABLE:
        # CK-F025 reports it; claiming the component absent too would turn a read that
        # failed for a reason other than damage (a chmod, EIO) into a corrupt verdict.
        return None
    if scan.io_error is not None:
        return f"cannot be read ({scan.io_error})"
    if scan.size != scan.entry.size:
        return f"has the wrong size ({scan.size} of {scan.entry.size} bytes)"
    if scan.digest != scan.entry.xxh3_128:
        return "fails its digest"
    if scan.header_error is not None:
        return f"has a bad header ({scan.header_error})"
    return None


def _file_stat_problem(ctx: CheckContext, rel: str) -> str | None:
    m = st.manifest(ctx)
    fe = m.file(rel)
    if fe is None:
        return "is not listed in the manifest"
    kind = fs.kind(ctx.root / rel)
    if kind is None:
        return "is missing"
    if kind != "file":
        return "is not a regular file"
    size = fs.size(ctx.root / rel)
    if size != fe.size:
        return f"has the wrong size ({size} of {fe.size} bytes)"
    return None


def _tree_at(tree: Any, parts: list[str]) -> tuple[bool, Any]:
    node = tree
    for p in parts:
        m = st.mapping(node)
        if p not in m:
            return False, None
        node = m[p]
    return True, node


@check(codes.C010)
def claimed_without_bytes(ctx: CheckContext) -> Iterator[Finding]:
    """Every component the table calls present is held by whole files or existing keys."""
    m = st.manifest(ctx)
    tensor_file = {te.key: te.file for te in m.tensors}
    dcp_meta = f"{DCP_DIR}/{METADATA}"
    for name, c in m.components.items():
        if c.present is not True:
            continue
        where = [w for w in c.where if isinstance(w, str)]
        if not where:
            yield CODES[codes.C010].finding(
                f"{name} is marked present but the table names no file or key holding it",
                component=name,
            )
            continue
        for w in where:
            if w == "manifest:env":
                if not m.env:
                    yield CODES[codes.C010].finding(
                        f"{name} lives in the manifest's env record, which is empty",
                        component=name,
                    )
                continue
            if w.startswith("manifest:tree/"):
                found, node = _tree_at(m.tree, w.removeprefix("manifest:tree/").split("/"))
                if not found:
                    yield CODES[codes.C010].finding(
                        f"{name} is marked present at '{w}', but the state tree has no such key",
                        component=name,
                    )
                    continue
                for _path, key in st_tree_refs(node):
                    rel = tensor_file.get(key)
                    why = (
                        "is not listed among the manifest's tensors" if rel is None
                        else _file_problem(ctx, rel)
                    )
                    if why is not None:
                        yield CODES[codes.C010].finding(
                            f"{name}: tensor '{key}' "
                            + (why if rel is None else f"lives in {rel}, which {why}"),
                            component=name,
                            path=rel,
                        )
                        break
                continue
            if m.elsewhere(w):
                continue  # a restoring rank's manifest: a file of a rank it does not read
            why = _file_problem(ctx, w)
            if why is not None:
                yield CODES[codes.C010].finding(
                    f"{name} is held by {w}, which {why}", component=name, path=w
                )
        if any(w.startswith(f"{DCP_DIR}/") for w in where) and not _dcp_has(ctx, name):
            yield CODES[codes.C010].finding(
                f"{name} is marked as stored with DCP, but {dcp_meta} is not listed, cannot "
                f"be read safely, or holds no '{name}.' items",
                component=name,
                path=dcp_meta,
            )


def st_tree_refs(node: Any) -> list[tuple[tuple[str, ...], str]]:
    """Tensor references inside a subtree of the state tree (tolerating damaged JSON)."""
    try:
        return list(tree_mod.iter_tensor_refs(node))
    except (TypeError, ValueError, KeyError, RecursionError):
        return []


def _dcp_has(ctx: CheckContext, component: str) -> bool:
    """Whether the (digest-checked) DCP metadata lists items of ``component``."""
    md = st.dcp_metadata(ctx)
    if isinstance(md, CkptkitError):
        return False  # unlisted, damaged or hostile: the integrity findings say why
    try:
        keys = dict(getattr(md, "state_dict_metadata", None) or {})
    except Exception:  # an unexpected structure: CK-F108 says why
        return False
    return any(isinstance(k, str) and k.startswith(component + ".") for k in keys)
