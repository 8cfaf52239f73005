"""The numba unit kind (``kind`` ``"numba"``): a stage's loop nests compiled by numba.

One job: run a compiled unit (:class:`NumbaUnit`: serial, ``prange`` or chunked,
:mod:`codegen.backends.numba_cpu.chunks`) and hold numba's thread count at one
where the machine is oversubscribed (:func:`one_thread`). The unit interface
is :mod:`codegen.units`'s.
"""

import contextlib
import operator

from . import chunks as _chunks
from . import compile as _compile
from ... import units as _units
from .. import workers as _workers
from . import forksafe as _forksafe

__all__ = ["NumbaUnit", "one_thread", "compile_descriptions"]


class NumbaUnit:
    """A stage compiled by numba: ``run(arrays, err)`` calls the compiled
    function (its overload's entry point) on ``arrays[i] for i in args``, then
    ``err``. See the module docstring for the attributes."""

    kind = "numba"
    loop_nest = True  # (a compiled loop nest: codegen.profile and explain say so)

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
        if (self.chunks or self.parallel) and _workers.oversubscribed():
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

    Used while the machine is oversubscribed (:func:`codegen.backends.workers.oversubscribed`:
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


def compile_descriptions(descs):
    """The compiled functions of the numba unit descriptions ``descs`` (in order),
    in one batch (memory, disk, worker processes: :func:`compile.compile_units`)."""
    return _compile.compile_units([(u.module_source, u.arg_specs, u.describe(), "unit")
                                   for u in descs])


_units.register("numba", NumbaUnit, compile_batch=compile_descriptions)
