"""The unit kind that runs a shift plan (``kind`` ``"shift"``): strided moves by one
compiled function per dtype.

One job: execute a :class:`codegen.analysis.shifts.ShiftPlan` (plain data) on the
kernel's flat buffers with the moves function (:data:`MOVES_SOURCE`, compiled and
cached like a unit).
"""

import numpy as np

from texpr.errors import TexprError

from ... import units as _units
from ..plan_unit import PlanUnit
from ...analysis.shifts import _WORDS, RANK
from .compile import compile_source

__all__ = ["ShiftUnit", "MOVES_SOURCE", "run_moves"]


#: the compiled moves, one function for every plan of a dtype (compiled and cached
#: like a unit, :func:`codegen.backends.numba_cpu.compile.compile_source`: once per cache directory)
MOVES_SOURCE = f"""# texpr shift moves (codegen/backends/numba_cpu/shift_units.py)
import numpy as np
from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def moves(dst, src, table, rng):
    # per move {_WORDS} words: mode (0 copy, 1 add, 2 zero), the element offsets in
    # dst and src, {RANK} extents, {RANK} dst strides, {RANK} src strides; the first
    # axis (every move's) runs over rng[0] <= i0 < rng[1] only (the caller's range),
    # outermost: a window's source rows and a tap sum's output rows stay in cache
    # while every move uses them
    for i0 in range(rng[0], rng[1]):
        for m in range(table.size // {_WORDS}):
            w = m * {_WORDS}
            mode = table[w]
            n1 = table[w + 4]
            n2 = table[w + 5]
            n3 = table[w + 6]
            d1 = table[w + 8]
            d2 = table[w + 9]
            d3 = table[w + 10]
            s1 = table[w + 12]
            s2 = table[w + 13]
            s3 = table[w + 14]
            base_d = table[w + 1] + i0 * table[w + 7]
            base_s = table[w + 2] + i0 * table[w + 11]
            for i1 in range(n1):
                for i2 in range(n2):
                    d = base_d + i1 * d1 + i2 * d2
                    s = base_s + i1 * s1 + i2 * s2
                    if mode == 2:
                        for i3 in range(n3):
                            dst[np.uint64(d + i3 * d3)] = 0
                    elif d3 == 1 and s3 == 1:
                        if mode == 0:
                            for i3 in range(n3):
                                dst[np.uint64(d + i3)] = src[np.uint64(s + i3)]
                        else:
                            for i3 in range(n3):
                                dst[np.uint64(d + i3)] += src[np.uint64(s + i3)]
                    elif mode == 0:
                        for i3 in range(n3):
                            dst[np.uint64(d + i3 * d3)] = src[np.uint64(s + i3 * s3)]
                    else:
                        for i3 in range(n3):
                            dst[np.uint64(d + i3 * d3)] += src[np.uint64(s + i3 * s3)]
    return 0
"""

_FUNCTIONS = {}


def _moves_compiled(dtype):
    """The first :class:`codegen.backends.numba_cpu.compile.Compiled` of the moves for ``dtype`` in this
    process (None after that: it is in memory)."""
    if dtype in _FUNCTIONS:
        return None
    c = compile_source(MOVES_SOURCE, [(dtype, 1), (dtype, 1), ("int64", 1), ("int64", 1)],
                       "the shift moves (codegen/backends/numba_cpu/shift_units.py)",
                       entry="moves")
    _FUNCTIONS[dtype] = c.entry
    return c


def _moves_function(dtype):
    """The compiled moves for ``dtype`` (its entry point: exact argument types)."""
    fn = _FUNCTIONS.get(dtype)
    if fn is None:
        _moves_compiled(dtype)
        fn = _FUNCTIONS[dtype]
    return fn


def run_moves(plan, arrays):
    """Compute ``plan``'s stage (a ShiftPlan) into ``arrays[out_key]`` (flat, C-contiguous):
    the moves by one compiled function (:data:`MOVES_SOURCE`), on the calling
    thread. (Two threads, each on half the first axis, ran the moves alone
    faster -- conv2d_s1's tap sum 0.53 against 0.74 ms -- but in the kernel,
    between GEMMs whose OpenBLAS threads were still spinning, the step took
    10.5 ms against 8.8 with one thread; in-process A/B, 2026-12-05.)"""
    out = np.asarray(arrays[plan.out_key]).reshape(-1)
    src = out if plan.src_key is None else np.asarray(arrays[plan.src_key]).reshape(-1)
    dt = np.dtype(plan.dtype)
    if out.dtype != dt or src.dtype != dt or not out.flags.c_contiguous \
            or not src.flags.c_contiguous or out.size != plan.out_size \
            or (plan.src_key is not None and src.size != plan.src_size):
        raise TexprError(f"stage {plan.stage}: internal: a buffer is not as planned; "
                         "please report the program")
    if plan.fill:
        out.fill(0)
    _moves_function(plan.dtype)(out, src, plan._table,
                                np.array([0, plan.extent], dtype=np.int64))
    return out


class ShiftUnit(PlanUnit):
    """A runnable unit (:mod:`codegen.backends.numba_cpu.units` interface): ``run(arrays, err)`` runs the
    plan on the kernel's flat buffers, as a GEMM unit does (both are
    :class:`codegen.backends.plan_unit.PlanUnit` s). Made with the kernel
    (inside ``codegen.build``), it compiles or loads the shared moves function
    of its dtype then, not at the first call: ``compile_seconds`` and
    ``compiled`` say so (the first unit of a dtype in a process that compiled
    it; from disk or memory after that)."""

    kind = "shift"

    def __init__(self, desc):
        super().__init__(desc)
        c = _moves_compiled(desc.plan.dtype)
        if c is not None:
            self.compile_seconds = c.compile_seconds
            self.from_disk_cache, self.from_memory_cache = c.from_disk_cache, False
            self.compiled = not c.from_disk_cache

    def run(self, arrays, err):
        run_moves(self.plan, arrays)


_units.register("shift", ShiftUnit)
