"""The statistical mode of the twin check: noise measured from the save by control runs.

Synthetic step records (no processes): the tolerance is per step and per field, grows only
as the runs do, never falls below a few ulps, and fresh references that disagree only
inform.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

import ckptkit
from ckptkit.drill.compare import F32_EPS, FLOOR_ULPS, NoiseFloor, twin
from ckptkit.drill.endstate import end_state
from ckptkit.drill.noisefloor import control_noise, differing_generators, noise_floor

W, N = 4, 6


def run(deltas: list[float], *, base: float = 2.0, rng: str = "r", start: int = W) -> list[dict]:
    """Records W+1..W+N whose loss is ``base - 0.01*k + deltas[k]``."""
    return [{"step": start + 1 + k, "loss": base - 0.01 * k + d, "grad_norm": 1.0 + d,
             "lr": 0.1, "rng": f"{rng}{k}", "batch_hash": f"b{k}"}
            for k, d in enumerate(deltas)]


def test_the_tolerance_is_per_step_and_grows_only_as_the_runs_do() -> None:
    resumed = run([0.0, 1e-6, 2e-6, 4e-6, 8e-6, 1.6e-5])
    control = run([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    nf = control_noise(NoiseFloor(runs=1), resumed, [control], start=W, stop=W + N)
    assert nf.source == "control" and not nf.deterministic
    env = nf.per_step["loss"]
    assert env == sorted(env)  # never shrinks
    # A step sees up to 3 steps ahead, no further; the last ones see the end.
    assert math.isclose(env[0], 4e-6) and math.isclose(env[1], 8e-6)
    assert math.isclose(env[-1], 1.6e-5) and math.isclose(env[-3], 1.6e-5)
    # The fault-free reference lies within the noise at every step ...
    ok = twin(run([0.0, -1e-6, 3e-6, -2e-6, 1e-5, -2e-5]), resumed, start=W, stop=W + N,
              noise=nf)
    assert ok.ok, ok.detail
    # ... a difference at the first step, where the controls agree, is beyond it.
    bad = twin(run([1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4]), resumed, start=W, stop=W + N,
               noise=nf)
    assert not bad.ok and bad.detail["first_divergence"]["step"] == W + 1
    assert "per step" in bad.detail["modes"]["loss"]


def test_values_the_controls_agree_on_may_still_differ_by_a_few_ulps() -> None:
    resumed = run([0.0] * N)
    control = [{**r, "grad_norm": r["grad_norm"] + 1e-3} for r in resumed]  # noisy field
    nf = control_noise(NoiseFloor(runs=1), resumed, [control], start=W, stop=W + N)
    assert nf.per_step["loss"] == [0.0] * N and not nf.deterministic
    one_ulp = [{**r, "loss": r["loss"] * (1 + F32_EPS)} for r in resumed]
    assert twin(one_ulp, resumed, start=W, stop=W + N, noise=nf).ok
    more = [{**r, "loss": r["loss"] * (1 + 4 * FLOOR_ULPS * F32_EPS)} for r in resumed]
    assert not twin(more, resumed, start=W, stop=W + N, noise=nf).ok
    # A deterministic run (controls bitwise) stays bitwise: no floor.
    nf_bitwise = control_noise(NoiseFloor(runs=1), resumed, [resumed], start=W, stop=W + N)
    assert nf_bitwise.deterministic and "bitwise" in nf_bitwise.action
    assert not twin(one_ulp, resumed, start=W, stop=W + N, noise=nf_bitwise).ok


def test_inputs_stay_bitwise_and_fresh_references_that_disagree_only_inform() -> None:
    ref0 = [{"step": s, "loss": 1.0, "rng": "a"} for s in range(1, W + N + 1)]
    ref1 = [{"step": s, "loss": 1.0, "rng": "b"} for s in range(1, W + N + 1)]
    base = noise_floor([ref0, ref1], start=W, stop=W + N)
    base.generators = [{"name": "python", "why": "Python's `random` is not seeded by the "
                        "script", "fix": "call random.seed(SEED) at the start of the script"}]
    # Without controls, the legacy message now names the generator.
    legacy = twin(ref0, ref0[W:], start=W, stop=W + N, noise=base)
    assert not legacy.ok and "Python's `random`" in legacy.detail["not_judgeable"]["rng"]
    resumed = ref0[W:]
    nf = control_noise(base, resumed, [resumed], start=W, stop=W + N)
    assert nf.reference_noisy == ["rng"] and "Python's `random` is not seeded" in nf.action
    assert twin(ref0, resumed, start=W, stop=W + N, noise=nf).ok
    wrong_rng = [{**r, "rng": "c"} for r in resumed]
    assert not twin(ref0, wrong_rng, start=W, stop=W + N, noise=nf).ok


def test_two_restores_that_disagree_at_their_first_step_are_not_judged() -> None:
    resumed = run([0.0] * N)
    reinit = run([0.5] * N)  # a layer re-initialised at random after the restore
    nf = control_noise(NoiseFloor(runs=1), resumed, [reinit], start=W, stop=W + N)
    t = twin(resumed, resumed, start=W, stop=W + N, noise=nf)
    assert not t.ok and "restore itself is random" in t.detail["not_judgeable"]["loss"]


def _save(d: Path, w: torch.Tensor, step: int, seed: int | None = None) -> Path:
    import random

    torch.manual_seed(0)
    m = torch.nn.Linear(2, 2, bias=False)
    if seed is not None:
        random.seed(seed)
    with torch.no_grad():
        m.weight.copy_(w)
    mgr = ckptkit.CheckpointManager(d)
    mgr.save(ckptkit.TrainState(model=m, step=step))
    mgr.close()
    return d / f"step-{step:08d}"


def test_end_state_measures_noise_on_the_controls_and_names_the_moved_tensors(
    tmp_path: Path,
) -> None:
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    ref = _save(tmp_path / "ref", w, 5)
    far_ref = _save(tmp_path / "ref1", w + 1.0, 5)  # a fresh reference, far off
    resumed = _save(tmp_path / "res", w + 1e-3, 5)
    control = _save(tmp_path / "ctl", w + 1e-3 + 1e-6, 5)
    # Fresh references drifted far apart: the legacy tolerance lets 1e-3 through.
    assert end_state([ref, far_ref], resumed).ok
    # Controls from the same checkpoint: 1e-3 is far beyond their noise, and named.
    es = end_state([ref, far_ref], resumed, controls=[control])
    assert not es.ok and es.detail["noise"]["source"] == "control"
    assert es.detail["moved"][0]["tensor"] == "model/weight"
    # One ulp off the reference where the control agrees with the resumed run bitwise:
    # within the floor (controls are passed for a run that is not bitwise) ...
    ulp = _save(tmp_path / "ulp", torch.nextafter(w, w + 1), 5)
    ctl_same = _save(tmp_path / "ctl2", torch.nextafter(w, w + 1), 5)
    assert end_state([ref], ulp, controls=[ctl_same]).ok
    # ... and only without controls (a bitwise run) is one ulp a difference.
    assert not end_state([ref], ulp).ok


def test_the_generator_a_fresh_start_does_not_seed_is_named(tmp_path: Path) -> None:
    a = _save(tmp_path / "a", torch.eye(2), 3, seed=1)
    b = _save(tmp_path / "b", torch.eye(2), 3, seed=2)
    gens = differing_generators(a, b)
    assert [g["name"] for g in gens] == ["python"]
    assert gens[0]["why"] == "Python's `random` is not seeded by the script"
    assert "random.seed" in gens[0]["fix"]
    assert differing_generators(a, a) == []
    assert math.isfinite(F32_EPS)
