"""The numba CPU dialect of the loop-nest lowering (:mod:`codegen.loopnest.dialect`).

One job: numba's spellings: ``@njit(...)`` units importing the shared runtime
module (:mod:`codegen.backends.numba_cpu.runtime`), ``prange`` loops, the
runtime's helper and check names, LLVM's loop-vectoriser rule
(:mod:`codegen.backends.numba_cpu.vectorize`), and the parfor pass's known
miscompilation that a stage avoids by running serially.
"""

from ...loopnest.dialect import Dialect, register
from . import runtime as _runtime
from .vectorize import unit_stride_loop

__all__ = ["NumbaCpuDialect", "NUMBA_CPU"]

_PRELUDE = "import math\n\nimport numpy as np\nfrom numba import njit, prange\n"


class NumbaCpuDialect(Dialect):
    """Units as numba ``@njit`` functions on the CPU (see the module docstring)."""

    unit_kind = "numba"
    parallel_range = "prange"
    helper_names = frozenset(n for n in _runtime.NAMES if n.startswith(("_fmax_", "_fmin_")))
    check_names = tuple(_runtime.CHECK_NAMES)

    def prelude(self):
        helpers = _runtime.IMPORT_LINE + "\n\n" + _runtime.GEMM_GUARD.strip() + "\n"
        return _PRELUDE + "\n\n" + helpers

    def decorator(self, parallel):
        return (f"@njit(parallel={bool(parallel)}, fastmath=False, cache=True, "
                "error_model='numpy', nogil=True)")

    def unit_stride_loop(self, text):
        return unit_stride_loop(text)

    def serial_instead(self, lowering):
        # a value bound in one flag block of a where= and read in a later one is, to
        # numba's parfor pass, possibly carried from another iteration: it gave wrong
        # sums (long run seed 7017100416 on 2b0e500, the same on 509b385; the serial
        # text was right). Such a stage runs as a serial loop nest
        return bool(lowering.uses_prange and lowering.split_guard)


NUMBA_CPU = NumbaCpuDialect()
register("numba_cpu", NUMBA_CPU)
