"""``TrainState``: everything a resume needs, captured and restored in one call each.

What the run *requires* is derived from what was passed: a scaler makes the scaler
required, an fp8 object the fp8 state, a world size W means W RNG states. The
manifest records it, so ``ckptkit verify`` can say "your GradScaler state is missing"
before anyone spends GPU hours on a resume.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import xxhash

from ckptkit import codes
from ckptkit._repr import brief
from ckptkit.capture import env as env_capture
from ckptkit.capture import fp8 as fp8_capture
from ckptkit.capture import optim as optim_capture
from ckptkit.capture import parallel as parallel_capture
from ckptkit.capture import perrank, refuse, show
from ckptkit.capture import progress as progress_capture
from ckptkit.capture import rng as rng_capture
from ckptkit.capture import sampler as sampler_capture
from ckptkit.capture import scaler as scaler_capture
from ckptkit.capture import scheduler as scheduler_capture
from ckptkit.capture.fit import fit_report
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.capture.progress import Progress
from ckptkit.capture.session import (
    ProbeFn,
    SessionGuard,
    SessionRecorder,
    TrainingSession,
    session_of,
)
from ckptkit.collective import Collective, Solo
from ckptkit.errors import StateError
from ckptkit.format import manifest as mf
from ckptkit.format import tree as tree_mod
from ckptkit.format.ranks import (
    PER_RANK,
    RANK_BUFFERS,
    RANK_STATE,
    rank_key,
    rank_of,
)
from ckptkit.storage import dcp_engine as dcp_store
from ckptkit.storage import dcp_meta
from ckptkit.storage.fs import Location

log = logging.getLogger("ckptkit")


def tree_problems(tree: Mapping[str, Any]) -> list[str]:
    """Return what in a TrainState tree :meth:`TrainState.restore_tree` could not restore as
    saved (empty: nothing), one line per problem, prefixed by its component.

    Each component's own ``problems`` (next to its capture and restore) judges it; this
    function knows only the tree's layout: one RNG state per rank under ``rank00000``...
    (each recording its own rank), the other components once. ``ckptkit verify`` runs it on
    the manifest's tree (check CK-S013) and ``restore_tree`` on the tree it is about to
    restore, before anything is loaded: one rule, so they cannot disagree.

    Example:
        >>> import torch
        >>> tree, _ = TrainState(model=torch.nn.Linear(2, 2), step=3).capture()
        >>> tree_problems(tree)
        []
        >>> tree_problems({**tree, "progress": {**tree["progress"], "step": "x"}})
        ["progress: step is 'x', not a non-negative int"]
    """
    out: list[str] = []
    for name, problems in _VALIDATORS.items():
        if name in tree:
            out += [f"{name}: {p}" for p in problems(tree[name])]
    if "rng" in tree:
        out += [f"rng: {p}" for p in _rng_problems(tree["rng"])]
    out += [f"{RANK_BUFFERS}: {p}" for p in perrank.problems(tree)]
    return out


_VALIDATORS: dict[str, Callable[[Any], list[str]]] = {
    "optimizer": optim_capture.problems,
    "scheduler": scheduler_capture.problems,
    "scaler": scaler_capture.problems,
    "fp8": fp8_capture.problems,
    "sampler": sampler_capture.problems,
    "progress": progress_capture.problems,
}


def _rng_problems(per_rank: Any) -> list[str]:
    if not isinstance(per_rank, Mapping) or not per_rank:
        # capture always records this rank's state: none at all is not a TrainState's.
        return [f"{show(per_rank)} is not one state per rank ('rank00000': ...)"]
    out: list[str] = []
    for key, state in per_rank.items():
        rank = rank_of(key)
        if rank is None:
            out.append(f"{show(key)} is not a rank's key ('rank00000')")
            continue
        found = rng_capture.problems(state)
        if not found and state["rank"] != rank:
            found = [f"the state records rank {state['rank']}"]
        out += [f"{key}: {p}" for p in found]
    return out


def manifests_to_read(root: mf.Manifest, rank: int) -> set[int] | None:
    """The ranks whose manifests rank ``rank`` of a restore reads, from a multi-rank root
    (:attr:`~ckptkit.format.manifest.Manifest.ranks`): those holding any state but per-rank state
    (:data:`~ckptkit.format.ranks.PER_RANK`: the model and optimizer shards, rank 0's state)
    and those whose RNG state and buffers it restores (:func:`ckptkit.capture.perrank.source`).
    None: every rank's (a world of one, a tree this does not know, a root holding the RNG
    states itself).

    With DCP storage the files a rank loads are known only once DCP has planned the load:
    the load reads the rank manifests of those (:class:`ckptkit.storage.dcp_meta.Listed`), so
    they are not chosen here.

    Example:
        >>> from ckptkit.format.ranks import RankRef, rank_manifest_path
        >>> ref = lambda r, heads: RankRef(r, rank_manifest_path(r), 1, "0" * 32, (), heads)
        >>> root = mf.Manifest(files=(), tensors=(), components={}, env={}, tree={},
        ...     ranks=(ref(0, ("model", "rng")), ref(1, ("rng",)), ref(2, ("rng",))))
        >>> sorted(manifests_to_read(root, 2)), sorted(manifests_to_read(root, 7))
        ([0, 2], [0])
    """
    plan = _restore_plan(root)
    if plan is None:
        return None
    return plan.shared | _source_rank(plan.rng, rank) | _source_rank(plan.buffers, rank)


def read_together(root: mf.Manifest, world_size: int) -> bool:
    """Whether the ``world_size`` ranks of a restore, each reading
    :func:`manifests_to_read`, read every rank manifest of ``root`` and every file between
    them: true at the saved world size and above, not below it. With DCP storage the load
    reads or checks every DCP file (and so reads the manifests listing them), which covers
    a rank whose manifest lists DCP files alone.
    """
    plan = _restore_plan(root)
    if plan is None:
        return True
    seen = plan.shared | plan.dcp_only
    for rank in range(world_size):
        seen = seen | _source_rank(plan.rng, rank) | _source_rank(plan.buffers, rank)
    return seen >= {r.rank for r in root.ranks}


@dataclass(frozen=True)
class _RestorePlan:
    shared: set[int]
    """The ranks every restoring rank reads: those holding state besides their own
    (:data:`~ckptkit.format.ranks.PER_RANK`) and DCP files, or not indexed."""
    rng: set[str]
    """The saved RNG states, by rank key."""
    buffers: set[str]
    """The saved per-rank buffers, by rank key."""
    dcp_only: set[int]
    """The ranks whose manifests list DCP files alone: a DCP load reads or checks each of
    those files, and reads the manifest to check it."""


def _restore_plan(root: mf.Manifest) -> _RestorePlan | None:
    """What :func:`manifests_to_read` decides from. None when every rank reads every
    manifest."""
    own = root.root_tree if root.root_tree is not None else root.tree
    if (
        not root.ranks
        or not isinstance(own, Mapping)
        or RANK_STATE in own  # ckptkit 0.3's first per-rank layout: it references them all
    ):
        return None
    dcp_only: set[int] = set()
    if (own.get("dcp") or {}).get("keys"):
        if any(r.sizes is None for r in root.ranks):
            return None  # a root that does not record its files' sizes: the load needs them
        prefix = dcp_meta.DCP_DIR + "/"
        dcp_only = {
            r.rank for r in root.ranks if r.files and all(p.startswith(prefix) for p in r.files)
        }
    shared = {r.rank for r in root.ranks if not r.indexed or set(r.heads or ()) - set(PER_RANK)}
    rng = {rank_key(r.rank) for r in root.ranks if RANK_STATE in (r.heads or ())}
    buffers = {rank_key(r.rank) for r in root.ranks if RANK_BUFFERS in (r.heads or ())}
    return _RestorePlan(shared, rng, buffers, dcp_only)


def _source_rank(held: Collection[str], rank: int) -> set[int]:
    """The rank whose manifest holds the per-rank state rank ``rank`` restores (``held``:
    the rank keys of those saved)."""
    key = perrank.source(held, rank)
    saved = rank_of(key) if key is not None else None
    return set() if saved is None else {saved}


def _own_buffers(
    tree: Mapping[str, Any], manifest: mf.Manifest | None, rank: int, path: Location | None
) -> tuple[Mapping[str, Any], str | None]:
    """``tree`` with its model holding the buffers rank ``rank`` restores, and whose they
    are (:func:`ckptkit.capture.perrank.source`) when the save kept them per rank; else ``tree``
    itself and None (the model's buffers were saved once, with it).

    Raises:
        ManifestError: ``CK-M009`` no manifest the rank read holds the buffers it restores.
    """
    held = tree.get(RANK_BUFFERS)
    if held is None:
        return tree, None
    keys = {rank_key(r) for r in perrank.holders(manifest)} if manifest is not None else set(held)
    key = perrank.source(keys, rank)
    if key is None or key not in held:
        raise codes.error(
            codes.M009,
            f"the checkpoint holds the model buffers of {key}, which rank {rank} restores, "
            "but no manifest it read holds them",
            path=path,
            hint="the rank manifests are damaged or hand-edited; roll back to the previous "
            "verified checkpoint",
        )
    return {**tree, "model": perrank.restored_model(tree, key)}, key


def grouper(key: str) -> str:
    """File group of a tensor key: per-rank state gets its own file (``rng-rank00000``,
    ``buffers-rank00000``)."""
    parts = key.split("/")
    if parts[0] in PER_RANK and len(parts) > 2:
        return f"{parts[0]}-{parts[1]}"
    return tree_mod.default_group(key)


@dataclass
class RestoreResult:
    """What :meth:`TrainState.restore_tree` did: the step reached and compatibility notes."""

    step: int
    restored: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    manifest: mf.Manifest | None = None
    path: Location | None = None
    guard: SessionGuard | None = None
    """The :class:`~ckptkit.signals.guard.ResumeGuard` checking this resume (its ``findings``)."""
    proven: bool = True
    """Every byte of the checkpoint was verified by some rank of the restore. False when
    the ranks read only part of it together (at fewer ranks than saved, the dropped
    ranks' own state is read by none): the restore is sound, the checkpoint unproven."""

    def __repr__(self) -> str:
        # The manifest (every rank's RNG state) would make this 20 KB: name, count, cut.
        return brief(
            "RestoreResult",
            step=self.step,
            path=self.path,
            restored=self.restored,
            notes=self.notes,
        )


def expect_train_state(obj: Any, where: str) -> None:
    """Refuse anything but a :class:`TrainState` where one is needed, naming the fix.

    A plain dict of tensors has no step, components or look-ahead to record: it failed deep
    inside the save with an ``AttributeError``.

    Example:
        >>> expect_train_state({"w": 1}, "CheckpointManager.save")
        Traceback (most recent call last):
        ckptkit.errors.StateError: CheckpointManager.save takes a ckptkit.TrainState, not a dict. Fix: wrap what the run trains: TrainState(model=..., optimizer=..., ...); to store a plain dict of tensors use ckptkit.save(obj, path) and ckptkit.load(path).
    """
    if not isinstance(obj, TrainState):
        raise StateError(
            f"{where} takes a ckptkit.TrainState, not a {type(obj).__name__}",
            hint="wrap what the run trains: TrainState(model=..., optimizer=..., ...); to "
            "store a plain dict of tensors use ckptkit.save(obj, path) and ckptkit.load(path)",
        )


class TrainState:
    """The whole training state of one rank, for :class:`~ckptkit.CheckpointManager`.

    Args:
        model: the module (parameters and buffers); required.
        optimizer: any ``torch.optim.Optimizer``.
        scheduler: any LR scheduler.
        scaler: an AMP ``GradScaler`` (fp16).
        fp8: FP8 scaling state: an object with ``state_dict``/``load_state_dict`` or a dict
            of tensors; ``fp8_recipe`` records margin, history length and format.
        sampler: a :class:`~ckptkit.capture.resumable.ResumableSampler`, a torchdata
            ``StatefulDataLoader`` or any object with ``state_dict``/``load_state_dict``.
        step: the global step (an int) or a full :class:`Progress`.
        parallel: the parallel layout (default: world size and rank from
            torch.distributed, else 1).
        data: data identity compared on resume (``{"snapshot": ..., "tokenizer": ...}``).
        numpy_generators: named ``np.random.Generator`` objects to capture with the RNG.
        recorder: a :class:`~ckptkit.Recorder` whose pre-save window goes into the manifest;
            it is bound to this state and fills its step records from it (RNG at step
            start, LR used, optimizer step, loss scale, batch hash, sample ids, cursor).
        extra: any other state (plain values and tensors) saved and restored as is.
        probe: ``probe(model) -> loss`` on a fixed batch; run in eval mode without grad at
            every save and after every restore (resume guard: weights are what was saved).
        guard_k: how many next sample ids and first steps the resume guard checks
            (0 turns the guard off; default 8).
        session: what watches the run, as one object
            (:class:`~ckptkit.capture.session.TrainingSession`): its recorder, probe,
            ``guard_k`` and the resume guard a restore starts. ``recorder``, ``probe`` and
            ``guard_k`` build one; pass either those or ``session``.
        storage: how model and optimizer tensors are stored: ``"tensors"`` (safetensors
            files written by ckptkit), ``"dcp"`` (``torch.distributed.checkpoint``, which
            reshards on load at another world size), or ``"auto"`` (DCP when any parameter
            is a DTensor, i.e. FSDP2 / tensor-parallel sharded; else safetensors).

    Example:
        >>> import torch, ckptkit
        >>> model = torch.nn.Linear(2, 2)
        >>> ts = ckptkit.TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), 0.1), step=5)
        >>> tree, comps = ts.capture()
        >>> comps["optimizer"].required, comps["scaler"].required
        (True, False)
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        fp8: Any = None,
        fp8_recipe: Mapping[str, Any] | None = None,
        sampler: Any = None,
        step: int | Progress = 0,
        parallel: ParallelConfig | None = None,
        data: Mapping[str, Any] | None = None,
        numpy_generators: Mapping[str, np.random.Generator] | None = None,
        recorder: SessionRecorder | None = None,
        extra: Mapping[str, Any] | None = None,
        probe: ProbeFn | None = None,
        guard_k: int | None = None,
        session: TrainingSession | None = None,
        storage: Literal["auto", "tensors", "dcp"] = "auto",
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise StateError(
                f"model must be a torch.nn.Module, not {type(model).__name__}",
                hint="pass model=your_module",
            )
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.fp8 = fp8
        self.fp8_recipe = fp8_recipe
        self.sampler = sampler
        self.progress = step if isinstance(step, Progress) else Progress(step=int(step))
        self.parallel = parallel or ParallelConfig.from_env()
        self.data = dict(data) if data is not None else None
        self.numpy_generators = dict(numpy_generators or {})
        self.session = session_of(session, recorder=recorder, probe=probe, guard_k=guard_k)
        """What watches the run: recorder, probe, guard settings and the live guard."""
        self.extra = dict(extra) if extra is not None else None
        if storage not in ("auto", "tensors", "dcp"):
            raise ValueError(f"storage must be 'auto', 'tensors' or 'dcp', not {storage!r}")
        self.storage = storage
        bind = getattr(self.session.recorder, "bind", None)
        if callable(bind):
            bind(self)

    @property
    def recorder(self) -> SessionRecorder | None:
        """The session's recorder (``session.recorder``)."""
        return self.session.recorder

    @recorder.setter
    def recorder(self, value: SessionRecorder | None) -> None:
        self.session.recorder = value

    @property
    def probe(self) -> ProbeFn | None:
        """The session's probe (``session.probe``)."""
        return self.session.probe

    @probe.setter
    def probe(self, value: ProbeFn | None) -> None:
        self.session.probe = value

    @property
    def guard_k(self) -> int:
        """The session's ``guard_k``: how many steps the resume guard checks (0: off)."""
        return self.session.guard_k

    @guard_k.setter
    def guard_k(self, value: int) -> None:
        self.session.guard_k = value

    @property
    def guard(self) -> SessionGuard | None:
        """The resume guard the last restore started (``session.guard``; None before)."""
        return self.session.guard

    @property
    def uses_dcp(self) -> bool:
        """Whether model and optimizer go through ``torch.distributed.checkpoint``."""
        if self.storage == "auto":
            return _has_dtensor(self.model)
        return self.storage == "dcp"

    def dcp_state(self) -> dict[str, Any]:
        """Model and optimizer state dicts for DCP (sharded as they live: DTensors stay)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self.optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return {"model": get_model_state_dict(self.model)}
        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optimizer": osd}

    def load_dcp(
        self, root: Location, manifest: mf.Manifest, coll: Collective | None = None
    ) -> None:
        """Read model and optimizer from ``root/dcp``, resharded to the current layout.

        Every DCP file is checked against the manifest while it is read, ``.metadata``
        before it is unpickled (with an allow-list): see :mod:`ckptkit.storage.dcp_engine`.
        """
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_state_dict,
        )

        c = coll if coll is not None else Solo()
        state = self.dcp_state()
        dcp_store.load(state, root, manifest, verify_rank=c.rank, verify_world=c.world_size)
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )

    @property
    def step(self) -> int:
        """The global step (``progress.step``)."""
        return self.progress.step

    @step.setter
    def step(self, value: int) -> None:
        self.progress.step = int(value)

    # --- capture ---------------------------------------------------------------------------

    def capture(self) -> tuple[dict[str, Any], dict[str, mf.Component]]:
        """Snapshot everything; return ``(state tree, component table)``.

        Tensors in the tree are the live ones (model parameters, optimizer moments):
        write them before the next optimizer step, or copy them (async save does).
        """
        rank, world = self.parallel.rank, self.parallel.world_size
        dcp = self.uses_dcp
        tree: dict[str, Any] = {}
        if dcp:
            keys = ["model"] + (["optimizer"] if self.optimizer is not None else [])
            tree["dcp"] = {"dir": dcp_meta.DCP_DIR, "keys": keys}
        else:
            tree["model"] = self.model.state_dict()
        comps: dict[str, mf.Component] = {}

        def add(name: str, state: Any, summary: Mapping[str, Any], *, required: bool,
                reason: str | None = None) -> None:
            tree[name] = state
            comps[name] = mf.Component(name=name, present=True, required=required,
                                       summary=dict(summary), reason=reason)

        comps["model"] = mf.Component(
            name="model", present=True, required=True,
            summary=_model_summary(self.model), reason="always",
        )
        if self.optimizer is not None and dcp:
            comps["optimizer"] = mf.Component(
                name="optimizer", present=True, required=True,
                summary=_dcp_optim_summary(self.optimizer),
                reason="an optimizer was passed (stored with torch.distributed.checkpoint)",
            )
        elif self.optimizer is not None:
            st = optim_capture.capture(self.optimizer, model=self.model)
            add("optimizer", st, optim_capture.summary(st), required=True,
                reason="an optimizer was passed")
        if self.scheduler is not None:
            st = scheduler_capture.capture(self.scheduler)
            add("scheduler", st, scheduler_capture.summary(st), required=True,
                reason="a scheduler was passed")
        if self.scaler is not None:
            st = scaler_capture.capture(self.scaler)
            summ = scaler_capture.summary(st)
            add("scaler", st, summ, required=bool(summ.get("enabled")),
                reason="an enabled GradScaler was passed" if summ.get("enabled")
                else "the GradScaler is disabled")
        if self.fp8 is not None:
            st = fp8_capture.capture(self.fp8, recipe=self.fp8_recipe)
            add("fp8", st, fp8_capture.summary(st), required=True, reason="fp8 state was passed")
        rng_state = rng_capture.capture(rank=rank, world_size=world,
                                        numpy_generators=self.numpy_generators)
        rng_summary = {
            "world_size": world,
            "ranks": [rank],
            "fingerprints": {rank_key(rank): rng_capture.fingerprint(rng_state)},
            **{k: v for k, v in rng_capture.summary(rng_state).items() if k == "generators"},
        }
        add("rng", {rank_key(rank): rng_state}, rng_summary, required=True,
            reason=f"always: one state per rank ({world} rank(s))")
        if self.sampler is not None:
            st = sampler_capture.capture(self.sampler)
            add("sampler", st, sampler_capture.summary(st), required=True,
                reason="a sampler was passed")
        elif self.optimizer is not None:
            comps["sampler"] = mf.Component(
                name="sampler", present=False, required=False,
                reason="training state without a resumable sampler: the data order restarts "
                "on resume unless the loader is stateless",
            )
        st = progress_capture.capture(self.progress)
        add("progress", st, progress_capture.summary(st), required=True, reason="always")
        st = parallel_capture.capture(self.parallel)
        add("parallel", st, parallel_capture.summary(st), required=True, reason="always")
        if self.data is not None:
            add("data", dict(self.data), {k: v for k, v in self.data.items()
                                          if isinstance(v, (str, int, float, bool))},
                required=True, reason="data identity was declared")
        if self.recorder is not None:
            snap = self.recorder.snapshot()
            add("metrics", snap, snap.get("stats", {}) if isinstance(snap, dict) else {},
                required=False, reason="a Recorder is attached")
        if self.extra is not None:
            tree["extra"] = self.extra
        for name in mf.COMPONENTS:
            comps.setdefault(name, mf.Component(name=name, present=False, required=False))
        comps["env"] = mf.Component(name="env", present=True, required=True,
                                    where=("manifest:env",), reason="always (automatic)")
        return tree, comps

    # --- restore ---------------------------------------------------------------------------

    def restore_tree(self, tree: Mapping[str, Any], manifest: mf.Manifest | None = None, *,
                     strict: bool = True, path: Location | None = None,
                     coll: Collective | None = None) -> RestoreResult:
        """Put a loaded state tree back into the live objects.

        At another world size than the save's: the sampler continues from the merged
        global cursor (re-split over the new ranks, nothing replayed or skipped), a rank
        without a saved RNG state gets a fresh stream derived from rank 0's, and the
        result's notes say what that changes for an exact resume.

        Args:
            tree: the object read from a checkpoint written from a TrainState.
            manifest: its manifest (for compatibility notes).
            strict: raise when the checkpoint lacks state this TrainState has (e.g. a
                scaler passed here but none saved); otherwise note and continue.
            path: the checkpoint directory (needed for DCP-stored model/optimizer state).
            coll: the ranks restoring together (DCP files are verified split over them).

        Raises:
            StateError: ``CK-S013`` a component cannot be restored as saved
                (:func:`tree_problems`); ``CK-R010`` the run does not fit the checkpoint (a component it
                passes is missing under ``strict``; model keys, shapes or dtypes differ);
                ``CK-R011`` the checkpoint is of another kind (not a TrainState tree, or
                DCP storage for a run that does not use it). Both are raised before
                anything is loaded.
        """
        restored: list[str] = []
        notes: list[str] = []

        def missing(name: str) -> None:
            msg = f"the checkpoint has no {name} state but this run passes one"
            if strict:
                raise StateError(msg, code=codes.R010,
                                 hint=f"save with {name}= passed, or restore with strict=False "
                                 "to start it fresh (the resume is then not exact)")
            notes.append(msg + "; it starts fresh")

        if not isinstance(tree, Mapping):
            raise StateError(f"the checkpoint holds a {type(tree).__name__}, not a TrainState tree",
                             code=codes.R011, hint="restore a checkpoint written by "
                             "CheckpointManager/TrainState; read others with ckptkit.load")
        # Everything that can refuse the checkpoint is checked before anything is loaded,
        # starting with the rule verify's CK-S013 applies (here with the tensors' values).
        refuse("training", tree_problems(tree))
        # The RNG states the checkpoint holds: a restoring rank of a multi-rank checkpoint
        # reads the one it restores only, which must be there.
        held_rng = (
            {rank_key(r) for r in manifest.rng_ranks}
            if manifest is not None
            else set(tree.get("rng") or {})
        )
        source = perrank.source(held_rng, self.parallel.rank)
        if source is not None and source not in (tree.get("rng") or {}):
            raise codes.error(
                codes.M009,
                f"the checkpoint holds the RNG state of {source}, which rank "
                f"{self.parallel.rank} restores, but no manifest it read holds it",
                path=path,
                hint="the rank manifests are damaged or hand-edited; roll back to the "
                "previous verified checkpoint",
            )
        tree, buffers_from = _own_buffers(tree, manifest, self.parallel.rank, path)
        if buffers_from is not None and buffers_from != rank_key(self.parallel.rank):
            notes.append(
                f"buffers: the checkpoint holds each saving rank's own model buffers (they "
                f"differed between the ranks, e.g. BatchNorm statistics) but none of rank "
                f"{self.parallel.rank}; it takes {buffers_from}'s"
            )
        dcp_keys: list[str] = list((tree.get("dcp") or {}).get("keys") or [])
        if dcp_keys:
            if not self.uses_dcp:
                raise StateError(
                    "the checkpoint stores model/optimizer with torch.distributed.checkpoint; "
                    "this run does not use DCP storage, so its files are not read",
                    code=codes.R011,
                    hint="restore it with TrainState(storage='dcp') (or 'auto' with a sharded "
                    "DTensor model); DCP files are only ever read for a run that writes them",
                )
            if path is None or manifest is None:
                raise StateError("model/optimizer state is stored with DCP; restore_tree needs "
                                 "the checkpoint path and manifest", code=codes.R011,
                                 hint="pass path= and manifest= (CheckpointManager does)")
            if "optimizer" in dcp_keys and self.optimizer is None:
                notes.append("the checkpoint holds optimizer state but this run passes none")
            if self.optimizer is not None and "optimizer" not in dcp_keys:
                missing("optimizer")
        elif "model" not in tree:
            raise StateError("the checkpoint holds no model state", code=codes.R011,
                             hint="is this a TrainState checkpoint? use ckptkit.load for others")
        else:
            report = fit_report(self.model.state_dict(), tree["model"])
            if not report.ok:
                raise StateError(f"model state does not fit the model: {report.summary()}",
                                 code=codes.R010,
                                 hint="build the same architecture (and dtype) as at save time; "
                                 "to load weights into another model on purpose, use "
                                 "ckptkit.load(path, into={'model': model.state_dict()}, "
                                 "strict=False) and read its report")
        for name, obj in (("optimizer", self.optimizer), ("scheduler", self.scheduler),
                          ("scaler", self.scaler), ("fp8", self.fp8), ("sampler", self.sampler)):
            if obj is not None and name not in tree and not (name == "optimizer" and dcp_keys):
                missing(name)
        if dcp_keys:
            assert path is not None and manifest is not None
            self.load_dcp(path, manifest, coll)
            restored.append("model")
            if self.optimizer is not None and "optimizer" in dcp_keys:
                restored.append("optimizer")
        else:
            self.model.load_state_dict(tree["model"])
            restored.append("model")
        saved_world = _saved_world(tree)
        world = self.parallel.world_size
        pairs: list[tuple[str, Any, Callable[[Any, Any], None] | None]] = [
            ("optimizer", self.optimizer, optim_capture.restore),
            ("scheduler", self.scheduler, scheduler_capture.restore),
            ("scaler", self.scaler, scaler_capture.restore),
            ("fp8", self.fp8, None),
            ("sampler", self.sampler, sampler_capture.restore),
        ]
        for name, obj, fn in pairs:
            if name == "optimizer" and dcp_keys:
                continue
            if obj is None:
                if name in tree:
                    notes.append(f"the checkpoint holds {name} state but this run passes none")
                continue
            if name not in tree:
                continue  # refused or noted above, before anything was loaded
            if name == "fp8":
                fp8_capture.restore(obj, tree[name], recipe=self.fp8_recipe)
            elif name == "sampler":
                state, how = choose_sampler_state(tree[name], rank=self.parallel.rank,
                                                  world_size=world, saved_world=saved_world)
                sampler_capture.restore(obj, state)
                if how:
                    notes.append(how)
            else:
                assert fn is not None
                fn(obj, tree[name])
            restored.append(name)
        if "progress" in tree:
            progress_capture.restore(self.progress, tree["progress"])
            restored.append("progress")
        if "parallel" in tree:
            notes += parallel_capture.diff(tree["parallel"], self.parallel)
        if self.data is not None and "data" in tree:
            for k, v in self.data.items():
                old = tree["data"].get(k)
                if old != v:
                    notes.append(f"data '{k}' changed since the save: {old!r} -> {v!r}")
        if "extra" in tree and self.extra is not None:
            self.extra.clear()
            self.extra.update(tree["extra"])
            restored.append("extra")
        # RNG last: nothing after it may draw random numbers before training resumes.
        rng_all = tree.get("rng") or {}
        if source == rank_key(self.parallel.rank):
            rng_capture.restore(rng_all[source], rank=self.parallel.rank,
                                numpy_generators=self.numpy_generators)
            restored.append("rng")
        elif source is not None:
            seed = fresh_seed(rng_all[source], self.parallel.rank)
            _seed_everything(seed)
            notes.append(
                f"RNG: the checkpoint holds state for {len(held_rng)} rank(s) "
                f"({_few_keys(held_rng)}) but not for rank {self.parallel.rank}; it starts a "
                f"fresh stream seeded {seed} (derived from {source}'s state and the rank), "
                "so dropout/augmentation on this rank differ from any saved stream and the "
                "resume is not bitwise exact"
            )
            restored.append("rng:fresh")
        else:
            missing("rng")
        if saved_world is not None and saved_world != world:
            notes.append(
                f"world size {saved_world} -> {world}: model and optimizer are "
                + ("resharded by torch.distributed.checkpoint" if dcp_keys
                   else "replicated, loaded whole on every rank")
                + "; per-rank RNG streams "
                + ("are reused for ranks that existed and fresh for new ranks" if world > saved_world
                   else "of the dropped ranks are unused")
                + "; the global batch per optimizer step changes by the factor "
                f"{world}/{saved_world} unless the per-rank batch or gradient accumulation is "
                "adjusted, so the LR schedule sees different samples per step"
            )
        for n in notes:
            log.warning("ckptkit restore: %s", n)
        return RestoreResult(step=self.progress.step, restored=tuple(restored), notes=notes,
                             manifest=manifest)

    def targets(self) -> dict[str, Any]:
        """Tensors to read into in place (model parameters and buffers)."""
        if self.uses_dcp:
            return {}
        return {"model": self.model.state_dict()}

    def env(self) -> dict[str, Any]:
        """The environment record for the manifest."""
        return env_capture.capture()


def _model_summary(model: torch.nn.Module) -> dict[str, Any]:
    params = list(model.named_parameters())
    return {
        "type": type(model).__name__,
        "num_params": sum(p.numel() for _, p in params),
        "num_tensors": len(model.state_dict()),
        "trainable": [n for n, p in params if p.requires_grad],
    }


def _has_dtensor(model: torch.nn.Module) -> bool:
    """Whether any parameter is a DTensor, without importing DTensor to find out.

    A DTensor can only exist once ``torch.distributed.tensor`` has been imported (by FSDP2,
    tensor parallelism or the caller), so a process that never imported it holds none.
    Importing it here would cost every fresh process ~1.5 s on its first save (it pulls in
    dynamo and sympy) for an answer that is always no.
    """
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    if dtensor is None:
        return False
    return any(isinstance(p, dtensor) for p in model.parameters())


def _dcp_optim_summary(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Summary of a DCP-stored optimizer, from its local state (steps and groups)."""
    try:
        return {**optim_capture.summary({"type": type(opt).__name__,
                                         "state_dict": opt.state_dict()}), "storage": "dcp"}
    except Exception:  # the summary is informative only; a sharded layout may not fit it
        return {"type": type(opt).__name__, "storage": "dcp"}


def _saved_world(tree: Mapping[str, Any]) -> int | None:
    par = tree.get("parallel")
    if isinstance(par, Mapping) and isinstance(par.get("world_size"), int):
        return int(par["world_size"])
    return None


def _few_keys(keys: Collection[str], n: int = 4) -> str:
    ks = sorted(keys)
    return ", ".join(ks[:n]) + (f" … (+{len(ks) - n})" if len(ks) > n else "")


def fresh_seed(base_state: Any, rank: int) -> int:
    """A deterministic seed for a rank that has no saved RNG state: from rank 0's and the rank.

    Example:
        >>> s = rng_capture.capture()
        >>> fresh_seed(s, 3) == fresh_seed(s, 3) != fresh_seed(s, 4)
        True
    """
    return xxhash.xxh3_64_intdigest(f"{rng_capture.fingerprint(base_state)}:{rank}".encode()) & (2**63 - 1)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def choose_sampler_state(
    saved: Mapping[str, Any], *, rank: int, world_size: int, saved_world: int | None
) -> tuple[Mapping[str, Any], str | None]:
    """Pick the sampler cursor this rank continues from; say what changed, if anything.

    A multi-rank save keeps every rank's cursor under ``saved["ranks"]``. At the saved
    world size each rank takes its own. At another one, ranks that moved in lockstep hold
    the same global count (``offset + position × world``); the smallest is used (a rank
    behind would otherwise skip samples), and :class:`~ckptkit.capture.resumable.ResumableSampler`
    re-splits the rest of the epoch over the new ranks.

    Returns:
        ``(state for sampler restore, note or None)``.
    """
    per = saved.get("ranks")
    base = {k: v for k, v in saved.items() if k != "ranks"}
    if not isinstance(per, Mapping) or not per:
        inner = base.get("state")
        w = inner.get("world_size") if isinstance(inner, Mapping) else None
        if (isinstance(inner, Mapping) and isinstance(w, int) and w != world_size
                and base.get("kind") == "resumable"):
            return base, (f"sampler: saved at world size {w}, resumed at {world_size}: "
                          f"{_consumed(inner)} samples of epoch {inner.get('epoch')} were "
                          "consumed; the rest is re-split over the new ranks (no sample "
                          "replayed or skipped)")
        return base, None
    mine = per.get(rank_key(rank))
    if saved_world == world_size and isinstance(mine, Mapping):
        return {**base, "state": mine}, None
    if base.get("kind") != "resumable":
        pick = mine if isinstance(mine, Mapping) else per[sorted(per)[0]]
        return {**base, "state": pick}, (
            f"sampler: a {base.get('type')} cursor cannot be re-split from world size "
            f"{saved_world} to {world_size}; rank {rank} continues from "
            f"{'its own' if mine is not None else 'rank ' + sorted(per)[0][4:]} cursor, so "
            "samples may be replayed or skipped (use ckptkit.capture.resumable.ResumableSampler)")
    states = [s for _, s in sorted(per.items()) if isinstance(s, Mapping)]
    counts = sorted({(int(s.get("epoch", 0)), _consumed(s)) for s in states})
    pick = min(states, key=lambda s: (int(s.get("epoch", 0)), _consumed(s)))
    lag = "" if len(counts) == 1 else (
        f" (ranks were not in lockstep: {counts}; continuing from the earliest, so up to "
        f"{counts[-1][1] - counts[0][1]} samples are seen twice)")
    return {**base, "state": pick}, (
        f"sampler: {len(states)} per-rank cursors saved at world size {saved_world} merged "
        f"into one global cursor ({_consumed(pick)} samples of epoch {pick.get('epoch')} "
        f"consumed); the rest of the epoch is re-split over {world_size} rank(s) from there, "
        f"so no sample is replayed or skipped{lag}")


def _consumed(state: Mapping[str, Any]) -> int:
    c = state.get("consumed")
    if isinstance(c, int):
        return c
    return int(state.get("offset", 0)) + int(state.get("position", 0)) * int(
        state.get("world_size", 1))
