"""Consistency family: the recorded pieces of state agree with each other (spec §4).

Every check reads the checkpoint's :class:`~ckptkit.verify.view.StateView`: the component
summaries, the optimizer's per-parameter state shapes, the model's tensor shapes. Native
checkpoints get theirs from the manifest (summaries written at capture time), foreign ones
from their reader (:mod:`ckptkit.verify.foreign`), so a defect gets the same code and the same
words in both. Only the NaN/Inf scans (CK-S010, CK-S011) read tensor values. A plain
``ckptkit.save`` of an arbitrary dict records no summaries and is checked for NaN/Inf only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from ckptkit import codes
from ckptkit.capture import fp8 as fp8_capture
from ckptkit.capture import progress as progress_capture
from ckptkit.capture import rng as rng_capture
from ckptkit.capture import sampler as sampler_capture
from ckptkit.capture import state as train_state
from ckptkit.checkpoint import catalog
from ckptkit.codes import ROLLBACK
from ckptkit.errors import CkptkitError
from ckptkit.format import tree as tree_mod
from ckptkit.format.dtypes import DTYPES
from ckptkit.format.manifest import Manifest
from ckptkit.format.records import GUARD_KEY, lookahead_problems, recoveries_problems
from ckptkit.verify.checks import _state as st
from ckptkit.verify.context import CheckContext
from ckptkit.verify.findings import CODES, INFO, WARNING, Finding, check
from ckptkit.verify.view import OptimizerView

STATEFUL_OPTIMIZERS = frozenset(
    {
        "Adam",
        "AdamW",
        "Adamax",
        "NAdam",
        "RAdam",
        "SparseAdam",
        "Adagrad",
        "Adadelta",
        "RMSprop",
        "Rprop",
        "ASGD",
        "Adafactor",
        "Lion",
        "Muon",
    }
)
"""Optimizers that hold per-parameter state once they have stepped (SGD: with momentum)."""

SCALER_SKIP_FRACTION = 0.10
SCALER_SKIP_MIN = 50
"""With an enabled GradScaler, up to this many optimizer steps (the larger of the two: a
fraction of the global step, or a fixed count) may have been skipped on inf/NaN gradients."""

PREFETCH_BATCHES = 16
"""Global batches a sampler may run ahead of the training loop (prefetching workers)."""

COLLAPSED_SCALE = 1.0
"""A loss scale below this has been halved on overflow far below any healthy value:
fp16 gradients then underflow to zero and the run silently stops learning."""

MAX_NAMED = 5


def _names(xs: list[str], n: int = MAX_NAMED) -> str:
    head = ", ".join(xs[:n])
    return head + (f" and {len(xs) - n} more" if len(xs) > n else "")


def _stateful(opt: OptimizerView) -> bool:
    """Whether the optimizer holds per-parameter state once it has stepped.

    By its recorded class; without one (foreign state dicts name none), by its
    hyper-parameters: Adam-family groups carry ``betas``, SGD keeps a momentum buffer
    only with ``momentum`` > 0.
    """
    kind = opt.kind
    if kind in STATEFUL_OPTIMIZERS:
        return True
    if kind not in (None, "SGD"):
        return False  # a damaged summary or another optimizer: judge nothing
    for g in opt.groups:
        if kind is None and "betas" in g:
            return True
        momentum = st.num(g.get("momentum"))
        if momentum is not None and momentum != 0:
            return True
    return False


# --- optimizer -------------------------------------------------------------------------------


@check(codes.S001, needs=("state",))
def moments_missing(ctx: CheckContext) -> Iterator[Finding]:
    step = st.integer(st.summary(ctx, "progress").get("step"))
    for opt in st.optimizers(ctx):
        params = opt.params
        if not params or not _stateful(opt):
            continue
        kind = opt.kind or "the optimizer"
        without = [p.name for p in params if p.moments is None]
        if not without:
            continue
        if len(without) == len(params):
            if step:
                yield CODES[codes.S001].finding(
                    f"{kind} holds no state for any of its {len(params)} parameters, but the "
                    f"global step is {step}"
                )
            continue
        yield CODES[codes.S001].finding(
            f"{kind} holds no state for {len(without)} of {len(params)} parameters: "
            f"{_names(without)}",
            severity=WARNING,
            hint="expected only for parameters that never received a gradient (unused or "
            "frozen by hand); otherwise their moments restart from zero on resume",
        )


# Per-parameter state that is legitimately not shaped like the parameter (factored
# second moments of Adafactor and friends).
_FACTORED = ("row", "col", "factored")


@check(codes.S002, needs=("state",))
def moment_shapes(ctx: CheckContext) -> Iterator[Finding]:
    model_shape = st.view(ctx).model_shapes()
    for opt in st.optimizers(ctx):
        bad: list[str] = []
        for p in opt.params:
            if p.moments is None:
                continue
            moments = {
                k: v for k, v in p.moments.items() if v and not any(f in k.lower() for f in _FACTORED)
            }
            if p.shape is not None:
                for key, got in moments.items():
                    if got != p.shape:
                        bad.append(f"{key!r} of {p.name!r} is {list(got)}, the parameter {list(p.shape)}")
            elif len(set(moments.values())) > 1:
                # The parameter's shape is unknown, but its moments must agree with each other.
                (k0, s0), *rest = sorted(moments.items())
                for key, got in rest:
                    if got != s0:
                        bad.append(f"{key!r} of {p.name!r} is {list(got)}, {k0!r} {list(s0)}")
        # The recorded parameter shapes must also match the model's tensors (same names),
        # unless parameters are flattened by FSDP/ZeRO (the optimizer then sees flat shards).
        if not opt.flat and not opt.matched_by_position:
            for p in opt.params:
                ms = model_shape.get(p.name)
                if p.shape is not None and ms is not None and ms != p.shape:
                    bad.append(
                        f"parameter {p.name!r} is {list(p.shape)} in the optimizer, "
                        f"{list(ms)} in the model"
                    )
        if bad:
            yield CODES[codes.S002].finding(
                f"{len(bad)} shape mismatch(es): "
                + "; ".join(bad[:MAX_NAMED])
                + (f"; and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else "")
                + (
                    " (parameters matched to the model's tensors by position: the state "
                    "dict names none)"
                    if opt.matched_by_position
                    else ""
                )
            )


# --- counters --------------------------------------------------------------------------------


@check(codes.S003, needs=("state",))
def optimizer_vs_global(ctx: CheckContext) -> Iterator[Finding]:
    osumm = st.summary(ctx, "optimizer")
    prog = st.summary(ctx, "progress")
    o = st.integer(osumm.get("step_max"))
    g = st.integer(prog.get("step"))
    if o is None or g is None:
        return
    accum = st.integer(prog.get("accum_steps")) or 1
    scaler = st.summary(ctx, "scaler").get("enabled") is True
    skip = max(SCALER_SKIP_MIN, int(g * SCALER_SKIP_FRACTION)) if scaler else 0
    # The global step counts optimizer steps; some loops count micro-batches instead.
    for ref in {g, g // accum} if accum > 1 and g % accum == 0 else {g}:
        if ref - skip <= o <= ref:
            return
    msg = f"optimizer step is {o} but the global step is {g}"
    if accum > 1:
        msg += f" (accum_steps {accum})"
    if scaler and o < g:
        msg += f"; more than the {skip} steps an fp16 GradScaler may skip"
    yield CODES[codes.S003].finding(msg)


_PER_STEP_EXEMPT = ("ReduceLROnPlateau", "ChainedScheduler")


@check(codes.S004, needs=("state",))
def scheduler_vs_global(ctx: CheckContext) -> Iterator[Finding]:
    ssumm = st.summary(ctx, "scheduler")
    prog = st.summary(ctx, "progress")
    if ssumm.get("type") in _PER_STEP_EXEMPT:
        return
    last = st.integer(ssumm.get("last_epoch"))
    g = st.integer(prog.get("step"))
    if last is None or g is None:
        return
    accum = st.integer(prog.get("accum_steps")) or 1
    epoch = st.integer(prog.get("epoch"))
    o = st.integer(st.summary(ctx, "optimizer").get("step_max"))
    # Per optimizer step, per micro-batch, per epoch, or per actual optimizer step;
    # one off either way is the usual "stepped before/after the save" ordering.
    candidates = {g, g * accum} | ({epoch} if epoch is not None else set())
    if o is not None:
        candidates.add(o)
    if any(abs(last - c) <= 1 for c in candidates):
        return
    yield CODES[codes.S004].finding(
        f"scheduler {ssumm.get('type')} is at last_epoch {last} but the global step is {g}"
        + (f" (epoch {epoch})" if epoch else "")
    )


@check(codes.S005, needs=("state",))
def sampler_vs_global(ctx: CheckContext) -> Iterator[Finding]:
    gbs = st.integer(st.summary(ctx, "parallel").get("global_batch_size"))
    prog = st.summary(ctx, "progress")
    g = st.integer(prog.get("step"))
    if not gbs or g is None:
        return
    expected = g * gbs
    consumed = st.integer(prog.get("consumed_samples"))
    if consumed and not expected <= consumed <= expected + gbs:
        yield CODES[codes.S005].finding(
            f"progress counts {consumed} consumed samples, but step {g} × global batch "
            f"{gbs} = {expected}",
            component="progress",
        )
    samp = st.summary(ctx, "sampler")
    pos = st.integer(samp.get("consumed"))
    if pos is None:
        return
    epoch = st.integer(samp.get("epoch")) or 0
    per_rank = st.integer(samp.get("num_samples"))
    world = st.integer(samp.get("world_size")) or 1
    epoch_len = per_rank * world if per_rank else st.integer(samp.get("data_len"))
    if epoch and not epoch_len:
        return
    drawn = epoch * (epoch_len or 0) + pos
    data_len = st.integer(samp.get("data_len"))
    if epoch_len and data_len is not None and pos >= data_len:
        return  # end of an epoch: consumed is capped, the count is not exact here
    ahead = PREFETCH_BATCHES * gbs
    if expected - gbs <= drawn <= expected + ahead:
        return
    where = "behind" if drawn < expected else "ahead of"
    yield CODES[codes.S005].finding(
        f"sampler has drawn {drawn} samples (epoch {epoch}, {pos} into it), {where} step "
        f"{g} × global batch {gbs} = {expected}"
    )


# --- per-rank and layout ---------------------------------------------------------------------


@check(codes.S006, needs=("state",))
def rng_duplicates(ctx: CheckContext) -> Iterator[Finding]:
    prints = st.mapping(st.summary(ctx, "rng").get("fingerprints"))
    by_print: dict[str, list[str]] = {}
    for rank, fp in prints.items():
        if isinstance(fp, str):
            by_print.setdefault(fp, []).append(rank)
    for fp, ranks in sorted(by_print.items()):
        if len(ranks) > 1:
            yield CODES[codes.S006].finding(
                f"{len(ranks)} ranks hold the same RNG state ({fp}): {_names(sorted(ranks), 8)}"
            )


@check(codes.S007, needs=("state",))
def parallel_layout(ctx: CheckContext) -> Iterator[Finding]:
    summ = st.summary(ctx, "parallel")
    problems = summ.get("problems")
    if not isinstance(problems, list):
        return
    # The saving process's own rank is not part of the layout (rank 0 writes the manifest).
    real = [p for p in problems if isinstance(p, str) and p and not p.startswith("rank ")]
    if real:
        yield CODES[codes.S007].finding("; ".join(real))


# --- scaling state ---------------------------------------------------------------------------


@check(codes.S008, needs=("state",))
def loss_scale(ctx: CheckContext) -> Iterator[Finding]:
    summ = st.summary(ctx, "scaler")
    if summ.get("enabled") is not True:
        return
    # The tree holds the exact value (non-finite floats tagged); the summary is a copy.
    scale = st.num(
        st.mapping(st.mapping(st.tree_part(ctx, "scaler")).get("state_dict")).get("scale")
    )
    if scale is None:
        scale = st.num(summ.get("scale"))
    if scale is None:
        return
    if not math.isfinite(scale) or scale <= 0:
        yield CODES[codes.S008].finding(f"loss scale is {scale}")
    elif scale < COLLAPSED_SCALE:
        yield CODES[codes.S008].finding(
            f"loss scale collapsed to {scale:g} (below {COLLAPSED_SCALE:g}): gradients have "
            "been overflowing step after step",
            severity=WARNING,
            hint="the run was diverging when this was saved (check the loss and grad norm "
            "before this step); roll back to an earlier checkpoint, or lower the LR",
        )


@check(codes.S009, needs=("state",))
def fp8_state(ctx: CheckContext) -> Iterator[Finding]:
    summ = st.summary(ctx, "fp8")
    if not summ:
        return
    n_tensors = st.integer(summ.get("num_tensors"))
    if n_tensors == 0 and not st.items(st.mapping(st.tree_part(ctx, "fp8")).get("state")):
        yield CODES[codes.S009].finding("fp8 state is empty: no scale or amax tensors")
        return
    for key, what in (
        ("nonfinite_scale", "non-finite scale"),
        ("zero_scale", "zero scale"),
        ("nonfinite_amax", "non-finite amax"),
    ):
        n = st.integer(summ.get(key))
        if n:
            yield CODES[codes.S009].finding(f"{n} {what} value(s)")
    if summ.get("amax_history_empty") is True:
        yield CODES[codes.S009].finding("amax history is empty (length 0)")
    elif summ.get("amax_history_all_zero") is True:
        yield CODES[codes.S009].finding(
            "amax history is all zeros: FP8 scaling state was never updated",
            severity=WARNING,
            hint="expected only before the first FP8 step; otherwise the state was reset or "
            "not captured from the live modules, and the resumed run recalibrates its scales",
        )


# --- tensor values ---------------------------------------------------------------------------


@check(codes.S010, needs=("state",))
def model_nonfinite(ctx: CheckContext) -> Iterator[Finding]:
    found = st.nonfinite(ctx).get("model", [])
    if not found:
        return
    v = st.view(ctx)
    trainable = v.trainable()
    names = v.model_names()
    hard = [nf for nf in found if nf.nan or any(n in trainable for n in names.get(nf.key, ()))]
    soft = [nf for nf in found if nf not in hard]
    if hard:
        yield CODES[codes.S010].finding(
            f"{len(hard)} tensor(s) hold NaN/Inf: " + _names([nf.describe() for nf in hard]),
            component="model",
        )
    if soft:
        # Known buffers (not trainable parameters) may hold -inf on purpose (attention
        # masks): info. Without a model summary (plain save) nothing is known: warning.
        known = bool(trainable)
        yield CODES[codes.S010].finding(
            f"{len(soft)} {'buffer' if known else 'tensor'}(s) hold ±Inf (no NaN): "
            + _names([nf.describe() for nf in soft]),
            component="model",
            severity=INFO if known else WARNING,
            hint="attention masks legitimately hold -inf; otherwise the model diverged "
            "before this save: " + ROLLBACK,
        )


@check(codes.S011, needs=("state",))
def optimizer_nonfinite(ctx: CheckContext) -> Iterator[Finding]:
    found = st.nonfinite(ctx).get("optimizer", [])
    if found:
        yield CODES[codes.S011].finding(
            f"{len(found)} tensor(s) hold NaN/Inf: " + _names([nf.describe() for nf in found]),
        )


# --- what the resume guard reads -------------------------------------------------------------


@check(codes.S012, needs=("manifest",))
def guard_values(ctx: CheckContext) -> Iterator[Finding]:
    # One rule for verify and restore: restore runs this check before it touches the state.
    man = ctx.manifest
    assert man is not None
    yield from guard_findings(man)


def guard_findings(man: Manifest) -> list[Finding]:
    """``CK-S012`` when the resume guard cannot read ``man``'s look-ahead: the one rule for
    a native manifest and an adopted one (a DCP save's, an integration's adoption).

    Example:
        >>> from ckptkit.format.manifest import Manifest
        >>> m = Manifest(files=(), tensors=(), tree=None, components={}, env={},
        ...              lookahead={"guard": {"lr": "fast"}})
        >>> [f.code for f in guard_findings(m)]
        ['CK-S012']
    """
    look = man.lookahead if isinstance(man.lookahead, Mapping) else {}
    found = lookahead_problems(look.get(GUARD_KEY), man.tree)
    return [CODES[codes.S012].finding("; ".join(found[:MAX_NAMED]))] if found else []


# --- what a restore continues from ------------------------------------------------------------


@check(codes.S031, needs=("manifest",))
def recoveries_record(ctx: CheckContext) -> Iterator[Finding]:
    # One rule for verify and every reader (Recoveries.read, the recoveries log): restore's
    # candidate check runs it, so a malformed record skips the checkpoint before any state
    # is touched.
    man = ctx.manifest
    assert man is not None
    found = recoveries_problems(man.recoveries) if man.recoveries is not None else []
    if found:
        more = f"; and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
        yield CODES[codes.S031].finding(
            "the recoveries record is malformed: " + "; ".join(found[:MAX_NAMED]) + more
        )


# --- what restore applies ----------------------------------------------------------------------

# Components whose tree records its class: the manifest's summary records it too, and the two
# disagreeing means one was edited (restore would refuse the class it does not build).
_TYPED = ("optimizer", "scheduler")

# Components whose summary is a plain function of their saved state: the summary recorded at
# save must be the summary of the state saved. A well-typed edit (a sampler seed, a step)
# is caught here; restore would refuse the cursor for a seed the run does not use.
_SUMMARIZED = {"sampler": sampler_capture, "progress": progress_capture}


@check(codes.S013, needs=("manifest",))
def restorable_as_saved(ctx: CheckContext) -> Iterator[Finding]:
    # One rule for verify and restore: restore runs this check before it reads the files,
    # and TrainState.restore_tree runs the same validators on the values it read.
    man = ctx.manifest
    assert man is not None
    progress = man.components.get("progress")
    if progress is None or not progress.required:
        return  # not a TrainState checkpoint (a plain save requires nothing): no layout to hold
    tree = _stand_in_tree(ctx)
    if not isinstance(tree, Mapping):
        return  # CK-M009 (cannot be rebuilt) or CK-R011 (not a TrainState tree) say why
    found = train_state.tree_problems(tree)
    for name in _TYPED:
        part, summ = tree.get(name), st.summary(ctx, name)
        saved = part.get("type") if isinstance(part, Mapping) else None
        recorded = summ.get("type")
        if isinstance(saved, str) and isinstance(recorded, str) and saved != recorded:
            found.append(f"{name}: the state is a {saved}'s, its summary says {recorded}")
    for name, module in _SUMMARIZED.items():
        part, recorded = tree.get(name), st.summary(ctx, name)
        if part is None or not recorded or module.problems(part):
            continue  # absent, no summary, or malformed (reported above)
        again = module.summary(part)
        differ = sorted(k for k in again if k in recorded and recorded[k] != again[k])
        if differ:
            found.append(
                f"{name}: the state and its summary differ in {', '.join(map(str, differ))}"
            )
    found += _summary_differs(ctx, tree)
    if found:
        more = f"; and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
        yield CODES[codes.S013].finding("; ".join(found[:MAX_NAMED]) + more)


def _summary_differs(ctx: CheckContext, tree: Mapping[str, object]) -> list[str]:
    """What the fp8 and RNG summaries recorded at save say that their saved state does not:
    restore matches these against the live run (the fp8 tensor names, the NumPy generator
    names), so an edit there would be refused as not fitting it."""
    out: list[str] = []
    fp8 = tree.get("fp8")
    recorded = st.summary(ctx, "fp8")
    if isinstance(fp8, Mapping) and recorded and not fp8_capture.problems(fp8):
        n = len(fp8_capture.tensors_of(fp8["state"]))
        if st.integer(recorded.get("num_tensors")) not in (None, n):
            out.append(f"fp8: the state holds {n} tensor(s), its summary {recorded['num_tensors']}")
    gens = st.summary(ctx, "rng").get("generators")
    rng = tree.get("rng")
    if isinstance(gens, list) and isinstance(rng, Mapping):
        for key, state in rng.items():
            if rng_capture.problems(state):
                continue  # reported above
            have = rng_capture.generators(state)
            if [g for g in have if not g.startswith("cuda")] != [
                g for g in gens if isinstance(g, str) and not g.startswith("cuda")
            ]:
                out.append(f"rng: {key} holds generators {have}, the summary records {gens}")
    return out


def _stand_in_tree(ctx: CheckContext) -> object:
    """The tree restore would be handed, decoded from the manifest: a tensor is its value
    when the check may read it (RNG states, whose bytes torch validates), else a ``meta``
    tensor of the recorded shape and dtype (every other validator reads shapes only)."""
    man = ctx.manifest
    assert man is not None
    entries = {te.key: te for te in man.tensors}
    values = st.tensor_values(ctx, "rng/")

    def leaf(tag: str, key: str, ref: Mapping[str, object]) -> torch.Tensor:
        if key in values:
            return values[key]
        te = entries[key]
        try:
            return torch.empty(te.shape, dtype=DTYPES[te.dtype], device="meta")
        except (KeyError, RuntimeError, ValueError, OverflowError):
            return torch.empty(0, device="meta")  # integrity reports the malformed entry

    try:
        return tree_mod.rebuild(man.tree, known=entries, leaf=leaf)
    except CkptkitError:
        return None


@check(codes.S020)
def step_vs_directory(ctx: CheckContext) -> Iterator[Finding]:
    """The manifest's step is the step its directory is named for (one rule with the
    catalog's listing: :func:`ckptkit.checkpoint.catalog.misplaced`)."""
    assert ctx.manifest is not None
    why = catalog.misplaced(ctx.root.name, ctx.manifest.step)
    if why is not None:
        step = ctx.manifest.step
        yield CODES[codes.S020].finding(
            why,
            hint=f"this is a copy or rename of step {step}'s checkpoint: rename it to "
            f"{catalog.step_dir_name(step) if isinstance(step, int) else 'its own step'} "
            "(if that does not exist) or remove it; until then it is never restored or "
            "counted as the newest",
        )


@check(codes.S021, needs=())
def duplicate_step(ctx: CheckContext) -> Iterator[Finding]:
    """A second directory for a step the run holds under another name is ignored by the
    run (:meth:`ckptkit.checkpoint.catalog.Catalog.duplicates`); say so where it is verified."""
    step = catalog.step_of(ctx.root.name)
    if step is None or ctx.root.name == catalog.step_dir_name(step):
        return  # the canonical name is never the duplicate (no listing of the run needed)
    for dup, used in catalog.Catalog(ctx.root.parent).duplicates():
        if dup.name == ctx.root.name:
            yield CODES[codes.S021].finding(
                f"{dup.name} is a second directory for step {step}: the run uses "
                f"{used.name} and ignores this one (never restored, never pruned)",
            )
