"""Kernels in a forked child: parallel units run their serial twins where numba's
threading layer would kill the child.

numba's ``omp`` threading layer with GNU OpenMP (libgomp, the one numba's Linux
wheels load) cannot run a parallel loop in a process forked from one in which
it has started: the child's first parallel loop prints "Terminating: fork()
called from a process already using GNU OpenMP, this is unsafe." and numba
sends it SIGTERM. A ``multiprocessing`` pool with the ``fork`` start method
(Linux's default up to Python 3.13), a data loader's workers or an ``os.fork``
after a kernel ran are such children (an attack's find: the child was killed and
``Pool.map`` waited for good).

So a child forked after the layer started sets :data:`FORKED_FROM_OPENMP`, and
a unit compiled with ``parallel=True`` runs its *serial twin* there instead:
the same text with its ``prange`` loops as ``range`` loops (numba's own
meaning of ``prange`` without ``parallel=True``: the same iterations, in
order), compiled on first use in that process (or loaded from the disk cache,
where its own content key puts it). The values are the parallel unit's: a
parallel loop's iterations are independent, and its reductions are the
serial loop's sums in another order (within rounding; texpr's generated
reductions are private to an iteration). PyTorch does the same in a forked
child of a process that used its OpenMP pool: it runs on one thread.

The TBB layer (``NUMBA_THREADING_LAYER=tbb``, where a TBB library numba can load
is installed) and ``workqueue`` are fork-safe: the flag stays False with them.
"""

import os

__all__ = ["FORKED_FROM_OPENMP", "OPENMP_USED", "serial_source", "openmp_started"]

#: True in a process forked from one whose GNU OpenMP layer had started
FORKED_FROM_OPENMP = [False]
#: True once this process launched a GNU OpenMP team itself (codegen.backends.numba_cpu.chunks)
OPENMP_USED = [False]


def openmp_started():
    """Whether GNU OpenMP has started in this process: a chunked unit launched
    its team (:mod:`codegen.backends.numba_cpu.chunks`), or numba's threading layer is GNU OpenMP
    and has started (numba starts it when it first compiles or loads a parallel
    function). True also when numba's state cannot be read (the serial twins
    are then used in a forked child: slower, never killed)."""
    if OPENMP_USED[0]:
        return True
    try:
        from numba.np.ufunc import parallel as _parallel

        if not _parallel._is_initialized:
            return False
        if _parallel._threading_layer != "omp":
            return False
        from numba.np.ufunc import omppool

        return omppool.openmp_vendor == "GNU"
    except Exception:  # noqa: BLE001 - numba's internals moved: be safe
        return True


def serial_source(source):
    """The serial twin of a unit's module text: ``@njit(parallel=True`` becomes
    ``@njit(parallel=False`` and every ``prange(`` loop a ``range(`` loop (user
    names appear in comments only, where the change is harmless)."""
    return source.replace("@njit(parallel=True", "@njit(parallel=False").replace("prange(", "range(")


def _after_fork_in_child():
    if openmp_started():
        FORKED_FROM_OPENMP[0] = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
