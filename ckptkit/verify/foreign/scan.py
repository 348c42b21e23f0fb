"""What a format module fills while it reads a foreign checkpoint.

Each format module has ``scan(s: Scan) -> None``: it looks at the files, loads what it
needs through :meth:`Scan.load` / :meth:`Scan.model_file` (container findings such as a
zip CRC or a pickle needing code are made there, once per file), and says where each
component is: by the tool's own conventions (:meth:`Scan.present`), or by handing a loaded
tree to :meth:`Scan.recognised` (components found by name or inferred from structure,
:mod:`ckptkit.verify.foreign.structure`). What a component's absence means for that tool goes in
:meth:`Scan.absent`. :meth:`Scan.finish` turns all of it into the
:class:`~ckptkit.verify.foreign.view.ForeignState` the registered checks read: the reader never
judges completeness, NaN/Inf or shapes itself.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ckptkit import codes
from ckptkit.capture import scaler as scaler_capture
from ckptkit.capture.parallel import ParallelConfig
from ckptkit.checkpoint import safeload
from ckptkit.errors import CkptkitError
from ckptkit.format import manifest as mf
from ckptkit.format.manifest import ADOPTED_SUFFIX
from ckptkit.storage import digest, files, fs
from ckptkit.verify.context import FileScan, scan_local
from ckptkit.verify.findings import CODES, ERROR, Finding, Severity
from ckptkit.verify.foreign.loads import needs_code_verdict, refused_by_load
from ckptkit.verify.foreign.structure import (
    EPOCH_KEYS,
    STEP_KEYS,
    Part,
    Recognised,
    TensorMeta,
    as_int,
    is_tensor,
    join,
    optimizer_shape,
    shape_of,
    value,
)
from ckptkit.verify.foreign.view import ForeignState, count_tensors, optimizer_facts, optimizer_view
from ckptkit.verify.view import RESUME_STATE, Expect, Found, NonFinite, count_nonfinite

# ADOPTED_SUFFIX (re-exported): the name of the manifest ``ckptkit adopt`` and
# ``ckptkit.dcp`` write (never ``manifest.json``: the foreign directory must not look like
# a native checkpoint); it lives in the format layer so the writers below verify see it.

STEP_ORDER = (
    "global_step",
    "step",
    "iter_num",
    "iteration",
    "num_updates",
    "train_step",
    "optimizer_step",
    "steps",
    "global_steps",
    "iterations",
    "iter",
    "num_steps",
    "updates",
)
"""Which counter is *the* step when several are saved (the most specific first)."""
assert set(STEP_ORDER) == set(STEP_KEYS)

_PARALLEL_SYNONYMS = {
    "world": "world_size",
    "num_ranks": "world_size",
    "tp_size": "tp",
    "tensor_parallel_size": "tp",
    "tensor_model_parallel_size": "tp",
    "pp_size": "pp",
    "pipeline_parallel_size": "pp",
    "pipeline_model_parallel_size": "pp",
    "dp_size": "dp",
    "data_parallel_size": "dp",
    "cp_size": "cp",
    "context_parallel_size": "cp",
    "ep_size": "ep",
    "expert_parallel_size": "ep",
}


@dataclass
class _Row:
    where: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    found: list[tuple[str, str]] = field(default_factory=list)
    """``(how, evidence)`` per location."""


@dataclass
class Scan:
    """A foreign checkpoint being read: where it is, its files, and what was found."""

    target: Path
    """The path given: a directory, or one file (Lightning, torch.save, safetensors)."""
    format: str
    root: Path
    """The directory file paths are relative to."""
    files: list[str] = field(default_factory=list)
    """Files of the checkpoint, relative to ``root`` (the adopted manifest excluded)."""
    outside: set[str] = field(default_factory=set)
    """Files that are symlinks or resolve outside the checkpoint: never read (CK-F009)."""
    findings: list[Finding] = field(default_factory=list)
    """Findings about the container (zip CRC, pickle needing code, unreadable files)."""
    step: int | None = None
    scan_values: bool = True
    """Read tensor values for the NaN/Inf scan (verify); False for inspect and adopt."""
    rows: dict[str, _Row] = field(default_factory=dict)
    opaque: bool = False
    """Nothing in the checkpoint could be read: it is one pickle that needs code (a
    ``torch.save(model)``). What it holds is unknown, so that is the one finding, an error,
    and no component is reported missing (:meth:`needs_code`)."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why a component is absent, in the tool's terms (used when it stays absent)."""
    required: set[str] = field(default_factory=set)
    """Components this tool needs for a resume beyond the training defaults."""
    model: dict[str, Any] = field(default_factory=dict)
    """The primary model's tensors (or their metadata), by state-dict name."""
    bad: dict[str, list[NonFinite]] = field(default_factory=lambda: {"model": [], "optimizer": []})
    _optimizers: list[Any] = field(default_factory=list)
    _steps: dict[str, int] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict)
    _refused: dict[str, str] = field(default_factory=dict)
    """What the reader said of each pickle that needs code (before the layout's verdict)."""
    digests: dict[str, tuple[str, int]] = field(default_factory=dict)
    """``{file: (xxh3-128, size)}`` of files the reader read whole while scanning them (a
    DCP shard): the check against an adopted manifest takes these instead of a second read."""
    adopted_record: dict[str, Any] | None = None
    """``user.adopted`` of the adopted manifest, read before the format's reader ran
    (:func:`ckptkit.verify.foreign.read.scan` with ``adopted=True``): None when there is none, empty
    when there is one that was refused (its finding says why)."""
    adopted: mf.Manifest | None = None
    """The adopted manifest, when there is one and it is valid."""

    def listing(self) -> dict[str, mf.FileEntry] | None:
        """The files the adopted manifest lists, by path (what a reader that trusts it may
        read), or None when there is no valid one."""
        if self.adopted is None:
            return None
        return {fe.path: fe for fe in mf.adopted_files(self.adopted)}

    @classmethod
    def start(cls, target: Path | str, fmt: str, *, scan_values: bool = True) -> Scan:
        """List the files of ``target``; symlinks are listed but marked, never read."""
        t = Path(target)
        if t.is_dir() and not t.is_symlink():
            root = t
            files, outside = [], set()
            for rel in fs.walk_entries(t):  # the walk of the native CK-F006 (unlisted files)
                p = t / rel
                if p.name.endswith(ADOPTED_SUFFIX):
                    continue
                if p.is_symlink():
                    files.append(rel)
                    outside.add(rel)
                elif p.is_file():
                    files.append(rel)
        else:
            root = t.parent
            files = [t.name] if (t.exists() or t.is_symlink()) else []
            outside = {t.name} if t.is_symlink() else set()
        return cls(
            target=t, format=fmt, root=root, files=files, outside=outside, scan_values=scan_values
        )

    # --- findings about the container ----------------------------------------------------------

    def add(
        self,
        code: str,
        message: str,
        *,
        path: str | None = None,
        component: str | None = None,
        hint: str | None = None,
        severity: Severity | None = None,
    ) -> None:
        """Record a finding of a registered code."""
        self.findings.append(
            CODES[code].finding(
                message, path=path, component=component, hint=hint, severity=severity
            )
        )

    def unrecognised(self, what: str, names: Iterable[str], *, path: str | None = None) -> None:
        """Report keys/files not mapped to a component (CK-C104, info)."""
        names = sorted(set(names))
        if names:
            shown = ", ".join(names[:12]) + (f" … (+{len(names) - 12})" if len(names) > 12 else "")
            self.add(codes.C104, f"{what} not recognised: {shown}", path=path)

    # --- files -------------------------------------------------------------------------------------

    def has(self, rel: str) -> bool:
        return rel in self.files

    def glob(self, pattern: str) -> list[str]:
        """Files whose name (relative path) matches ``pattern`` (fnmatch), sorted."""
        return [f for f in self.files if fnmatch.fnmatch(f, pattern)]

    def path(self, rel: str) -> Path:
        return self.root / rel

    def readable(self, rel: str) -> bool:
        """Inside the checkpoint (not a symlink, not escaping it): the one rule for reading."""
        return rel in self.files and rel not in self.outside

    def loc(self, file: str | None, path: tuple[Any, ...] = ()) -> str:
        """``file:key/path`` (the component table's ``where``)."""
        inner = join(path)
        if file is None:
            return inner
        return f"{file}:{inner}" if inner else file

    def tensor_key(self, file: str | None, path: tuple[Any, ...]) -> str:
        """How a finding names a tensor: its key path, prefixed by its file in a folder."""
        inner = join(path)
        if file is None or not self.target.is_dir():
            return inner
        return f"{file}:{inner}"

    def load(self, rel: str, *, component: str) -> Any | None:
        """Load a torch file safely, once; on failure record the finding and return None.

        A file that is a symlink or resolves outside the checkpoint is never read (the
        registered CK-F009 check reports it). A pickle that needs code is reported through
        :meth:`refused_pickle`: an error when a resume of this layout loads the file. A
        file ckptkit read is then held to the allow-list of the framework's own load
        (:func:`ckptkit.verify.foreign.loads.refused_by_load`): one that load refuses is a
        ``CK-F103`` error too, though its content was read and checked.
        """
        if rel in self._cache:
            return self._cache[rel]
        if not self.readable(rel):
            self._cache[rel] = None
            return None
        obj, problem = safeload.safe_torch_load(self.path(rel))
        if problem is not None and problem.code == codes.F103:
            self.refused_pickle(rel, problem.message, component=component)
        elif problem is not None:
            self.add(problem.code, problem.message, path=rel, component=component)
        else:
            refusal = refused_by_load(self.format, rel, self.path(rel))
            if refusal is not None:
                self.add(codes.F103, refusal.message, path=rel, component=component,
                         hint=refusal.hint, severity=ERROR)
        self._cache[rel] = obj
        return obj

    def content(self, rel: str) -> Any | None:
        """The whole content of file ``rel``, read the safe way its kind allows: a torch file
        through :meth:`load` (cached, findings recorded), a safetensors file after its
        header is checked, a JSON file parsed (at most :data:`safeload.MAX_PICKLE_BYTES`).
        None when it cannot be read so (``ckptkit diff`` reports it as not compared).
        """
        if not self.readable(rel):
            return None
        if rel.endswith(".safetensors"):
            _hdr, problem = safeload.check_safetensors(self.path(rel), rel)
            if problem is not None:
                return None
            try:
                return safeload.load_safetensors(self.path(rel))
            except Exception:  # safetensors raises its own SafetensorError
                return None
        if rel.endswith(".json"):
            p = self.path(rel)
            try:
                if p.stat().st_size > safeload.MAX_PICKLE_BYTES:
                    return None
                with files.open_regular(p, code=codes.F022, rel=rel) as fh:
                    return json.loads(fh.read().decode("utf-8"))
            except (CkptkitError, OSError, UnicodeDecodeError, ValueError, RecursionError):
                return None
        return self.load(rel, component="extra")

    def refused_pickle(self, rel: str, message: str, *, component: str | None = None) -> None:
        """Record that ``rel`` holds a pickle that needs code (``CK-F103``; nothing was run).

        Its severity and the reason come from :func:`ckptkit.verify.foreign.loads.needs_code_verdict`
        (how this layout's framework loads ``rel`` on resume): an error when a resume loads
        the file (the code would run, or the resume would fail), info when none does.
        """
        self._refused[rel] = message
        sev, why = needs_code_verdict(self.format, rel)
        hint = None
        if sev is ERROR:
            hint = (
                "do not resume from this checkpoint: resume from an earlier one ('ckptkit ls "
                "RUN' lists them; the integrations' resume picks skip this one); if the file "
                "is yours, make that state plain tensors, numbers and dicts"
            )
        self.add(codes.F103, f"{message}; {why}", path=rel, component=component, hint=hint,
                 severity=sev)

    def needs_code(self, rel: str) -> bool:
        """When ``rel``, the whole checkpoint, is a pickle that needs code, say so as the one
        cause (``CK-F103`` as an error, with what to save instead) and mark the scan
        :attr:`opaque`; True when so, False when ``rel`` failed otherwise.

        The restricted unpickler refuses the whole file at the first global it does not
        allow, so a pickled model and a state dict with one object planted in it look the
        same from here: the message names the globals and claims neither."""
        i = next((i for i, f in enumerate(self.findings)
                  if f.path == rel and f.code == codes.F103), None)
        if i is None:
            return False
        self.findings[i] = CODES[codes.F103].finding(
            f"{self._refused.get(rel, self.findings[i].message)}: nothing in the file can be read without running "
            "that code, so none of it can be checked (torch.save(model) pickles the model's "
            "class, not a state dict; an object planted in a state dict does the same)",
            path=rel,
            component=self.findings[i].component,
            severity=ERROR,
            hint="save state dicts instead, e.g. torch.save({'model': model.state_dict(), "
            "'optimizer': opt.state_dict(), 'step': step}, PATH), or use ckptkit.save; to "
            "convert this file, load it in code you trust (torch.load(PATH, "
            "weights_only=False)) and save its state_dict()",
        )
        self.opaque = True
        return True

    def why_unread(self, rel: str) -> str:
        """Why ``rel`` gave nothing (for a component's absence reason)."""
        if rel in self.outside:
            return f"{rel} is a symlink or resolves outside the checkpoint, so it was not read"
        for f in self.findings:
            if f.path == rel and f.code.startswith("CK-F1"):
                return f"{rel} could not be read ({f.code}: {f.message})"
        return f"{rel} holds nothing readable"

    def model_file(self, rel: str) -> bool:
        """Read a weights file (safetensors or torch) as the model; True when it was read."""
        if not self.readable(rel):
            return False
        if rel.endswith(".safetensors"):
            hdr, problem = safeload.check_safetensors(self.path(rel), rel)
            if problem is not None:
                self.add(problem.code, problem.message, path=rel, component="model")
                return False
            tensors: dict[str, Any] = {
                k: TensorMeta(tuple(h.shape), safeload.safetensors_dtype(h.dtype))
                for k, h in (hdr or {}).items()
            }
            if self.scan_values and tensors:
                try:
                    tensors = dict(safeload.load_safetensors(self.path(rel)))
                except Exception as e:  # safetensors raises its own SafetensorError
                    self.add(codes.F104, f"cannot be read: {e}", path=rel, component="model")
                    return False
        else:
            obj = self.load(rel, component="model")
            if not isinstance(obj, Mapping):
                return False
            tensors = {str(k): v for k, v in safeload.iter_tensors(obj)}
        self.present("model", [rel], summary={"tensors": len(tensors)})
        self.model_tensors(tensors, file=rel, primary=True)
        return True

    # --- components --------------------------------------------------------------------------------

    def present(
        self,
        name: str,
        at: Iterable[str],
        *,
        how: str = "found",
        evidence: str = "",
        summary: Mapping[str, Any] | None = None,
    ) -> None:
        """Record that component ``name`` is at ``at`` (files or ``file:key`` places)."""
        assert name in mf.COMPONENTS, name
        row = self.rows.setdefault(name, _Row())
        at = list(at)
        row.where.extend(w for w in at if w not in row.where)
        for k, v in (summary or {}).items():
            row.summary.setdefault(k, v)
        row.found.append((how, evidence))

    def optimizer_file(self, rel: str) -> bool:
        """Record ``optimizer`` from the file ``rel`` when it holds an optimizer state dict;
        return whether it did."""
        obj = self.load(rel, component="optimizer")
        if isinstance(obj, Mapping) and optimizer_shape(obj) is not None:
            self.present("optimizer", [rel])
            self.optimizer_state(obj, file=rel)
            return True
        return False

    def scheduler_file(self, rel: str) -> None:
        """Record ``scheduler`` from the LR scheduler state file ``rel`` when it holds a
        state dict."""
        sch = self.load(rel, component="scheduler")
        if isinstance(sch, Mapping):
            self.present("scheduler", [rel], summary=scheduler_summary(sch))

    def scaler_file(self, rel: str) -> None:
        """Record ``scaler`` from the GradScaler state file ``rel`` (the ``scaler.pt`` of a
        Trainer or an Accelerate folder, fp16 AMP only) when it loads."""
        sc = self.load(rel, component="scaler")
        if sc is not None:
            self.present("scaler", [rel], summary=scaler_summary(sc))

    def world_from_rng(self, rng: list[str]) -> None:
        """Record ``parallel`` from the per-process RNG files ``rng``: one file per process,
        so their count is the world size."""
        self.present(
            "parallel",
            rng,
            summary={"world_size": len(rng)},
            evidence="world size counted from the per-process RNG files",
        )

    def absent(self, name: str, reason: str) -> None:
        """Say what the component's absence means for this tool (kept if it stays absent)."""
        self.reasons.setdefault(name, reason)

    def require(self, name: str, reason: str) -> None:
        """This tool needs ``name`` for a resume (beyond model, optimizer and progress);
        ``reason`` says what happens without it."""
        self.required.add(name)
        self.absent(name, reason)

    def counter(self, key: str, v: Any) -> None:
        """Record a progress counter (``global_step``, ``epoch`` ...) found in the content."""
        n = as_int(v)
        if n is None:
            f = value(v)
            if key in EPOCH_KEYS and isinstance(f, float):
                self.rows.setdefault("progress", _Row()).summary.setdefault("epoch", f)
            return
        if key in STEP_KEYS:
            self._steps.setdefault(key, n)
        summ = self.rows.setdefault("progress", _Row()).summary
        summ.setdefault("epoch" if key in EPOCH_KEYS else key, n)

    # --- content -----------------------------------------------------------------------------------

    def model_tensors(
        self,
        tensors: Mapping[str, Any],
        *,
        file: str | None,
        path: tuple[Any, ...] = (),
        primary: bool | None = None,
    ) -> None:
        """Register model tensors: shapes for the checks, values scanned for NaN/Inf.

        The first model registered is the primary one (its shapes are what optimizer
        moments are held against) unless ``primary`` says otherwise (weight shards).
        """
        if primary is None:
            primary = not self.model
        for name, t in tensors.items():
            t = value(t)
            if not is_tensor(t):
                continue
            if primary:
                self.model[str(name)] = t
            if isinstance(t, torch.Tensor):
                self.scan_tensor("model", self.tensor_key(file, (*path, name)), t)

    def optimizer_state(self, sd: Any, *, file: str | None, path: tuple[Any, ...] = ()) -> None:
        """Register an optimizer state dict: its view for the checks, moments for NaN/Inf."""
        self._optimizers.append(sd)
        try:
            summ, _groups, state = optimizer_facts(sd)
        except (TypeError, AttributeError, ValueError):
            return
        row = self.rows.setdefault("optimizer", _Row())
        for k, v in summ.items():
            row.summary.setdefault(k, v)
        if not self.scan_values:
            return
        state_path = (*path, "state") if isinstance(value(sd).get("state"), Mapping) else path
        for pid, per in state.items():
            per = value(per)
            if isinstance(per, Mapping):
                for k, t in per.items():
                    t = value(t)
                    if isinstance(t, torch.Tensor):
                        self.scan_tensor("optimizer", self.tensor_key(file, (*state_path, pid, k)), t)

    def scan_tensor(self, component: str, key: str, t: torch.Tensor) -> None:
        """Count NaN/Inf in one model or optimizer tensor (the one counter, shared with
        native checkpoints)."""
        if not self.scan_values or component not in self.bad:
            return
        try:
            nf = count_nonfinite(key, t)
        except (RuntimeError, TypeError):  # a dtype without CPU kernels: not judged
            return
        if nf is not None:
            self.bad[component].append(nf)

    def recognised(self, rec: Recognised, *, file: str | None, base: tuple[Any, ...] = ()) -> None:
        """Register every part :func:`~ckptkit.verify.foreign.structure.recognise` found."""
        for part in rec.parts:
            self._part(part, file=file, base=base)

    def _part(self, part: Part, *, file: str | None, base: tuple[Any, ...]) -> None:
        path = (*base, *part.path)
        node = part.node
        where = [self.loc(file, path)]
        comp = part.component
        summary: dict[str, Any] = {}
        if comp == "model":
            v = value(node)
            tensors = dict(_flatten(v)) if isinstance(v, Mapping) else {"": v}
            summary = {"tensors": count_tensors(v)}
            self.model_tensors(tensors, file=file, path=path)
        elif comp == "optimizer":
            v = value(node)
            if isinstance(v, Mapping):
                self.optimizer_state(v, file=file, path=path)
        elif comp == "progress":
            v = value(node)
            if isinstance(v, Mapping):
                for k, x in v.items():
                    if isinstance(k, str) and k in (STEP_KEYS | EPOCH_KEYS | _COUNTS):
                        self.counter(k, x)
            elif part.path and isinstance(part.path[-1], str):
                self.counter(part.path[-1].lower(), v)
        elif comp == "scheduler":
            summary = scheduler_summary(value(node))
        elif comp == "scaler":
            summary = scaler_summary(value(node))
        elif comp == "parallel":
            summary = _parallel_summary(value(node))
        elif comp == "sampler":
            v = value(node)
            if isinstance(v, Mapping):
                summary = {
                    k: n for k, x in v.items()
                    if isinstance(k, str) and (n := as_int(x)) is not None and not k.startswith("_")
                }
        self.present(comp, where, how=part.how, evidence=part.evidence, summary=summary)

    # --- the result ----------------------------------------------------------------------------------

    def finish(self, expect: Expect | None = None) -> ForeignState:
        """Build the state view: the table, the expectation, the optimizer views."""
        self.step = next((self._steps[k] for k in STEP_ORDER if k in self._steps), self.step)
        if self.step is not None:
            self.rows.setdefault("progress", _Row()).summary.setdefault("step", self.step)
        table: dict[str, mf.Component] = {}
        found: dict[str, Found] = {}
        for name in mf.COMPONENTS:
            row = self.rows.get(name)
            if row is not None and row.where:
                how = "found" if any(h == "found" for h, _ in row.found) else "inferred"
                evidence = "; ".join(sorted({e for h, e in row.found if e and h == how}))
                found[name] = Found(how, tuple(row.where), evidence)  # type: ignore[arg-type]
                table[name] = mf.Component(
                    name=name,
                    present=True,
                    required=name in RESUME_STATE or name in self.required,
                    where=tuple(row.where),
                    summary=dict(row.summary),
                )
            else:
                table[name] = mf.Component(
                    name=name,
                    present=False,
                    required=name in self.required,
                    reason=self.reasons.get(name),
                )
        why = ""
        if self.opaque:
            expect = None  # nothing was read: no component can be held to be there
        elif expect is None:
            held = {n for n, c in table.items() if c.present and n in RESUME_STATE}
            if held == {"model"}:
                expect = "weights"
                why = "it holds model tensors and no optimizer, step, scheduler, RNG or data state"
            else:
                expect = "training"
                why = "it holds training state" if held - {"model"} else "nothing shows otherwise"
        views = []
        alone = len(self._optimizers) == 1
        for sd in self._optimizers:
            v = optimizer_view(sd, self.model, alone=alone)
            if v is not None:
                views.append(v)
        shapes = {n: s for n, t in self.model.items() if (s := shape_of(t)) is not None}
        return ForeignState(
            table=table,
            where_found=found,
            expect=expect,
            expect_why=why,
            opt_views=views,
            shapes=shapes,
            bad={k: list(v) for k, v in self.bad.items()},
        )

    def file_scans(self, recorded: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, FileScan]:
        """One :class:`FileScan` per file, for the registered file checks.

        Without ``recorded`` digests (no ``ckptkit adopt``) each file is recorded as
        found: only the "inside the checkpoint" rule (CK-F009) can fire. With them, every
        recorded file is compared by size and digest (CK-F001/F002/F003).
        """
        out: dict[str, FileScan] = {}
        if recorded is None:
            for rel in self.files:
                size = _lsize(self.path(rel))
                fe = mf.FileEntry(path=rel, size=size, xxh3_128="")
                out[rel] = FileScan(fe, exists=True, outside=rel in self.outside, size=size)
            return out
        for rel, rec in recorded.items():
            fe = mf.FileEntry(path=rel, size=int(rec["size"]), xxh3_128=str(rec["xxh3_128"]))
            out[rel] = _scan_recorded(
                self.root, fe, outside=rel in self.outside, read=self.digests.get(rel)
            )
        for rel in self.outside - set(recorded):
            fe = mf.FileEntry(path=rel, size=0, xxh3_128="")
            out[rel] = FileScan(fe, exists=True, outside=True)
        return out


_COUNTS = frozenset({"consumed_samples", "consumed_tokens", "tokens_seen", "ntokens_seen"})


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Tensors of a (possibly nested) model mapping, keyed by dotted state-dict name."""
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        v = value(v)
        if isinstance(v, Mapping):
            out.extend(_flatten(v, name))
        elif is_tensor(v):
            out.append((name, v))
    return out


def scheduler_summary(v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        return {}
    kind = None
    keys = {k for k in v if isinstance(k, str)}
    if {"best", "num_bad_epochs"} <= keys:
        kind = "ReduceLROnPlateau"
    elif "_schedulers" in keys and "_milestones" not in keys:
        kind = "ChainedScheduler"
    out: dict[str, Any] = {"type": kind, "last_epoch": as_int(v.get("last_epoch"))}
    for key, name in (("_last_lr", "last_lr"), ("base_lrs", "base_lrs")):
        lrs = value(v.get(key))
        if isinstance(lrs, list | tuple) and all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in lrs
        ):
            out[name] = [float(x) for x in lrs]
    return out


def scaler_summary(v: Any) -> dict[str, Any]:
    """A GradScaler state dict's facts in the native vocabulary (``enabled``, ``scale`` ...)."""
    if not isinstance(v, Mapping) or "scale" not in v:
        return {}
    try:
        return scaler_capture.summary({"enabled": True, "state_dict": v})
    except (TypeError, ValueError, RuntimeError):
        return {}


def _parallel_summary(v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        return {}
    sizes: dict[str, int] = {}
    for k, x in v.items():
        if not isinstance(k, str):
            continue
        n = as_int(x)
        key = _PARALLEL_SYNONYMS.get(k.lower(), k.lower())
        if n is not None and key in ("world_size", "tp", "pp", "dp", "cp", "ep", "rank", "zero_stage"):
            sizes.setdefault(key, n)
    out: dict[str, Any] = dict(sizes)
    if "world_size" in sizes:
        try:
            cfg = ParallelConfig(**sizes)  # type: ignore[arg-type]
            out["problems"] = [p for p in cfg.validate() if not p.startswith("rank ")]
        except (TypeError, ValueError):
            pass
    return out


def _lsize(p: Path) -> int:
    try:
        return os.lstat(p).st_size
    except OSError:
        return 0


def _scan_recorded(
    root: Path, fe: mf.FileEntry, *, outside: bool, read: tuple[str, int] | None = None
) -> FileScan:
    """Compare one file with what ``ckptkit adopt`` recorded (size, then xxh3-128), by the
    one scan of a local file (:func:`ckptkit.verify.context.scan_local`).

    ``read``: ``(digest, size)`` of the file taken by the reader's own pass
    (:attr:`Scan.digests`); used when the file still has that size, else it is hashed.
    A symlink swapped in after the look is reported replaced, as it always was here.
    """

    def digest_of(p: Path, fe: mf.FileEntry) -> FileScan:
        if read is not None and read[1] == fe.size:
            return FileScan(fe, exists=True, size=read[1], digest=read[0])
        hexd, size = digest.hash_file(p)
        return FileScan(fe, exists=True, size=size, digest=hexd)

    return scan_local(root, fe, digest_of, outside=outside, swapped_link="replaced")


__all__ = ["ADOPTED_SUFFIX", "Scan", "scaler_summary", "scheduler_summary"]
