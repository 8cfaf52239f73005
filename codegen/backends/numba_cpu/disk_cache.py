"""The numba CPU backend's disk cache of compiled units: modules and numba's files, checked.

One job: a unit's text as a module file in the cache directory
(:func:`module_file`, its name the checksum of its text), executed with
numba's disk cache and compiled or loaded (:func:`on_disk`), numba's cache
files checked against their recorded checksums before a load and recorded
after a compile (:mod:`codegen.backends.numba_cpu.unit_files`), and the
helper modules the units link (:mod:`codegen.backends.numba_cpu.runtime`,
:func:`runtime_module`). The integrity rules are
:mod:`codegen.backends.numba_cpu.compile`'s module docstring's.
"""

import os
import sys
import time
import types as _pytypes

from texpr.errors import TexprError

from . import runtime as _runtime
from . import unit_files as _files
from .errors import warn_once as _warn_once
from .jit import compile_with_flags

__all__ = ["CacheUnusable", "on_disk", "load", "compile_unit", "module_file",
           "runtime_module", "discard_unverified", "record_all", "verify_helper_machine_code"]


class _CacheUnusable(Exception):
    """The disk cache failed for this kernel (the cause is the message)."""


#: the helper modules (:mod:`codegen.backends.numba_cpu.runtime`) loaded in this process: ``"disk"``,
#: the one of units cached on disk (``cache=True``), and ``"memory"``, the one of
#: units compiled in memory (``cache=False``, named ``<MODULE>_m``)
_RUNTIMES = {}
_MEMORY_RUNTIME = _runtime.MODULE + "_m"


def _runtime_module(d):
    """The helper module of units cached in directory ``d`` (``None``: of units
    compiled in memory), executed once per process. The disk one is written to,
    and its helpers' machine code cached in, the first cache directory this
    process compiles a unit in, whichever directory later units use: a unit's
    cached machine code holds the helpers it calls (linked in), so it loads from
    any directory, and a process compiles each helper once however many
    directories it builds in. Raises OSError when ``d`` cannot hold the
    module's file. Call under numba's compiler lock."""
    kind = "memory" if d is None else "disk"
    mod = _RUNTIMES.get(kind)
    if mod is None:
        if d is None:
            name, path = _MEMORY_RUNTIME, None
            text = _runtime.SOURCE.replace("cache=True", "cache=False")
        else:
            name, text = _runtime.MODULE, _runtime.SOURCE
            path = _module_file(d, name, text.encode("utf-8"))
            _discard_unverified(d, name, path)
        mod = _pytypes.ModuleType(name)
        mod.__file__ = path
        sys.modules[name] = mod
        code = compile(text, path or f"<texpr helpers {name}>", "exec")
        if path is None:
            exec(code, mod.__dict__)
        else:
            with _files.in_tree_caches():
                exec(code, mod.__dict__)
            _files.check_in_tree(mod.__dict__, d)
        _RUNTIMES[kind] = mod
    return mod


def _record_all(d, modname, fn=None):
    """Record the checksums of numba's files of the unit ``modname`` in ``d`` and,
    when numba compiled it (``fn``, its dispatcher: a cache miss; None: assume
    so), of the disk helper module, whose machine code the compile linked in and
    may have added to (a unit loaded from the cache reads no helper file)."""
    _files.record_files(d, modname)
    stats = getattr(fn, "stats", None)
    if stats is not None and not any(stats.cache_misses.values()):
        return
    mod = _RUNTIMES.get("disk")
    if mod is not None and mod.__file__:
        _files.record_files(os.path.dirname(mod.__file__), _runtime.MODULE)


#: how many times a helper machine-code file that differs from its record is read
#: again (20 ms apart) before it counts as replaced
HELPER_RECHECKS = 3


def _verify_helper_machine_code(d, modname):
    """Before the unit ``modname`` of ``d`` compiles (it has no numba files yet):
    the helpers' machine code it will read must be the recorded one. The helper
    module was checked when this process loaded it; a machine-code file of it
    replaced since (helper-25: ``_fmax``'s by ``_fmin``'s, then recorded as
    good after the next compile) is removed with all of the module's numba
    files (helpers compile again), with one warning."""
    mod = _RUNTIMES.get("disk")
    if mod is None or not mod.__file__ or any(
            p.endswith(".nbi") for p in _files.numba_files(d, modname)):
        return
    rd = os.path.dirname(mod.__file__)
    bad = _files.changed_machine_code(rd, _runtime.MODULE)
    for _ in range(HELPER_RECHECKS):
        if not bad:
            return
        # another process may be between saving a helper it compiled too (numba
        # overwrites a file of the same signature) and recording it
        time.sleep(0.02)
        bad = sorted(set(bad) & set(_files.changed_machine_code(rd, _runtime.MODULE)))
    if bad:
        _warn_once(("helpers", rd),
                   f"texpr: numba's machine code of the helper module in {rd} changed after "
                   f"it was recorded ({', '.join(bad[:3])}): it was removed, and the helpers "
                   "compile again")
        _files.remove_numba_files(rd, _runtime.MODULE)


def _remove_runtime_numba_files():
    """Remove numba's cache files of the disk helper module loaded in this
    process; whether there were any."""
    mod = _RUNTIMES.get("disk")
    if mod is None or not mod.__file__:
        return False
    return _files.remove_numba_files(os.path.dirname(mod.__file__), _runtime.MODULE)


def _load(source, modname, path, entry="kernel"):
    """The ``entry`` dispatcher of ``source`` executed as module ``modname``:
    with numba's disk cache when ``path`` (the module's file, holding the same
    text) is given, else in memory only. The unit's helpers come from the helper
    module of the same cache directory (:func:`_runtime_module`)."""
    if path is None:
        # the text is ours (no user text outside comments): the flag and the helper
        # module's name (a checksum) are the only changes
        source = source.replace("cache=True", "cache=False").replace(
            f"from {_runtime.MODULE} import", f"from {_MEMORY_RUNTIME} import")
    from numba.core.compiler_lock import global_compiler_lock

    # under numba's (re-entrant) compiler lock: CPython 3.11's compile() is not
    # safe while another thread parses (numba's front end parses too): threads
    # building at once once got "SystemError: AST constructor recursion depth
    # mismatch", which the cache's fallback then blamed on the cache directory
    with global_compiler_lock:
        _runtime_module(None if path is None else os.path.dirname(path))
        code = compile(source, path or f"<texpr kernel {modname}>", "exec")
        mod = _pytypes.ModuleType(modname)
        mod.__file__ = path
        # numba's cached code names its module: it must be importable by that name
        sys.modules[modname] = mod
        if path is None:
            exec(code, mod.__dict__)
        else:
            with _files.in_tree_caches():  # (a cfunc compiles or loads right here)
                exec(code, mod.__dict__)
            _files.check_in_tree(mod.__dict__, os.path.dirname(path))
    return mod.__dict__[entry]


def _compile(fn, sig, source):
    """Compile ``fn`` for ``sig`` (:func:`codegen.backends.numba_cpu.jit.compile_with_flags`)
    under numba's compiler lock, then check that every helper has one signature."""
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        compile_with_flags(fn, sig, source)
        _check_one_signature()
    return fn


def _check_one_signature():
    """Every helper of :mod:`codegen.backends.numba_cpu.runtime` has at most one compiled signature
    (the call sites give each one argument types; several signatures of one
    function in numba's unlocked disk cache could be mixed up by two processes:
    see :data:`codegen.backends.numba_cpu.runtime._PER_DTYPE`). Raises TexprError (a code
    generator bug) otherwise."""
    for mod in _RUNTIMES.values():
        for name in _runtime.NAMES:
            sigs = getattr(getattr(mod, name), "overloads", ())  # (an intrinsic: none)
            if len(sigs) > 1:
                raise TexprError(f"internal error: the helper {name} was compiled for "
                                 f"{len(sigs)} signatures ({', '.join(map(str, sigs))}); "
                                 "please report the program")


def _discard_unverified(d, modname, path):
    """Remove numba's cache files of ``modname`` when they are not the recorded
    ones (one :class:`CacheWarning`); the unit is then compiled afresh."""
    state = _files.files_state(d, modname)
    if state == "damaged":
        _warn_once(("sums", d, modname),
                   f"texpr: numba's cache files of {path} do not match the checksums "
                   "recorded when they were written (damaged or replaced): they were "
                   "removed and the kernel recompiled")
    if state != "ok":
        _files.remove_numba_files(d, modname)


def _module_file(d, modname, data):
    """The path of the module ``modname`` in ``d`` holding exactly ``data``:
    written if missing, rewritten (its numba cache files removed, one warning)
    if it holds anything else."""
    path = os.path.join(d, modname + ".py")
    try:
        with open(path, "rb") as f:
            old = f.read()
    except FileNotFoundError:
        old = None
    except IsADirectoryError:
        # a directory in the file's place (damage, or another tool): no module
        # text at all, so it goes the way of a truncated one
        old = b""
    if old is not None and old != data:
        _warn_once(("entry", path),
                   f"texpr: the cached kernel module {path} does not hold the text its name "
                   f"is the checksum of ({len(old)} bytes instead of {len(data)}; truncated or "
                   "overwritten): it was discarded with its numba cache files and rebuilt")
        _files.remove_numba_files(d, modname, [path] * (not old))
        old = None
    if old is None:
        _files.write_atomic(path, data)
    return path


def _on_disk(d, key, source, sig, entry):
    modname = f"texpr_k_{key}"
    data = source.encode("utf-8")
    try:
        path = _module_file(d, modname, data)
        _discard_unverified(d, modname, path)
        loaded = _load(source, modname, path, entry)
        _verify_helper_machine_code(d, modname)
        fn = _compile(loaded, sig, source)
        _record_all(d, modname, fn)
        return path, fn
    except Exception as exc:  # noqa: BLE001 - numba's cache raises many kinds
        first = exc
    # numba's cache files that cannot be read (empty, truncated, random bytes) make
    # the load fail: remove them (the unit's, and the helper module's, whose machine
    # code numba loads while it types the unit) and compile again (numba writes
    # them afresh)
    if _files.remove_numba_files(d, modname) | _remove_runtime_numba_files():
        try:
            path = _module_file(d, modname, data)
            fn = _compile(_load(source, modname, path, entry), sig, source)
        except Exception as exc:  # noqa: BLE001
            raise _CacheUnusable(f"{type(exc).__name__}: {exc}") from None
        _record_all(d, modname)
        _warn_once(("numba", d),
                   f"texpr: numba's cache files of {path} could not be loaded "
                   f"({type(first).__name__}: {str(first)[:200]}); they were removed and the "
                   "kernel recompiled")
        return path, fn
    raise _CacheUnusable(f"{type(first).__name__}: {first}")


# the names other modules use
CacheUnusable, load, compile_unit, module_file = _CacheUnusable, _load, _compile, _module_file
runtime_module, discard_unverified, record_all = _runtime_module, _discard_unverified, _record_all
verify_helper_machine_code, on_disk = _verify_helper_machine_code, _on_disk
