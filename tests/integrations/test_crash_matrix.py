"""The crash matrix: every framework x every store a user can reach x every kill point of a save.

Issue 24, item 2: after a kill at any point of a framework's save (before / during the
framework's files, before / after adoption, during rotation), the restart resumes the newest
complete state, or says which newer checkpoint it passed over and why, and the run ends in
exactly the state of a run that was never interrupted.

Each framework has a training script in ``tests/crash_scripts/`` (a user's loop with the
documented ckptkit lines; the real transformers / accelerate / lightning; CPU, a tiny model
with dropout, synthetic data, 8 steps over two epochs, a save every 2 steps, keep-last 2).
A cell is three real processes, forked from a warmed zygote (``tests/zygote.py``):

1. the script with ``CKPTKIT_CRASH_AT`` armed at the save of step 6 (``_harness.ARM_AT``):
   it must stop dead at the named point (exit status 86: the point was reached, so no cell
   passes vacuously);
2. the script again, with nothing armed, on the same run: the restart, to step 8;
3. once per framework x store, shared by its cells: the same script never interrupted (the
   reference).

The restart must resume from the step the cell names (the newest complete checkpoint on
disk after the kill), name a newer incomplete checkpoint it passed over where one is left,
and end bitwise equal to the reference: model weights, optimizer state, step, learning
rate, data position (the batch of every step it trained, and the native sampler's cursor)
and the global RNGs (torch, NumPy, Python; every framework here restores them).

Cells a user cannot reach are listed in :data:`UNREACHABLE` with the reason, never dropped:
:func:`test_every_cell_is_run_or_listed_unreachable` checks that the cross product is covered.
The whole matrix is about a minute of CPU (two warm forks a cell); ``make crash-matrix`` runs
this module alone.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crash_scripts._harness import ARM_AT, SAVE_EVERY, STEPS

from ckptkit import crashpoints

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).resolve().parents[1] / "crash_scripts"

STORES = ("local", "s3")
TIMEOUT = 240.0
"""Seconds a run of a script may take (a few on an idle machine)."""


@dataclass(frozen=True)
class Framework:
    """A framework's script and what a restart after each kill point must do."""

    script: str
    resume_at: dict[str, int]
    """Kill point -> the step the restart resumes from: the newest checkpoint complete on
    disk after the kill (step 4 is the last save that finished; step 6 is interrupted)."""
    passed_over: dict[str, str] = field(default_factory=dict)
    """Kill point -> the newer, incomplete checkpoint the restart must name (its warning)."""
    preload: tuple[str, ...] = ()
    """Modules the zygote imports once (the children fork with them loaded)."""
    needs: str | None = None
    """The library of the ``interop`` extra it runs (CI installs it: nothing is skipped
    there; without the extra, as in tests/framework_checkpoints.py, the cell is)."""


_BEFORE = ARM_AT - SAVE_EVERY
FRAMEWORKS: dict[str, Framework] = {
    "native": Framework(
        "native.py",
        {
            "commit.file_written": _BEFORE,  # a temporary directory, not a checkpoint
            "commit.done": ARM_AT,
            "settle.verified": ARM_AT,
            "settle.latest": ARM_AT,
            "rotate.deleted": ARM_AT,
        },
    ),
    "trainer": Framework(
        "trainer.py",
        {
            "framework.files@1": _BEFORE,  # checkpoint-6 holds config.json only
            "framework.files@2": _BEFORE,  # ... and model.safetensors
            "settle.begin": ARM_AT,
            "settle.adopted": ARM_AT,
            "settle.verified": ARM_AT,
            "rotate.deleted": ARM_AT,
        },
        passed_over={"framework.files@1": "checkpoint-6", "framework.files@2": "checkpoint-6"},
        preload=("transformers.trainer", "transformers.models.gpt2.modeling_gpt2",
                 "ckptkit.integrations.hf"),
        needs="transformers",
    ),
    "accelerate": Framework(
        "accelerate_loop.py",
        {
            "framework.files@1": _BEFORE,  # checkpoint_2 (the third save) is empty
            "framework.files@2": _BEFORE,  # ... or holds model.safetensors only
            "settle.begin": ARM_AT,
            "settle.adopted": ARM_AT,
            "settle.verified": ARM_AT,
            "rotate.deleted": ARM_AT,
        },
        passed_over={"framework.files@1": "checkpoint_2", "framework.files@2": "checkpoint_2"},
        preload=("accelerate", "ckptkit.integrations.hf"),
        needs="accelerate",
    ),
    "lightning": Framework(
        "lightning_trainer.py",
        {
            "framework.files@1": _BEFORE,  # killed serialising step 6: nothing of it written
            "framework.files@2": ARM_AT,  # step 6 saved and settled; last.ckpt not rewritten
            "settle.begin": ARM_AT,
            "settle.adopted": ARM_AT,
            "settle.verified": ARM_AT,
            "rotate.deleted": ARM_AT,
        },
        preload=("lightning", "lightning.pytorch", "ckptkit.integrations.lightning"),
        needs="lightning",
    ),
    "fabric": Framework(
        "fabric_loop.py",
        {
            "framework.files@1": _BEFORE,  # one file a save: killed before it
            "settle.begin": ARM_AT,
            "settle.adopted": ARM_AT,
            "settle.verified": ARM_AT,
            "rotate.deleted": ARM_AT,
        },
        preload=("lightning", "ckptkit.integrations.lightning"),
        needs="lightning",
    ),
}

UNREACHABLE: dict[tuple[str, str], str] = {
    ("trainer", "s3"): "transformers.Trainer writes checkpoint-N with os.makedirs / torch.save / "
    "safetensors into a local output_dir; it has no remote path (push_to_hub aside)",
    ("accelerate", "s3"): "Accelerator.save_state writes project_dir/checkpoints/checkpoint_I "
    "with os.makedirs / torch.save / safetensors; project_dir is a local directory",
}
"""Framework x store cells a user cannot build, with the reason (not silently dropped)."""

REFUSED: dict[tuple[str, str], str] = {
    ("lightning", "s3"): "Lightning writes s3:// checkpoints itself, but ckptkit keeps the run's "
    "lock, index and adopted manifests on a local filesystem only: CkptkitCallback.dirpath "
    "(and on_fit_start, for a ModelCheckpoint dirpath) refuses the URL before the first step",
    ("fabric", "s3"): "as lightning x s3: FabricCheckpoints refuses an s3:// dirpath when it "
    "is built, before the first step",
}
"""Cells a user can build that ckptkit refuses loudly before any compute is spent (issue 24:
'either does the right thing or refuses loudly before any compute is spent'), with why;
:func:`test_a_refused_cell_stops_before_any_step` holds them to it."""

def _cells() -> Iterator[Any]:
    for name, fw in FRAMEWORKS.items():
        for store in STORES:
            if (name, store) in UNREACHABLE or (name, store) in REFUSED:
                continue
            for point in fw.resume_at:
                yield pytest.param(name, store, point, id=f"{name}-{store}-{point}")


# --- running the scripts ------------------------------------------------------------------


@dataclass
class Run:
    """One run of a script: exit status, its output JSON (None if it wrote none), stderr."""

    returncode: int
    result: dict[str, Any] | None
    stderr: str
    strays: list[str]
    """Files the run left in its (fresh, empty) working directory: a remote root taken
    for a local relative path lands there."""
    stored: list[str] = field(default_factory=list)
    """The files under the run's root after it (filled for the references)."""

    def why(self) -> str:
        return f"exit {self.returncode}; stderr ends:\n{self.stderr[-3000:]}"


class Matrix:
    """Per module: the zygote, the S3 bucket, and the uninterrupted runs (one per
    framework x store, shared by its cells)."""

    def __init__(self, workdir: Path) -> None:
        from zygote import Zygote

        preload = tuple(dict.fromkeys(
            m for fw in FRAMEWORKS.values() if _installed(fw) for m in fw.preload
        ))
        self.zygote = Zygote(workdir / "zygote", preload=preload)
        self.workdir = workdir
        self.references: dict[tuple[str, str], Run] = {}
        self.bucket: str | None = None
        self._n = 0

    def root(self, store: str, request: pytest.FixtureRequest, name: str) -> str:
        """A fresh run root on ``store``."""
        self._n += 1
        if store == "local":
            return str(self.workdir / f"{self._n}-{name}")
        if self.bucket is None:
            request.getfixturevalue("s3_endpoint")
            import fsspec

            self.bucket = f"crash-matrix-{uuid.uuid4().hex[:8]}"
            fsspec.filesystem("s3", skip_instance_cache=True).mkdir(self.bucket)
        return f"s3://{self.bucket}/{self._n}-{name}"

    def run(self, framework: str, root: str, kill: str | None = None) -> Run:
        """The framework's script on ``root`` in a fresh process (a fork of the zygote)."""
        self._n += 1
        out = self.workdir / f"{self._n}-out.json"
        cwd = self.workdir / f"{self._n}-cwd"
        cwd.mkdir()
        argv = [sys.executable, str(SCRIPTS / FRAMEWORKS[framework].script), root, str(out)]
        child = self.zygote.start_argv([*argv, kill] if kill else argv,
                                       env={crashpoints.ENV: None}, cwd=cwd)
        r = child.wait(TIMEOUT)
        result = json.loads(out.read_text()) if out.exists() else None
        strays = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*") if p.is_file())
        return Run(r.returncode, result, r.stderr, strays)

    def reference(self, framework: str, store: str, request: pytest.FixtureRequest) -> Run:
        key = (framework, store)
        if key not in self.references:
            root = self.root(store, request, "reference")
            run = self.references[key] = self.run(framework, root)
            run.stored = _files(root)
        return self.references[key]


def _installed(fw: Framework) -> bool:
    return fw.needs is None or importlib.util.find_spec(fw.needs) is not None


def _files(root: str) -> list[str]:
    """The files under a run root, on its own store."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    return sorted(fs.find(path)) if fs.exists(path) else []


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    m = Matrix(tmp_path_factory.mktemp("crash-matrix"))
    try:
        yield m
    finally:
        m.zygote.close()


# --- comparing with the uninterrupted run --------------------------------------------------


def _differences(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What differs between the reference's final state and the restart's (empty: bitwise)."""
    problems = []
    for key in sorted(set(ref) | set(got)):
        if key in ("batches", "resumed_from"):
            continue
        a, b = ref.get(key), got.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            problems.append(f"{key} differs at {keys[:6]}{' ...' if len(keys) > 6 else ''}")
        else:
            problems.append(f"{key}: {str(a)[:80]} uninterrupted, {str(b)[:80]} restarted")
    trained = [s for s, _ in got["batches"]]
    first = (got["resumed_from"] or 0) + 1
    if trained != list(range(first, STEPS + 1)):
        problems.append(f"the restart trained steps {trained}, not {first}..{STEPS}")
    want = dict(ref["batches"])
    wrong = [s for s, d in got["batches"] if want.get(s) != d]
    if wrong:
        problems.append(f"data position: steps {wrong} trained on other batches than uninterrupted")
    return problems


def _ckptkit_lines(stderr: str) -> str:
    """What the run said about its checkpoints (ckptkit's lines, the harness's resume line)."""
    lines = stderr.splitlines()
    return "\n".join(line for line in lines if "ckptkit" in line.lower() or "crash-matrix" in line)[-2000:]


# --- the matrix -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "store", "point"), list(_cells()))
def test_a_restart_after_a_kill_ends_bitwise_as_the_uninterrupted_run(
    framework: str, store: str, point: str, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    fw = FRAMEWORKS[framework]
    if fw.needs is not None:
        pytest.importorskip(fw.needs)
    ref = matrix.reference(framework, store, request)
    assert ref.returncode == 0 and ref.result is not None, (
        f"the uninterrupted {framework} run on {store} failed: {ref.why()}"
    )
    assert ref.result["step"] == STEPS
    assert ref.stored and not ref.strays, (
        f"the uninterrupted {framework} run was given a {store} root and wrote "
        f"{len(ref.stored)} file(s) there; in its working directory: {ref.strays[:4]}"
    )

    root = matrix.root(store, request, f"{framework}-{point}")
    killed = matrix.run(framework, root, kill=point)
    assert killed.returncode == crashpoints.EXIT_CODE, (
        f"the {framework} save of step {ARM_AT} did not stop at {point}: {killed.why()}"
    )

    restarted = matrix.run(framework, root)
    assert restarted.returncode == 0 and restarted.result is not None, (
        f"the restart after a kill at {point} failed: {restarted.why()}"
    )
    got = restarted.result
    said = _ckptkit_lines(restarted.stderr)
    assert got["resumed_from"] == fw.resume_at[point], (
        f"after a kill at {point} the restart resumed from step {got['resumed_from']}, "
        f"not from the newest complete checkpoint (step {fw.resume_at[point]}); it said:\n{said}"
    )
    passed = fw.passed_over.get(point)
    if passed is not None:
        assert re.search(rf"\b{re.escape(passed)}\b", restarted.stderr), (
            f"the restart passed over {passed} (incomplete) without naming it; it said:\n{said}"
        )
    problems = _differences(ref.result, got)
    assert not problems, (
        f"the restart after a kill at {point} does not end as the uninterrupted run: "
        + "; ".join(problems)
    )


def test_every_cell_is_run_or_listed_unreachable() -> None:
    """The cross product frameworks x stores is covered: run, or listed with a reason."""
    run = {(c.values[0], c.values[1]) for c in _cells()}
    for name in FRAMEWORKS:
        for store in STORES:
            reason = UNREACHABLE.get((name, store)) or REFUSED.get((name, store))
            assert ((name, store) in run) != bool(reason), (name, store)
    for fw in FRAMEWORKS.values():
        for point in fw.resume_at:
            assert point.partition("@")[0] in crashpoints.POINTS, point


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "store"), sorted(REFUSED))
def test_a_refused_cell_stops_before_any_step(
    framework: str, store: str, matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """The script exits with ckptkit's error naming the fix; it trained nothing, wrote
    nothing to its root and left nothing in its working directory (no local ``s3:/``)."""
    fw = FRAMEWORKS[framework]
    if fw.needs is not None:
        pytest.importorskip(fw.needs)
    root = matrix.root(store, request, f"refused-{framework}")
    got = matrix.run(framework, root)
    assert got.returncode != 0, got.why()
    assert "is on an object store" in got.stderr and "Fix:" in got.stderr, got.why()
    assert "crash-matrix: resumed from step" not in got.stderr, got.why()  # no training began
    assert got.result is None, got.why()
    assert got.strays == [], got.strays
    assert _files(root) == []


def test_the_comparison_sees_each_kind_of_difference() -> None:
    """The bitwise check is not vacuous: a digest, a batch or a skipped step each show."""
    ref = {
        "step": STEPS,
        "resumed_from": 0,
        "model": {"w": "a", "b": "b"},
        "optimizer": {"state": {"0": {"exp_avg": "tensor:c"}}},
        "rng": {"torch": "d"},
        "batches": [[s, f"batch{s}"] for s in range(1, STEPS + 1)],
    }
    got = {**ref, "resumed_from": 4, "batches": ref["batches"][4:]}
    assert _differences(ref, got) == []
    assert _differences(ref, {**got, "model": {"w": "a", "b": "x"}}) == ["model differs at ['b']"]
    assert _differences(ref, {**got, "rng": {"torch": "e"}}) == ["rng differs at ['torch']"]
    moved = [[s, f"batch{s - 1}"] for s in range(5, STEPS + 1)]
    assert "data position" in _differences(ref, {**got, "batches": moved})[0]
    assert "trained steps" in _differences(ref, {**got, "batches": ref["batches"][5:]})[0]
