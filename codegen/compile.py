"""Numba compilation and the kernel caches -- the only texpr module that imports numba.

Generated source is written under the cache directory as an importable module
(``texpr_k_<hash>.py``, the hash of the source text, which is a canonical
function of the scheduled graph), so numba's own on-disk cache (``cache=True``,
kept in ``__pycache__`` beside the module) is found again by a second process
running the same program: it loads the machine code instead of recompiling.
In one process, compiled kernels are also kept in memory by the same hash.

The directory is ``$TEXPR_CACHE_DIR``, else ``$XDG_CACHE_HOME/texpr``, else
``~/.cache/texpr``.
"""

import hashlib
import importlib.util
import os
import sys
import tempfile
import time
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

from texpr.errors import TexprError  # noqa: E402

__all__ = ["CompileError", "cache_dir", "compile_source", "clear_memory_cache"]

_MEMORY = {}


class CompileError(TexprError):
    """Numba failed to compile a generated kernel (the message names the stages)."""


def cache_dir():
    """The directory of generated modules (created if missing)."""
    d = os.environ.get("TEXPR_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "texpr")
    os.makedirs(d, exist_ok=True)
    return d


def clear_memory_cache():
    """Forget the kernels compiled in this process (the disk cache stays)."""
    _MEMORY.clear()


def _array_type(dtype, ndim):
    return types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")


class Compiled:
    """A compiled kernel: ``fn`` (the numba dispatcher), ``key``, ``path`` (of the
    module), ``compile_seconds``, ``from_disk_cache`` (loaded without compiling),
    ``from_memory_cache``."""

    def __init__(self, fn, key, path, seconds, from_disk):
        self.fn, self.key, self.path = fn, key, path
        self.compile_seconds, self.from_disk_cache = seconds, from_disk
        self.from_memory_cache = False


def compile_source(source, arg_specs, describe=""):
    """Compile ``source`` (defining ``kernel``) for arguments ``arg_specs``
    (a list of ``(dtype, ndim)``, C-contiguous arrays).

    Returns a :class:`Compiled`. Raises :class:`CompileError` (naming
    ``describe``, e.g. the stages) when numba rejects the code.
    """
    # comments carry user names: the key is the structure alone
    body = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith("#"))
    key = hashlib.sha256((numba.__version__ + "\n" + repr(arg_specs) + "\n" + body)
                         .encode()).hexdigest()[:32]
    hit = _MEMORY.get(key)
    if hit is not None:
        c = Compiled(hit.fn, key, hit.path, 0.0, hit.from_disk_cache)
        c.from_memory_cache = True
        return c
    d = cache_dir()
    modname = f"texpr_k_{key}"
    path = os.path.join(d, modname + ".py")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    t0 = time.perf_counter()
    try:
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        fn = mod.kernel
        sig = tuple(_array_type(dt, nd) for dt, nd in arg_specs)
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
    except TexprError:
        raise
    except Exception as exc:  # noqa: BLE001 - numba raises many kinds
        msg = str(exc).strip().splitlines()
        short = "\n".join(msg[:12])
        raise CompileError(f"numba could not compile the kernel of {describe}: "
                           f"{type(exc).__name__}: {short}\n(generated source: {path})") from None
    seconds = time.perf_counter() - t0
    from_disk = bool(fn.stats.cache_hits) and not fn.stats.cache_misses
    c = Compiled(fn, key, path, seconds, from_disk)
    _MEMORY[key] = c
    return c
