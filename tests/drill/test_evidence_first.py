"""Evidence before names (issue 37, item 2), on synthetic records shaped like the reported runs.

What was observed directly (sample ids and order, the data cursor, RNG fingerprints at step
start, the resume guard's findings, the LR per step, optimizer step counts) outweighs what
is inferred (batch rows and hashes); a component the run does not have is never named; a
continuity item never fails on equal values. The drilled versions of these cases (a script
written independently of the bundled ones) are in tests/drill/test_evidence_drills.py.
"""

from __future__ import annotations

from typing import Any

from ckptkit.drill.compare import twin
from ckptkit.drill.continuity import continuity
from ckptkit.drill.diagnose import WORKERS_RNG, diagnose
from ckptkit.drill.exposure import exposure

W, N = 6, 6
FWD = "forward"
RESEEDED = ("CK-D008 torch was re-seeded (torch.manual_seed(5), then 70 words drawn); python "
            "was re-seeded (random.seed(5), then 4 words drawn): a seed_everything()/"
            "manual_seed() call, or a state load, after the restore; seen at the start of the "
            "first resumed step (forward)")


def rec(s: int, tag: str = "", **kw: Any) -> dict[str, Any]:
    """A record of step ``s``: four samples, rows = augmented samples (``tag`` = another
    augmentation stream), fingerprinted at the first forward."""
    ids = [(s * 4 + k) % 40 for k in range(4)]
    rows = [f"{tag}row{i}@{s}" for i in ids]
    r = {"step": s, "loss": 1.0 / s + (0.01 if tag else 0), "rng": f"{tag}r{s}", "rng_at": FWD,
         "opt_step": s, "lr": 0.1, "rows": rows, "batch_hash": "|".join(rows),
         "sample_ids": [[0, i, f"h{i}"] for i in ids]}
    r.update(kw)
    return r


def run(tag: str = "", first: int = 1, **per_step: dict[int, Any]) -> list[dict[str, Any]]:
    out = []
    for s in range(first, W + N + 1):
        extra = {k: v[s] for k, v in per_step.items() if s in v}
        r = rec(s, tag, **extra)
        for k in [k for k, v in r.items() if v is None]:
            del r[k]
        out.append(r)
    return out


def diag(ref: list[dict[str, Any]], res: list[dict[str, Any]], **kw: Any) -> Any:
    checks = [twin(ref, res, start=W, stop=W + N), exposure(ref, res, start=W, stop=W + N)]
    return diagnose(ref, res, checks, start=W, stop=W + N, **kw)


def guard(message: str, component: str = "rng") -> dict[int, Any]:
    return {W + 1: [{"code": message.split()[0], "component": component, "message": message}]}


def test_reseeded_augmentation_with_the_same_ids_in_the_same_order_is_the_rng() -> None:
    """The reported case: re-seeding after restore, full logging, named ``sampler (medium)``
    ("the data order is not resumed") because one augmented row happened to equal a row the
    reference had at another step, while exposure showed the same ids in the same order."""
    ref = run()
    res = run("aug", W + 1, guard=guard(RESEEDED))
    res[2]["rows"][0] = ref[1]["rows"][0]  # a coincidence: an un-noised row seen elsewhere
    d = diag(ref, res)
    assert (d.component, d.confidence) == ("rng", "high"), d.evidence
    assert "torch.manual_seed(5)" in d.hint  # the generator and the call the guard saw
    assert any("rows only infer the order" in e for e in d.evidence)


def test_manual_seed_after_restore_without_sample_ids_is_the_rng() -> None:
    """busy logging: no sample ids, the cursor filled by the Recorder is equal at every step."""
    ref = run(cursor={s: f"c{s}" for s in range(13)}, sample_ids={s: None for s in range(13)})
    res = run("aug", W + 1, cursor={s: f"c{s}" for s in range(13)},
              sample_ids={s: None for s in range(13)}, guard=guard(RESEEDED))
    res[0]["rows"][1] = ref[0]["rows"][0]
    d = diag(ref, res)
    assert d.component == "rng" and d.confidence in ("high", "medium"), d.evidence


def test_rng_restored_after_the_first_batch_is_fetched_is_the_rng() -> None:
    """A Trainer-style bug (the RNG restored after the first resumed batch is fetched): was
    ``unknown (low) [sampler, rng]``; the guard sees the restored streams did not draw."""
    msg = ("CK-D008 nothing drew from the restored generators before the first resumed step's "
           "forward, while the saved run's batch fetch drew there at every step")
    cur = {s: f"c{s}" for s in range(13)}
    ref = run(cursor=cur, sample_ids={s: None for s in range(13)})
    res = run("aug", W + 1, cursor=cur, sample_ids={s: None for s in range(13)},
              guard=guard(msg))
    d = diag(ref, res)
    assert d.component == "rng" and d.confidence in ("high", "medium"), d.evidence


def test_augmentation_in_loader_workers_is_never_named_sampler_or_data_version() -> None:
    """A loader with 2 workers built after the restore: same ids, same order, same content
    hashes, the main process's RNG equal; only the augmented rows differ (was ``sampler
    (high)`` in the report, ``data-version (medium)`` on this tree's own reproduction)."""
    ref = run()
    res = run("aug", W + 1, rng={s: f"r{s}" for s in range(13)})
    d = diag(ref, res)
    assert (d.component, d.confidence) == ("rng", "medium"), d.evidence
    assert WORKERS_RNG in d.hint
    # Without sample ids or content hashes and no word on the workers: both stay candidates.
    cur = {s: f"c{s}" for s in range(13)}
    ref = run(cursor=cur, sample_ids={s: None for s in range(13)})
    res = run("aug", W + 1, cursor=cur, sample_ids={s: None for s in range(13)},
              rng={s: f"r{s}" for s in range(13)})
    d = diag(ref, res)
    assert (d.component, d.confidence) == ("unknown", "low")
    assert set(d.candidates) == {"data-version", "rng"}


def _accum_counts(reset: bool) -> dict[int, int]:
    """Optimizer steps every 4 micro-steps; saved at micro-step 6 (2 into a window)."""
    if not reset:
        return {s: s // 4 for s in range(1, 13)}
    return {s: 1 + (s - W) // 4 for s in range(W + 1, 13)}


def test_a_reset_accumulation_counter_is_never_the_scaler_in_a_run_without_one() -> None:
    """Was ``scaler (medium)`` ("an fp16 overflow") in a run with no GradScaler."""
    ref = run(opt_step=_accum_counts(False))
    res = run(first=W + 1, opt_step=_accum_counts(True))
    d = diag(ref, res)
    assert d.component != "scaler" and "scaler" not in d.candidates, d
    assert d.component == "progress" or "progress" in d.candidates
    assert "accumulation" in d.hint


def test_continuity_never_fails_on_equal_optimizer_step_counts() -> None:
    """``FAIL opt_step: recorded 20, resumed 20``: the first resumed step of a run that
    accumulates gradients does not step the optimizer."""
    facts = {"step": W, "lookahead": {"guard": {"next_step": W + 1, "opt_step": 20}}}
    r = continuity(facts, [{"step": W + 1, "opt_step": 20}])
    item = next(i for i in r.detail["items"] if i["what"] == "opt_step")
    assert item["ok"] and r.ok
    for got in (19, 22):
        r = continuity(facts, [{"step": W + 1, "opt_step": got}])
        assert not r.ok


def test_a_scheduler_rebuilt_after_the_restore_is_the_scheduler_not_hyperparameters() -> None:
    """Warm-up then constant, a new scheduler after the restore: the resumed LRs are the warm-up's,
    then rejoin the reference (was ``hyperparameters (medium)``: "set by hand")."""
    warm = {1: 0.01, 2: 0.02, 3: 0.03}
    ref = run(lr={s: warm.get(s, 0.04) for s in range(1, 13)})
    res = run(first=W + 1, lr={s: warm.get(s - W, 0.04) for s in range(W + 1, 13)})
    d = diag(ref, res)
    assert (d.component, d.confidence) == ("scheduler", "high"), d.evidence
    # The guard saw the scheduler's position differ: the schedule, whatever the values.
    pos = ("CK-D003 scheduler position 0, the checkpoint recorded 6 (its LR schedule restarts "
           "or is offset)")
    ref = run(lr={s: 0.01 * s for s in range(1, 13)})
    res = run(first=W + 1, lr={7: 0.03, 8: 0.06, **{s: 0.01 * s for s in range(9, 13)}},
              guard=guard(pos, "scheduler"))
    d = diag(ref, res)
    assert d.component == "scheduler", d.evidence
