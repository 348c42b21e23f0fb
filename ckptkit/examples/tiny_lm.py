"""Train a tiny causal transformer LM with ckptkit: resumable bitwise, drillable, fault-injectable.

A real (small) training script written the way a user writes one: a 2-layer causal
transformer (dropout, tied embeddings) on a synthetic, shuffled, variable-length corpus,
AdamW, linear warmup + cosine decay, gradient clipping, optional fp16 autocast with a
``GradScaler``. Everything a resume needs goes into one :class:`~ckptkit.TrainState`; the
:class:`~ckptkit.CheckpointManager` restores the newest checkpoint at start and saves every
``--save-every`` steps; a :class:`~ckptkit.Recorder` logs one JSONL record per step.

Run::

    python -m ckptkit.examples.tiny_lm --steps 200 --ckpt-dir runs/tiny/ckpt \\
        --metrics runs/tiny/metrics.jsonl

Run it again with the same ``--ckpt-dir`` and it continues from the newest checkpoint (and
says so, with the step); on CPU with the same ``--threads`` the continuation is bitwise
identical to an uninterrupted run. Without ``--ckpt-dir`` every invocation is a new run in
a fresh numbered directory, ``runs/tiny_lm/run-NNN/ckpt`` (printed at start), so two
commands in one directory never share checkpoints; ``--resume`` continues the newest of
those runs instead. A resume from a checkpoint whose recorded health is not ``ok``, or one
that already reached ``--steps``, is said on stderr, never silent. Under ``ckptkit drill``
the drill's ``CKPTKIT_CKPT_DIR`` is used as it is.

**Drill contract** (environment variables, read by :mod:`ckptkit.integrations.drill_env`; ``ckptkit
drill`` sets them, nothing else in the script changes):

``CKPTKIT_DRILL_SAVE_AT=W``
    also save a checkpoint exactly after step ``W``;
``CKPTKIT_DRILL_STOP_AT=S``
    stop after step ``S`` (overrides ``--steps`` as the stopping point; the LR schedule still
    spans ``--steps``, so a truncated run follows the same schedule);
``CKPTKIT_DRILL_RESUME_FROM=PATH``
    restore that checkpoint (a ``step-N`` directory, or a run directory for its newest) instead
    of the newest one in ``--ckpt-dir``; new saves still go to ``--ckpt-dir``;
``CKPTKIT_METRICS=PATH``
    the metrics file when ``--metrics`` is not given.

**Step records.** Step ``s`` is the ``s``-th optimizer step (1-based, the label of the record
logged after it and of a checkpoint saved after it). With ``--log minimal`` the script logs
only ``loss`` (one ``rec.log(step, loss=...)`` per step, no look-ahead): the Recorder bound
to the TrainState fills the rest itself (RNG at step start, LR used, optimizer step, loss
scale and growth tracker, batch hash, sample ids with content hashes from
:meth:`Corpus.sample_hash`, data cursor; see :mod:`ckptkit.signals.observe`). ``--log busy`` logs
what a busy user logs (``loss``, ``grad_norm``, ``lr``) and lets the Recorder fill the rest.
With ``--log full``
(the default) each record holds ``loss``,
``grad_norm`` (before clipping), ``lr`` (used for this step), ``loss_scale`` (with
``--amp fp16``), ``tokens``, ``seq_lens``, ``sample_ids``, ``epoch``, ``sample_hashes``
(xxh3-64 of each sample's tokens, 8 hex), ``batch_hash`` (xxh3-64 of the input tensor fed to
the model), ``rows`` (:func:`ckptkit.signals.observe.row_hashes` of the batch's padded sequences),
``rng`` (fingerprint of the torch RNG state before the step) and ``opt_step``
(AdamW's step count after the step). Every checkpoint also records a ``lookahead`` in its
manifest: what the next step will use (``next_step``, ``lr``, ``loss_scale``, ``opt_step``,
``rng``, ``sample_ids``, ``epoch``), in the same units as the records, for the resume guard.

**Faults** (``--fault NAME``, applied right after the restore, only when one happened): the
classic resume bugs, written the way a user writes them:

=====================  ================================================================
``none``               a correct resume
``no-rng``             re-seeds torch/numpy/random after the restore (``set_seed(seed)``)
``no-sampler``         the sampler is left out of the TrainState: data restarts at epoch start
``sampler-reshuffle``  cursor restored into a sampler built with another shuffle seed
``no-scheduler``       the scheduler is left out of the TrainState: it restarts from step 0
``sched-off-by-one``   the scheduler comes back one step behind (``last_epoch - 1``)
``no-moments``         AdamW state (moments, step counts) dropped after the restore
``no-scaler``          the GradScaler is left out of the TrainState (visible with fp16)
``step-reset``         the global step counter reset to 0 while the weights are restored
``data-version``       the corpus is regenerated with another ``--data-version``
``lr-changed``         the learning rate (param groups and base LRs) ×1.1 after the restore
=====================  ================================================================

**An instability** (``--fault lr-spike``, not a resume bug): from ``--spike-at`` (default
40 % of ``--steps``, which defaults to 1500 here) the schedule's LR multiplier climbs
geometrically to ``--spike-peak`` (1000) over ``--spike-ramp`` (100) steps and is held
``--spike-hold`` steps (default: to the end): the gradient norm and the loss build up for
a few dozen steps, then the loss diverges for good. (A slower ramp builds for hundreds of
steps, but damages the model before the watch warns: see ``docs/stability.md``.) ``--watch`` feeds loss and grad norm to a default
:class:`~ckptkit.signals.stability.StabilityWatch` (health in every manifest, an emergency
checkpoint on the first warning); ``--auto-recover`` adds the default
:class:`~ckptkit.signals.recovery.RecoveryPolicy`: on a critical verdict the manager rolls back to
the newest healthy checkpoint, lowers the LR and the clip norm, skips the batches seen since
the first warning and continues (``docs/stability.md``). The summary then also lists the
recoveries, and ``final_loss_avg`` (the mean loss of the last 50 steps) compares runs::

    python -m ckptkit.examples.tiny_lm --fault lr-spike --auto-recover --ckpt-dir runs/spike

**Data parallelism.** Launched by ``torchrun`` (``WORLD_SIZE`` > 1) or with ``--ddp``, the
script joins a process group (gloo on CPU, NCCL on CUDA), wraps the model in
``DistributedDataParallel``, gives each rank its share of the epoch through the
``ResumableSampler`` (``--batch-size`` is per rank) and seeds each rank's dropout stream
differently. Rank 0 writes the metrics: ``loss`` is averaged over ranks, ``sample_ids``,
``sample_hashes``, ``rows`` and ``seq_lens`` are every rank's batch in rank order
(``rank_sample_ids`` keeps them per rank), ``batch_hash`` and ``rng`` cover every rank. So a drill compares the
exposure of each rank::

    ckptkit drill -- torchrun --standalone --nproc-per-node 2 -m ckptkit.examples.tiny_lm

At the end the script prints one JSON line: ``final_step``, ``final_loss``, ``param_hash``
(xxh3-64 over every parameter and buffer), ``resumed_from``, ``fault`` and ``seconds``.

This module is the script (its arguments and its training loop); the rest of the example
has a module each: :mod:`~ckptkit.examples.tiny_lm_data` (corpus and batches),
:mod:`~ckptkit.examples.tiny_lm_model`, :mod:`~ckptkit.examples.tiny_lm_schedule`,
:mod:`~ckptkit.examples.tiny_lm_faults` and :mod:`~ckptkit.examples.tiny_lm_runs` (run
directories and what the script says about a resume).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
import xxhash
from torch import nn

import ckptkit
from ckptkit.capture.rng import fingerprint
from ckptkit.collective import leave
from ckptkit.examples.tiny_lm_data import (
    PAD,
    Corpus,
    collate,
    corpus_id,
    make_corpus,
    next_batch,
    peek_batch,
)
from ckptkit.examples.tiny_lm_faults import FAULTS, INSTABILITIES, inject_fault
from ckptkit.examples.tiny_lm_model import TinyLM, param_hash, set_seed
from ckptkit.examples.tiny_lm_runs import RUNS, recovery_summary, run_dir, say_resumed, skipped
from ckptkit.examples.tiny_lm_schedule import lr_spike, warmup_cosine
from ckptkit.integrations.drill_env import DrillEnv
from ckptkit.signals.observe import row_hashes
from ckptkit.signals.recovery import RecoveryPolicy
from ckptkit.signals.recovery import describe as describe_recovery
from ckptkit.signals.stability import StabilityWatch

SPIKE_STEPS = 1500
"""``--steps`` when ``--fault lr-spike`` comes without it: room for the watch's warm-up, a
build-up of a few hundred steps, the collapse and the recovery."""
TAIL = 50
"""Steps averaged into ``final_loss_avg`` (one batch's loss is too noisy to compare runs)."""


def rng_fingerprint(device: torch.device) -> str:
    """Fingerprint of the torch generators dropout draws from (CPU, plus the CUDA device)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return fingerprint(state)


def opt_step_count(opt: torch.optim.Optimizer) -> int:
    """AdamW's step counter (0 before the first step or after its state was dropped)."""
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st and "step" in st:
                return int(st["step"])
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m ckptkit.examples.tiny_lm",
        description="Train a tiny causal LM with ckptkit checkpoints (resumes automatically).",
        epilog="Drill contract: CKPTKIT_DRILL_SAVE_AT, CKPTKIT_DRILL_STOP_AT, "
        "CKPTKIT_DRILL_RESUME_FROM, CKPTKIT_METRICS (see the module docstring).",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"total optimizer steps (LR horizon; default 200, {SPIKE_STEPS} with --fault lr-spike)",
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default: steps/10)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping threshold")
    p.add_argument("--seed", type=int, default=0, help="model init, dropout and shuffle seed")
    p.add_argument("--data-seed", type=int, default=1234, help="synthetic corpus seed")
    p.add_argument("--data-version", default="v1", help="corpus snapshot (changes content)")
    p.add_argument("--num-seqs", type=int, default=2000, help="corpus size")
    p.add_argument(
        "--bucket",
        type=int,
        default=0,
        help="length-bucket size for the sampler (0: plain shuffle)",
    )
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-len", type=int, default=64, help="longest sequence (>= 8)")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument(
        "--amp",
        choices=("none", "fp16", "bf16"),
        default="none",
        help="autocast dtype; fp16 adds a GradScaler",
    )
    p.add_argument("--init-scale", type=float, default=2.0**16, help="GradScaler initial scale")
    p.add_argument("--growth-interval", type=int, default=2000, help="GradScaler growth interval")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--ddp",
        action="store_true",
        help="data parallel over a process group (automatic under torchrun: WORLD_SIZE > 1)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (fixed for bitwise reproducibility)",
    )
    p.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (0: off)")
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument(
        "--ckpt-dir",
        default=None,
        help=f"checkpoint directory; continues from its newest checkpoint (default: a new run "
        f"in {RUNS}/run-NNN/ckpt; a drill's $CKPTKIT_CKPT_DIR wins)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"without --ckpt-dir: continue the newest {RUNS}/run-NNN instead of starting a new one",
    )
    p.add_argument(
        "--metrics", default=None, help="JSONL metrics file (default: $CKPTKIT_METRICS, else none)"
    )
    p.add_argument(
        "--log",
        choices=("full", "busy", "minimal"),
        default="full",
        help="what the loop logs itself: every field docs/drills.md lists, loss + grad_norm "
        "+ lr (busy), or only the loss (the bound Recorder fills the rest)",
    )
    p.add_argument(
        "--fault",
        choices=FAULTS + INSTABILITIES,
        default="none",
        help="inject a classic resume bug at restore (for drills and tests), or an "
        "instability during training (lr-spike)",
    )
    p.add_argument(
        "--spike-at", type=int, default=None, help="lr-spike: first step of the build-up (default: steps*0.4)"
    )
    p.add_argument("--spike-ramp", type=int, default=100, help="lr-spike: steps to reach the peak")
    p.add_argument(
        "--spike-peak", type=float, default=1000.0, help="lr-spike: LR multiplier at the peak"
    )
    p.add_argument(
        "--spike-hold", type=int, default=None, help="lr-spike: steps at the peak (default: to the end)"
    )
    p.add_argument(
        "--watch",
        action="store_true",
        help="feed loss and grad norm to a StabilityWatch (health in every manifest, an "
        "emergency checkpoint on the first warning); implied by --auto-recover and lr-spike",
    )
    p.add_argument(
        "--auto-recover",
        action="store_true",
        help="recover automatically from a collapse: roll back to the newest healthy "
        "checkpoint, LR x0.3, clip norm x0.3, skip the batches since the first warning "
        "(ckptkit.signals.recovery.RecoveryPolicy defaults)",
    )
    p.add_argument(
        "--recover-lr-factor",
        type=float,
        default=0.3,
        help="--auto-recover: multiply the LR by this on each recovery",
    )
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = SPIKE_STEPS if args.fault in INSTABILITIES else 200
    if args.max_len < 8:
        p.error("--max-len must be >= 8")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train (resuming if a checkpoint exists); return and print the summary."""
    t_start = time.perf_counter()
    args = parse_args(argv)
    drill = DrillEnv.from_env()
    # A drill pins threads and device for every run it starts; its values win.
    torch.set_num_threads(drill.threads or args.threads)
    device = torch.device(drill.device or args.device)
    rank, world = init_ddp(args, device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    if device.type == "cuda":
        # Deterministic cuBLAS needs a fixed workspace, set before the first CUDA call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    set_seed(args.seed)

    corpus = Corpus(
        make_corpus(
            args.num_seqs,
            seed=args.data_seed,
            version=args.data_version,
            vocab=args.vocab,
            max_len=args.max_len,
        )
    )
    lengths = [len(s) for s in corpus]
    bucket = args.bucket or None
    sampler = ckptkit.ResumableSampler(
        corpus,
        seed=args.seed,
        shuffle=True,
        rank=rank,
        world_size=world,
        lengths=lengths if bucket else None,
        bucket_size=bucket,
        batch_size=args.batch_size * world if bucket else None,
    )
    model = TinyLM(
        vocab=args.vocab,
        dim=args.dim,
        heads=args.heads,
        layers=args.layers,
        max_len=args.max_len,
        dropout=args.dropout,
    ).to(device)
    # Same initial weights everywhere (DDP also broadcasts rank 0's); dropout differs per rank.
    train_model: nn.Module = model
    if world > 1:
        set_seed(args.seed + rank)
        train_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    opt = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay
    )
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    schedule = warmup_cosine(warmup, args.steps)
    if args.fault == "lr-spike":
        start = args.spike_at if args.spike_at is not None else int(args.steps * 0.4)
        schedule = lr_spike(start, args.spike_ramp, args.spike_peak, schedule, hold=args.spike_hold)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.amp)
    scaler = torch.amp.GradScaler(
        device.type,
        init_scale=args.init_scale,
        growth_interval=args.growth_interval,
        enabled=args.amp == "fp16",
    )
    if rank != 0:
        # Rank 0 writes the metrics (with every rank's samples); the others keep a window.
        os.environ.pop("CKPTKIT_METRICS", None)
        args.metrics = None
    rec = ckptkit.Recorder(args.metrics)  # None: $CKPTKIT_METRICS, else memory only
    watch = (
        StabilityWatch()
        if args.watch or args.auto_recover or args.fault in INSTABILITIES
        else None
    )
    ckpt_dir = drill.ckpt_dir or args.ckpt_dir or run_dir(resume=args.resume, world=world)
    mgr = ckptkit.CheckpointManager(
        ckpt_dir,
        keep_last=args.keep_last,
        watch=watch,
        recovery=RecoveryPolicy(lr_factor=args.recover_lr_factor) if args.auto_recover else None,
    )

    fault = args.fault
    ts = ckptkit.TrainState(
        model=model,
        optimizer=opt,
        scheduler=None if fault == "no-scheduler" else sched,
        scaler=scaler if args.amp == "fp16" and fault != "no-scaler" else None,
        sampler=None if fault == "no-sampler" else sampler,
        data={"snapshot": corpus_id(corpus), "version": args.data_version},
        recorder=rec,
    )
    restored = drill.restore(ts, mgr)
    stop = drill.total_steps(args.steps)
    if restored is not None and rank == 0:
        say_resumed(restored, stop)
    if restored is not None and fault in FAULTS:
        corpus, sampler = inject_fault(
            fault, args, ts, corpus=corpus, sampler=sampler, opt=opt, sched=sched
        )

    loss_value = float("nan")
    tail: collections.deque[tuple[int, float]] = collections.deque(maxlen=TAIL)
    events: list[dict[str, Any]] = []
    autocast = (
        torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    )
    model.train()
    while ts.step < stop:
        ids = next_batch(sampler, args.batch_size)
        seqs = [corpus[i] for i in ids]
        x, y = collate(seqs)
        batch_hash = xxhash.xxh3_64_hexdigest(x.numpy().tobytes())
        # Rows of the whole sequences (the model's input drops each one's last token, so a
        # sample's input row depends on the batch's width; its padded sequence does not).
        rows = row_hashes(nn.utils.rnn.pad_sequence(list(seqs), batch_first=True,
                                                    padding_value=PAD))
        x, y = x.to(device), y.to(device)
        rng = rng_fingerprint(device)
        lr = opt.param_groups[0]["lr"]

        with autocast:
            logits = train_model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        # After an automatic recovery the clip norm is tightened: read it every step.
        clip = mgr.recovery.clip_norm(args.clip) if mgr.recovery is not None else args.clip
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        sched.step()

        ts.step += 1
        tokens = int((y != -100).sum())
        loss_value = float(loss.detach())
        mine = {
            "ids": ids,
            "lens": [len(s) for s in seqs],
            "hashes": [xxhash.xxh3_64_hexdigest(s.numpy().tobytes())[:8] for s in seqs],
            "batch_hash": batch_hash,
            "rows": rows,
            "rng": rng,
            "tokens": tokens,
            "loss": loss_value,
        }
        ranks = gather(mine, world)
        tokens = sum(r["tokens"] for r in ranks)
        ts.progress.epoch = sampler.epoch
        ts.progress.consumed_samples += sum(len(r["ids"]) for r in ranks)
        ts.progress.consumed_tokens += tokens
        if world > 1:
            # Mean over ranks, summed in rank order (the same bits on every rerun).
            loss_value = math.fsum(r["loss"] for r in ranks) / world
        tail.append((ts.step, loss_value))
        if watch is not None:
            watch.update(ts.step, loss=loss_value, grad_norm=float(grad_norm))
        extra: dict[str, Any] = {}
        if world > 1:
            extra["rank_sample_ids"] = [r["ids"] for r in ranks]
        due = (args.save_every and ts.step % args.save_every == 0) or drill.should_save(ts.step)
        if args.log == "minimal":
            rec.log(ts.step, loss=loss_value)  # the bound Recorder fills the rest
            if due:
                mgr.save(ts)
        elif args.log == "busy":
            # What a busy user logs for a dashboard; the bound Recorder fills the rest.
            rec.log(ts.step, loss=loss_value, grad_norm=float(grad_norm), lr=lr)
            if due:
                mgr.save(ts)
        else:
            rec.log(
                ts.step,
                loss=loss_value,
                grad_norm=float(grad_norm),
                lr=lr,
                loss_scale=scaler.get_scale() if scaler.is_enabled() else None,
                tokens=tokens,
                seq_lens=[n for r in ranks for n in r["lens"]],
                sample_ids=[i for r in ranks for i in r["ids"]],
                epoch=sampler.epoch,
                sample_hashes=[h for r in ranks for h in r["hashes"]],
                batch_hash=combine([r["batch_hash"] for r in ranks]),
                rows=[h for r in ranks for h in r["rows"]],
                rng=combine([r["rng"] for r in ranks]),
                opt_step=opt_step_count(opt),
                **extra,
            )
            if due:
                mgr.save(
                    ts, lookahead=lookahead(ts.step, opt, scaler, sampler, args, device, world)
                )
        if watch is not None:
            mgr.observe(ts)  # an emergency checkpoint on the first warning
            event = mgr.recover(ts)  # with --auto-recover: roll back, act, continue
            # After an event the cursor may have moved: next_batch() draws afresh each step.
            if event is not None and event.kind == "restored":
                events.append(recovery_summary(event.record))
                while tail and tail[-1][0] > ts.step:
                    tail.pop()
                if rank == 0:
                    print(f"tiny_lm: {describe_recovery(event.record)}", file=sys.stderr)
        if drill.should_stop(ts.step):
            break
    mgr.close()
    rec.close()
    if world > 1:
        # Every rank done before any leaves; the process group stays up for leave() (the
        # DDP model holds it: freeing it here could hang this rank, see __main__).
        torch.distributed.barrier()
    summary = {
        "final_step": ts.step,
        "final_loss": loss_value,
        "final_loss_avg": math.fsum(v for _, v in tail) / max(len(tail), 1),
        "recoveries": [
            {**e, "skipped_samples": skipped(mgr, e["n"])} for e in events
        ],
        "param_hash": param_hash(model),
        "resumed_from": restored.step if restored is not None else None,
        "fault": fault,
        "seconds": round(time.perf_counter() - t_start, 3),
    }
    if rank == 0:
        print(json.dumps(summary), flush=True)
    return summary


def init_ddp(args: argparse.Namespace, device: torch.device) -> tuple[int, int]:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1) or ``--ddp`` asks for.

    Returns:
        ``(rank, world size)``; ``(0, 1)`` for a single process.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not args.ddp:
        return 0, 1
    dist = torch.distributed
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def gather(obj: Any, world: int) -> list[Any]:
    """Every rank's ``obj`` in rank order (just ``[obj]`` for one process)."""
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def combine(parts: Sequence[str]) -> str:
    """One fingerprint for one part per rank (the part itself for one process)."""
    if len(parts) == 1:
        return parts[0]
    return xxhash.xxh3_64_hexdigest("|".join(parts).encode())


def lookahead(
    step: int,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    sampler: ckptkit.ResumableSampler,
    args: argparse.Namespace,
    device: torch.device,
    world: int = 1,
) -> dict[str, Any]:
    """What step ``step + 1`` will use, in the units of the step records (resume guard)."""
    epoch, ids = peek_batch(sampler, args.batch_size)
    ranks = gather({"ids": ids, "rng": rng_fingerprint(device)}, world)
    return {
        "step": step,
        "next_step": step + 1,
        "lr": opt.param_groups[0]["lr"],
        "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
        "opt_step": opt_step_count(opt),
        "rng": combine([r["rng"] for r in ranks]),
        "sample_ids": [i for r in ranks for i in r["ids"]],
        "epoch": epoch,
    }


if __name__ == "__main__":
    main()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Everything is saved and the summary printed: end without the interpreter's
        # teardown, in which a gloo rank can hang or abort (pytorch/pytorch#179291).
        leave(0)
