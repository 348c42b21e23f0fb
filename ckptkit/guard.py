"""The resume guard: every real resume checked, not only drills.

At save time the manifest records a short *look-ahead* of what the run will do next:
the step label, the LR of every param group, the loss scale, the optimizer step count,
an RNG fingerprint, the next K sample ids the sampler will yield, and the loss of a
fixed probe batch (when the user gives one). On restore the same look-ahead is
computed from the restored objects and compared; over the first K steps the Recorder's
records are compared too. Any mismatch is a ``CK-D`` finding that names the component
(sampler replay or skip, scheduler offset, weights not what was saved ...).

Cost: a look-ahead peeks the sampler (no data is loaded) and hashes the RNG states
(a few KiB); the probe is one forward pass in eval mode without grad.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

from ckptkit.verify.findings import CODES, Finding

if TYPE_CHECKING:
    from ckptkit.capture.state import TrainState

log = logging.getLogger("ckptkit")

GUARD_KEY = "guard"
"""Key of the automatic look-ahead inside the manifest's ``lookahead`` object."""
DEFAULT_K = 8
PROBE_RTOL = 1e-6
"""Relative tolerance of the probe loss (bitwise where the run is deterministic)."""

ProbeFn = Callable[[torch.nn.Module], Any]

def _fp(data: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def rng_fingerprint() -> str:
    """A short fingerprint of this process's Python, NumPy and torch (CPU, CUDA) RNG states."""
    parts = [
        repr(random.getstate()).encode(),
        np.random.get_state(legacy=True)[1].tobytes(),  # type: ignore[index]
        torch.get_rng_state().numpy().tobytes(),
    ]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        parts += [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return _fp(b"|".join(parts))


def _opt_step(opt: torch.optim.Optimizer) -> int | None:
    steps = []
    for st in opt.state.values():
        s = st.get("step") if isinstance(st, dict) else None
        if isinstance(s, torch.Tensor):
            steps.append(int(s.item()))
        elif isinstance(s, (int, float)):
            steps.append(int(s))
    return max(steps) if steps else 0


def probe_loss(model: torch.nn.Module, probe: ProbeFn) -> float:
    """Run ``probe(model)`` in eval mode without grad and return its loss as a float.

    Train/eval mode is put back afterwards, so dropout state is untouched.
    """
    was = model.training
    model.eval()
    try:
        # fork_rng: a probe that draws random numbers must not move the training streams.
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = probe(model)
    finally:
        model.train(was)
    return float(out.item() if isinstance(out, torch.Tensor) else out)


def compute(ts: TrainState, *, k: int = DEFAULT_K, probe: ProbeFn | None = None) -> dict[str, Any]:
    """Return the look-ahead of ``ts``: what the next step will use.

    Example:
        >>> import torch, ckptkit
        >>> m = torch.nn.Linear(2, 1)
        >>> ts = ckptkit.TrainState(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1), step=3)
        >>> la = compute(ts); la["next_step"], la["lr"]
        (4, [0.1])
    """
    out: dict[str, Any] = {"k": k, "next_step": ts.step + 1, "rng": rng_fingerprint()}
    if ts.optimizer is not None:
        out["lr"] = [float(g["lr"]) for g in ts.optimizer.param_groups]
        out["opt_step"] = _opt_step(ts.optimizer)
    if ts.scheduler is not None and hasattr(ts.scheduler, "last_epoch"):
        out["sched_epoch"] = int(ts.scheduler.last_epoch)
    if ts.scaler is not None and ts.scaler.is_enabled():
        out["loss_scale"] = float(ts.scaler.get_scale())
    peek = getattr(ts.sampler, "next_indices", None)
    if callable(peek):
        out["sample_ids"] = [int(i) for i in peek(k)]
        out["epoch"] = int(getattr(ts.sampler, "epoch", 0))
    if probe is not None:
        out["probe_loss"] = probe_loss(ts.model, probe)
    return out


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
    _seen_steps: int = 0
    _ids_seen: list[int] = field(default_factory=list)

    def _add(self, code: str, message: str) -> None:
        f = CODES[code].finding(message)
        self.findings.append(f)
        log.warning("ckptkit resume guard: %s %s. Fix: %s", code, message, f.hint)

    def check_restored(self, ts: TrainState) -> list[Finding]:
        """Compare the freshly restored objects with the saved look-ahead; return new findings."""
        before = len(self.findings)
        now = compute(ts, k=int(self.saved.get("k", DEFAULT_K)),
                      probe=self.probe if "probe_loss" in self.saved else None)
        s = self.saved
        if s.get("next_step") != now["next_step"]:
            self._add("CK-D001", f"next step will be {now['next_step']}, the checkpoint "
                      f"recorded {s.get('next_step')}")
        if self.per_rank and "sample_ids" in s and now.get("sample_ids") != s["sample_ids"]:
            self._add("CK-D002", _ids_message(s["sample_ids"], now.get("sample_ids")))
        if "lr" in s and not _same_floats(s["lr"], now.get("lr")):
            self._add("CK-D003", f"next LR {now.get('lr')}, the checkpoint recorded {s['lr']}")
        if "sched_epoch" in s and s["sched_epoch"] != now.get("sched_epoch"):
            self._add("CK-D003", f"scheduler position {now.get('sched_epoch')}, the checkpoint "
                      f"recorded {s['sched_epoch']} (its LR schedule restarts or is offset)")
        if "loss_scale" in s and s["loss_scale"] != now.get("loss_scale"):
            self._add("CK-D004", f"loss scale {now.get('loss_scale')}, the checkpoint recorded "
                      f"{s['loss_scale']}")
        if "opt_step" in s and s["opt_step"] != now.get("opt_step"):
            self._add("CK-D005", f"optimizer step {now.get('opt_step')}, the checkpoint "
                      f"recorded {s['opt_step']}")
        if self.per_rank and s.get("rng") and s["rng"] != now["rng"]:
            self._add("CK-D006", "RNG fingerprint differs from the one recorded at save")
        if "probe_loss" in s and "probe_loss" in now:
            a, b = float(s["probe_loss"]), float(now["probe_loss"])
            if not math.isclose(a, b, rel_tol=PROBE_RTOL, abs_tol=0.0):
                self._add("CK-D007", f"probe loss {b!r}, the checkpoint recorded {a!r}")
        return self.findings[before:]

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
                self._add("CK-D001", f"first logged step after resume is {step}, expected {want}")
            lr = record.get("lr")
            saved_lr = self.saved.get("lr") or []
            if lr is not None and saved_lr and not _same_floats([float(lr)], [saved_lr[0]]):
                self._add("CK-D003", f"first step used LR {lr!r}, the checkpoint recorded "
                          f"{saved_lr[0]!r}")
        ost, saved_ost = record.get("opt_step"), self.saved.get("opt_step")
        if first and isinstance(ost, int) and isinstance(saved_ost, int) and ost < saved_ost:
            self._add("CK-D005", f"optimizer step count is {ost} after the first resumed step, "
                      f"the checkpoint recorded {saved_ost} before it (moments reset)")
        ids = record.get("sample_ids")
        if self.per_rank and ids is not None and "sample_ids" in self.saved:
            flat = [_sample_id(x) for x in ids]
            want_all = list(self.saved["sample_ids"])
            lo = len(self._ids_seen)
            self._ids_seen += flat
            want = want_all[lo : lo + len(flat)]
            if want and flat[: len(want)] != want:
                self._add("CK-D002", _ids_message(want, flat[: len(want)]))
                self._seen_steps = k  # one report is enough
        return self.findings[before:]


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
    """Make ``recorder.log`` feed its first records to ``guard`` (wraps the bound method)."""
    if recorder is None:
        return
    # Unwrap an earlier guard (a second restore in the same process) instead of stacking.
    inner = getattr(recorder.log, "__ckptkit_inner__", recorder.log)

    def log_and_check(step: int, **metrics: Any) -> Any:
        out = inner(step, **metrics)
        try:
            guard.observe(step, metrics)
        except (TypeError, ValueError) as e:  # a record in unexpected units: never break training
            log.debug("ckptkit resume guard skipped a record: %s", e)
        return out

    log_and_check.__ckptkit_inner__ = inner  # type: ignore[attr-defined]
    recorder.log = log_and_check
