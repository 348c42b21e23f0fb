"""What a format module fills while it reads a foreign checkpoint: components and findings.

Each format module has ``scan(s: Scan) -> None``: it looks at the files, loads what it
needs through :meth:`Scan.load` / :meth:`Scan.safetensors` (integrity findings are made
there, once per file), fills the spec §1 component table with :meth:`Scan.comp`, and
reports what is missing with the tool-specific consequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ckptkit import manifest as mf
from ckptkit.foreign import _load
from ckptkit.verify.findings import CODES, INFO, WARNING, Finding, Severity

ADOPTED_SUFFIX = "ckptkit-manifest.json"
"""Name of the manifest ``ckptkit adopt`` writes (never ``manifest.json``: the foreign
directory must not look like a native checkpoint)."""


@dataclass
class Scan:
    """A foreign checkpoint being read: where it is, its files, and what was found."""

    target: Path
    """The path given: a directory, or one file (Lightning, torch.save)."""
    format: str
    root: Path
    """The directory file paths are relative to."""
    files: list[str] = field(default_factory=list)
    """Files of the checkpoint, relative to ``root`` (the adopted manifest excluded)."""
    findings: list[Finding] = field(default_factory=list)
    components: dict[str, mf.Component] = field(default_factory=dict)
    step: int | None = None
    scan_values: bool = True
    """Load tensors and scan for NaN/Inf (verify); False for inspect and adopt."""
    _cache: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, target: Path | str, fmt: str, *, scan_values: bool = True) -> Scan:
        """List the files of ``target`` and start an empty component table."""
        t = Path(target)
        if t.is_dir():
            root = t
            files = sorted(
                p.relative_to(t).as_posix()
                for p in t.rglob("*")
                if p.is_file() and not p.is_symlink() and not p.name.endswith(ADOPTED_SUFFIX)
            )
        else:
            root, files = t.parent, [t.name] if t.exists() else []
        s = cls(target=t, format=fmt, root=root, files=files, scan_values=scan_values)
        for n in mf.COMPONENTS:
            s.components[n] = mf.Component(name=n, present=False, required=False)
        return s

    # --- results -------------------------------------------------------------------------

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

    def comp(
        self,
        name: str,
        *,
        present: bool,
        required: bool = False,
        where: Iterable[str] = (),
        summary: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        """Set one row of the component table (spec §1 names only)."""
        assert name in mf.COMPONENTS, name
        self.components[name] = mf.Component(
            name=name,
            present=present,
            required=required,
            where=tuple(where),
            summary=dict(summary or {}),
            reason=reason,
        )

    def load_present(
        self, name: str, files: list[str], *, summary: dict[str, Any] | None = None
    ) -> bool:
        """Load ``files`` safely as component ``name`` and mark it present (required).

        Returns False (and changes nothing) when ``files`` is empty.
        """
        if not files:
            return False
        for f in files:
            self.load(f, component=name)
        self.comp(name, present=True, required=True, where=files, summary=summary)
        return True

    def load_model(self, files: list[str]) -> bool:
        """Check model weight files (safetensors header/length, or a safe torch load plus a
        NaN/Inf scan) and mark the model present; False when ``files`` is empty."""
        if not files:
            return False
        self.comp("model", present=True, required=True, where=files)
        for f in files:
            if f.endswith(".safetensors"):
                self.safetensors(f)
            else:
                obj = self.load(f, component="model")
                if obj is not None:
                    self.nonfinite("model", iter_state(obj), path=f)
        return True

    def missing(
        self,
        name: str,
        code: str,
        message: str,
        *,
        hint: str | None = None,
        severity: Severity | None = None,
    ) -> None:
        """Mark a required component absent and report it with the tool's consequence."""
        self.comp(name, present=False, required=True, reason=message)
        self.add(code, message, component=name, hint=hint, severity=severity)

    # --- files ---------------------------------------------------------------------------

    def has(self, rel: str) -> bool:
        return rel in self.files

    def glob(self, pattern: str) -> list[str]:
        """Files whose name (relative path) matches ``pattern`` (fnmatch), sorted."""
        import fnmatch

        return [f for f in self.files if fnmatch.fnmatch(f, pattern)]

    def path(self, rel: str) -> Path:
        return self.root / rel

    def load(self, rel: str, *, component: str, critical: bool = True) -> Any | None:
        """Load a torch file safely, once; on failure record the finding and return None.

        ``critical=False`` files (e.g. ``training_args.bin``) hold no resume state: a pickle
        needing code there is reported as info, not a warning.
        """
        if rel in self._cache:
            return self._cache[rel]
        obj, problem = _load.safe_torch_load(self.path(rel))
        if problem is not None:
            sev = INFO if (problem.code == "CK-F103" and not critical) else None
            self.add(problem.code, problem.message, path=rel, component=component, severity=sev)
        self._cache[rel] = obj
        return obj

    def safetensors(self, rel: str, *, component: str = "model") -> bool:
        """Check a safetensors file's header against its length; scan values when asked."""
        hdr, problem = _load.check_safetensors(self.path(rel), rel)
        if problem is not None:
            self.add(problem.code, problem.message, path=rel, component=component)
            return False
        if self.scan_values and hdr:
            try:
                tensors = _load.load_safetensors(self.path(rel))
            except Exception as e:  # safetensors raises its own SafetensorError
                self.add("CK-F104", f"cannot be read: {e}", path=rel, component=component)
                return False
            self.nonfinite(component, tensors.items(), path=rel)
        return True

    def nonfinite(
        self,
        component: str,
        tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        path: str | None = None,
        prefix: str = "",
    ) -> None:
        """Report NaN/Inf in model (CK-S010) or optimizer (CK-S011) tensors, named.

        Only model and optimizer tensors are scanned: other state legitimately holds
        ±Inf (Lightning's ModelCheckpoint ``kth_value``, attention masks).
        """
        if not self.scan_values or component not in ("model", "optimizer"):
            return
        found = _load.nonfinite(iter((prefix + k, t) for k, t in tensors))
        if not found:
            return
        code = "CK-S010" if component == "model" else "CK-S011"
        hard = [nf for nf in found if nf.nan or component == "optimizer"]
        soft = [nf for nf in found if nf not in hard]
        if hard:
            self.add(
                code,
                f"{len(hard)} tensor(s) hold NaN/Inf: " + _names(hard),
                path=path,
                component=component,
            )
        if soft:
            self.add(
                code,
                f"{len(soft)} tensor(s) hold ±Inf (no NaN): " + _names(soft),
                path=path,
                component=component,
                severity=WARNING,
                hint="buffers such as attention masks may hold -inf on purpose; "
                "otherwise the model diverged before this save: resume from an "
                "earlier checkpoint",
            )

    def unrecognised(self, what: str, names: Iterable[str], *, path: str | None = None) -> None:
        """Report keys/files not mapped to a component (CK-C104, info)."""
        names = sorted(set(names))
        if names:
            shown = ", ".join(names[:12]) + (f" … (+{len(names) - 12})" if len(names) > 12 else "")
            self.add("CK-C104", f"{what} not recognised: {shown}", path=path)


def _names(found: list[_load.NonFinite]) -> str:
    shown = ", ".join(nf.describe() for nf in found[:5])
    return shown + (f" … (+{len(found) - 5} more)" if len(found) > 5 else "")


def iter_state(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested state dict, keyed by dotted path."""
    return _load.iter_tensors(obj, prefix)


def as_int(v: Any) -> int | None:
    """An int from an int, a 0-d tensor or a float with no fraction; else None."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def adam_step(opt: Any) -> int | None:
    """The ``step`` of the first parameter's optimizer state (Adam-like), or None."""
    state = opt.get("state")
    if isinstance(state, dict):
        for v in state.values():
            if isinstance(v, dict) and "step" in v:
                return as_int(v["step"])
    return None
