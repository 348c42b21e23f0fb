"""The one commit protocol: every save, at every world size, commits the same way.

1. rank 0 prepares (the manager takes the run lock) and creates the temporary sibling
   directory; every rank learns its name (a broadcast);
2. every rank writes and hashes its own files into it through a
   :class:`~ckptkit.storage.shards.ShardWriter` (safetensors shards or DCP);
3. every rank's file entries and per-rank state reach rank 0 (a gather to rank 0: no rank
   but rank 0 receives another's); any rank's failure travels in that gather;
4. rank 0 builds the manifest, writes it last (the commit marker) and renames the
   directory into place, or aborts when a rank failed; every rank learns the outcome (a
   broadcast), so every rank raises together and nothing is committed on a failure.

A world of one is this protocol with identity collectives (:class:`~ckptkit.collective.Solo`):
``ckptkit.save``, a one-process ``CheckpointManager`` save and a multi-rank save differ
only in the collective and in what each rank writes. :class:`StateSave` is what one rank
of a :class:`~ckptkit.TrainState` save writes and how rank 0 merges the ranks' parts;
:func:`save_tree` is the plain nested-state save under :func:`ckptkit.save`.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ckptkit import _progress, crashpoints
from ckptkit.capture import env as env_capture
from ckptkit.capture import perrank
from ckptkit.capture.state import TrainState, grouper, manifests_to_read
from ckptkit.checkpoint import manifest_io
from ckptkit.checkpoint.read import files_by_head, fill_where, infer_components
from ckptkit.collective import Collective, Solo, describe
from ckptkit.errors import CkptkitError, DistributedError, StateError
from ckptkit.format import manifest as mf
from ckptkit.format import tree as tree_mod
from ckptkit.format.ranks import PER_RANK, RANK_BUFFERS, RANK_STATE, RankManifest, RankRef, rank_key
from ckptkit.storage import atomic, codec, fs
from ckptkit.storage.dcp_meta import DCP_COMPONENT
from ckptkit.storage.fs import Location
from ckptkit.storage.shards import (
    DEFAULT_SHARD_BYTES,
    DcpShards,
    RankFiles,
    SafetensorsShards,
)

NOTHING_COMMITTED = "nothing was committed; the previous checkpoints are intact"
MAYBE_COMMITTED = (
    "rank 0 may or may not have committed it: a restore takes the newest checkpoint that "
    "verifies, and 'ckptkit ls' shows which"
)
SPREAD = ("model", "optimizer")
"""Top-level state whose replicated shards every rank of a multi-rank save helps write."""


def commit(
    final: Location,
    coll: Collective,
    *,
    write: Callable[[Location], Any],
    build: Callable[[list[Any], Location], mf.Manifest],
    overwrite: bool = False,
    fsync: bool = True,
    prepare: Callable[[], None] | None = None,
    fence: Callable[[], None] | None = None,
    key: bytes | None = None,
    before_commit: Callable[[Location], None] | None = None,
) -> mf.Manifest | None:
    """Commit one checkpoint at ``final``: the protocol above, on every rank of ``coll``.

    Args:
        final: the checkpoint directory to create.
        coll: the ranks taking part (``Solo()`` for one process).
        write: called on every rank with the temporary directory; writes this rank's
            files and returns what rank 0 needs to build the manifest (picklable).
        build: called on rank 0 with every rank's ``write`` result, in rank order, and the
            temporary directory; returns the manifest to commit.
        overwrite: replace a committed checkpoint at ``final``.
        fsync: flush files and directories (turn off only in tests of other things).
        prepare: called on rank 0 before anything is created (the manager's lock).
        fence: called on rank 0 right before the manifest is written; raises if this
            writer lost the run lock meanwhile (an object-store lease taken over), so a
            fenced-off writer never commits.
        key: an HMAC key (resolved): the manifest is signed with it (``docs/security.md``).
        before_commit: called on rank 0 with the temporary directory after the manifest
            is written and before the rename (fault-injection tests use it).

    Returns:
        The committed manifest on rank 0, None on the other ranks.

    Raises:
        CkptkitError: any rank failed; nothing was committed (every rank raises). A
            plain ``OSError`` of this rank (disk full, permissions) is restated with the
            fix and stays an ``OSError`` of the same errno.
        DistributedError: another rank failed or died.
    """
    what = f"save of {final.name}"
    err: BaseException | None = None
    pending: atomic.PendingCheckpoint | None = None
    if coll.rank == 0:
        try:
            if prepare is not None:
                prepare()
            pending = atomic.PendingCheckpoint.create(final, overwrite=overwrite)
            crashpoints.reached("commit.tmp_created")
        except BaseException as e:
            err = e
    with _peer_loss(what, final, pending, NOTHING_COMMITTED):
        tmp_name, msg = coll.broadcast(
            (str(pending.tmp), None)
            if pending is not None
            else (None, describe(err) if err is not None else "no temporary directory")
        )
    if tmp_name is None:
        if err is not None:
            raise _restated(err, final) from err
        raise DistributedError(
            f"{what} failed on rank 0: {msg}",
            path=final,
            hint="see rank 0's log; nothing was written",
        )
    part: Any = None
    try:
        part = write(pending.tmp if pending is not None else fs.location(tmp_name))
        crashpoints.reached("commit.files_written")
    except BaseException as e:
        err = e
    with _peer_loss(what, final, pending, NOTHING_COMMITTED):
        gathered = coll.gather((describe(err) if err is not None else None, part))
    man: mf.Manifest | None = None
    outcome: Outcome | None = None
    if pending is not None:
        assert gathered is not None  # rank 0 creates the temporary directory and gathers
        failed = [(r, m) for r, (m, _) in enumerate(gathered) if m is not None]
        if failed:
            pending.abort()
            outcome = Outcome(failed, committed=False)
        else:
            try:
                man = build([p for _, p in gathered], pending.tmp)
                if key is not None:
                    man = man.signed(key)
                if fence is not None:
                    fence()
                manifest_io.write(pending.tmp, man, fsync=fsync)
                crashpoints.reached("commit.manifest_written")
                if before_commit is not None:
                    before_commit(pending.tmp)
                pending.finalize(fsync=fsync)
                crashpoints.reached("commit.done")
            except BaseException as e:
                pending.abort()
                err, outcome = e, Outcome([(0, describe(e))], committed=None)
    # Rank 0 answers every rank with one small message: the ranks' records went to rank 0
    # alone, so what each rank exchanges does not grow with the world size.
    with _peer_loss(what, final, None, MAYBE_COMMITTED):
        outcome = coll.broadcast(outcome)
    if outcome is not None:
        if err is not None:
            raise _restated(err, final) from err
        raise outcome.error(what, final)
    return man


@dataclass(frozen=True)
class Outcome:
    """Why a commit failed, as rank 0 tells every rank: the failed ranks and their messages;
    ``committed`` False when nothing was (a rank failed before the commit), None when rank
    0 failed at the commit itself (it may or may not have committed)."""

    failed: list[tuple[int, str]]
    committed: bool | None

    def error(self, what: str, final: Location) -> DistributedError:
        """The error a rank that did not fail itself raises."""
        if self.committed is None:
            [(_, msg)] = self.failed
            return DistributedError(
                f"{what} failed on rank 0 at commit: {msg}", path=final, hint="see rank 0's log"
            )
        return DistributedError(
            f"{what} failed on rank(s) {', '.join(str(r) for r, _ in self.failed)}: "
            + " | ".join(f"rank {r}: {m}" for r, m in self.failed),
            path=final,
            hint="nothing was committed; see that rank's log for the cause",
        )


@contextlib.contextmanager
def _peer_loss(
    what: str, final: Location, pending: atomic.PendingCheckpoint | None, hint: str
) -> Iterator[None]:
    """Say what a failed collective of this save means on disk: the collective layer
    (:func:`ckptkit.collective.peer_failure`) already names the backend failure; this adds
    the save, the hint for what was or was not committed, and on rank 0 removes what it
    wrote first."""
    try:
        yield
    except BaseException as e:
        if pending is not None:
            pending.abort()
        raise DistributedError(
            f"{what}: a collective with the other ranks failed ({describe(e)}); a rank died "
            "or timed out mid-save",
            path=final,
            hint=hint,
        ) from e

# --- a plain nested state (ckptkit.save) ---------------------------------------------------------


def save_tree(
    obj: Any,
    path: Location | str,
    *,
    encoded: tree_mod.Encoded | None = None,
    compress: codec.Compression | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    grouper: tree_mod.Grouper = tree_mod.default_group,
    components: Mapping[str, mf.Component] | None = None,
    env: Mapping[str, Any] | None = None,
    step: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    fsync: bool = True,
    manifest_fields: Mapping[str, Any] | None = None,
    key: bytes | None = None,
    before_commit: Callable[[Location], None] | None = None,
) -> mf.Manifest:
    """Write nested ``obj`` as a committed checkpoint at ``path`` (one process).

    Args:
        obj: nested state (dicts, lists, tuples, tensors, plain scalars).
        path: the checkpoint directory to create.
        encoded: ``obj`` already split by :func:`ckptkit.format.tree.encode`.
        compress: ``"zstd"`` to compress each file (streaming, multithreaded).
        shard_bytes: split a group into several files past this size.
        grouper: tensor key -> file group (default: the top-level key).
        components: the component table (``where`` is filled in); default: inferred
            from the top-level keys, nothing required.
        env: environment record (default: captured now).
        step: training step recorded in the manifest.
        overwrite: replace an existing checkpoint at ``path``.
        progress: force the progress bar on/off (default: on a terminal for big saves).
        fsync: flush files and directories (turn off only in tests of other things).
        manifest_fields: extra manifest fields (``lookahead``, ``health``, ``pins``, ``user``).
        key: sign the manifest with this HMAC key (resolved).
        before_commit: fault-injection hook (see :func:`commit`).

    Returns:
        The manifest written.
    """
    if compress is not None and compress not in codec.SUFFIX:
        raise ValueError(f"compress must be None or 'zstd', not {compress!r}")
    enc = encoded if encoded is not None else tree_mod.encode(obj)
    total = sum(t.numel() * t.element_size() for t in enc.tensors.values())
    final = fs.location(path)

    def write(tmp: Location) -> RankFiles:
        with _progress.bar(f"saving {final.name}", total, progress) as on_bytes:
            return SafetensorsShards(
                enc,
                "rank0",
                grouper=grouper,
                compress=compress,
                shard_bytes=shard_bytes,
                fsync=fsync,
                on_bytes=on_bytes,
            ).write(tmp, Solo())

    def build(parts: list[RankFiles], tmp: Location) -> mf.Manifest:
        files = parts[0]
        comps = (
            fill_where(components, files_by_head(files.tensors))
            if components is not None
            else infer_components(enc.tree, files.tensors)
        )
        return _manifest(enc.tree, files, comps, env, step, manifest_fields)

    man = commit(
        final,
        Solo(),
        write=write,
        build=build,
        overwrite=overwrite,
        fsync=fsync,
        key=key,
        before_commit=before_commit,
    )
    assert man is not None
    return man


def _manifest(
    tree_: Any,
    files: RankFiles,
    comps: Mapping[str, mf.Component],
    env: Mapping[str, Any] | None,
    step: int | None,
    fields: Mapping[str, Any] | None,
) -> mf.Manifest:
    extra = dict(fields or {})
    if "pins" in extra:
        extra["pins"] = tuple(extra["pins"])
    return mf.Manifest(
        files=tuple(sorted(files.files, key=lambda f: f.path)),
        tensors=tuple(files.tensors),
        tree=tree_,
        components=dict(comps),
        env=dict(env if env is not None else env_capture.capture()),
        step=step,
        **extra,
    )


# --- a TrainState --------------------------------------------------------------------------------


@dataclass
class RankPart:
    """What one rank sends rank 0 after writing its share of a TrainState save.

    In a multi-rank save the rank's file and tensor entries and its RNG state stay in its
    own manifest (:func:`ckptkit.checkpoint.manifest_io.write_rank`): it sends the record
    of that manifest (``ref``), which files hold each component (``where``) and its RNG
    fingerprint, small records whose size does not grow with its tensors. A world of one
    sends its entries (``files``)."""

    files: RankFiles
    ref: RankRef | None = None
    """This rank's manifest (multi-rank saves)."""
    where: dict[str, list[str]] = field(default_factory=dict)
    """Top-level state key -> this rank's files holding its tensors."""
    dcp_files: list[str] = field(default_factory=list)
    """The DCP files this rank wrote."""
    rng_fingerprint: str | None = None
    """Of this rank's RNG state: verify compares them across ranks (``CK-S006``)."""
    sampler: Any = None
    """This rank's sampler cursor."""


@dataclass
class StateSave:
    """One rank's capture of a :class:`~ckptkit.TrainState`, ready to be committed.

    :meth:`capture` snapshots the live state (tensors are the live ones);
    :meth:`staged` swaps them for copies in reusable host buffers (async saves);
    :meth:`write` is this rank's part of :func:`commit`, :meth:`build` rank 0's merge.
    """

    tree: dict[str, Any]
    comps: dict[str, mf.Component]
    encoded: tree_mod.Encoded
    rank: int
    world_size: int
    dcp_state: dict[str, Any] | None = None
    env: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    compress: codec.Compression | None = None
    fsync: bool = True
    key: bytes | None = None
    """The HMAC key the rank manifests are signed with (the root's, on every rank)."""
    process_group: Any = None
    """The process group DCP uses (a dedicated one when the save runs in the background)."""
    buffers: frozenset[str] = frozenset()
    """The model's buffer names (state-dict keys): not kept in step by DDP's gradient sync
    (BatchNorm's running statistics are updated by each rank's own forward), so never
    compared between replicas (:mod:`ckptkit.checkpoint.replicas`)."""

    @classmethod
    def capture(
        cls,
        state: TrainState,
        coll: Collective,
        *,
        step: int,
        fields: Mapping[str, Any],
        compress: codec.Compression | None = None,
        key: bytes | None = None,
    ) -> StateSave:
        """Snapshot ``state`` on this rank (cheap: references, not copies); ``key`` signs
        the manifests.

        Raises:
            StateError: the state's parallel layout disagrees with the collective.
        """
        par = state.parallel
        if coll.world_size > 1 and (par.world_size, par.rank) != (coll.world_size, coll.rank):
            raise StateError(
                f"TrainState.parallel says rank {par.rank} of {par.world_size}, the process "
                f"group rank {coll.rank} of {coll.world_size}",
                hint="build the TrainState after init_process_group, or pass "
                "parallel=ckptkit.ParallelConfig.from_env(...)",
            )
        tree_, comps = state.capture()
        return cls(
            tree=tree_,
            comps=comps,
            encoded=tree_mod.encode(tree_),
            rank=coll.rank,
            world_size=coll.world_size,
            dcp_state=state.dcp_state() if state.uses_dcp else None,
            env=state.env() if coll.rank == 0 else {},
            step=step,
            fields=dict(fields),
            compress=compress,
            key=key,
            buffers=frozenset(n for n, _ in state.model.named_buffers())
            if isinstance(state.model, torch.nn.Module)
            else frozenset(),
        )

    def staged(self, stager: Stager) -> StateSave:
        """A copy whose tensors live in host buffers: the live state may change after this."""
        return replace(
            self,
            encoded=stager.stage(self.encoded),
            dcp_state=stager.stage_dcp(self.dcp_state) if self.dcp_state is not None else None,
        )

    def write(self, tmp: Location, coll: Collective) -> RankPart:
        """This rank's share: DCP (collective) first, then its safetensors shards, then (in
        a multi-rank save) its manifest of them."""
        files = RankFiles()
        if self.dcp_state is not None:
            files.extend(
                DcpShards(self.dcp_state, fsync=self.fsync, process_group=self.process_group).write(
                    tmp, coll
                )
            )
        mine = rank_key(self.rank)
        # The ranks agree on what they write once (refused otherwise, naming what differs),
        # and on whether each rank writes its own buffers (they differ between the ranks).
        decided = perrank.plan(
            coll,
            {k: t for k, t in self.encoded.tensors.items() if k.split("/", 1)[0] in SPREAD},
            perrank.buffers_of(self.encoded, self.buffers),
        )
        if decided.own_buffers:
            # Rank 0's root is then built from its split tree too (:meth:`root`).
            self.encoded = perrank.own_buffers(self.encoded, self.buffers, self.rank)
        spread, own, rest = {}, {}, {}
        for k, t in self.encoded.tensors.items():
            head, _, tail = k.partition("/")
            if head in SPREAD:
                spread[k] = t
            elif head in PER_RANK and tail.startswith(f"{mine}/"):
                own[k] = t
            else:
                rest[k] = t
        for tensors_, owner in ((spread, "spread"), (own, "rank"), (rest, "rank0")):
            files.extend(
                SafetensorsShards(
                    tree_mod.Encoded(self.encoded.tree, tensors_),
                    owner,  # type: ignore[arg-type]
                    grouper=grouper,
                    compress=self.compress,
                    fsync=self.fsync,
                ).write(tmp, coll)
            )
        samp = self.encoded.tree.get("sampler")
        where = files_by_head(files.tensors)
        dcp_files = [f.path for f in files.files if f.component == DCP_COMPONENT]
        ref = None
        if self.world_size > 1:
            ref = manifest_io.write_rank(
                tmp,
                RankManifest(
                    self.rank,
                    self.step,
                    tuple(files.files),
                    tuple(files.tensors),
                    rng=self.encoded.tree.get(RANK_STATE, {}).get(mine),
                    buffers=self.encoded.tree.get(RANK_BUFFERS, {}).get(mine),
                ),
                key=self.key,
                fsync=self.fsync,
            )
            files = RankFiles()  # rank 0 gets the record of the manifest, not its entries
        return RankPart(
            files=files,
            ref=ref,
            where=where,
            dcp_files=dcp_files,
            rng_fingerprint=self.comps["rng"].summary.get("fingerprints", {}).get(mine),
            sampler=samp.get("state") if isinstance(samp, dict) else None,
        )

    def build(self, parts: list[RankPart], tmp: Location) -> mf.Manifest:
        """Rank 0: merge every rank's part into one manifest (the identity for one rank).

        In a multi-rank save it is a root (:meth:`root`); only the root is written. The
        manifest returned also has what rank 0 would read of it to restore, read back from
        the rank manifests in ``tmp`` for the checks before the commit: its own and those
        holding the shared state (:func:`~ckptkit.capture.state.manifests_to_read`; with
        DCP storage, a check that needs a DCP file's entry reads that rank's manifest then:
        :meth:`~ckptkit.format.manifest.Manifest.entry`). So rank 0's work before the commit does
        not grow with ranks x tensors; the read-back verify after it (``verify_after_save``)
        reads every rank manifest and every byte.
        """
        return manifest_io.with_ranks(
            tmp, self.root(parts), key=self.key, only=lambda root: manifests_to_read(root, 0)
        )

    def root(self, parts: list[RankPart]) -> mf.Manifest:
        """Rank 0: the manifest it commits, from every rank's part.

        In a multi-rank save it is a root: it lists the ranks' manifests and holds the
        run-level facts (step, tree, components, environment, health), none of the entries
        and none of the ranks' RNG states. For one rank, the whole manifest.
        """
        tree_ = dict(self.encoded.tree)
        comps = dict(self.comps)
        files = RankFiles()
        by_head: dict[str, dict[str, None]] = {}  # ordered sets: first-seen, rank order
        dcp_files: list[str] = []
        for p in parts:
            files.extend(p.files)
            dcp_files += p.dcp_files
            for head, paths in p.where.items():
                by_head.setdefault(head, {}).update(dict.fromkeys(paths))
        if len(parts) > 1:
            for head in PER_RANK:
                tree_.pop(head, None)  # each rank's is in its manifest
            prints = {
                rank_key(r): p.rng_fingerprint
                for r, p in enumerate(parts)
                if p.rng_fingerprint is not None
            }
            rc = comps["rng"]
            comps["rng"] = replace(
                rc,
                summary={
                    **dict(rc.summary),
                    "ranks": sorted(r for r, p in enumerate(parts) if p.rng_fingerprint is not None),
                    "fingerprints": prints,
                },
            )
            if isinstance(tree_.get("sampler"), dict):
                tree_["sampler"] = {
                    **tree_["sampler"],
                    "ranks": {
                        rank_key(r): p.sampler for r, p in enumerate(parts) if p.sampler is not None
                    },
                }
        if dcp_files:
            for name in (tree_.get("dcp") or {}).get("keys", []):
                if name in comps and comps[name].present:
                    comps[name] = replace(comps[name], where=tuple(sorted(dcp_files)))
        comps = fill_where(comps, {head: list(paths) for head, paths in by_head.items()})
        man = _manifest(tree_, files, comps, self.env, self.step, self.fields)
        return replace(man, ranks=tuple(p.ref for p in parts if p.ref is not None))


def save_state(
    state: TrainState,
    path: Location | str,
    *,
    step: int | None = None,
    fields: Mapping[str, Any] | None = None,
    compress: codec.Compression | None = None,
    overwrite: bool = False,
    fsync: bool = True,
    coll: Collective | None = None,
    key: bytes | None = None,
) -> mf.Manifest | None:
    """Commit a :class:`~ckptkit.TrainState` at ``path``: no lock, no verify, no rotation.

    The building block under :meth:`CheckpointManager.save`; use the manager in training
    code. Collective when ``coll`` spans several ranks.

    Returns:
        The manifest on rank 0, None on the other ranks.

    Example:
        >>> import tempfile, torch, ckptkit
        >>> m = save_state(ckptkit.TrainState(model=torch.nn.Linear(2, 2), step=4),
        ...                tempfile.mkdtemp() + "/c")
        >>> m.step, m.components["model"].where
        (4, ('model.safetensors',))
    """
    c = coll if coll is not None else Solo()
    snap = StateSave.capture(
        state,
        c,
        step=state.step if step is None else step,
        fields=fields or {},
        compress=compress,
        key=key,
    )
    snap.fsync = fsync
    return commit(
        fs.location(path),
        c,
        write=lambda tmp: snap.write(tmp, c),
        build=snap.build,
        overwrite=overwrite,
        fsync=fsync,
        key=key,
    )


class Stager:
    """Reusable host buffers for async saves: one staging copy, reused across saves."""

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def stage(self, encoded: tree_mod.Encoded) -> tree_mod.Encoded:
        """Copy every tensor into its host buffer (pinned when CUDA is there)."""
        staged: dict[str, torch.Tensor] = {}
        pin = torch.cuda.is_available()
        for k, t in encoded.tensors.items():
            buf = self._bufs.get(k)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin and t.is_cuda)
                self._bufs[k] = buf
            buf.copy_(t.detach(), non_blocking=t.is_cuda)
            staged[k] = buf
        for dev in {t.device for t in encoded.tensors.values() if t.is_cuda}:
            torch.cuda.synchronize(dev)  # every device copied from, not only the current one
        for k in set(self._bufs) - set(encoded.tensors):
            del self._bufs[k]  # keys gone from the state: free their buffers
        return tree_mod.Encoded(tree=encoded.tree, tensors=staged)

    @staticmethod
    def stage_dcp(state_dict: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of a DCP state dict (DTensors keep their layout), as DCP's async save does."""
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        cpu = _create_cpu_state_dict(state_dict)
        return dict(_copy_state_dict(state_dict, cpu))


# --- errors --------------------------------------------------------------------------------------

_SAVE_ERRNO = {
    errno.ENOSPC: ("disk full", "free space on that filesystem, or lower keep_last/max_bytes"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota"),
    errno.EACCES: ("permission denied", "make the run directory writable by this user"),
    errno.EPERM: ("operation not permitted", "make the run directory writable by this user"),
    errno.EROFS: ("read-only filesystem", "save to a writable filesystem"),
}


def _restated(e: BaseException, final: Location) -> BaseException:
    """Restate a plain OS error of a save: what failed, that nothing was lost, and the fix.

    Stays an ``OSError`` of the same errno (``PermissionError`` for EACCES), so existing
    ``except OSError`` clauses keep working. Other exceptions are returned as they are.
    """
    if not isinstance(e, OSError) or isinstance(e, CkptkitError):
        return e
    what, fix = _SAVE_ERRNO.get(e.errno or 0, (e.strerror or str(e), "see the OS error"))
    where = f" ({e.filename})" if e.filename else ""
    msg = (
        f"{what} while saving {final.name}{where}; the partial save was removed and older "
        f"checkpoints are intact. Fix: {fix}"
    )
    return OSError(e.errno if e.errno is not None else errno.EIO, msg, str(final))


__all__ = ["SPREAD", "RankPart", "Stager", "StateSave", "commit", "save_tree"]
