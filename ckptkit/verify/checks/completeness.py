"""Completeness family: every component the run requires (spec §1) is in the checkpoint.

What a run *requires* is recorded at save time (``TrainState`` derives it from what was
passed: a scaler makes the scaler required, a world size W means W RNG states); a plain
``ckptkit.save`` requires nothing, so these checks stay silent on it.
"""

from __future__ import annotations

from collections.abc import Iterator

from ckptkit import manifest as mf
from ckptkit.verify.checks import _state as st
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, WARNING, Finding, check

# Components whose state lives in the tree under their own name in a TrainState save.
_IN_TREE = tuple(n for n in mf.COMPONENTS if n not in ("env",))


@check("CK-C001")
def required_missing(ctx: CheckContext) -> Iterator[Finding]:
    m = st.manifest(ctx)
    tree = st.mapping(m.tree)
    trainstate = "model" in tree and st.present(ctx, "model")
    for name in mf.COMPONENTS:
        c = st.component(ctx, name)
        if c is None or c.required is not True:
            continue
        why = f" (required: {c.reason})" if c.reason else ""
        if c.present is not True:
            yield CODES["CK-C001"].finding(
                f"{name} state is required{why} but missing", component=name
            )
        elif trainstate and name in _IN_TREE and name not in tree:
            # The table says present, but the state itself is gone (edited or damaged).
            yield CODES["CK-C001"].finding(
                f"{name} is marked present{why} but the state tree holds no '{name}'",
                component=name,
            )
    if "env" in m.components and m.components["env"].required and not m.env:
        yield CODES["CK-C001"].finding(
            "env is required (always recorded) but the manifest's env record is empty",
            component="env",
        )


@check("CK-C002")
def sampler_missing(ctx: CheckContext) -> Iterator[Finding]:
    opt = st.component(ctx, "optimizer")
    if opt is None or opt.required is not True or opt.present is not True:
        return  # not a training resume (or a plain save): nothing to say
    samp = st.component(ctx, "sampler")
    if samp is not None and samp.present is True:
        return
    if samp is not None and samp.required is True:
        return  # CK-C001 reports it
    yield CODES["CK-C002"].finding(
        "the checkpoint holds optimizer state but no data-loader cursor", component="sampler"
    )


@check("CK-C003")
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
        yield CODES["CK-C003"].finding(
            f"the RNG record says world size {world}, the parallel layout {par_world}"
        )
    ranks: set[int] = set()
    rng_tree = st.tree_part(ctx, "rng")
    for key, _ in st.items(rng_tree):
        if isinstance(key, str) and key.startswith("rank") and key[4:].isdigit():
            ranks.add(int(key[4:]))
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
        yield CODES["CK-C003"].finding(
            f"RNG state for {n} of {world} rank(s) missing: ranks "
            f"{', '.join(map(str, first))}{more}"
        )
    if extra:
        yield CODES["CK-C003"].finding(
            f"RNG state for rank(s) {_few(extra)} outside the recorded world size {world}",
            severity=WARNING,
            hint="the checkpoint mixes states of two layouts; check which run wrote it",
        )


def _few(xs: list[int], n: int = 8) -> str:
    head = ", ".join(str(x) for x in xs[:n])
    return head + (f" … (+{len(xs) - n})" if len(xs) > n else "")
