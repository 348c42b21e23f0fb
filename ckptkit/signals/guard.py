"""The resume guard: every real resume checked, not only drills.

At save time the manifest records a short *look-ahead* of what the run will do next:
the step label, the LR of every param group, the loss scale and the scaler's growth
tracker, the optimizer step count, an RNG fingerprint, which generators the run drew from
between one step's record and the next step's start, the next K sample ids the sampler
will yield, a fingerprint of the declared data identity, and the loss of a fixed probe
batch (when the user gives one). On restore the same look-ahead is computed from the
restored objects and compared. With a :class:`~ckptkit.Recorder` bound to the
``TrainState`` the guard also watches the first resumed step: the RNG state where the step
starts (draws between the restore and the first step, and which call likely made them,
:mod:`ckptkit.signals.rngtrace`), the optimizer and GradScaler that actually step (a rebuilt
optimizer, a fresh scaler whose scale has not moved yet), and the first K records. Any
mismatch is a ``CK-D`` finding that names the component; the findings are also written
into the next step records (``guard`` field), where a drill reads them.

Cost: a look-ahead peeks the sampler (no data is loaded) and hashes the RNG states
(a few KiB); the probe is one forward pass in eval mode without grad.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ckptkit import codes
from ckptkit.capture import tree_fingerprint
from ckptkit.capture.resumable import loader_iterator
from ckptkit.capture.session import DEFAULT_K as DEFAULT_K
from ckptkit.capture.session import ProbeFn as ProbeFn
from ckptkit.capture.state import TrainState
from ckptkit.checkpoint.lookahead import compute as compute
from ckptkit.checkpoint.lookahead import lookahead as lookahead
from ckptkit.checkpoint.lookahead import lookahead_of as lookahead_of
from ckptkit.checkpoint.lookahead import opt_step as _opt_step
from ckptkit.checkpoint.lookahead import probe_loss as probe_loss
from ckptkit.checkpoint.lookahead import rng_fingerprint as rng_fingerprint
from ckptkit.format.records import MAX_K as MAX_K
from ckptkit.format.records import lookahead_problems
from ckptkit.signals import rngtrace
from ckptkit.signals.observe import StepObserver, calling_scaler, scaler_state
from ckptkit.verify.findings import CODES, Finding

if TYPE_CHECKING:
    from ckptkit.signals.recorder import Logged

log = logging.getLogger("ckptkit")

# The look-ahead a save records is computed in the checkpoint layer, where every writer calls
# it (:mod:`ckptkit.checkpoint.lookahead`: ``compute``, ``lookahead``, ``lookahead_of``, ...,
# imported above under the guard's names), and checked by its validator in the format layer,
# where verify reads it too.
problems = lookahead_problems
"""What the resume guard could not read in a checkpoint
(:func:`ckptkit.format.records.lookahead_problems`)."""

SUBSCRIPTION_KEY = "resume-guard"
"""The key of the guard's :meth:`~ckptkit.Recorder.subscribe` subscription on a recorder."""
PROBE_RTOL = 1e-6
"""Relative tolerance of the probe loss (bitwise where the run is deterministic)."""

FOREIGN_STEPS = 16
MAX_NAMED = 5
"""The most parameter names a finding lists."""
"""Optimizer steps of other models the guard lets pass before it stops waiting for the
restored optimizer's first step (and says so, as unknown)."""
_WATCHING: ResumeGuard | None = None
"""The guard whose one-shot hooks are installed (:meth:`ResumeGuard.watch`), if any."""
_STEP_HOOK: Any = None
"""The one process-wide optimizer step pre-hook, dispatching to the armed guard. Installed
once and never removed: a guard disarms itself inside the hook, and removing a hook while
torch iterates over the hooks raises "OrderedDict mutated during iteration"."""


def _dispatch_first_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    g = _WATCHING
    if g is not None and g.armed:
        g._on_any_step(optimizer, args, kwargs)


def shared_loader_generator(loader: Any) -> bool:
    """Whether ``loader`` (a StatefulDataLoader) shares its ``generator`` with its sampler.

    torchdata 0.11 draws each ``iter()``'s base seed from ``loader.generator`` and saves the
    sampler's generator state from before that draw, so with one generator for both the
    epoch after a mid-epoch resume gets another permutation.

    Example:
        >>> shared_loader_generator(torch.utils.data.DataLoader([1, 2]))
        False
    """
    gen = getattr(loader, "generator", None)
    if gen is None or not hasattr(loader, "next_iter_state"):  # not a StatefulDataLoader
        return False
    return getattr(getattr(loader, "sampler", None), "generator", None) is gen


@dataclass
class ResumeGuard:
    """Compare a restored run with the look-ahead its checkpoint recorded.

    Args:
        saved: the ``guard`` look-ahead read from the manifest.
        probe: the same probe function that was used at save time.
    """

    saved: Mapping[str, Any]
    probe: ProbeFn | None = None
    per_rank: bool = True
    """Check the per-rank facts (sample ids, RNG) too: same layout as the save, rank 0."""
    findings: list[Finding] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    """What the guard could not check at the restore, and why (no finding: a check it
    cannot make is not evidence of a mismatch; the first step records may still settle it)."""
    seeds: tuple[int, ...] = ()
    """Seeds to try when a generator turns out re-seeded (the script's own, when known)."""
    _seen_steps: int = 0
    _ids_seen: list[int] = field(default_factory=list)
    _restored: rngtrace.RngSnapshot | None = None
    _state: TrainState | None = None
    _started: bool = False
    _stepped: bool = False
    _sink: Callable[[list[Finding]], None] | None = None
    _observed: bool = False
    """A StepObserver (a Recorder bound to the TrainState) feeds this guard: it judges the
    RNG at the first step's start against the saved run's own between-step draws."""
    _rng_told: bool = False
    armed: bool = False
    """The first-step watch is on (:meth:`watch`) and has not decided yet."""
    _foreign_steps: int = 0
    _cursor0: Mapping[str, Any] | None = None
    _epoch_end: bool = False
    _weights: dict[str, str] = field(default_factory=dict)
    """A fingerprint of every model parameter as the restore left it (name -> digest)."""

    def _add(self, code: str, message: str, *, hint: str | None = None) -> None:
        f = CODES[code].finding(message, hint=hint)
        self.findings.append(f)
        log.warning("ckptkit resume guard: %s %s. Fix: %s", code, message, f.hint)
        if self._sink is not None:
            self._sink([f])

    def check_restored(self, ts: TrainState) -> list[Finding]:
        """Compare the freshly restored objects with the saved look-ahead; return new findings."""
        before = len(self.findings)
        self._restored = rngtrace.RngSnapshot.take()
        self._state = ts
        self._weights = weights_fingerprint(ts.model) if isinstance(ts.model, torch.nn.Module) else {}
        now = compute(ts, k=int(self.saved.get("k", DEFAULT_K)),
                      probe=self.probe if "probe_loss" in self.saved else None)
        if self.saved.get("rng_v") != rngtrace.FINGERPRINT_VERSION:
            now["rng"] = rng_fingerprint()  # a v0.1 checkpoint: compare like with like
        s = self.saved
        if s.get("next_step") != now["next_step"]:
            self._add(codes.D001, f"next step will be {now['next_step']}, the checkpoint "
                      f"recorded {s.get('next_step')}")
        if self.per_rank and "sample_ids" in s:
            self._check_ids(s["sample_ids"], now.get("sample_ids"))
        if "lr" in s and not _same_floats(s["lr"], now.get("lr")):
            self._add(codes.D003, f"next LR {now.get('lr')}, the checkpoint recorded {s['lr']}")
        if "sched_epoch" in s and s["sched_epoch"] != now.get("sched_epoch"):
            self._add(codes.D003, f"scheduler position {now.get('sched_epoch')}, the checkpoint "
                      f"recorded {s['sched_epoch']} (its LR schedule restarts or is offset)")
        if "loss_scale" in s and s.get("scaler") is None:
            if s["loss_scale"] != now.get("loss_scale"):
                self._add(codes.D004, f"loss scale {now.get('loss_scale')}, the checkpoint "
                          f"recorded {s['loss_scale']}")
            elif "scale_growth" in s and s["scale_growth"] != now.get("scale_growth"):
                self._add(codes.D004, f"GradScaler growth tracker {now.get('scale_growth')}, "
                          f"the checkpoint recorded {s['scale_growth']}: the scale will grow "
                          "(or back off) at other steps than in the saved run")
        if s.get("cursor_ahead") is True:
            self._add(codes.D002, "the checkpoint's sampler cursor counted the indices the "
                      "DataLoader's workers had prefetched, not the batches the loop had "
                      "trained on: this resume skips the prefetched ones",
                      hint="iterate with 'for batch in sampler.batches(loader)' (or "
                      "track_delivery() + delivered(n)): the cursor then counts only the "
                      "batches the loop received")
        if shared_loader_generator(ts.sampler):
            self._add(codes.D009, "the StatefulDataLoader draws its workers' base seed from "
                      "the generator its RandomSampler shuffles with, and saves only the "
                      "sampler's part of it: the epoch after this resume is shuffled "
                      "differently from the uninterrupted run")
        if "data_id" in s and now.get("data_id") not in (None, s["data_id"]):
            self._add(codes.R003, "the declared data identity (TrainState data=) differs from "
                      "the one saved: the same sample ids now mean other content")
        if "opt_step" in s and s["opt_step"] != now.get("opt_step"):
            self._add(codes.D005, f"optimizer step {now.get('opt_step')}, the checkpoint "
                      f"recorded {s['opt_step']}")
        if self.per_rank and s.get("rng") and s["rng"] != now["rng"]:
            self._add(codes.D006, "RNG fingerprint differs from the one recorded at save")
        if "probe_loss" in s and "probe_loss" in now:
            a, b = float(s["probe_loss"]), float(now["probe_loss"])
            if not math.isclose(a, b, rel_tol=PROBE_RTOL, abs_tol=0.0):
                self._add(codes.D007, f"probe loss {b!r}, the checkpoint recorded {a!r}")
        return self.findings[before:]

    def _check_ids(self, want: Sequence[int], got: Sequence[int] | None) -> None:
        """Compare the next sample ids the restored sampler names with the recorded ones.

        Only ids both sides name are compared: a look-ahead that sees fewer (a sampler
        that cannot tell, a checkpoint that recorded fewer) is *unknown* for the rest, not a
        mismatch; the first step records (:meth:`observe`) then compare the ids the steps
        really receive. No sampler at all where the saved run had one (``got`` None) is
        CK-D002: the cursor the checkpoint holds is not put back.
        """
        if got is None:
            self._add(codes.D002, _ids_message(want, None))
            return
        n = min(len(want), len(got))
        if list(got[:n]) != list(want[:n]):
            self._add(codes.D002, _ids_message(want, got))
        elif len(got) != len(want):
            self._note_unknown(
                f"next sample ids after the first {n}: the checkpoint recorded {len(want)}, "
                f"the restored sampler names {len(got)} (the first step records are "
                "compared instead)"
            )

    def _note_unknown(self, what: str) -> None:
        self.unknown.append(what)
        log.info("ckptkit resume guard: unknown: %s", what)

    # --- the first resumed step without a Recorder (own one-shot hooks) -----------------

    def watch(self, ts: TrainState) -> None:
        """Check the first resumed step of ``ts`` whether or not a Recorder is bound.

        Two one-shot hooks, installed at the restore (after :meth:`check_restored`, which
        took the RNG snapshot they compare with):

        * the restored :class:`~ckptkit.ResumableSampler`'s first pass
          (:meth:`on_resumed_pass`): the DataLoader's ``iter()`` that asks for it;
        * an optimizer step pre-hook (:meth:`on_first_step`): the first step of the
          restored optimizer, or of one that replaced it.

        Example:
            >>> import torch, ckptkit
            >>> m = torch.nn.Linear(2, 1)
            >>> ts = ckptkit.TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
            >>> g = ResumeGuard(compute(ts)); _ = g.check_restored(ts); g.watch(ts)
            >>> g.close()
        """
        global _STEP_HOOK, _WATCHING
        if _WATCHING is not None and _WATCHING is not self:
            _WATCHING.close()  # a second restore in this process: its guard takes over
        _WATCHING = self
        self._state = ts
        arm = getattr(ts.sampler, "on_resumed_pass", None)
        if callable(arm):
            arm(self.on_resumed_pass)
            self._cursor0 = ts.sampler.state_dict()
        self.armed = True
        if _STEP_HOOK is None:
            _STEP_HOOK = register_optimizer_step_pre_hook(_dispatch_first_step)

    def close(self) -> None:
        """Disarm the one-shot hooks :meth:`watch` installed (idempotent; safe inside them)."""
        self.armed = False
        ts = self._state
        arm = getattr(ts.sampler, "on_resumed_pass", None) if ts is not None else None
        if ts is not None and callable(arm) and (
            getattr(ts.sampler, "resumed_pass_hook", None) == self.on_resumed_pass
        ):
            arm(None)

    def on_resumed_pass(self, sampler: Any) -> None:
        """At the first pass over the restored sampler cursor: did the global RNG move?

        The DataLoader iterator asking for the pass was just built: its ``iter()`` drew its
        workers' base seed from the global torch generator (one 64-bit draw, 2 words),
        which the uninterrupted run, still inside its epoch, did not draw here. That very
        draw (the iterator's base seed is the first draw from the restored state), and only
        it, is put back: the rest of the epoch then sees the saved streams,
        bitwise (with ``num_workers=0``, augmentation included). Any other move is
        CK-D008 with the call that likely drew. With workers, a dataset that draws from the
        global RNG cannot resume bitwise mid-epoch: CK-D090 (:meth:`_check_workers`).
        """
        try:
            self._first_pass(sampler, loader_iterator(sys._getframe(1)))
        except Exception as e:  # inside the user's data loading: never break training
            log.debug("ckptkit resume guard: first-pass check skipped: %s", e)

    def _first_pass(self, sampler: Any, it: Any) -> None:
        if self._restored is None:
            return
        mid_epoch = 0 < int(sampler.position) < int(sampler.num_samples)
        if int(sampler.position) > 0:
            # Position 0: the saved run had not started this epoch's pass, so it built an
            # iterator (and drew) here too; nothing to compare.
            draws = rngtrace.draws_between(self._restored, rngtrace.RngSnapshot.take(),
                                           seeds=self.seeds)
            if rngtrace.pattern(draws) == {"torch": 2} and _drew_base_seed(it, self._restored):
                state = torch.frombuffer(bytearray(self._restored.torch_cpu), dtype=torch.uint8)
                torch.set_rng_state(state)
                log.info("ckptkit resume guard: put back the DataLoader's base-seed draw from "
                         "the global torch RNG (the saved run drew none there)")
            elif draws and not (self._observed and isinstance(self.saved.get("rng_gaps"), list)):
                what, fix = rngtrace.explain(draws)
                self._rng_told = True
                self._add(codes.D008, f"{what}; seen at the first iter() over the restored "
                          "sampler", hint=fix)
        # Restored at the end of an epoch: the saved run's next step came after the next
        # epoch's iter(), which draws its base seed (the step-start check allows that draw).
        self._epoch_end = it is not None and int(sampler.position) >= int(sampler.num_samples)
        if it is not None and mid_epoch and int(getattr(it, "_num_workers", 0)) > 0:
            self._check_workers(it, sampler)

    def _check_workers(self, it: Any, sampler: Any) -> None:
        """CK-D090 when the dataset draws from the global RNG in the loader's workers.

        Each worker seeds its generators from the base seed this ``iter()`` drew, and its
        streams then move with every sample it loads: in the uninterrupted run the worker
        loading the next batch was seeded at the epoch's start and had loaded others
        since. No saved state reproduces that, so the guard asks whether it matters: it
        loads the next sample twice, in this process, under two seeds of every global
        generator (the training streams are put back). Equal: the dataset draws nothing
        (nothing to say). Different: augmentation differs from here to the epoch's end.
        """
        index = (sampler.next_indices(1) or [None])[0]
        dataset = getattr(it, "_dataset", None)
        if index is None or dataset is None:
            return
        differs = draws_in_getitem(dataset, index)
        if differs is None:
            self._note_unknown(f"whether {type(dataset).__name__}.__getitem__ draws from the "
                               "global RNG in the DataLoader's workers (loading it failed)")
            return
        if differs:
            self._add(codes.D090, f"the DataLoader's {it._num_workers} workers are seeded from "
                      "the base seed this resumed iter() drew, not where the saved run's "
                      f"workers stood in epoch {sampler.epoch}, and "
                      f"{type(dataset).__name__}.__getitem__ draws from the global RNG "
                      f"(sample {index} differs under two seeds): every augmented sample "
                      "until the epoch's end differs from the uninterrupted run")

    def _check_first_ids(self, sampler: Any) -> None:
        """CK-D002 when the restored sampler's first pass is not the one the checkpoint named.

        The ids it handed out since the restore (in the pass running now: a loop that
        skipped to another epoch counts from that epoch's start) are compared with the
        saved next ids; none at all means the loop iterates another sampler.
        """
        start = self._cursor0
        if start is None or not callable(getattr(sampler, "consumed_between", None)):
            return
        now = sampler.state_dict()
        if (now["epoch"], now["offset"]) != (start["epoch"], start["offset"]):
            start = {**now, "position": 0}
        got = [i for _, i in sampler.consumed_between(start, now, limit=MAX_K)]
        want = list(self.saved["sample_ids"])
        if not got:
            self._add(codes.D002, "the restored sampler handed out no sample before the first "
                      "optimizer step: the DataLoader iterates another sampler (a new one "
                      "built after the restore starts the data order over)")
            return
        n = min(len(got), len(want))
        if got[:n] != want[:n]:
            self._add(codes.D002, "the first resumed step: " + _ids_message(want[:n], got[:n])
                      + f" (the restored sampler is in epoch {now['epoch']})")

    def _on_any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self.on_first_step(optimizer)
        except Exception as e:  # a check inside the user's optimizer.step(): never break training
            log.debug("ckptkit resume guard: first-step check skipped: %s", e)
            self.close()

    def on_first_step(self, optimizer: torch.optim.Optimizer) -> None:
        """At the first optimizer step after the restore (the guard's own pre-hook).

        Which objects train: the restored optimizer, one rebuilt over the restored
        parameters (CK-D005), or one over other parameters while the restored model has no
        gradient (CK-D091: model and optimizer rebuilt after the restore); the optimizer of
        another model (a GAN's second one) is let pass. Then what the step uses: the LR of
        every param group (CK-D003: changed by hand after the restore), the step count
        (CK-D005), the GradScaler calling it (CK-D004), and whether the restored sampler
        handed out anything (CK-D002: the loader iterates another sampler).
        """
        ts = self._state
        if ts is None:
            self.close()
            return
        mine = optimizer is ts.optimizer
        stepping = [p for g in optimizer.param_groups for p in g["params"]]
        params = {id(p) for p in stepping}
        trained = [p for p in ts.model.parameters() if p.requires_grad]
        unused = bool(trained) and all(p.grad is None for p in trained)
        model_params = {id(p) for p in trained}
        # A model rebuilt after the restore: an optimizer over other parameters of the very
        # shapes of the restored model's, which has no gradient. (Another model in this
        # process, say the next experiment of a notebook, rarely has the same shapes; and
        # the watch stops after FOREIGN_STEPS steps of other optimizers.)
        rebuilt = unused and not params & model_params and _shapes(stepping) == _shapes(trained)
        if ts.optimizer is None and params & model_params and not unused:
            self.close()  # an optimizer the TrainState does not hold: the restore said so
            return
        if not mine:
            restored = (
                {id(p) for g in ts.optimizer.param_groups for p in g["params"]}
                if ts.optimizer is not None else set()
            )
            if not params & restored and not rebuilt:
                self._foreign_steps += 1  # another model's optimizer: wait for ours
                if self._foreign_steps >= FOREIGN_STEPS:
                    self._note_unknown("the first resumed step: the restored optimizer did not "
                                       f"step in the first {FOREIGN_STEPS} optimizer steps")
                    self.close()
                return
        self.close()
        if not unused:
            self._check_weights(ts)
        if unused:
            self._add(codes.D091, f"the first optimizer step after the restore ({type(optimizer).__name__}) "
                      "finds no gradient on any parameter of the restored model: the model "
                      "trained is not the restored one (rebuilt after mgr.restore()), so "
                      "training starts from fresh weights")
            return
        if not mine:
            if not self._stepped:
                self.on_optimizer_step(None, optimizer, calling_scaler())
            return
        told = {f.code for f in self.findings}
        lr = [float(g["lr"]) for g in optimizer.param_groups]
        if codes.D003 not in told and "lr" in self.saved and not _same_floats(self.saved["lr"], lr):
            self._add(codes.D003, f"the first resumed step uses LR {lr}, the checkpoint recorded "
                      f"{self.saved['lr']}: changed after the restore")
        step = _opt_step(optimizer)
        want = self.saved.get("opt_step")
        if codes.D005 not in told and isinstance(want, int) and step is not None and step < want:
            self._add(codes.D005, f"optimizer step count {step} at the first resumed step, the "
                      f"checkpoint recorded {want}: its state was reset after the restore")
        if self.per_rank and codes.D002 not in told and "sample_ids" in self.saved:
            self._check_first_ids(ts.sampler)
        if not self._stepped:
            self.on_optimizer_step(None, optimizer, calling_scaler())

    def _check_weights(self, ts: TrainState) -> None:
        """CK-D092 when model parameters changed between the restore and the first
        optimizer step: loaded from elsewhere (pretrained weights over the resumed ones),
        cast, re-initialised or set back after ``mgr.restore()``. Parameters do not change
        in a forward or backward, so until the first step they are what the restore left.
        """
        if not self._weights:
            return
        now = weights_fingerprint(ts.model)
        changed = [n for n, d in self._weights.items() if n in now and now[n] != d]
        if not changed:
            return
        shown = ", ".join(changed[:MAX_NAMED]) + (
            f" and {len(changed) - MAX_NAMED} more" if len(changed) > MAX_NAMED else "")
        self._add(codes.D092, f"{len(changed)} of {len(self._weights)} model parameters "
                  f"changed between the restore and the first optimizer step ({shown}): the "
                  "first resumed step trains other weights than the checkpoint's")

    # --- the first resumed step (StepObserver listener) ---------------------------------

    def on_step_start(self, observer: StepObserver, snapshot: rngtrace.RngSnapshot) -> None:
        """At the first step after the restore: did anything draw since the restore?

        Draws the saving run also made there (its ``rng_gaps``) are expected; any other
        draw, or a generator re-seeded, is CK-D008 with the call that likely drew. After the
        fetch (``forward``), the fetch's own draws that depend on the batch are not judged
        (:func:`_fetch_draws`), and restored streams nothing drew from where the saving
        run's fetch always drew are CK-D008 (:meth:`_check_fetch_drew`).
        """
        if self._started or self._restored is None:
            return
        self._started = True
        if self._rng_told or not self.per_rank or not self.saved.get("rng"):
            return
        draws = rngtrace.draws_between(self._restored, snapshot, seeds=self.seeds)
        expected = self.saved.get("rng_gaps")
        if not draws:
            self._check_fetch_drew(observer, expected)
            return
        reseeded = any(d.words is None for d in draws.values())
        if not reseeded:
            if not isinstance(expected, list):
                return  # the saving run did not say what it draws between steps
            if rngtrace.pattern(draws) in (expected or [{}]):
                return
            if self._epoch_end and rngtrace.pattern(draws) == {"torch": 2}:
                return  # the next epoch's iter(DataLoader): the saved run drew it there too
            if _fetch_draws(observer.point, expected, draws):
                self._note_unknown(
                    f"the draws between the restore and the first resumed step "
                    f"({rngtrace.pattern(draws)}): the step starts at its first forward, after "
                    "the batch was fetched, and the saved run's fetches drew from the same "
                    f"generators in amounts that depend on the batch ({expected}); a draw "
                    "inside Dataset.__getitem__ in this process is part of the step, so "
                    "this is not judged")
                return
        what, fix = rngtrace.explain(draws)
        at = observer.point or "the first step"
        usual = ""
        if isinstance(expected, list) and expected and expected != [{}]:
            usual = f" (the saved run drew {expected} there)"
        self._add(codes.D008, f"{what}; seen at the start of the first resumed step "
                  f"({at}){usual}", hint=fix)

    def _check_fetch_drew(self, observer: StepObserver, expected: Any) -> None:
        """CK-D008 when nothing drew from the restored streams before the first resumed step
        although the saving run's fetch drew there at every step it observed.

        With the step starting at the first forward, the batch was fetched in between; a
        fetch that always drew (augmentation in ``__getitem__`` on the global RNG) and now
        drew nothing from the restored streams drew from other ones: the RNG was restored
        (or set back) after the batch was fetched, or the batch was fetched before the restore.
        """
        if (observer.point != "forward" or self._epoch_end or not isinstance(expected, list)
                or not expected or any(not p for p in expected)):
            return
        self._add(codes.D008, "nothing drew from the restored generators before the first "
                  "resumed step's forward, while the saved run's batch fetch drew there at "
                  f"every step ({expected}): the first resumed batch drew from other random "
                  "streams (the RNG restored, or set back, after the batch was fetched; or the "
                  "batch fetched before the restore); seen at the start of the first resumed "
                  "step (forward)",
                  hint="restore the RNG (mgr.restore()) before the DataLoader fetches the first "
                  "resumed batch, and do not set the generators' states after it")

    def on_optimizer_step(
        self, observer: StepObserver | None, optimizer: torch.optim.Optimizer, scaler: Any
    ) -> None:
        """At the first optimizer step after the restore: is it the restored optimizer and
        does the GradScaler calling it hold the saved scale and growth tracker?"""
        if self._stepped:
            return
        self._stepped = True
        ts = self._state
        if ts is not None and ts.optimizer is not None and optimizer is not ts.optimizer:
            self._add(codes.D005, f"the optimizer stepping the model is a new "
                      f"{type(optimizer).__name__}, not the one restored: its moments and step "
                      "count start from zero (rebuilt after mgr.restore())")
        s = self.saved
        st = scaler_state(scaler)
        if st is None or "loss_scale" not in s:
            return
        scale, tracker = st
        want_g = s.get("scale_growth")
        if scale == s["loss_scale"] and (want_g is None or tracker == want_g):
            return
        how = ("the GradScaler is not in the TrainState, so it was not saved"
               if s.get("scaler") or (ts is not None and ts.scaler is None)
               else "it is not the restored one" if ts is not None and scaler is not ts.scaler
               else "it was changed after the restore")
        self._add(codes.D004, f"the GradScaler stepping the optimizer has scale {scale} and "
                  f"growth tracker {tracker}, the checkpoint recorded {s['loss_scale']} and "
                  f"{want_g}: {how}; its next growth or back-off comes at another step",
                  hint="pass scaler= to TrainState and use that scaler after the restore")

    def observe(self, step: int, record: Mapping[str, Any]) -> list[Finding]:
        """Check one of the first K step records after the resume (Recorder hook)."""
        k = int(self.saved.get("k", DEFAULT_K))
        if self._seen_steps >= k:
            return []
        before = len(self.findings)
        first = self._seen_steps == 0
        self._seen_steps += 1
        if first:
            want = self.saved.get("next_step")
            if want is not None and step != want:
                self._add(codes.D001, f"first logged step after resume is {step}, expected {want}")
            lr = record.get("lr")
            saved_lr = self.saved.get("lr") or []
            told = any(f.code == codes.D003 for f in self.findings)
            if (lr is not None and saved_lr and not told
                    and not _same_floats([float(lr)], [saved_lr[0]])):
                self._add(codes.D003, f"first step used LR {lr!r}, the checkpoint recorded "
                          f"{saved_lr[0]!r}")
        ost, saved_ost = record.get("opt_step"), self.saved.get("opt_step")
        if first and isinstance(ost, int) and isinstance(saved_ost, int) and ost < saved_ost:
            self._add(codes.D005, f"optimizer step count is {ost} after the first resumed step, "
                      f"the checkpoint recorded {saved_ost} before it (moments reset)")
        ids = record.get("sample_ids")
        if self.per_rank and ids is not None and "sample_ids" in self.saved:
            flat = [_sample_id(x) for x in ids]
            want_all = list(self.saved["sample_ids"])
            lo = len(self._ids_seen)
            self._ids_seen += flat
            want = want_all[lo : lo + len(flat)]
            if want and flat[: len(want)] != want:
                self._add(codes.D002, _ids_message(want, flat[: len(want)]))
                self._seen_steps = k  # one report is enough
        return self.findings[before:]


def _fetch_draws(point: str | None, expected: Any, draws: Mapping[str, Any]) -> bool:
    """Whether draws seen at a step start taken after the fetch are the fetch's own.

    At ``forward`` the batch was fetched since the restore; where the saving run's fetches
    drew from the same generators in amounts that changed from step to step (more than one
    pattern: draws that depend on the batch, such as noise per token of variable-length
    samples), the resumed fetch's amount cannot be predicted, so an advance (not a re-seed)
    of those generators is the step's own draw, not a drift.
    """
    if point != "forward" or not isinstance(expected, list) or len(expected) < 2:
        return False
    drew = {k for p in expected if isinstance(p, Mapping) for k in p}
    return set(draws) <= drew and all(getattr(d, "words", None) for d in draws.values())


def weights_fingerprint(model: torch.nn.Module) -> dict[str, str]:
    """A digest of every parameter of ``model`` (its local shard, for a DTensor), by name.

    Dtype, shape and bytes (:func:`~ckptkit.capture.tree_fingerprint`), so a cast, a
    weight loaded from elsewhere or one step of training all change it.

    Example:
        >>> m = torch.nn.Linear(2, 1)
        >>> before = weights_fingerprint(m)
        >>> with torch.no_grad():
        ...     _ = m.bias.add_(1.0)
        >>> [n for n, d in weights_fingerprint(m).items() if before[n] != d]
        ['bias']
    """
    out: dict[str, str] = {}
    for name, p in model.named_parameters():
        t = p.detach()
        local = getattr(t, "to_local", None)
        out[name] = tree_fingerprint(local() if callable(local) else t)
    return out


def _shapes(params: Sequence[torch.Tensor]) -> list[tuple[int, ...]]:
    return sorted(tuple(p.shape) for p in params)


def _drew_base_seed(it: Any, restored: rngtrace.RngSnapshot) -> bool:
    """Whether the DataLoader iterator ``it`` drew its base seed from the restored global
    torch RNG: its ``_base_seed`` is the first 64-bit draw from that state (a loader with
    a ``generator=`` drew from its own, and a draw by anything else leaves another value)."""
    seed = getattr(it, "_base_seed", None)
    if seed is None:
        return False
    g = torch.Generator()
    g.set_state(torch.frombuffer(bytearray(restored.torch_cpu), dtype=torch.uint8))
    return bool(torch.empty((), dtype=torch.int64).random_(generator=g).item() == seed)


def draws_in_getitem(dataset: Any, index: int) -> bool | None:
    """Whether ``dataset[index]`` depends on the global RNG (None: loading it failed).

    The item is loaded twice in this process, after seeding torch, Python and NumPy's global
    generators with 1 and then 2; every generator is put back afterwards.

    Example:
        >>> draws_in_getitem([torch.ones(2)], 0)
        False
    """
    py, npy = random.getstate(), np.random.get_state()
    try:
        seen = []
        with torch.random.fork_rng(devices=[]):
            for seed in (1, 2):
                torch.manual_seed(seed)
                random.seed(seed)
                np.random.seed(seed)
                seen.append(tree_fingerprint({"item": dataset[index]}))
    except Exception as e:  # a dataset that cannot load here: unknown, never a crash
        log.debug("ckptkit resume guard: loading sample %s to test it failed: %s", index, e)
        return None
    finally:
        random.setstate(py)
        np.random.set_state(npy)
    return seen[0] != seen[1]


def _sample_id(x: Any) -> int:
    # Records hold bare ids or (epoch, id, content hash) triples.
    if isinstance(x, (list, tuple)) and len(x) >= 2:
        return int(x[1])
    return int(x)


def _same_floats(a: Any, b: Any) -> bool:
    if not isinstance(a, Sequence) or not isinstance(b, Sequence) or len(a) != len(b):
        return False
    return all(float(x) == float(y) for x, y in zip(a, b, strict=True))


def _ids_message(want: Sequence[int], got: Sequence[int] | None) -> str:
    if got is None:
        return "the sampler cannot say which samples come next (no cursor)"
    want_l, got_l = list(want), list(got)
    replay = len(set(got_l) - set(want_l))
    return (f"next sample ids {got_l[:4]}… differ from the recorded {want_l[:4]}… "
            f"({replay} of {len(got_l)} not the expected ones: data replayed, skipped or "
            "reshuffled)")


def attach(recorder: Any, guard: ResumeGuard) -> None:
    """Feed ``recorder``'s first records to ``guard`` (a recorder subscription).

    With a Recorder bound to the TrainState, the guard also hears the first step's start
    and optimizer step, and its findings (those of the restore included) go into the next
    step records as ``guard`` entries. A second restore in the same process replaces the
    first restore's guard (one subscription under :data:`SUBSCRIPTION_KEY`); other
    subscribers, such as a stability watch, are untouched, and detaching them leaves the
    guard subscribed.
    """
    if recorder is None:
        return
    obs = getattr(recorder, "observer", None)
    if isinstance(obs, StepObserver):
        guard._observed = True
        obs.add_listener(guard)
        guard._sink = obs.note
        obs.note(guard.findings)
    subscribe = getattr(recorder, "subscribe", None)
    if subscribe is None:
        # TrainState takes any object as its recorder; one without subscriptions is not a
        # ckptkit Recorder and writes no records the guard could check.
        log.debug("ckptkit resume guard: %s takes no subscribers", type(recorder).__name__)
        return

    def check(event: Logged) -> None:
        try:
            guard.observe(event.step, event.record)
        except (TypeError, ValueError) as e:  # a record in unexpected units: never break training
            log.debug("ckptkit resume guard skipped a record: %s", e)

    subscribe(check, key=SUBSCRIPTION_KEY)
