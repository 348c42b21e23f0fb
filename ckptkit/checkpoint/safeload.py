"""Read foreign checkpoint files without executing code: zip CRCs, safe pickles, headers.

Nothing here unpickles with the full :mod:`pickle` machinery. torch files go through
``torch.load(weights_only=True)`` with a narrow allow-list (:data:`SAFE_GLOBALS`); the DCP
``.metadata`` pickle goes through :class:`_DcpUnpickler`, whose ``find_class`` only hands
out torch's own checkpoint-metadata dataclasses. A file that needs anything else is
reported unreadable with the globals it asks for, and is never executed.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import struct
import zipfile
import zlib
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

try:  # the Python 2 -> 3 names torch's weights-only unpickler maps (private API)
    from torch._utils import IMPORT_MAPPING as _IMPORT_MAPPING
    from torch._utils import NAME_MAPPING as _NAME_MAPPING
except ImportError:  # pragma: no cover - older torch: the stdlib tables it adapts
    from _compat_pickle import IMPORT_MAPPING as _IMPORT_MAPPING
    from _compat_pickle import NAME_MAPPING as _NAME_MAPPING

from ckptkit import codes
from ckptkit.errors import CkptkitError, IntegrityError
from ckptkit.format.dtypes import DTYPES
from ckptkit.storage import dcp_meta
from ckptkit.storage import tensors as st

ZIP_CHUNK = 1 << 20
MAX_PICKLE_BYTES = 256 << 20
"""A ``data.pkl`` (or DCP ``.metadata``) larger than this is not parsed (hostile input)."""

MAX_INFLATED_ENV = "CKPTKIT_MAX_INFLATED_BYTES"
"""Environment variable that overrides :data:`MAX_INFLATED_BYTES` (a number of bytes)."""
MAX_INFLATED_BYTES = 256 << 20
"""How many bytes the *compressed* members of a torch zip archive may inflate to, in total,
before ckptkit refuses to load it (``CK-F109``).

``torch.load`` reads ``data.pkl`` and every storage member into memory whole, so a small
file whose deflated members expand to gigabytes (a zip bomb) would drive ``verify``,
``inspect`` and ``adopt`` to gigabytes of memory. torch.save stores its members
uncompressed: their bytes are on disk and cost no more than the file's own size, so only
compressed members count against this bound (a large real checkpoint is never refused).
"""


def _numpy_globals() -> list[Any]:
    core = getattr(np, "_core", None) or np.core
    out: list[Any] = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    # numpy >= 1.25 pickles dtypes as numpy.dtypes.<Name>DType classes.
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        out += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]
    else:  # pragma: no cover - old numpy
        out.append(type(np.dtype(np.uint32)))
    return out


SAFE_GLOBALS: list[Any] = [
    *_numpy_globals(),
    torch.torch_version.TorchVersion,
    io.BytesIO,
]
"""What ``torch.load(weights_only=True)`` may build beyond its own defaults.

numpy arrays, dtypes and scalars (NumPy RNG state in Trainer ``rng_state.pth`` and
Accelerate ``random_states_*.pkl``), ``torch.__version__`` (a ``str`` subclass) and
``io.BytesIO`` (torchtitan keeps loss histories as BytesIO in its DCP ``train_state``; the
bytes inside are never unpickled). None of these runs user code; every other global stays
refused and is reported.

It holds every framework's list (``tests/checkpoint/test_foreign_loads.py``), so ckptkit reads
whatever a framework's load accepts; a file a resume loads is then held to that load's
narrower list as well (:func:`ckptkit.verify.foreign.loads.refused_by_load`).
"""


@dataclass(frozen=True)
class Problem:
    """Why a file could not be read: a finding code and the message."""

    code: str
    message: str


def failed_read(e: BaseException, damage: str, what: str) -> Problem:
    """A failed read of a foreign file as a finding: ``CK-F025`` (unreadable now, tried again
    later, never deleted as corrupt) when the error is not evidence of damage (a permission,
    EIO, a stale handle: :func:`ckptkit.codes.transient`), else ``damage``.

    Example:
        >>> import errno
        >>> failed_read(PermissionError(errno.EACCES, "Permission denied"), "CK-F108", "x").code
        'CK-F025'
        >>> failed_read(EOFError("truncated"), "CK-F108", "torch.load failed").code
        'CK-F108'
    """
    if codes.transient(e):
        return Problem(codes.UNREADABLE, f"cannot be read now: {errname(e)}: {first_line(e)}")
    return Problem(damage, f"{what}: {errname(e)}: {first_line(e)}")


# --- zip archives (torch.save's default format) -----------------------------------------


def is_zip(path: Path) -> bool:
    """Whether ``path`` starts like a zip archive (torch.save's format since 1.6)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


ZIP_OPEN_ERRORS: tuple[type[Exception], ...] = (
    zipfile.BadZipFile,
    OSError,
    ValueError,
    NotImplementedError,
    EOFError,
    struct.error,
)
"""What :class:`zipfile.ZipFile` raises on a damaged archive (e.g. ``NotImplementedError:
zip file version 25.5`` for a flipped byte in a central-directory record)."""

ZIP_READ_ERRORS: tuple[type[Exception], ...] = (*ZIP_OPEN_ERRORS, zlib.error)
"""What reading a member of a damaged archive raises."""


def open_zip(src: Path | IO[bytes]) -> tuple[zipfile.ZipFile | None, str | None]:
    """Open a zip archive: ``(archive, None)``, or ``(None, why)`` when it is damaged."""
    try:
        return zipfile.ZipFile(src), None
    except ZIP_OPEN_ERRORS as e:
        return None, f"{errname(e)}: {first_line(e)}"


def max_inflated_bytes() -> int:
    """The bound on inflated bytes: ``$CKPTKIT_MAX_INFLATED_BYTES``, else the default.

    Raises:
        CkptkitError: the variable is set but is not a non-negative whole number of bytes.

    Example:
        >>> import os; os.environ.pop(MAX_INFLATED_ENV, None) and None
        >>> max_inflated_bytes() == MAX_INFLATED_BYTES
        True
    """
    raw = os.environ.get(MAX_INFLATED_ENV)
    if raw is None or raw.strip() == "":
        return MAX_INFLATED_BYTES
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise CkptkitError(
            f"{MAX_INFLATED_ENV}={raw!r} is not a number of bytes",
            hint=f"set it to a whole number of bytes, e.g. {MAX_INFLATED_ENV}={4 << 30} "
            "(4 GiB), or unset it for the default (256 MiB)",
        )
    return int(text)


def check_zip_sizes(zf: zipfile.ZipFile, *, archive_size: int) -> Problem | None:
    """Check what each member of a zip archive claims it holds, before anything reads it.

    A stored (uncompressed) member must hold as many bytes as it claims and fit in the
    archive (else ``CK-F102``: a lying or damaged directory). Compressed members may
    inflate to at most :func:`max_inflated_bytes` in total (else ``CK-F109``, naming the
    member, its sizes and the override); torch never compresses, so this bounds only
    archives that were re-packed, or built to exhaust memory.

    Example:
        >>> import io, zipfile
        >>> buf = io.BytesIO()
        >>> with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        ...     z.writestr("a/data.pkl", bytes(1 << 20))
        >>> check_zip_sizes(zipfile.ZipFile(buf), archive_size=len(buf.getvalue())) is None
        True
    """
    limit = max_inflated_bytes()
    inflated = 0
    for info in zf.infolist():
        name = info.filename
        if info.compress_size > archive_size:
            return Problem(
                codes.F102,
                f"member {name!r} claims {info.compress_size} bytes in an archive of "
                f"{archive_size}: truncated or damaged",
            )
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                return Problem(
                    codes.F102,
                    f"stored member {name!r} claims {info.file_size} bytes but holds "
                    f"{info.compress_size}: damaged",
                )
            continue
        inflated += info.file_size
        if inflated > limit:
            return Problem(
                codes.F109,
                f"compressed member {name!r} inflates to {info.file_size} bytes from "
                f"{info.compress_size} ({inflated} bytes of compressed members so far), past "
                f"the limit of {limit} bytes; not loaded (set {MAX_INFLATED_ENV} to a larger "
                "number of bytes to read it anyway)",
            )
    return None


def _check_sizes(path: Path) -> Problem | None:
    """:func:`check_zip_sizes` for the archive at ``path`` (None when it does not open:
    the CRC pass or ``torch.load`` reports that damage)."""
    zf, _why = open_zip(path)
    if zf is None:
        return None
    with zf:
        try:
            size = path.stat().st_size
        except OSError:
            return None
        return check_zip_sizes(zf, archive_size=size)


def check_zip(path: Path) -> Problem | None:
    """Read every member of a torch zip archive, checking its CRC-32.

    ``torch.load`` never checks the CRCs (not even with ``weights_only=True``): a flipped
    byte in a tensor loads silently. This reads the whole file once.

    Returns:
        None when intact; a ``CK-F102`` problem (truncated / not an archive) or a
        ``CK-F101`` problem (a member fails its CRC) otherwise.
    """
    zf, why = open_zip(path)
    if zf is None:
        return Problem(codes.F102, f"not a readable zip archive ({why}): truncated or damaged")
    with zf:
        for info in zf.infolist():
            try:
                with zf.open(info) as m:
                    while m.read(ZIP_CHUNK):
                        pass
            except zipfile.BadZipFile as e:
                if "CRC" in str(e):
                    return Problem(codes.F101, f"member {info.filename!r} fails its CRC-32 ({e})")
                return Problem(codes.F102, f"member {info.filename!r} is damaged ({e})")
            except ZIP_READ_ERRORS as e:
                return failed_read(e, codes.F102, f"member {info.filename!r} cannot be read")
    return None


def pickle_globals(data: bytes) -> list[str]:
    """List the ``module.name`` globals a pickle would import, without running it."""
    found, _complete = _scan_globals(_Bounded(io.BytesIO(data), len(data)))
    return found


class _Bounded:
    """A read-only stream that yields at most ``limit`` bytes of ``f`` (hostile lengths)."""

    def __init__(self, f: IO[bytes], limit: int) -> None:
        self._f = f
        self._left = limit
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        self._pos += len(data)
        return data

    def readline(self) -> bytes:
        data = self._f.readline(self._left)
        self._left -= len(data)
        self._pos += len(data)
        return data

    def tell(self) -> int:
        return self._pos


def _scan_globals(f: _Bounded) -> tuple[list[str], bool]:
    """Walk one pickle of stream ``f`` with :mod:`pickletools` (nothing is executed).

    Returns:
        ``(globals, complete)``: the sorted ``module.name`` globals seen, and whether the
        pickle parsed up to its ``STOP`` (False: damaged, truncated, not a pickle, or
        longer than the stream's bound).
    """
    out: list[str] = []
    strings: list[str] = []
    complete = False
    try:
        for op, arg, _pos in pickletools.genops(cast(IO[bytes], f)):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(arg))
            elif op.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                out.append(_py3_name(module, name))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                out.append(f"{strings[-2]}.{strings[-1]}")
            elif op.name == "STOP":
                complete = True
    except Exception:  # a damaged pickle: list what was seen so far (untrusted input)
        complete = False
    # Protocol <= 2 names builtins "__builtin__" (Python 2 spelling).
    return sorted({g.replace("__builtin__.", "builtins.", 1) for g in out}), complete


def _py3_name(module: str, name: str) -> str:
    """``module.name`` of a ``GLOBAL`` as torch's weights-only unpickler matches it: the
    Python 2 names a protocol-2 pickle (torch.save's) writes are mapped to Python 3's first
    (``__builtin__.set`` is ``builtins.set``), so a name refused here is one torch refuses."""
    if (module, name) in _NAME_MAPPING:
        module, name = _NAME_MAPPING[(module, name)]
    elif module in _IMPORT_MAPPING:
        module = _IMPORT_MAPPING[module]
    return f"{module}.{name}"


LEGACY_PICKLES = 4
"""Pickles at the start of a legacy (non-zip) torch file that may name globals: the magic
number, the protocol version, the system info and the object itself (the storage keys and
raw bytes follow)."""


def _pickled_globals(path: Path) -> tuple[list[str], bool]:
    """The globals the pickle(s) of a torch file name, and whether they parsed completely.

    A zip archive's ``data.pkl`` is streamed from the archive; a legacy file's leading
    pickles are walked in turn. At most :data:`MAX_PICKLE_BYTES` are walked.
    """
    try:
        if is_zip(path):
            zf, _why = open_zip(path)
            if zf is None:
                return [], False
            with zf:
                info = next(
                    (
                        i
                        for i in zf.infolist()
                        if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"
                    ),
                    None,
                )
                if info is None:
                    return [], False
                with zf.open(info) as m:
                    return _scan_globals(_Bounded(m, MAX_PICKLE_BYTES))
        found: set[str] = set()
        intact = False
        with open(path, "rb") as raw:
            f = _Bounded(raw, MAX_PICKLE_BYTES)
            for _ in range(LEGACY_PICKLES):
                names, complete = _scan_globals(f)
                if not complete:
                    # A plain pickle (not torch's legacy format) ends after its first object:
                    # what the intact pickles named still counts; a cut-off one does not.
                    return sorted(found), intact
                found.update(names)
                intact = True
        return sorted(found), True
    except ZIP_READ_ERRORS:
        return [], False


def global_names(objs: Iterable[Any]) -> frozenset[str]:
    """The ``module.name`` under which torch's weights-only unpickler accepts each of the
    allow-listed ``objs`` (``torch.serialization.add_safe_globals`` entries: an object, keyed
    by its ``__module__`` and ``__qualname__``, or an ``(object, name)`` pair).

    Example:
        >>> sorted(global_names([io.BytesIO, (print, "x.y")]))
        ['_io.BytesIO', 'x.y']
    """
    names = set()
    for g in objs:
        if isinstance(g, tuple) and len(g) == 2 and isinstance(g[1], str):
            names.add(g[1])
        else:
            names.add(f"{g.__module__}.{g.__qualname__}")
    return frozenset(names)


def torch_default_names() -> frozenset[str]:
    """The globals ``torch.load(weights_only=True)`` accepts with no allow-list added
    (torch's private ``_get_allowed_globals``; absent: none, so every global is reported)."""
    try:
        return frozenset(torch._weights_only_unpickler._get_allowed_globals())
    except AttributeError:  # pragma: no cover
        return frozenset()


def refused_globals(path: Path, allowed: Collection[str] | None = None) -> list[str]:
    """Globals a complete, intact pickle of ``path`` names that ``torch.load(weights_only=True)``
    refuses when ``allowed`` (names, :func:`global_names`) is added to torch's default list.

    ``allowed`` None: ckptkit's own list, :data:`SAFE_GLOBALS`. Empty when the pickle is
    damaged or not a pickle at all: a failure to load it is then damage, not a refusal.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.pt"; torch.save({"v": np.float64(1)}, p)
        >>> refused_globals(p), [g.rsplit(".", 1)[1] for g in refused_globals(p, allowed=())]
        ([], ['scalar', 'dtype'])
    """
    names, complete = _pickled_globals(path)
    if not complete:
        return []
    ok = global_names(SAFE_GLOBALS) if allowed is None else allowed
    default = torch_default_names()
    return [g for g in names if g not in ok and g not in default]


def safe_torch_load(path: Path, *, check_crc: bool = True) -> tuple[Any, Problem | None]:
    """Load a torch file with ``weights_only=True`` and the :data:`SAFE_GLOBALS` allow-list.

    Returns:
        ``(object, None)``, or ``(None, problem)``: ``CK-F101``/``CK-F102`` for a damaged
        archive, ``CK-F109`` for compressed members that would inflate past
        :func:`max_inflated_bytes` (checked before anything is read, CRC pass or not),
        ``CK-F103`` when an intact pickle names globals outside the allow-list
        (they are named; nothing is executed), ``CK-F108`` for any other failure (a
        damaged pickle, random bytes: never an exception, this reads untrusted input).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.pt"; torch.save({"a": 1}, p)
        >>> safe_torch_load(p)
        ({'a': 1}, None)
    """
    if is_zip(path):
        # Sizes first, CRC or not: torch.load would inflate every member into memory.
        bad = _check_sizes(path)
        if bad is None and check_crc:
            bad = check_zip(path)
        if bad is not None:
            return None, bad
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch wraps *every* failure of the weights-only unpickler ("Weights only load
        # failed ..."), damage included: only globals outside the allow-lists, named by
        # an intact pickle, make it a refusal (CK-F103) rather than damage (CK-F108).
        refused = refused_globals(path)
        if refused:
            names = ", ".join(refused[:12]) + (" …" if len(refused) > 12 else "")
            return None, Problem(
                codes.F103, f"needs code to unpickle, not on the allow-list: {names}; not executed"
            )
        return None, Problem(
            codes.F108, f"cannot be unpickled (damaged or not a torch file): {_unpickle_why(e)}"
        )
    except Exception as e:  # untrusted input: any failure is a finding, never a traceback
        return None, failed_read(e, codes.F108, "torch.load failed")
    return obj, None


def weights_only_refusal(path: Path, allow: list[Any]) -> str | None:
    """Why ``torch.load(weights_only=True)`` with ``allow`` added to torch's default list
    refuses ``path``, or None when it loads.

    The load itself, not a reading of the pickle's names: torch also refuses to *build* an
    object whose type is not on the list though no global names it (a float32 numpy array
    names ``numpy.dtype``, whose ``BUILD`` makes a ``numpy.dtypes.Float32DType``). For a
    file ckptkit already read with its own list (so its sizes are checked and nothing on
    this list runs code): a zip archive's storages are memory-mapped, not read.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.pt"
        >>> torch.save({"a": np.arange(3, dtype=np.float32)}, p)
        >>> weights_only_refusal(p, SAFE_GLOBALS) is None
        True
        >>> core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
        >>> arrays = [core.multiarray._reconstruct, np.ndarray, np.dtype]
        >>> "Float32DType" in weights_only_refusal(p, arrays)
        True
    """
    try:
        with torch.serialization.safe_globals(allow):
            torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip(path))
    except pickle.UnpicklingError as e:
        return _unpickle_why(e)
    except Exception:  # not a refusal by this list (damage was reported by ckptkit's own read)
        return None
    return None


def _unpickle_why(e: BaseException) -> str:
    """The useful part of torch's weights-only error (it leads with boilerplate)."""
    text = str(e)
    marker = "WeightsUnpickler error:"
    if marker in text:
        lines = text[text.index(marker) + len(marker) :].strip().splitlines()
        why = next((ln.strip() for ln in lines if ln.strip()), "")
        if why:
            return why[:300]
    return first_line(e)


def errname(e: BaseException) -> str:
    """``ValueError``, ``struct.error``: the exception's type, qualified when not builtin."""
    t = type(e)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod.removeprefix('_')}.{t.__qualname__}"


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters), for a finding."""
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


# --- tensors ---------------------------------------------------------------------------------------


def iter_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(dotted key, tensor)`` for every tensor in a nested dict/list/tuple."""
    if isinstance(obj, torch.Tensor):
        yield prefix or "<root>", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from iter_tensors(v, f"{prefix}.{i}" if prefix else str(i))


# --- safetensors ------------------------------------------------------------------------------


def check_safetensors(path: Path, rel: str) -> tuple[dict[str, Any] | None, Problem | None]:
    """Check a safetensors header and its offsets against the file length.

    Returns:
        ``(header entries, None)`` or ``(None, CK-F104 problem)``.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n, raw = st.read_header_from(f, path=rel, file_size=size)
        return st.parse_header(raw, path=rel, data_len=size - 8 - n), None
    except IntegrityError as e:
        return None, Problem(codes.F104, e.what)
    except OSError as e:
        return None, failed_read(e, codes.F104, "cannot be read")


def safetensors_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype name (``F32`` → ``torch.float32``), or None."""
    return DTYPES.get(name)


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load every tensor of a safetensors file (header already checked)."""
    from safetensors.torch import load_file

    return dict(load_file(str(path), device="cpu"))


# --- DCP metadata -------------------------------------------------------------------------------

def read_dcp_metadata(path: Path) -> tuple[Any, Problem | None]:
    """Read a DCP ``.metadata`` file with the restricted unpickler of :mod:`ckptkit.storage.dcp_engine`."""
    try:
        data = path.read_bytes()
    except OSError as e:
        return None, failed_read(e, codes.F108, "cannot be read")
    return loads_dcp_metadata(data)


def loads_dcp_metadata(data: bytes) -> tuple[Any, Problem | None]:
    """:func:`read_dcp_metadata` of bytes already read."""
    if len(data) > MAX_PICKLE_BYTES:
        return None, Problem(codes.F108, f"{len(data)} bytes: absurdly large metadata")
    try:
        return dcp_meta.loads_metadata(data), None
    except pickle.UnpicklingError as e:
        if "not allowed" in str(e):
            return None, Problem(codes.F103, f"{e}; not executed")
        return None, Problem(codes.F108, f"damaged or truncated pickle: {first_line(e)}")
    except (
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
        IndexError,
        ImportError,
        RecursionError,
        MemoryError,
    ) as e:
        return None, Problem(
            codes.F108, f"damaged or truncated pickle: {errname(e)}: {first_line(e)}"
        )
    except Exception as e:  # untrusted input: any failure is a finding, never a traceback
        return None, Problem(codes.F108, f"cannot be unpickled: {errname(e)}: {first_line(e)}")
