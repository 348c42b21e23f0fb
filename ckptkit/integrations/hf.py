"""ckptkit for Hugging Face ``transformers.Trainer`` and ``accelerate`` (the ``interop`` extra).

The frameworks keep writing their own checkpoints; ckptkit adds what they leave out,
beside their files (no second copy of any tensor):

* **digests and the component table** of every checkpoint (an adopted manifest,
  ``checkpoint-N/ckptkit-manifest.json``), written after a full verify;
* **resume selection**: the newest complete state, adopted on the spot; newer ones passed
  over (corrupt, incomplete) are named; chosen once on rank 0 for every rank; for
  ``trainer.train(resume_from_checkpoint=...)`` or ``accelerator.load_state(...)``;
* **verified rotation** (:class:`ckptkit.run.retain.Policy`: keep last K / every N / pinned /
  byte budget) instead of ``save_total_limit`` / ``total_limit``, which delete without
  checking anything: it runs only after the new checkpoint verified and never deletes the
  newest good one;
* **step records** (:class:`ckptkit.Recorder`: RNG fingerprint, LR, optimizer step,
  batch hash, data cursor, loss) when ``ckptkit drill`` runs the script, and the drill
  contract (save at ``W``, stop at ``W+N``, resume from the drill's checkpoint);
* the **stability watch** (:class:`ckptkit.signals.stability.StabilityWatch`) fed from the
  logged loss and grad norm, with a pinned emergency checkpoint on the first warning.

Trainer (two lines)::

    trainer = Trainer(..., callbacks=[CkptkitCallback(keep=3)])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

Accelerate (three lines; see docs/hf.md for the exact-resume recipe)::

    ck = AccelerateCheckpoints(accelerator, model, optimizer, scheduler, dataloader, keep=3)
    step = ck.resume()                      # load_state of the newest complete state
    ...
        if ck.step_end(step, loss=loss):    # records, watch, saves when due; True: stop
            break
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptkit import codes
from ckptkit.capture import tree_fingerprint
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint.manifest_io import read_path
from ckptkit.codes import CODES, error
from ckptkit.errors import CkptkitError
from ckptkit.format.manifest import Manifest
from ckptkit.format.records import LookAhead
from ckptkit.integrations.drill_env import DrillEnv
from ckptkit.run import Run, resume_target, retain
from ckptkit.run.layout import step_unknown
from ckptkit.run.layouts.hf import LAYOUTS, Kind, checkpoint_dirs, open_hf
from ckptkit.signals import guard as guard_mod
from ckptkit.signals.emergency import EmergencyPolicy
from ckptkit.signals.observe import CopySafeHook
from ckptkit.signals.recorder import Recorder
from ckptkit.signals.stability import StabilityWatch
from ckptkit.verify.findings import ERROR, Finding
from ckptkit.verify.foreign.adopt import Adoption, Notes, adopted_path
from ckptkit.verify.foreign.report import verify_foreign

try:
    from transformers import TrainerCallback
except ImportError:  # accelerate-only installs still get AccelerateCheckpoints
    TrainerCallback = object  # type: ignore[assignment,misc]
    _HAVE_TRANSFORMERS = False
else:
    _HAVE_TRANSFORMERS = True

log = logging.getLogger("ckptkit")

EXTRA_HINT = "pip install 'ckptkit[interop]' (transformers and accelerate)"
"""How to install what this module needs."""
DATA_SAMPLES = 256
"""Samples hashed (evenly spaced) for the automatic data identity of a dataset."""
_RESUMED: dict[str, Path] = {}
"""The checkpoint :func:`resume_checkpoint` chose last, per layout (the callback reads it)."""


# --- what both frameworks share ---------------------------------------------------------------


def data_identity(dataset: Any, *, samples: int = DATA_SAMPLES) -> dict[str, Any] | None:
    """A fingerprint of a map-style dataset: its length and ``samples`` evenly spaced items.

    Items are read with every global RNG saved and put back (a dataset that augments
    draws nothing the training run would see). None for a dataset without ``len`` or
    item access (an iterable dataset: declare ``data=`` yourself).

    Example:
        >>> data_identity([torch.ones(2), torch.zeros(2)])["samples"]
        2
    """
    try:
        n = len(dataset)
        getter = dataset.__getitem__
    except (TypeError, AttributeError):
        return None
    if n == 0:
        return {"snapshot": tree_fingerprint([]), "length": 0, "samples": 0}
    idx = sorted({int(i * n / min(n, samples)) for i in range(min(n, samples))})
    py, npy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            items = [getter(i) for i in idx]
        snap = tree_fingerprint({"n": n, "items": items})
    except Exception as e:  # an exotic item: no identity rather than a crash
        log.info("ckptkit: no data identity for %s: %s", type(dataset).__name__, e)
        return None
    finally:
        random.setstate(py)
        np.random.set_state(npy)
    return {"snapshot": snap, "length": n, "samples": len(idx)}


def _policy(keep: retain.Policy | int | None, framework_limit: int | None) -> retain.Policy | None:
    if isinstance(keep, retain.Policy):
        return keep
    if keep is not None:
        return retain.Policy(keep_last=int(keep))
    if framework_limit:
        return retain.Policy(keep_last=int(framework_limit))
    return None


def _component_of(f: Finding, man: Manifest | None) -> str:
    """The component a finding is about (a file finding: the component that file holds)."""
    if f.component and f.component != "checkpoint":
        return f.component
    spec = CODES.get(f.code)
    if spec is not None and spec.component != "checkpoint":
        return spec.component
    if man is not None and f.path:
        for name, c in man.components.items():
            if any(w.split(":", 1)[0] == f.path for w in c.where):
                return name
    return "checkpoint"


def check_resumable(path: Path, layout: Kind) -> None:
    """Verify a checkpoint before the framework loads it; raise on the first error.

    The error names the component the failing file holds (``optimizer: optimizer.pt:
    file listed in the manifest is missing``), with the finding's code and fix.

    Raises:
        CkptkitError: the checkpoint has an error finding (its code), or is not a
            checkpoint of ``layout``.

    Example:
        >>> check_resumable(Path("/nonexistent"), "hf-trainer")  # doctest: +SKIP
    """
    rep = verify_foreign(path, layout, expect="training")
    bad = [f for f in rep.findings if f.severity is ERROR]
    if not bad:
        return
    man = None
    with contextlib.suppress(CkptkitError):
        man = read_path(adopted_path(path))
    # A file finding first: it names the file, and the file names the component.
    bad.sort(key=lambda f: (f.path is None, 0 if f.code.startswith("CK-F") else 1))
    first = bad[0]
    comp = _component_of(first, man)
    where = f"{first.path}: " if first.path else ""
    more = f" ({len(bad) - 1} more finding(s): ckptkit verify {path})" if len(bad) > 1 else ""
    raise error(first.code, f"{comp}: {where}{first.message}{more}", path=path, hint=first.hint)


def _pick(root: Path, layout: Kind, run: Run | None = None) -> tuple[Path, int] | None:
    """The checkpoint of ``root`` to resume from and its real step, the same on every rank
    (:func:`ckptkit.run.resume_target`: rank 0 chooses the newest complete state, adopted
    on the spot when a kill came before its adoption, and names every newer one passed
    over; the other ranks are told). Collective: every rank calls it.

    ``run``: rank 0's writable run of ``root``; else one is opened for the choice.

    Raises:
        CkptkitError: the newest complete checkpoint's step is unknown (the fix named).
    """
    strategy = LAYOUTS[layout]()
    chosen = resume_target(root, strategy, run=run)
    if chosen.info is None:
        if chosen.passed:
            log.warning("ckptkit: no checkpoint of %s verifies: starting fresh", root)
        return None
    return strategy.local(chosen.info.path), chosen.info.step


def _drill_target(drill: DrillEnv, layout: Kind) -> Path | None:
    """The checkpoint the drill asks to resume from (verified; raises when it fails)."""
    if drill.resume_from is None:
        return None
    p = LAYOUTS[layout]().local(drill.resume_from)
    check_resumable(p, layout)
    return p


class _Keeper:
    """Adopt, record, watch and rotate for one run directory (both integrations use it)."""

    def __init__(
        self,
        layout: Kind,
        *,
        policy: retain.Policy | None,
        watch: StabilityWatch | bool,
        emergency: EmergencyPolicy | None,
        data: Mapping[str, Any] | None,
        recorder: Recorder | None,
    ) -> None:
        self.layout: Kind = layout
        self.policy = policy
        self.watch: StabilityWatch | None = (
            StabilityWatch() if watch is True else watch if isinstance(watch, StabilityWatch) else None
        )
        self.emergency = emergency or (EmergencyPolicy() if self.watch is not None else None)
        self.data = dict(data) if data is not None else None
        self.drill = DrillEnv.from_env()
        self.recorder = recorder
        self._own_recorder = recorder is None and self.drill.metrics is not None
        if self._own_recorder:
            self.recorder = Recorder(None)  # $CKPTKIT_METRICS: the drill's records
        self.state: TrainState | None = None
        self.run: Run | None = None
        self.pin_next: str | None = None
        self.adoptions: list[Adoption] = []
        self.guard: guard_mod.ResumeGuard | None = None
        """The resume guard of the last resume (its ``findings``), when it had a look-ahead."""

    def bind(self, model: Any, optimizer: Any, scheduler: Any, sampler: Any = None) -> None:
        """Fill the step records from the live objects (RNG, LR, optimizer step, batch)."""
        if self.recorder is None or model is None:
            return
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
        self.state = TrainState(model=model, optimizer=opt, scheduler=scheduler,
                                sampler=sampler, recorder=self.recorder)

    def open(self, root: Path) -> None:
        """Take the run lock (rank 0): no prune may delete while this run saves."""
        if self.run is None:
            self.run = open_hf(root, self.layout, readonly=False)

    def close(self) -> None:
        if self.state is not None and self.recorder is not None and self.recorder.observer:
            self.recorder.observer.close()
            self.state = None
        if self.recorder is not None:
            if self._own_recorder:
                self.recorder.close()
            else:
                self.recorder.flush()  # the caller's: it may log on
        if self.run is not None:
            self.run.close()
            self.run = None

    def check_data(self, ckpt: Path | None) -> None:
        """Compare the data identity saved with ``ckpt`` to this run's (CK-R003)."""
        if ckpt is None or not self.data:
            return
        try:
            man = read_path(adopted_path(ckpt))
        except CkptkitError:
            return
        saved = man.components.get("data")
        if saved is None or not saved.present:
            return
        was = saved.summary.get("snapshot")
        now = self.data.get("snapshot")
        if was == now:
            return
        msg = (f"data identity changed since {ckpt.name} was saved: snapshot {was} there, "
               f"{now} now")
        log.warning("ckptkit: %s %s; %s", codes.R003, msg, CODES[codes.R003].hint)
        obs = self.recorder.observer if self.recorder is not None else None
        if obs is not None:
            obs.note([{"code": codes.R003, "component": "data", "message": msg}])

    def _objects(self, step: int, model: Any, optimizer: Any, scheduler: Any) -> TrainState:
        """The framework's live objects as a TrainState (accelerate's wrappers unwrapped)."""
        return TrainState(
            model=model if isinstance(model, torch.nn.Module) else torch.nn.Module(),
            optimizer=getattr(optimizer, "optimizer", optimizer),
            scheduler=getattr(scheduler, "scheduler", scheduler),
            step=step,
            data=self.data,
        )

    def lookahead(self, step: int, model: Any, optimizer: Any, scheduler: Any) -> Any:
        """The look-ahead of the checkpoint of ``step`` (what its next step will use), from
        the framework's objects as they stand after that step: the one computation every
        save path records (:func:`ckptkit.signals.guard.lookahead_of`)."""
        if optimizer is None:
            return None
        try:
            return guard_mod.lookahead_of(self._objects(step, model, optimizer, scheduler))
        except Exception as e:  # an exotic optimizer or scheduler: no look-ahead, never a crash
            log.info("ckptkit: no look-ahead for step %d: %s", step, e)
            return None

    def check_lookahead(self, ckpt: Path | None, step: int, model: Any, optimizer: Any,
                        scheduler: Any) -> None:
        """Compare the resumed objects with the look-ahead ``ckpt``'s adopted manifest
        recorded (the resume guard, without a Recorder): step, LR of every group, scheduler
        position, optimizer step count, data identity. The framework restores the RNG and
        the data position itself, later, so those are not compared here."""
        if ckpt is None or optimizer is None:
            return
        try:
            man = read_path(adopted_path(ckpt))
        except CkptkitError:
            return
        saved = LookAhead.of(man.lookahead).guard
        if not saved or guard_mod.problems(saved, {}):
            return  # none recorded (an older adoption), or unreadable (verify says CK-S012)
        g = guard_mod.ResumeGuard(saved, per_rank=False)
        found = g.check_restored(self._objects(step, model, optimizer, scheduler))
        self.guard = g
        obs = self.recorder.observer if self.recorder is not None else None
        if obs is not None and found:
            obs.note(found)

    def log(self, step: int, **metrics: Any) -> bool:
        """Record one step and feed the watch; True when an emergency save is due."""
        if self.recorder is not None:
            self.recorder.log(step, **metrics)
        return self.feed(step, **metrics)

    def feed(self, step: int, **metrics: Any) -> bool:
        if self.watch is None:
            return False
        v = self.watch.update(step, **{k: v for k, v in metrics.items() if v is not None})
        if self.emergency is not None and self.emergency.should_save(v):
            self.emergency.saved(step)
            self.pin_next = self.emergency.pin
            log.warning("ckptkit: stability %s at step %d: emergency checkpoint (%s)",
                        v.level, step, v.summary())
            return True
        return False

    def saved(self, path: Path, step: int, *, lookahead: Any = None) -> Adoption | None:
        """Settle the checkpoint the framework just wrote (rank 0): the run verifies and
        adopts it (signed with the run's key), records it and rotates
        (:meth:`ckptkit.run.Run.settle`)."""
        if not path.is_dir():
            log.error("ckptkit: %s was not written: nothing to adopt", path)
            return None
        pins: tuple[str, ...] = (self.pin_next,) if self.pin_next else ()
        self.pin_next = None
        if self.drill.should_save(step):
            pins += ("drill",)  # the drill snapshots it a moment later: never rotated away
        notes = Notes(
            step=step,
            health=self.watch.snapshot() if self.watch is not None else None,
            pins=pins,
            data=self.data,
            lookahead=lookahead,
        )
        self.open(path.parent)
        assert self.run is not None
        settled = self.run.settle(path, step=step, policy=self.policy, notes=notes)
        a = settled.adoption
        assert a is not None
        self.adoptions.append(a)
        if a.refused is not None:
            log.error("ckptkit: %s failed its verify and is not adopted: %s", path.name, a.refused)
            return a
        if a.missing:
            log.warning("ckptkit: %s lacks %s: a resume from it is not exact",
                        path.name, ", ".join(a.missing))
        for line in settled.deleted:
            log.info("ckptkit: rotated %s", line)
        return a


# --- transformers.Trainer -----------------------------------------------------------------


class CkptkitCallback(TrainerCallback):  # type: ignore[misc,valid-type]
    """A ``TrainerCallback``: adopt every ``checkpoint-N``, verified rotation, drills, watch.

    Args:
        keep: verified rotation: a :class:`ckptkit.run.retain.Policy` or a keep-last count.
            None takes over ``save_total_limit`` (which is then turned off: the Trainer's
            own rotation deletes without verifying); neither: keep everything.
        watch: a :class:`~ckptkit.signals.stability.StabilityWatch` (True: the default one) fed
            with every logged ``loss`` / ``grad_norm``; its first warning saves a pinned
            emergency checkpoint and every checkpoint records its health.
        emergency: when the watch saves (default :class:`EmergencyPolicy`).
        data: the data identity to record and compare on resume; default: a fingerprint
            of the training dataset (:func:`data_identity`).
        recorder: step records to keep (default: only under ``ckptkit drill``).

    Under ``ckptkit drill`` it also saves at the drill's step, stops at its stop step,
    and sends the checkpoints to the drill's directory (``$CKPTKIT_CKPT_DIR``).

    Example:
        >>> from transformers import Trainer  # doctest: +SKIP
        >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[CkptkitCallback(keep=3)])  # doctest: +SKIP
        >>> trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        keep: retain.Policy | int | None = None,
        watch: StabilityWatch | bool = False,
        emergency: EmergencyPolicy | None = None,
        data: Mapping[str, Any] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        if not _HAVE_TRANSFORMERS:
            raise ImportError(f"CkptkitCallback needs transformers: {EXTRA_HINT}")
        self._keep = keep
        self._keeper = _Keeper("hf-trainer", policy=None, watch=watch, emergency=emergency,
                               data=data, recorder=recorder)
        self._loss: list[torch.Tensor] = []
        self._hook: Any = None
        self._started = False

    @property
    def adoptions(self) -> list[Adoption]:
        """What each save's adoption found (this process)."""
        return self._keeper.adoptions

    def on_init_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        k = self._keeper
        if k.drill.ckpt_dir is not None:
            log.info("ckptkit drill: checkpoints go to %s", k.drill.ckpt_dir)
            args.output_dir = str(k.drill.ckpt_dir)
        k.policy = _policy(self._keep, args.save_total_limit)
        if args.save_total_limit:
            log.info("ckptkit: save_total_limit=%s is replaced by verified rotation (%s)",
                     args.save_total_limit, k.policy)
            args.save_total_limit = None
        if getattr(args, "save_only_model", False):
            log.warning("ckptkit: save_only_model=True writes no optimizer, scheduler or RNG "
                        "state: a resume from these checkpoints is not exact")
        if getattr(args, "ignore_data_skip", False):
            log.warning("ckptkit: ignore_data_skip=True: a resume replays the interrupted "
                        "epoch from its start (samples seen twice); leave it False for an "
                        "exact resume")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        k = self._keeper
        model = kw.get("model")
        dl = kw.get("train_dataloader")
        if k.data is None and dl is not None:
            k.data = data_identity(getattr(dl, "dataset", None))
        if state.is_world_process_zero:
            k.open(Path(args.output_dir))
            k.bind(model, kw.get("optimizer"), kw.get("lr_scheduler"))
            obs = k.recorder.observer if k.recorder is not None else None
            workers = getattr(dl, "num_workers", None)
            if obs is not None and isinstance(workers, int):
                obs.num_workers = workers  # records carry it (the workers' RNG)
            if model is not None and k.recorder is not None:
                # Copy-safe: an EMA's deepcopy of the model must not copy this callback
                # (and the Recorder's open file) along with the hook.
                self._hook = model.register_forward_hook(CopySafeHook(self._on_forward))

    def _on_forward(self, module: Any, inputs: Any, output: Any) -> None:
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, Mapping):
            loss = output.get("loss")
        if isinstance(loss, torch.Tensor) and module.training and torch.is_grad_enabled():
            self._loss.append(loss.detach())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self._started:
            self._started = True
            if state.global_step > 0 and state.is_world_process_zero:
                ckpt = _RESUMED.get("hf-trainer") or Path(args.output_dir) / f"checkpoint-{state.global_step}"
                self._keeper.check_data(ckpt)
                self._keeper.check_lookahead(ckpt, state.global_step, kw.get("model"),
                                             kw.get("optimizer"), kw.get("lr_scheduler"))
        self._loss = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        k = self._keeper
        step = state.global_step
        if state.is_world_process_zero and k.recorder is not None:
            loss = float(torch.stack(self._loss).float().mean()) if self._loss else None
            k.recorder.log(step, loss=loss)
        if k.drill.should_save(step):
            control.should_save = True
        if k.drill.should_stop(step):
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        logs = logs or {}
        if "loss" not in logs:
            return
        if self._keeper.feed(state.global_step, loss=logs.get("loss"),
                             grad_norm=logs.get("grad_norm")):
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # every rank has written its files (rng_state_<rank>.pth) first
        if not state.is_world_process_zero:
            return
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        la = self._keeper.lookahead(state.global_step, kw.get("model"), kw.get("optimizer"),
                                    kw.get("lr_scheduler"))
        self._keeper.saved(path, state.global_step, lookahead=la)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._started = False
        self._keeper.close()


def resume_checkpoint(output_dir: str | Path) -> str | None:
    """The checkpoint to pass to ``trainer.train(resume_from_checkpoint=...)``.

    The newest complete state of ``output_dir``, adopted on the spot (a ``checkpoint-N``
    a kill left unadopted is verified and adopted now); newer ones passed over are named
    in a warning. None when there is none (a fresh start). On several ranks rank 0
    chooses and every rank gets its choice (:func:`ckptkit.run.resume_target`; call it on
    every rank). Under ``ckptkit drill``: the drill's checkpoint (verified: a failing one
    raises), or None for the reference.

    Raises:
        CkptkitError: the drill's checkpoint does not verify; or the newest complete
            checkpoint's step is unknown (no adopted manifest, no intent record): it is
            never resumed with the step counter at 0, the message names the fix.

    Example:
        >>> import tempfile
        >>> resume_checkpoint(tempfile.mkdtemp()) is None
        True
    """
    drill = DrillEnv.from_env()
    target = _drill_target(drill, "hf-trainer")
    if target is None and drill.active:
        return None  # the drill's reference starts fresh
    if target is None:
        root = Path(drill.ckpt_dir) if drill.ckpt_dir is not None else Path(output_dir)
        picked = _pick(root, "hf-trainer")
        target = picked[0] if picked is not None else None
    if target is None:
        _RESUMED.pop("hf-trainer", None)
        return None
    _RESUMED["hf-trainer"] = target
    return str(target)


# --- accelerate -----------------------------------------------------------------------------


class AccelerateCheckpoints:
    """Verified ``save_state`` / ``load_state`` for an Accelerate loop.

    Needs ``ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)``: the
    checkpoints are ``project_dir/checkpoints/checkpoint_I``. ``total_limit`` is replaced
    by verified rotation (``keep``); each saved folder is adopted with the optimizer step
    recorded (Accelerate's own ``step`` counts micro-steps).

    Args:
        accelerator: the ``Accelerator``.
        model, optimizer, scheduler, dataloader: the prepared objects (for the step
            records; the dataloader's position when it is stateful).
        keep: a :class:`ckptkit.run.retain.Policy` or a keep-last count (None: ``total_limit``).
        save_every: save every this many steps in :meth:`step_end` (None: only the drill's
            and emergency saves; call :meth:`save` yourself).
        watch, emergency, data, recorder: as :class:`CkptkitCallback`.

    Example:
        >>> ck = AccelerateCheckpoints(accelerator, model, opt, sched, dl, keep=3)  # doctest: +SKIP
        >>> step = ck.resume()  # doctest: +SKIP
    """

    def __init__(
        self,
        accelerator: Any,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        dataloader: Any = None,
        *,
        keep: retain.Policy | int | None = None,
        save_every: int | None = None,
        watch: StabilityWatch | bool = False,
        emergency: EmergencyPolicy | None = None,
        data: Mapping[str, Any] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        pc = accelerator.project_configuration
        if not pc.automatic_checkpoint_naming or not pc.project_dir:
            raise CkptkitError(
                "AccelerateCheckpoints needs automatic checkpoint naming",
                hint="Accelerator(project_config=ProjectConfiguration(project_dir=DIR, "
                "automatic_checkpoint_naming=True))",
            )
        self.accelerator = accelerator
        self.save_every = save_every
        if data is None and dataloader is not None:
            data = data_identity(getattr(dataloader, "dataset", None))
        self._keeper = _Keeper("accelerate", policy=_policy(keep, pc.total_limit), watch=watch,
                               emergency=emergency, data=data, recorder=recorder)
        k = self._keeper
        if k.drill.ckpt_dir is not None:
            pc.set_directories(str(k.drill.ckpt_dir))
        if pc.total_limit:
            log.info("ckptkit: total_limit=%s is replaced by verified rotation (%s)",
                     pc.total_limit, k.policy)
            pc.total_limit = None
        self.root = Path(pc.project_dir) / "checkpoints"
        self.step = 0
        """The optimizer step restored by :meth:`resume` (0: fresh start)."""
        self._objects = (model, optimizer, scheduler)
        if accelerator.is_main_process:
            k.open(self.root)
            k.bind(model, optimizer, scheduler, dataloader)

    @property
    def adoptions(self) -> list[Adoption]:
        """What each save's adoption found (this process)."""
        return self._keeper.adoptions

    def resume(self, *, path: str | Path | None = None) -> int:
        """``load_state`` of the newest complete state (or ``path``); its step, or 0.

        The newest complete state is adopted on the spot (a ``checkpoint_I`` a kill left
        unadopted is verified and adopted now, at the step its intent record holds);
        newer ones passed over are named in a warning. Rank 0 chooses, every rank loads
        its choice (:func:`ckptkit.run.resume_target`; call it on every rank). Under
        ``ckptkit drill``: the drill's checkpoint (verified first), or a fresh start for
        the reference.

        Raises:
            CkptkitError: the drill's (or the given) checkpoint does not verify; or the
                step of the checkpoint to resume is unknown (no adopted manifest, no intent
                record): it is never resumed with the step counter at 0, the message names
                the fix (``ckptkit adopt --step N PATH``).
        """
        k = self._keeper
        step: int | None = None
        if path is not None:
            target: Path | None = Path(path)
            check_resumable(Path(path), "accelerate")
        else:
            target = _drill_target(k.drill, "accelerate")
            if target is None and not k.drill.active:
                picked = _pick(self.root, "accelerate", k.run)
                if picked is not None:
                    target, step = picked
        if target is None:
            return 0
        if step is None:
            step = self._step_of(target)
        self.accelerator.load_state(str(target))
        self.step = step
        k.check_data(target)
        if self.accelerator.is_main_process:
            k.check_lookahead(target, step, *self._objects)
        log.info("ckptkit: resumed from %s at step %d", target, self.step)
        return self.step

    def step_end(self, step: int, *, loss: Any = None, **metrics: Any) -> bool:
        """Call after each optimizer step: record, watch, save when due; True: stop now."""
        k = self._keeper
        main = self.accelerator.is_main_process
        emergency = False
        if main:
            if isinstance(loss, torch.Tensor):
                loss = float(loss.detach().float())
            emergency = k.log(step, loss=loss, **metrics)
        # Every rank must take the same decision (save_state is collective).
        due = (k.drill.should_save(step) or emergency
               or (self.save_every is not None and step % self.save_every == 0))
        if self.accelerator.num_processes > 1:
            flag = torch.tensor([1 if due else 0], device=self.accelerator.device)
            due = bool(self.accelerator.reduce(flag, reduction="sum").item())
        if due:
            self.save(step)
        return k.drill.should_stop(step)

    def _step_of(self, target: Path) -> int:
        """The real step of checkpoint ``target`` (its adopted manifest, else its intent
        record); never 0 for a step nobody knows.

        Raises:
            CkptkitError: its step is unknown (the fix: ``ckptkit adopt --step N PATH``).
        """
        run = self._keeper.run
        with contextlib.ExitStack() as stack:
            if run is None:
                run = stack.enter_context(open_hf(target.parent, "accelerate"))
            step = run.step_of(target)
        if step is None:
            raise step_unknown(target, resuming=True)
        return step

    def save(self, step: int) -> Path:
        """``accelerator.save_state()`` into the next ``checkpoint_I``, then settle it (the
        run verifies, adopts, records and rotates).

        Before ``save_state`` the run records the step the checkpoint will hold (its intent
        record): a kill before the adoption still resumes it at its real step.
        """
        pc = self.accelerator.project_configuration
        taken = [n for n, _ in checkpoint_dirs(self.root, "accelerate")]
        if taken and pc.iteration <= taken[-1]:
            pc.iteration = taken[-1] + 1  # never overwrite (a resumed run keeps counting)
        if self.accelerator.is_main_process:
            self._keeper.open(self.root)
            assert self._keeper.run is not None
            self._keeper.run.intend(f"checkpoint_{pc.iteration}", step)
        out = Path(self.accelerator.save_state())
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self._keeper.saved(out, step, lookahead=self._keeper.lookahead(step, *self._objects))
        return out

    def close(self) -> None:
        """Release the run lock and close the records."""
        self._keeper.close()


__all__ = [
    "EXTRA_HINT",
    "AccelerateCheckpoints",
    "CkptkitCallback",
    "check_resumable",
    "data_identity",
    "resume_checkpoint",
]
