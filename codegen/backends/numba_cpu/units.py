"""The runnable units of a kernel: what :class:`codegen.build.Kernel` calls in order.

One job: turn a :class:`codegen.loopnest.lower.Program`'s unit descriptions
(:class:`codegen.loopnest.lower.UnitSource`, picklable) into runnable units, compiling
the numba ones in one batch (:func:`codegen.backends.numba_cpu.compile.compile_units`: memory,
disk, worker processes).

The interface every unit kind implements (the driver relies on nothing else):

* ``run(arrays, err)``: compute the stage. ``arrays`` is the kernel's list of
  flat (1-D, C-contiguous) numpy arrays in :attr:`Program.buffers` order; the
  unit reads and writes ``arrays[i]`` for ``i`` in its ``args`` only. ``err``
  is an ``int64[2]`` array, zero on entry; a failed run-time check sets
  ``err[0]`` to its code (1-based, into ``errors``) and ``err[1]`` to the
  offending value; the driver raises after the unit returns.
* attributes: ``kind`` (str), ``stage`` (the op's name), ``args`` (tuple of
  buffer indices), ``errors`` (list of messages, each naming the stage),
  ``key`` (content key or None), ``path`` (module on disk or None),
  ``compile_seconds``, ``from_disk_cache``, ``from_memory_cache``,
  ``compiled`` (True when this build compiled it: numba ran, here or in a
  worker). Optional: ``calls_blas`` (a numba unit whose code calls a BLAS,
  besides the ``"blas"`` kind: the kernel then parks the BLAS's worker
  threads after a call, :mod:`codegen.backends.numpy_host.parking`).

Adding a kind (e.g. a contraction run by a library call instead of a loop
nest): give its description in ``Program.units`` a ``kind`` of its own, write
a class with the interface above, and register a factory
``description -> unit`` in :data:`FACTORIES`. Numba units are batched so that
their compilation can run concurrently; other kinds are built one by one.
"""

import contextlib
import operator

from . import chunks as _chunks
from . import compile as _compile
from . import forksafe as _forksafe
from ..numpy_host import gemm as _gemm

__all__ = ["NumbaUnit", "FACTORIES", "make_units", "one_thread"]


class NumbaUnit:
    """A stage compiled by numba: ``run(arrays, err)`` calls the compiled
    function (its overload's entry point) on ``arrays[i] for i in args``, then
    ``err``. See the module docstring for the attributes."""

    kind = "numba"

    def __init__(self, desc, compiled):
        self.stage, self.args, self.errors = desc.stage, tuple(desc.args), desc.errors
        self.arg_specs = list(desc.arg_specs)
        self.key, self.path = compiled.key, compiled.path
        self.compile_seconds = compiled.compile_seconds
        self.from_disk_cache = compiled.from_disk_cache
        self.from_memory_cache = compiled.from_memory_cache
        self.compiled = not (compiled.from_disk_cache or compiled.from_memory_cache)
        self.in_worker = compiled.in_worker
        self.fn = compiled.fn
        self._entry = compiled.entry
        # a parallel unit keeps its text: in a child forked after numba's GNU
        # OpenMP layer started, it runs its serial twin (codegen.backends.numba_cpu.forksafe)
        self.parallel = "@njit(parallel=True" in desc.module_source
        # a scan step run as np.dot (codegen.loopnest.scan_gemm) calls SciPy's BLAS
        self.calls_blas = "np.dot(" in desc.module_source
        self._desc = desc if self.parallel else None
        self._serial = None
        # a chunked unit (codegen.backends.numba_cpu.chunks): the extent of the axis its parts cut
        self.chunks = getattr(desc, "chunks", 0)
        self.chunk_align = getattr(desc, "chunk_align", 1)
        self._chunk_state = None
        if not self.args:  # every buffer of the stage has a zero-size axis: none is passed
            self._pick = lambda arrays: ()
        elif len(self.args) == 1:
            self._pick = lambda arrays, i=self.args[0]: (arrays[i],)
        else:
            self._pick = operator.itemgetter(*self.args)

    def run(self, arrays, err):
        if (self.chunks or self.parallel) and _gemm._oversubscribed():
            with one_thread():
                self._run(arrays, err)
            return
        self._run(arrays, err)

    def _run(self, arrays, err):
        if self.chunks:
            _chunks.run(self, self._pick(arrays), err)
            return
        if self.parallel and _forksafe.FORKED_FROM_OPENMP[0]:
            self._serial_entry()(*self._pick(arrays), err)
            return
        self._entry(*self._pick(arrays), err)

    def _serial_entry(self):
        """The compiled serial twin of this parallel unit (compiled, or loaded from
        the cache, on first use in this process)."""
        if self._serial is None:
            d = self._desc
            self._serial = _compile.compile_source(_forksafe.serial_source(d.module_source),
                                                   d.arg_specs, d.describe(), "unit").entry
        return self._serial

    def __repr__(self):
        return f"NumbaUnit({self.stage!r}, args={self.args}, key={self.key})"


@contextlib.contextmanager
def one_thread():
    """numba's thread count in this thread held at 1 (restored on exit): the
    parallel units (prange loops and chunked units alike) run on the calling
    thread alone.

    Used while the machine is oversubscribed (:func:`codegen.backends.numpy_host.gemm._oversubscribed`:
    the load average above the usable CPUs plus a half). GNU OpenMP, whose
    team runs both kinds of unit, makes a thread that finishes its share wait
    at the region's end by spinning first (its default wait policy, which is
    the whole process's and PyTorch's too, so texpr leaves it alone): on
    cores other processes want, the thread it waits for has lost its core and
    every parallel unit takes a time slice (measured 2026-12-07 at a load
    average of 8-10 on 2 cores, benchmarks/peer_alone.py --peer texpr, medians
    of two runs: maxpool2 0.9 and 16.0 ms, avgpool3s2 16.0 and 16.0 ms with
    2 threads waiting by default; 1.6-2.8 and 1.7-2.9 ms with OpenMP waiting
    passively, as texpr once set it for the whole process; 1.8-1.9 and
    1.7-1.8 ms on one thread). The PyTorch bridge's compiled driver
    (:class:`codegen.backends.numba_cpu.native_call.Runner`) does the same for a whole call; a
    kernel XLA calls (the JAX bridge) keeps its threads."""
    numba = _compile.numba
    before = numba.get_num_threads()
    if before == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _contraction_unit(desc):
    from ...analysis.contraction import ContractionUnit
    return ContractionUnit(desc)


def _shift_unit(desc):
    from ...analysis.shifts import ShiftUnit
    return ShiftUnit(desc)


#: kind -> factory(description) for the unit kinds not compiled by numba
#: (``"blas"``: a contraction stage run as GEMMs, :mod:`codegen.analysis.contraction`;
#: ``"shift"``: a window or tap-sum stage run as strided moves, :mod:`codegen.analysis.shifts`)
FACTORIES = {"blas": _contraction_unit, "shift": _shift_unit}


def make_units(program):
    """The runnable units of ``program`` (a list, in order). Raises
    :class:`codegen.CompileError` (naming the stage) when numba rejects a
    unit; TexprError for a unit kind without a factory."""
    from texpr.errors import TexprError

    numba_descs = [u for u in program.units if u.kind == "numba"]
    compiled = _compile.compile_units([(u.module_source, u.arg_specs, u.describe(), "unit")
                                       for u in numba_descs])
    by_id = {id(u): c for u, c in zip(numba_descs, compiled)}
    out = []
    for u in program.units:
        if u.kind == "numba":
            out.append(NumbaUnit(u, by_id[id(u)]))
        elif u.kind in FACTORIES:
            out.append(FACTORIES[u.kind](u))
        else:
            raise TexprError(f"stage {u.stage}: no unit kind {u.kind!r} is registered")
    return out
