"""Compiling units with numba: the memory cache, the disk cache and the worker pool.

One job: :func:`compile_source` (a unit's text -> its compiled function: from
this process's memory, else from the disk cache or numba,
:mod:`codegen.backends.numba_cpu.disk_cache`, with the unit's compile settings,
:mod:`codegen.backends.numba_cpu.jit`) and :func:`compile_units` (a build's
units, the missing ones shared between this process and worker processes).
Errors and warnings: :mod:`codegen.backends.numba_cpu.errors`.

The texts compiled are the units of :class:`codegen.loopnest.lower.Program` (one per
materialised stage, :attr:`codegen.loopnest.lower.UnitSource.module_source`): canonical
identifiers and no user names (see :mod:`codegen.loopnest.source`), so each is a
function of its stage's structure alone. Each is written under the cache
directory as ``texpr_k_<key>.py``, ``key`` the sha256 of the numba version,
the argument types and the text, so that numba's own on-disk cache
(``cache=True``: ``__pycache__/texpr_k_<key>.*.nbi`` and ``.nbc`` beside the
module) is found again by a second process running the same program: it loads
the machine code instead of recompiling. In one process, compiled kernels are
also kept in memory by the same key. The helpers the units call are one module
of their own (:mod:`codegen.backends.numba_cpu.runtime`), written and cached the same way in the
first cache directory a process uses, loaded before any unit
(:func:`codegen.backends.numba_cpu.disk_cache.runtime_module`), and linked by numba into each unit's machine code.

Integrity (the name of a module is the checksum of its content):

* the code executed is always the text in memory, compiled with the module's
  path as its file name; the file on disk is only compared with it, byte for
  byte. A file that differs (truncated, empty, random bytes, another text) is
  discarded with its numba cache files and written again, with one
  :class:`CacheWarning`;
* numba cache files that fail to load (empty, truncated, random bytes) are
  removed and the kernel recompiled (and cached again), with one warning;
* numba cache files are loaded only when they hold what was written: the
  sha256 of each (``.nbi``, ``.nbc``) is recorded beside them
  (``__pycache__/<module>.sha256``) after every compile, and checked before a
  load; files that differ (a flipped bit inside machine code that would still
  load) are removed and the unit recompiled, with one warning (files with no
  record, from an older texpr or a process stopped before recording, are
  rebuilt silently);
* files are written atomically (a temporary file in the same directory, then
  ``os.replace``), so a reader never sees half a module;
* a cache directory that cannot be used (it is a file, it is not writable, it
  is deleted while kernels are built) degrades to compiling in memory, with one
  warning per process: never an exception.

The directory is ``$TEXPR_CACHE_DIR``, else ``$XDG_CACHE_HOME/texpr``, else
``~/.cache/texpr``.

Concurrent compilation (:func:`compile_units`): the units of a build that are
neither in memory nor loadable from numba's disk cache are compiled by worker
processes when at least two are missing and the disk cache is usable: a
persistent :class:`concurrent.futures.ProcessPoolExecutor` (``spawn`` context,
started on first use, ``min(workers, missing)`` processes, ``workers`` =
``$TEXPR_COMPILE_WORKERS`` or ``os.cpu_count()``; ``0`` disables them, and a
pool is replaced by a fresh one after ``WORKER_RECYCLE_UNITS`` units, which
bounds what numba's compiled code holds in the workers' memory). A
worker compiles with ``cache=True`` into the disk cache; this process then
loads the machine code from there (milliseconds). This process compiles a
share itself (:data:`PARENT_COMPILES`; ``TEXPR_COMPILE_HERE=0`` leaves every
missing unit to the workers): :func:`split_units` places the units longest
first (:func:`estimate_seconds`, from the text) on whichever of this process
and the workers would finish them first, a fresh worker counted from the end
of its start-up (``WORKER_START_SECONDS``: a new interpreter, numpy, numba and
numba's first compile, about 1.1 s here), so a build of a few small units
compiles here (a suite case's 2 parallel units: 1.4-1.8 s through two fresh
workers, 1.0-1.1 s here). Anything that
goes wrong with the pool (a worker that fails, dies, or takes longer than
``$TEXPR_COMPILE_TIMEOUT`` seconds, default 600: the pool is then killed)
falls back to compiling here: the pool never raises, and a unit that numba
rejects still gives a :class:`CompileError` naming its stage.
:func:`stats` counts the units compiled, loaded and reused.
"""

import atexit
import concurrent.futures as _futures
import hashlib
import multiprocessing
import os
import sys
import time
import types as _pytypes
import warnings

# No OpenMP setting is made here. numba's ``omp`` layer, PyTorch and texpr's
# chunked units (codegen.backends.numba_cpu.chunks) share one GNU OpenMP runtime in a process
# (libgomp.so.1, loaded once), so its wait policy is the whole process's: texpr
# once set OMP_WAIT_POLICY=PASSIVE on import, against its own OpenMP workers
# spinning beside OpenBLAS's, and PyTorch's eager step then ran 1.5-2.7x slower
# beside texpr than alone (issue 48; the digits step 2.0-2.3 ms against
# 0.9-1.0 ms). libgomp's default spins a few milliseconds, then sleeps; the
# spinner that held a core for 0.1 s after each call was OpenBLAS's, and texpr
# now parks it after a kernel call instead (codegen.backends.numpy_host.parking).
import numba
import numpy as np
from numba.core import types

from texpr import cache as _cache
from texpr.envvars import env_number
from texpr.errors import TexprError

from ...loopnest.source import set_parse_lock
from . import unit_files as _files
from .disk_cache import (CacheUnusable as _CacheUnusable, compile_unit as _compile,
                         discard_unverified as _discard_unverified, load as _load,
                         module_file as _module_file, on_disk as _on_disk,
                         record_all as _record_all,
                         verify_helper_machine_code as _verify_helper_machine_code)
from .errors import CacheWarning, CompileError, warn_once as _warn_once
from .jit import FLAGS_VERSION, jit_codegen as _jit_codegen  # noqa: F401 - (tests read it here)

# a unit's text is parsed (codegen.loopnest.source) under the lock numba compiles it under
set_parse_lock(numba.core.compiler_lock.global_compiler_lock)

__all__ = ["CompileError", "CacheWarning", "cache_dir", "compile_source", "compile_units",
           "clear_memory_cache", "stats", "estimate_seconds", "split_units"]

_MEMORY = {}
_STATS = dict(compiled=0, in_workers=0, from_disk=0, from_memory=0, worker_failures=0,
              pools_retired=0)


def cache_dir():
    """The directory of generated modules (created if missing): the one
    :func:`texpr.cache.cache_dir` names.

    Raises OSError when it cannot be created (e.g. the path is a file);
    :func:`compile_source` then compiles in memory."""
    return _cache.cache_dir(create=True)


def clear_memory_cache():
    """Forget the kernels compiled in this process (the disk cache stays): the
    next build of each loads or compiles it again. It returns no memory: numba
    keeps every function's machine code for the life of the process (about
    1.9 MB a unit; docs/cache.md, "Memory in the process")."""
    _MEMORY.clear()



def _array_type(dtype, ndim):
    return types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")


class Compiled:
    """A compiled unit: ``fn`` (the numba dispatcher), ``entry`` (the compiled
    overload's entry point: the same function without the dispatcher's type
    dispatch, for calls with exactly the compiled argument types), ``key``,
    ``path`` (of the module on disk; None when it was compiled in memory),
    ``compile_seconds``, ``from_disk_cache`` (loaded without compiling),
    ``from_memory_cache``, ``in_worker`` (compiled by a worker process)."""

    def __init__(self, fn, key, path, seconds, from_disk, entry=None):
        self.fn, self.key, self.path = fn, key, path
        self.compile_seconds, self.from_disk_cache = seconds, from_disk
        self.from_memory_cache = False
        self.in_worker = False
        self.entry = fn if entry is None else entry

    def _copy(self):
        c = Compiled(self.fn, self.key, self.path, self.compile_seconds, self.from_disk_cache,
                     self.entry)
        c.from_memory_cache, c.in_worker = self.from_memory_cache, self.in_worker
        return c


def stats():
    """Counts of units since the process started (a dict of int): ``compiled``
    (numba ran, in this process or a worker), ``in_workers`` (of those, by a
    worker process), ``from_disk`` (machine code loaded from the disk cache),
    ``from_memory`` (taken from this process's memory cache),
    ``worker_failures`` (units a worker could not compile, compiled here instead),
    ``pools_retired`` (worker pools replaced after ``WORKER_RECYCLE_UNITS`` units)."""
    return dict(_STATS)


def source_key(source, arg_specs):
    """The content key of a unit: sha256 (32 hex digits) of the numba version,
    :data:`FLAGS_VERSION`, the argument specs and the text."""
    return hashlib.sha256((numba.__version__ + "\n" + FLAGS_VERSION + "\n" + repr(arg_specs)
                           + "\n" + source).encode("utf-8")).hexdigest()[:32]


def _entry_point(fn, sig):
    """The compiled overload's entry point for ``sig`` (the dispatcher if numba
    does not expose one): calling it skips the dispatcher's typing of every
    argument (measured, a unit of 3 arrays and ``err``: 4.6 us per call instead
    of 7.2 us through the dispatcher)."""
    try:
        return fn.overloads[tuple(sig)].entry_point
    except (AttributeError, KeyError):
        return fn


def compile_source(source, arg_specs, describe="", entry="kernel"):
    """Compile ``source`` (a canonical text defining the function ``entry``, free of
    user names: :attr:`codegen.loopnest.lower.UnitSource.module_source` defines
    ``unit``) for arguments ``arg_specs`` (a list of ``(dtype, ndim)``,
    C-contiguous arrays).

    Returns a :class:`Compiled`. Raises :class:`CompileError` (naming
    ``describe``, e.g. the stage) when numba rejects the code. Problems of the
    disk cache never raise: see the module docstring (a :class:`CacheWarning`
    is issued instead).
    """
    key = source_key(source, arg_specs)
    hit = _MEMORY.get(key)
    if hit is not None:
        c = hit._copy()
        c.compile_seconds, c.from_memory_cache = 0.0, True
        _STATS["from_memory"] += 1
        return c
    sig = tuple(_array_type(dt, nd) for dt, nd in arg_specs)
    t0 = time.perf_counter()
    path = fn = None
    try:
        d = cache_dir()
        if not os.access(d, os.W_OK | os.X_OK):
            raise PermissionError(f"the directory {d} is not writable")
        path = os.path.join(d, f"texpr_k_{key}.py")
        path, fn = _on_disk(d, key, source, sig, entry)
    except (OSError, _CacheUnusable) as exc:
        cause = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)
    if fn is None:
        try:
            fn = _compile(_load(source, f"texpr_k_{key}", None, entry), sig, source)
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
    _STATS["from_disk" if from_disk else "compiled"] += 1
    c = Compiled(fn, key, path, seconds, from_disk, _entry_point(fn, sig))
    _MEMORY[key] = c
    return c


# ---- concurrent compilation ----------------------------------------------------------------

_POOL = None  # [executor, number of workers, units submitted to it]
#: units a pool of workers compiles before it is retired for a fresh one (at the
#: start of a build; the old pool finishes what it has and exits). numba keeps
#: what it compiled in a process for good (about 3 MB a unit): the fuzzer's long
#: runs grew each worker to 4.8 GB in 40 minutes and swapped the machine; a new
#: pool costs its start-up (about 1.1 s) once per this many units
WORKER_RECYCLE_UNITS = 256
#: a worker that is still busy after this many seconds is taken as stuck
_DEFAULT_TIMEOUT = 600.0


def _workers_allowed():
    """``$TEXPR_COMPILE_WORKERS`` (0 disables the workers), else ``os.cpu_count()``
    (one fewer, at least one, when this process compiles too:
    :data:`PARENT_COMPILES`)."""
    v = env_number("TEXPR_COMPILE_WORKERS", None, integer=True)
    if v is None:  # unset, or not a count (then with a warning)
        return max(1, (os.cpu_count() or 1) - (1 if PARENT_COMPILES else 0))
    return v


def _timeout():
    """``$TEXPR_COMPILE_TIMEOUT`` seconds (a finite number >= 0), else 600."""
    return env_number("TEXPR_COMPILE_TIMEOUT", _DEFAULT_TIMEOUT)


def _worker_compile(d, key, source, arg_specs, entry):
    """(Runs in a worker process.) Compile ``source`` into the disk cache ``d``
    (the module ``texpr_k_<key>.py`` and numba's cache files beside it); the
    seconds it took. Raises whatever numba or the file system raise (the parent
    then compiles the unit itself)."""
    t0 = time.perf_counter()
    modname = f"texpr_k_{key}"
    sig = tuple(_array_type(dt, nd) for dt, nd in arg_specs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = _module_file(d, modname, source.encode("utf-8"))
        try:
            _discard_unverified(d, modname, path)
            loaded = _load(source, modname, path, entry)
            _verify_helper_machine_code(d, modname)
            _record_all(d, modname, _compile(loaded, sig, source))
        finally:
            sys.modules.pop(modname, None)  # the worker keeps no module alive
    return time.perf_counter() - t0


#: the function the workers run (tests replace it to simulate a stuck or failing worker)
_WORKER_FN = _worker_compile


class _NoMain:
    """While worker processes start: hide ``__main__`` (``spawn`` would import the
    parent's main module in every worker, running a user's script without a
    ``__name__ == "__main__"`` guard again, or importing ``python -m``'s module
    and everything it imports), and mark the workers' environment so that
    ``texpr.codegen`` skips importing the simplifier: they need this module only."""

    def __enter__(self):
        self.main = sys.modules.get("__main__")
        self.env = os.environ.get("_TEXPR_COMPILE_WORKER")
        sys.modules["__main__"] = _pytypes.ModuleType("__main__")
        os.environ["_TEXPR_COMPILE_WORKER"] = "1"

    def __exit__(self, *exc):
        if self.main is not None:
            sys.modules["__main__"] = self.main
        if self.env is None:
            os.environ.pop("_TEXPR_COMPILE_WORKER", None)
        else:
            os.environ["_TEXPR_COMPILE_WORKER"] = self.env
        return False


def _watch_parent(ppid):
    """(Runs in each worker as it starts.) Exit when the parent process is gone: a
    parent killed without running its exit handlers (SIGKILL, a CI timeout)
    would otherwise leave its idle workers waiting for work for ever."""
    import threading

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != ppid:
                os._exit(0)

    threading.Thread(target=watch, name="texpr-parent-watch", daemon=True).start()


def _pool(n):
    global _POOL
    if _POOL is not None and _POOL[2] >= WORKER_RECYCLE_UNITS:
        _retire_pool()
    if _POOL is not None and _POOL[1] >= n:
        return _POOL[0]
    _shutdown_pool()
    # (not max_tasks_per_child: in Python 3.11-3.13 a pool that replaces a worker
    # at its limit can stop scheduling, cpython issue 115634)
    ex = _futures.ProcessPoolExecutor(max_workers=n,
                                      mp_context=multiprocessing.get_context("spawn"),
                                      initializer=_watch_parent, initargs=(os.getpid(),))
    _POOL = [ex, n, 0]
    _shutdown_at_multiprocessing_exit()
    return ex


_MP_EXIT = [None]  # the pid whose multiprocessing exit shuts the pool down


def _forget_parent_pool():
    """In a forked child: the parent's compile workers are not this process's
    children, and its executor's threads did not survive the fork; the child
    starts a pool of its own when it needs one."""
    global _POOL
    _POOL = None
    _STARTED["pool"] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_pool)


def _shutdown_at_multiprocessing_exit():
    """In a process that multiprocessing started (a DDP rank, a Process target),
    atexit handlers do not run: multiprocessing's own exit joins the process's
    children, the compile workers among them, which wait for work for good (the
    README's DDP example hung on its first run, a new user's find). A
    multiprocessing finalizer, run before those joins (and registered anew in
    each process that starts a pool: a forked child's registry is emptied),
    shuts the pool down."""
    if _MP_EXIT[0] == os.getpid():
        return
    import multiprocessing.util
    multiprocessing.util.Finalize(None, _shutdown_pool, exitpriority=100)
    _MP_EXIT[0] = os.getpid()


def _retire_pool():
    """Let the pool finish the units already submitted (another thread's build
    may be waiting on them) and exit; the next build starts a fresh one."""
    global _POOL
    ex, _POOL = _POOL[0], None
    _STARTED["pool"] = False
    _STATS["pools_retired"] += 1
    try:
        ex.shutdown(wait=False, cancel_futures=False)
    except Exception:  # noqa: BLE001
        pass


def _shutdown_pool(kill=False):
    """Stop the worker processes (``kill``: at once, e.g. a stuck one)."""
    global _POOL
    if _POOL is None:
        return
    ex, _POOL = _POOL[0], None
    if kill:
        for p in list((getattr(ex, "_processes", None) or {}).values()):
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
    try:
        ex.shutdown(wait=not kill, cancel_futures=True)
    except Exception:  # noqa: BLE001
        pass


# drop the executor before the interpreter tears its modules down (else its
# weakref callback fails noisily at exit)
atexit.register(_shutdown_pool)


def _disk_ready(d, key, data):
    """Whether the unit ``key`` looks loadable from the disk cache ``d``: its module
    holds ``data`` and numba's index file is there (a wrong guess only costs an
    in-process compile)."""
    modname = f"texpr_k_{key}"
    try:
        with open(os.path.join(d, modname + ".py"), "rb") as f:
            if f.read() != data:
                return False
    except OSError:
        return False
    return any(p.endswith(".nbi") for p in _files.numba_files(d, modname)) \
        and _files.files_state(d, modname) == "ok"


#: estimated seconds of a fresh worker before its first unit: ``spawn`` of a new
#: interpreter, its imports (numpy, numba) and numba's first compile in the
#: process (measured on a quiet 2-core machine: 0.64 s to a worker answering,
#: about 0.45 s more for numba's start); 0 once the pool has compiled a unit
WORKER_START_SECONDS = 1.1
#: numba's first compile in a process (its target's start-up), paid once by
#: whichever process compiles first (the parent, or each worker)
NUMBA_START_SECONDS = 0.45
#: whether the building process compiles a share of a build's units itself
#: (:func:`split_units`); on by default, off with ``TEXPR_COMPILE_HERE=0``. Cold
#: builds of suite cases took 15-30% less time than with every unit in the
#: workers (2026-12-02, one run alternating: max_pool2d 2.06 -> 1.45 s,
#: layernorm 3.07 -> 2.52, softmax_xent 1.89 -> 1.49, depthwise 3.61 -> 3.20).
#: It was off until then: a process that compiled a stage's unit itself ran
#: that stage's kernels 1.7-2x slower afterwards than a process that loaded the
#: same machine code from the cache (measured 2026-12-01 on max_pool2d's
#: value-and-grad: 2.9 vs 1.5 ms on 2 threads, 4.7 vs 2.5 ms on one; the same
#: after reloading the unit from disk in that process; not the vectoriser
#: settings, malloc's thresholds or the threading layer). The cause (found
#: 2026-12-02, isolated on the argmax unit alone: 1.3-1.5 ms compiled here,
#: 0.4-0.7 ms loaded; one thread 2.3 vs 0.66): numba compiles a parfor's body as
#: a library of its own, optimised once, and links it into the unit's module,
#: where it is optimised again; the compiling process resolves the body's symbol
#: to the first library's code, a loading process has only the module's.
#: Running numba's first ("cheap") module round at -O3 with the loop vectoriser
#: (what NUMBA_OPT=max does, :func:`_unit_flags`) gives both the same code (the
#: argmax unit 0.45 ms either way; depthwise's units, whose unrolled partial
#: sums keep numba's default round, ran at the same speed both ways too).
PARENT_COMPILES = os.environ.get("TEXPR_COMPILE_HERE", "").strip() != "0"
_STARTED = {"parent": False, "pool": False}


def estimate_seconds(source):
    """A unit's numba compile time (seconds), estimated from its text, for the
    split of a build's units between this process and the workers: the lines of
    the unit's function (the shared helpers above it aside) times a rate,
    higher for a ``parallel=True`` unit (numba's parfor pass). Fitted to the
    units of the main job and the suite cases compiled one by one on a quiet
    2-core machine (serial: 0.06 s + 0.013 s a line; parallel: 0.25 s + 0.022 s
    a line, first compile in a process aside): a guide for the split, not a
    prediction."""
    at = source.find("@njit(parallel=")
    lines = source.count("\n", at if at >= 0 else 0)
    if "@njit(parallel=True" in source:
        return 0.25 + 0.022 * lines
    return 0.06 + 0.013 * lines


def split_units(estimates, workers, parent_start, worker_start):
    """Which units the workers compile: ``estimates`` (key -> seconds, see
    :func:`estimate_seconds`) are placed longest first, each on whichever of
    the parent (free at ``parent_start`` seconds) and the ``workers`` (each free
    at ``worker_start``) would finish it first -- Graham's LPT rule ("Bounds on
    multiprocessing timing anomalies", SIAM J. Appl. Math. 1969). Returns
    ``(keys for the workers, number of workers used)``: a build of a few small
    units keeps them all here, where a fresh worker's start would cost more than
    the unit."""
    free = [parent_start] + [worker_start] * workers
    to_workers = []
    used = set()
    for key, est in sorted(estimates.items(), key=lambda kv: -kv[1]):
        slot = min(range(len(free)), key=lambda i: (free[i] + est, i))
        free[slot] += est
        if slot:
            to_workers.append(key)
            used.add(slot)
    return to_workers, len(used)


def _start_workers(jobs):
    """Submit the ``jobs`` (``key -> (source, arg_specs, entry)``, none of them in
    memory) that the workers should compile into the disk cache; ``key ->
    future`` (empty when the workers are disabled, the disk cache is unusable,
    or the split keeps every unit in this process). Never raises."""
    allowed = _workers_allowed()
    if not jobs or allowed < 1:
        return {}
    try:
        d = cache_dir()
        if not os.access(d, os.W_OK | os.X_OK):
            return {}
        todo = {k: j for k, j in jobs.items()
                if not _disk_ready(d, k, j[0].encode("utf-8"))}
    except OSError:
        return {}
    if not todo:
        return {}
    if PARENT_COMPILES:
        warm = _POOL is not None and _STARTED["pool"]
        keys, n = split_units({k: estimate_seconds(j[0]) for k, j in todo.items()}, allowed,
                              0.0 if _STARTED["parent"] else NUMBA_START_SECONDS,
                              0.0 if warm else WORKER_START_SECONDS)
        if _POOL is not None:
            n = max(n, min(_POOL[1], allowed))  # a running pool keeps its size
    else:
        keys, n = list(todo), min(allowed, len(todo))
        if len(todo) < 2:
            return {}
    if not keys:
        return {}
    try:
        ex = _pool(n)
        _POOL[2] += len(keys)
        with _NoMain():
            return {k: ex.submit(_WORKER_FN, d, k, *todo[k]) for k in keys}
    except BaseException as exc:  # noqa: BLE001 - a broken pool: compile here
        _shutdown_pool(kill=True)
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {}


def _collect_workers(futs):
    """Wait for the workers' ``futs`` (``key -> future``); ``key -> seconds`` of
    the units compiled. A failed or stuck worker's units are left for this
    process to compile (a stuck pool is killed after ``$TEXPR_COMPILE_TIMEOUT``
    seconds). Never raises but KeyboardInterrupt."""
    if not futs:
        return {}
    done = {}
    try:
        finished, pending = _futures.wait(list(futs.values()), timeout=_timeout())
        for k, f in futs.items():
            if f not in finished:
                continue
            try:
                done[k] = float(f.result())
                _STARTED["pool"] = True
            except BaseException:  # noqa: BLE001 - any worker failure: compile here
                _STATS["worker_failures"] += 1
        if pending:
            _STATS["worker_failures"] += len(pending)
            _shutdown_pool(kill=True)
    except BaseException as exc:  # noqa: BLE001 - a broken pool: compile here
        _shutdown_pool(kill=True)
        if isinstance(exc, KeyboardInterrupt):
            raise
    return done


def compile_units(units):
    """Compile a build's units: ``units`` is a list of ``(source, arg_specs,
    describe, entry)`` (as for :func:`compile_source`). Units already in memory
    are taken from there; the missing ones that the disk cache cannot provide
    are compiled concurrently by worker processes (see the module docstring),
    then every unit is loaded (or, where a worker failed, compiled here).

    Returns a list of :class:`Compiled`, one per unit, in order (a unit listed
    twice is compiled once: the second is ``from_memory_cache``; a unit compiled
    by a worker has ``in_worker`` and ``compile_seconds`` the worker's time plus
    the load). Raises :class:`CompileError` naming the unit's ``describe``.
    """
    keys = [source_key(src, specs) for src, specs, _, _ in units]
    missing = {}
    for k, (src, specs, _, entry) in zip(keys, units):
        if k not in _MEMORY and k not in missing:
            missing[k] = (src, specs, entry)
    futs = _start_workers(missing)
    out = [None] * len(units)
    # this process compiles (or loads) its share while the workers compile theirs,
    # then loads the workers' units from the disk cache
    for late in (False, True):
        worker_seconds = _collect_workers(futs) if late else {}
        for i, (k, (src, specs, describe, entry)) in enumerate(zip(keys, units)):
            if (k in futs) != late or out[i] is not None:
                continue
            fresh = k not in _MEMORY
            c = compile_source(src, specs, describe, entry)
            _STARTED["parent"] = True
            if fresh and k in worker_seconds:
                if c.from_disk_cache:
                    _STATS["from_disk"] -= 1
                    _STATS["compiled"] += 1
                _STATS["in_workers"] += 1
                c.compile_seconds += worker_seconds[k]
                c.from_disk_cache, c.in_worker = False, True
                _MEMORY[k].from_disk_cache, _MEMORY[k].in_worker = False, True
            out[i] = c
    return out
