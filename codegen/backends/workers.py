"""codegen's worker threads and the machine's load, shared by the backends.

One job: how many threads texpr's parallel work uses (:func:`threads`: the
loop-nest backend's thread count, which it registers with
:func:`set_thread_count`), the pool of Python worker threads that split GEMMs,
packing copies and chunked units' parts run on (:func:`pool`), and whether the
machine is oversubscribed (:func:`oversubscribed`: then parallel units run on
one thread).
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor

__all__ = ["threads", "set_thread_count", "oversubscribed", "pool", "LOAD_CHECK_S"]

#: how often the load average is read again, in seconds
LOAD_CHECK_S = 1.0

_COUNT = [lambda: 1]  # the registered thread count
_POOL = []
_LOAD = [float("-inf"), False]  # (when last read, oversubscribed)


def set_thread_count(fn):
    """Register ``fn() -> int``, the number of threads parallel work uses (the
    loop-nest backend's: the loop-nest backend's thread count in this thread)."""
    _COUNT[0] = fn


def threads():
    """Worker threads for packing copies, split GEMMs and chunked parts (at least 1)."""
    try:
        return max(1, int(_COUNT[0]()))
    except Exception:  # noqa: BLE001 - a backend without a threading layer: one thread
        return 1


def oversubscribed():
    """Whether the 1-minute load average exceeds this process's usable CPUs by more
    than half a CPU (read at most every ``LOAD_CHECK_S`` seconds; False where
    the platform has no load average)."""
    now = time.monotonic()
    if now - _LOAD[0] >= LOAD_CHECK_S:
        try:
            cpus = len(os.sched_getaffinity(0))
            _LOAD[1] = os.getloadavg()[0] > cpus + 0.5
        except (AttributeError, OSError):
            _LOAD[1] = False
        _LOAD[0] = now
    return _LOAD[1]


def pool():
    """The worker threads of the GEMMs and packing copies, and of chunked units'
    parts without libgomp (the backend's chunked units (docs/stages.md)); created on first use."""
    if not _POOL or _POOL[0][0] != os.getpid():
        # a forked child inherits the pool object but not its threads: a new one
        _POOL[:] = [(os.getpid(), ThreadPoolExecutor(max_workers=max(threads(), 2),
                                                     thread_name_prefix="texpr-gemm"))]
    return _POOL[0][1]
