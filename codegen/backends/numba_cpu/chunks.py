"""Chunked units: a large stage runs as parts of one spatial axis at the same
time, each part a call of the same serial compiled function.

One job: run a chunked unit (:attr:`codegen.loopnest.lower.UnitSource.chunks`) in parts.

Why: numba's parfor pass (``parallel=True`` with ``prange`` loops) costs about
0.5-1 s of compile time per unit, whatever its size (measured 2026-12-02 on the
suite's parallel units, fresh processes, quiet 2-core machine: maxpool2's two
units 2.11 s vs 1.03 s compiled serially, upsample2's two 1.51 vs 0.49,
depthwise's three 4.54 vs 2.22; numba's option to run the prange conversion
alone did not change it). So a stage large enough to be parallel
(``Options.parallel_min_points``) is lowered, where its loop nests
allow it, as a serial function ``unit(b0, .., part, err)`` whose parallel loop
runs only the values ``part[0] <= v < part[1]`` of one spatial axis of the
stage (``part``: an ``int64[2]``). Instances at different values of that axis
write different output elements (the rule
:func:`codegen.loopnest.plan.decide_chunks` checks before any text is written), so the parts are
independent.

How the parts run: one part per thread of GNU OpenMP's own team
(``GOMP_parallel`` of libgomp, the library numba's ``omp`` threading layer
runs prange loops on, called through ctypes, which releases the GIL). Every
thread runs a small compiled *trampoline* (a numba ``cfunc``, one per argument
count, compiled and cached like a unit) that takes the next part from an atomic
counter and calls the unit's compiled function by address with that part
(numba's calling convention, :func:`codegen.backends.numba_cpu.native_call._call_unit`). The
launch costs about what a prange loop's does; the trampoline compiles in a
fraction of a parfor pass and is shared by every unit with its argument count.
Measured side by side (benchmarks/bench_compile.py, bench_suite.py): see
docs/stages.md.

Without libgomp, the parts run on Python worker threads (each call releases
the GIL: ``nogil=True``); with one thread, or in a child forked after GNU
OpenMP started (:mod:`codegen.backends.numba_cpu.forksafe`: OpenMP would kill it), a chunked unit
runs as one part, ``[0, n)``. A unit whose nests chunks cannot take (a
scatter, a scan, two parallel axes, a parallel axis a schedule split, a buffer
filled outside the loops over a non-leading axis) keeps its ``prange`` loops.
The bridges' compiled driver (:mod:`codegen.backends.numba_cpu.native_call`) leaves a kernel with
chunked units to the Python driver.
"""

import ctypes

import numpy as np

from .. import workers as _workers
from . import forksafe as _forksafe
from .compile import compile_source
from .intrinsics import unit_address
from ...options import current as _opts

__all__ = ["run", "threads"]

# options.chunk_runner (default "openmp"): how the parts run: "openmp" (libgomp's team,
#   falling back to "threads" when libgomp cannot be loaded) or "threads" (Python worker
#   threads)
_HEAD = 6  # words: part counter, parts, unit address, err address, status, block length


def threads():
    """The number of parts a chunked unit is cut into: numba's thread count in
    this thread (``numba.set_num_threads``; by default ``NUMBA_NUM_THREADS``,
    the machine's cores)."""
    import numba

    try:
        return int(numba.get_num_threads())
    except Exception:  # noqa: BLE001 - no threading layer: numba's configured count
        from numba.core import config

        return int(config.NUMBA_NUM_THREADS)


_workers.set_thread_count(threads)


def _trampoline_source(nargs):
    """The text of the trampoline for units of ``nargs`` arguments (the buffers,
    ``part`` and ``err``): ``void trampoline(int64 address)``, run by every
    thread of the team on the call block at ``address`` (see :func:`_block`),
    and ``body(block)``, its work on the block as an array (what
    :func:`codegen.backends.numba_cpu.compile.compile_source` compiles and caches)."""
    nb = nargs - 1  # arrays before err: the buffers and part
    return f"""# texpr chunk trampoline: units of {nargs} arguments (codegen/backends/numba_cpu/chunks.py)
import numpy as np
from numba import carray, cfunc, njit, types

from texpr.codegen.backends.numba_cpu.intrinsics import _call_unit, _fetch_add, _load, _pointer


@njit(cache=True, nogil=True)
def body(block):
    data = np.int64(block.ctypes.data)
    n_parts = block[1]
    err = carray(_pointer(block[3], np.int64), 2)
    idx = block[{_HEAD}:{_HEAD + nb}]
    sizes = block[{_HEAD + nb}:{_HEAD + 2 * nb}]
    items = block[{_HEAD + 2 * nb}:{_HEAD + 3 * nb}]
    rows = {_HEAD + 3 * nb}
    c = _fetch_add(data, 1)
    while c < n_parts:
        ptrs = block[rows + {nb + 2} * c:rows + {nb + 2} * c + {nb}]
        if _call_unit(block[2], ptrs, sizes, items, idx, err, {nargs}) != 0:
            block[4] = -1
        c = _fetch_add(data, 1)
    return 0


@cfunc(types.void(types.int64), cache=True, nogil=True)
def trampoline(address):
    body(carray(_pointer(address, np.int64), _load(address + 40)))
"""


_TRAMPOLINES = {}  # nargs -> address of the compiled trampoline
_GOMP = []  # [GOMP_parallel as a ctypes function, or None]


def _gomp():
    """libgomp's ``GOMP_parallel(fn, data, threads, flags)`` (ctypes), or None."""
    if not _GOMP:
        fn = None
        try:
            lib = ctypes.CDLL("libgomp.so.1")
            fn = lib.GOMP_parallel
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            fn.restype = None
        except (OSError, AttributeError):
            fn = None
        _GOMP.append(fn)
    return _GOMP[0]


def _trampoline(nargs):
    """The address of the trampoline for ``nargs`` arguments (compiled, or loaded
    from the cache, on first use)."""
    addr = _TRAMPOLINES.get(nargs)
    if addr is None:
        c = compile_source(_trampoline_source(nargs), [("int64", 1)],
                           f"the chunk trampoline of {nargs} arguments", entry="body")
        addr = _TRAMPOLINES[nargs] = c.fn.py_func.__globals__["trampoline"].address
    return addr


class _State:
    """What every run of a chunked unit repeats, computed on its first run: the
    address of its compiled function (None: it cannot be called by address),
    the trampoline's, the call block's fixed words, the whole part ``[0, n)``."""

    def __init__(self, unit, bufs):
        n = unit.chunks
        self.n, self.align = n, unit.chunk_align
        self.whole = np.array([0, n], dtype=np.int64)
        self.nb = len(bufs) + 1  # the buffers, then part
        self.address = self.trampoline = self.gomp = None
        self._parts, self._templates = {}, {}
        self.gomp = _gomp()
        if self.gomp is not None:
            self.address = unit_address(unit)
        if self.address is not None:
            self.trampoline = _trampoline(self.nb + 1)
            fixed = np.zeros(_HEAD + 3 * self.nb, dtype=np.int64)
            fixed[2] = self.address
            fixed[_HEAD:_HEAD + self.nb] = np.arange(self.nb)
            s = _HEAD + self.nb
            fixed[s:s + self.nb] = [b.size for b in bufs] + [2]
            fixed[s + self.nb:s + 2 * self.nb] = [b.itemsize for b in bufs] + [8]
            self.fixed = fixed

    def template(self, nt):
        """``(block, offsets)``: the call block for ``nt`` parts with every address
        0 (see :func:`_block`), and the byte offsets of the parts' ``[lo, hi)``
        from the block's start."""
        got = self._templates.get(nt)
        if got is None:
            nb, fixed = self.nb, self.fixed
            row = nb + 2
            block = np.zeros(len(fixed) + row * nt, dtype=np.int64)
            block[:len(fixed)] = fixed
            block[0], block[1], block[5] = 0, nt, len(block)
            rows = block[len(fixed):].reshape(nt, row)
            c = np.arange(nt, dtype=np.int64)
            cuts = self.cuts(nt)
            rows[:, nb] = cuts[:-1]
            rows[:, nb + 1] = cuts[1:]
            offsets = 8 * (len(fixed) + row * c + nb)
            got = self._templates[nt] = (block, offsets)
        return got

    def cuts(self, nt):
        """The ``nt + 1`` bounds of ``nt`` parts of ``[0, n)`` of about equal size,
        each inner one a multiple of ``align`` (a part may be empty)."""
        a = self.align
        inner = [self.n * c // nt // a * a for c in range(1, nt)]
        return [0] + inner + [self.n]

    def parts(self, nt):
        """``nt`` parts ``[lo, hi)`` of ``[0, n)`` (int64 arrays, made once)."""
        got = self._parts.get(nt)
        if got is None:
            cuts = self.cuts(nt)
            got = self._parts[nt] = [np.array([lo, hi], dtype=np.int64)
                                     for lo, hi in zip(cuts[:-1], cuts[1:])]
        return got


def _address(a):
    """The data pointer of the numpy array ``a`` (faster than ``a.ctypes.data``)."""
    return a.__array_interface__["data"][0]


def _block(st, bufs, err, nt):
    """The call block of one launch (int64 words, a new array per call: calls may
    run at the same time): the head (part counter, parts, unit address, err's
    address, status, the block's length), the arguments' indices, lengths and
    item sizes (one word each per argument before ``err``), then per part its row of data pointers (the buffers', then its
    ``[lo, hi)``'s) and ``[lo, hi)`` itself. Made from a template per part
    count (:meth:`_State.template`): only the addresses change between calls."""
    template, offsets = st.template(nt)
    block = template.copy()
    base = _address(block)
    block[3] = _address(err)
    rows = block[len(st.fixed):].reshape(nt, st.nb + 2)
    rows[:, :st.nb - 1] = [_address(b) for b in bufs]
    rows[:, st.nb - 1] = offsets + base
    return block


def run(unit, bufs, err):
    """Run the chunked ``unit`` on its buffers ``bufs`` (flat C-contiguous arrays,
    in its argument order) and the error flag ``err`` (see the module
    docstring). Sets ``err`` as the unit does; code -1 when a part raised
    inside numba."""
    st = unit._chunk_state
    if st is None:
        st = unit._chunk_state = _State(unit, bufs)
    if _forksafe.FORKED_FROM_OPENMP[0]:
        unit._entry(*bufs, st.whole, err)
        return
    nt = min(threads(), st.n)
    if nt < 2:
        unit._entry(*bufs, st.whole, err)
        return
    if st.trampoline is not None and _opts().chunk_runner == "openmp":
        block = _block(st, bufs, err, nt)
        _forksafe.OPENMP_USED[0] = True
        st.gomp(st.trampoline, block.ctypes.data, nt, 0)
        if block[4]:
            err[0], err[1] = -1, 0
        return

    parts = st.parts(nt)
    entry = unit._entry
    futures = [_workers.pool().submit(entry, *bufs, p, err) for p in parts[1:]]
    entry(*bufs, parts[0], err)
    for f in futures:
        f.result()
