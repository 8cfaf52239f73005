"""BLAS worker threads parked after a kernel call, so that they do not spin
beside the process's other work.

One job: after a kernel that ran GEMMs on numpy's (or SciPy's) OpenBLAS,
stop that OpenBLAS's worker threads (:func:`park_blas_threads`).

Why: OpenBLAS's pthreads server keeps each worker busy-waiting for its next
job for ``2**28`` cycles (``THREAD_TIMEOUT``, about 0.1 s; on x86-64 the wait
is a loop of ``nop``, not ``sched_yield``) after every multi-threaded call.
On a 2-core machine that is a core taken from whatever runs next: a PyTorch
step right after a texpr call ran 2.6x slower than right after another PyTorch
step (issue 48: a GRU step, 99.6 ms against 37.8 ms), and the loop-nest backend's own parallel
loops share the cores with it too. A 100 ms sleep after a 512x512 SGEMM cost
the process 41-50 ms of CPU with the workers left to spin, 0.04 ms parked
(measured 2026-12-07, this machine).

How: OpenBLAS's own ``blas_thread_shutdown_`` (the routine it runs itself
before a ``fork()``): it wakes each worker, lets it exit and joins it; the
next multi-threaded call starts the workers again (``blas_thread_init``,
lazily, as in a forked child), with the same thread count. No setting of the
library changes: ``openblas_get_num_threads``, the environment and
threadpoolctl's view stay as they were. A park costs about 0.1 ms (the join,
then one ``pthread_create`` at the next threaded GEMM); a park when the
workers are already stopped costs a lock.

Safety: a shutdown while another thread's BLAS call has work queued on the
workers would hang both (the queue word is overwritten). So a park happens
only when no other thread can be inside that BLAS or enter it: when every
other Python thread is one of texpr's own (idle once the kernel returns: they
run only the parts of this thread's calls) or tqdm's monitor thread (it never
calls a BLAS), checked at each park. Such threads start no new thread, so the
check holds until the shutdown returns. Any other Python thread (a
data loader, a Jupyter kernel's I/O threads, another thread calling a texpr
kernel) means no park: the workers then spin as OpenBLAS leaves them. A BLAS
that threadpoolctl does not find, or that is not OpenBLAS with its pthreads
server (OpenMP builds wait in their OpenMP runtime; MKL has its own
``MKL_BLOCKTIME``), is left alone. ``TEXPR_PARK_BLAS=0`` turns parking off.
"""

import ctypes
import os
import sys
import threading

__all__ = ["park_blas_threads", "note_blas_woken", "parkable_libraries", "ENABLED",
           "THREADED_MNK"]

#: whether kernels park the BLAS workers after a call (``TEXPR_PARK_BLAS=0``: never)
ENABLED = os.environ.get("TEXPR_PARK_BLAS", "1") != "0"

_LIBS = {}  # filepath -> the library's blas_thread_shutdown_ (ctypes), or None
_SCANNED = [-1]  # len(sys.modules) at the last scan: an import may have loaded a BLAS
_PARKS = [0]  # parks done (for tests and benchmarks)
_WOKEN = [False]  # a GEMM since the last park may have run on the workers
#: OpenBLAS runs a GEMM of more multiply-adds (m * n * k) than this on its worker
#: threads (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD,
#: 65536 * 4); smaller ones run on the calling thread and wake no worker
THREADED_MNK = 65536 * 4


def note_blas_woken():
    """Record that a BLAS call that may have run on the workers was made (a
    GEMM of more than :data:`THREADED_MNK` multiply-adds on the BLAS's own
    threads): the next :func:`park_blas_threads` parks them."""
    _WOKEN[0] = True


def parkable_libraries():
    """The OpenBLAS libraries (pthreads server) that threadpoolctl finds loaded
    in this process, as ``{filepath: shutdown}``
    (``shutdown``: their ``blas_thread_shutdown_``, a :class:`ctypes.PyDLL`
    function). Libraries loaded later are found at a later call. Empty without
    threadpoolctl."""
    _SCANNED[0] = len(sys.modules)
    try:
        from threadpoolctl import ThreadpoolController
        found = ThreadpoolController().select(internal_api="openblas").lib_controllers
    except Exception:  # noqa: BLE001 - optional dependency, or a library it cannot read
        return {}
    for lib in found:
        path = lib.filepath
        if path in _LIBS:
            continue
        fn = None
        if getattr(lib, "threading_layer", None) == "pthreads":
            try:
                fn = ctypes.PyDLL(path).blas_thread_shutdown_
                fn.restype = ctypes.c_int
                fn.argtypes = []
            except (OSError, AttributeError):
                fn = None
        _LIBS[path] = fn
    return {p: f for p, f in _LIBS.items() if f is not None}


def _only_quiet_threads():
    """Whether every Python thread other than this one is texpr's own (named
    ``texpr-...``) or tqdm's monitor: none of them can be inside a BLAS call
    when a kernel call of this thread has returned."""
    me = threading.get_ident()
    others = set(sys._current_frames()) - {me}
    if not others:
        return True
    quiet = {t.ident for t in threading.enumerate()
             if t.name.startswith("texpr-") or type(t).__name__ == "TMonitor"}
    return others <= quiet


def park_blas_threads():
    """Stop the worker threads of the process's OpenBLAS libraries (see the
    module docstring), when parking is enabled and no other thread can be in a
    BLAS call, and a call since the last park may have woken them
    (:func:`note_blas_woken`; a park of workers that already sleep costs a
    thread's wake-up and join, and its start again at the next threaded call:
    1-5 ms per call on a loaded machine, measured on the digits step). Returns
    the number of libraries parked (0 when skipped). Never raises."""
    if not ENABLED or not _WOKEN[0]:
        return 0
    if _SCANNED[0] != len(sys.modules):  # a scan costs ~1 ms: only after new imports
        parkable_libraries()
    libs = [f for f in _LIBS.values() if f is not None]
    if not libs or not _only_quiet_threads():
        return 0
    _WOKEN[0] = False
    for fn in libs:
        fn()
    _PARKS[0] += 1
    return len(libs)
