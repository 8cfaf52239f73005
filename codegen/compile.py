"""Numba compilation and the kernel caches -- the only texpr module that imports numba.

The text compiled is :attr:`codegen.lower.Program.module_source`: canonical
identifiers and no user names (see :mod:`codegen.source`), so it is a function
of the scheduled graph's structure alone. It is written under the cache
directory as ``texpr_k_<key>.py``, ``key`` the sha256 of the numba version,
the argument types and the text, so that numba's own on-disk cache
(``cache=True``: ``__pycache__/texpr_k_<key>.*.nbi`` and ``.nbc`` beside the
module) is found again by a second process running the same program: it loads
the machine code instead of recompiling. In one process, compiled kernels are
also kept in memory by the same key.

Integrity (the name of a module is the checksum of its content):

* the code executed is always the text in memory, compiled with the module's
  path as its file name; the file on disk is only compared with it, byte for
  byte. A file that differs (truncated, empty, random bytes, another text) is
  discarded with its numba cache files and written again, with one
  :class:`CacheWarning`;
* numba cache files that fail to load (empty, truncated, random bytes) are
  removed and the kernel recompiled (and cached again), with one warning;
* files are written atomically (a temporary file in the same directory, then
  ``os.replace``), so a reader never sees half a module;
* a cache directory that cannot be used (it is a file, it is not writable, it
  is deleted while kernels are built) degrades to compiling in memory, with one
  warning per process: never an exception.

The directory is ``$TEXPR_CACHE_DIR``, else ``$XDG_CACHE_HOME/texpr``, else
``~/.cache/texpr``.
"""

import glob
import hashlib
import os
import sys
import tempfile
import time
import types as _pytypes
import warnings

# numba's OpenMP workers spin while waiting by default; on a machine whose cores
# are shared (with other processes, or with torch's/JAX's thread pools in the same
# process) a spinning worker that loses its core stalls every parallel loop by a
# time slice (measured: 10-50x slower kernels). Waiting passively costs little
# on an idle machine. A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba.core import types  # noqa: E402

from texpr.errors import TexprError, TexprWarning  # noqa: E402

__all__ = ["CompileError", "CacheWarning", "cache_dir", "compile_source", "clear_memory_cache"]

_MEMORY = {}
_WARNED = set()


class CompileError(TexprError):
    """Numba failed to compile a generated kernel (the message names the stages)."""


class CacheWarning(TexprWarning):
    """The on-disk kernel cache was repaired (a corrupt entry rebuilt) or could not
    be used (kernels are then compiled in memory)."""


def cache_dir():
    """The directory of generated modules (created if missing).

    Raises OSError when it cannot be created (e.g. the path is a file);
    :func:`compile_source` then compiles in memory."""
    d = os.environ.get("TEXPR_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "texpr")
    os.makedirs(d, exist_ok=True)
    return d


def clear_memory_cache():
    """Forget the kernels compiled in this process (the disk cache stays)."""
    _MEMORY.clear()


def _warn_once(tag, message):
    if tag in _WARNED:
        return
    _WARNED.add(tag)
    warnings.warn(message, CacheWarning, stacklevel=4)


def _array_type(dtype, ndim):
    return types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")


class Compiled:
    """A compiled kernel: ``fn`` (the numba dispatcher), ``key``, ``path`` (of the
    module on disk; None when it was compiled in memory), ``compile_seconds``,
    ``from_disk_cache`` (loaded without compiling), ``from_memory_cache``."""

    def __init__(self, fn, key, path, seconds, from_disk):
        self.fn, self.key, self.path = fn, key, path
        self.compile_seconds, self.from_disk_cache = seconds, from_disk
        self.from_memory_cache = False


class _CacheUnusable(Exception):
    """The disk cache failed for this kernel (the cause is the message)."""


def _load(source, modname, path):
    """The ``kernel`` dispatcher of ``source`` executed as module ``modname``:
    with numba's disk cache when ``path`` (the module's file, holding the same
    text) is given, else in memory only."""
    if path is None:
        # the text is ours (no user text outside comments): the flag is the only change
        source = source.replace("cache=True", "cache=False")
    code = compile(source, path or f"<texpr kernel {modname}>", "exec")
    mod = _pytypes.ModuleType(modname)
    mod.__file__ = path
    # numba's cached code names its module: it must be importable by that name
    sys.modules[modname] = mod
    exec(code, mod.__dict__)
    return mod.__dict__["kernel"]


def _compile(fn, sig):
    # numba leaves LLVM's SLP vectoriser off; the unrolled partial sums of the
    # generated reductions need it (restored after: other numba users keep theirs)
    slp = numba.config.SLP_VECTORIZE
    numba.config.SLP_VECTORIZE = 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn.compile(sig)
    finally:
        numba.config.SLP_VECTORIZE = slp
    return fn


def _numba_files(d, modname):
    return glob.glob(os.path.join(glob.escape(os.path.join(d, "__pycache__")),
                                  glob.escape(modname) + ".*"))


def _remove(paths):
    n = 0
    for p in paths:
        try:
            os.unlink(p)
            n += 1
        except OSError:
            pass
    return n


def _write_atomic(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _remove([tmp])
        raise


def _module_file(d, modname, data):
    """The path of the module ``modname`` in ``d`` holding exactly ``data``:
    written if missing, rewritten (its numba cache files removed, one warning)
    if it holds anything else."""
    path = os.path.join(d, modname + ".py")
    try:
        with open(path, "rb") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    if old is not None and old != data:
        _warn_once(("entry", path),
                   f"texpr: the cached kernel module {path} does not hold the text its name "
                   f"is the checksum of ({len(old)} bytes instead of {len(data)}; truncated or "
                   "overwritten): it was discarded with its numba cache files and rebuilt")
        _remove(_numba_files(d, modname))
        old = None
    if old is None:
        _write_atomic(path, data)
    return path


def _on_disk(d, key, source, sig):
    modname = f"texpr_k_{key}"
    data = source.encode("utf-8")
    try:
        path = _module_file(d, modname, data)
        return path, _compile(_load(source, modname, path), sig)
    except Exception as exc:  # noqa: BLE001 - numba's cache raises many kinds
        first = exc
    # numba's cache files that cannot be read (empty, truncated, random bytes) make
    # the load fail: remove them and compile again (numba writes them afresh)
    if _remove(_numba_files(d, modname)):
        try:
            path = _module_file(d, modname, data)
            fn = _compile(_load(source, modname, path), sig)
        except Exception as exc:  # noqa: BLE001
            raise _CacheUnusable(f"{type(exc).__name__}: {exc}") from None
        _warn_once(("numba", path),
                   f"texpr: numba's cache files of {path} could not be loaded "
                   f"({type(first).__name__}: {str(first)[:200]}); they were removed and the "
                   "kernel recompiled")
        return path, fn
    raise _CacheUnusable(f"{type(first).__name__}: {first}")


def compile_source(source, arg_specs, describe=""):
    """Compile ``source`` (the canonical text defining ``kernel``, free of user
    names: :attr:`codegen.lower.Program.module_source`) for arguments
    ``arg_specs`` (a list of ``(dtype, ndim)``, C-contiguous arrays).

    Returns a :class:`Compiled`. Raises :class:`CompileError` (naming
    ``describe``, e.g. the stages) when numba rejects the code. Problems of the
    disk cache never raise: see the module docstring (a :class:`CacheWarning`
    is issued instead).
    """
    key = hashlib.sha256((numba.__version__ + "\n" + repr(arg_specs) + "\n" + source)
                         .encode("utf-8")).hexdigest()[:32]
    hit = _MEMORY.get(key)
    if hit is not None:
        c = Compiled(hit.fn, key, hit.path, 0.0, hit.from_disk_cache)
        c.from_memory_cache = True
        return c
    sig = tuple(_array_type(dt, nd) for dt, nd in arg_specs)
    t0 = time.perf_counter()
    path = fn = None
    try:
        d = cache_dir()
        if not os.access(d, os.W_OK | os.X_OK):
            raise PermissionError(f"the directory {d} is not writable")
        path = os.path.join(d, f"texpr_k_{key}.py")
        path, fn = _on_disk(d, key, source, sig)
    except (OSError, _CacheUnusable) as exc:
        cause = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)
    if fn is None:
        try:
            fn = _compile(_load(source, f"texpr_k_{key}", None), sig)
        except TexprError:
            raise
        except Exception as exc:  # noqa: BLE001 - numba raises many kinds
            msg = str(exc).strip().splitlines()
            short = "\n".join(msg[:12])
            where = path or "not written: the cache directory is unusable"
            raise CompileError(f"numba could not compile the kernel of {describe}: "
                               f"{type(exc).__name__}: {short}\n(generated module: "
                               f"{where})") from None
        path = None
        _warn_once(("dir", os.environ.get("TEXPR_CACHE_DIR")),
                   f"texpr: the kernel cache directory cannot be used ({cause[:300]}); "
                   "kernels are compiled in memory (set TEXPR_CACHE_DIR to a writable "
                   "directory)")
    seconds = time.perf_counter() - t0
    from_disk = bool(fn.stats.cache_hits) and not fn.stats.cache_misses
    c = Compiled(fn, key, path, seconds, from_disk)
    _MEMORY[key] = c
    return c
