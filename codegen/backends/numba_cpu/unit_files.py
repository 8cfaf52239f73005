"""numba's cache files of a compiled unit on disk: finding them, and their checksums.

A unit ``texpr_k_<key>.py`` in the cache directory ``d`` has numba's index
(``.nbi``) and machine code (``.nbc``) files in ``d/__pycache__``, named
``texpr_k_<key>.<function>-<line>.<python>...``, and beside them the sha256 of
each as recorded when they were written (``texpr_k_<key>.sha256``).
:func:`files_state` compares the two, so machine code that was damaged or
replaced after it was written is never run (issue 10, cache integrity).

Finding a unit's files needs a listing of ``__pycache__``, which holds every
unit's files: a cache near its size bound holds tens of thousands. One listing
is taken per state of the directory and shared by every unit of a build (a
warm build of the main job with 4,842 other programs' units in its cache spent
3.6 s in 121 listings, one glob per question). A listing is reused only while
the directory's modification time is the one it had when the listing was taken,
and only if that time was :data:`LISTING_MARGIN_S` older than the listing (a
file written within the file system's timestamp granularity after a listing
could otherwise leave the time unchanged). Anything but an intact verdict is
taken again from a fresh listing, and so is a verdict that there are no files;
files are removed from a fresh listing.

numba keeps a unit's cache files in ``d/__pycache__`` only: :func:`in_tree_caches`
points the unit's functions there whatever numba's own settings say
(``NUMBA_CACHE_DIR`` would move them where no checksum covers them), and
:func:`check_in_tree` refuses a module whose functions would cache elsewhere.
Only regular files are read (a FIFO in a file's place blocked the build).
:func:`changed_machine_code` judges the shared helper module between the
compiles of one process, while other processes add to it.
"""

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
import time

from numba.core.caching import CompileResultCacheImpl, FunctionCache, InTreeCacheLocator
from numba.core.ccallback import CFunc
from numba.core.dispatcher import Dispatcher

from texpr import cache as _cache

__all__ = ["numba_files", "files_state", "record_files", "remove_numba_files",
           "write_atomic", "in_tree_caches", "check_in_tree", "changed_machine_code",
           "LISTING_MARGIN_S",
           "MAX_FILE_BYTES"]

#: seconds a ``__pycache__``'s modification time must precede a listing of it
#: for the listing to be reused (file systems with timestamps coarser than this
#: are not supported for reuse: FAT's 2 s is the coarsest in common use)
LISTING_MARGIN_S = 3.0

#: ``{__pycache__ path: (its st_mtime_ns when listed, {module name: [paths]})}``
_LISTINGS = {}
_LOCK = threading.Lock()


def _listing(pycache, fresh):
    """``{module name: [paths]}`` of the files in ``pycache`` (empty when it
    cannot be read): the shared listing unless ``fresh`` or the directory
    changed since it was taken."""
    try:
        mtime = os.stat(pycache).st_mtime_ns
    except OSError:
        return {}
    if not fresh:
        with _LOCK:
            hit = _LISTINGS.get(pycache)
        if hit is not None and hit[0] == mtime:
            return hit[1]
    by_module = {}
    try:
        with os.scandir(pycache) as entries:
            for e in entries:
                name = e.name
                if "." in name and not name.startswith("."):
                    by_module.setdefault(name.split(".", 1)[0], []).append(e.path)
    except OSError:
        return {}
    with _LOCK:
        if time.time_ns() - mtime >= LISTING_MARGIN_S * 1e9:
            _LISTINGS[pycache] = (mtime, by_module)
        else:
            _LISTINGS.pop(pycache, None)
    return by_module


def numba_files(d, modname, fresh=False):
    """Paths of the files of module ``modname`` in ``d/__pycache__`` (numba's
    cache files, their checksum record and its temporary files); ``fresh``: from
    a listing taken now, not the shared one. Never raises."""
    return list(_listing(os.path.join(d, "__pycache__"), fresh).get(modname, ()))


def remove_numba_files(d, modname, extra=()):
    """Remove the files of ``modname`` in ``d/__pycache__`` (from a fresh listing)
    and the paths ``extra``; whether any was there."""
    return _cache.remove_files(numba_files(d, modname, fresh=True) + list(extra))


#: the largest cache file read for its checksum (numba's files of a unit are a
#: few MB at most): a larger one is damage, not something to read into memory
MAX_FILE_BYTES = 1 << 30


def _read_regular(path):
    """The bytes of ``path``, which must be a regular file of at most
    :data:`MAX_FILE_BYTES` (a FIFO, a device such as ``/dev/zero`` behind a
    symlink, or a directory in its place is damage: reading it would block or
    never end). Raises FileNotFoundError when it is missing, OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            raise OSError(f"{path}: not a regular file of at most {MAX_FILE_BYTES} bytes")
        parts, left = [], MAX_FILE_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, max(st.st_size, 1 << 16)))
            if not b:
                break
            parts.append(b)
            left -= len(b)
        return b"".join(parts)
    finally:
        os.close(fd)


def _sums_path(d, modname):
    # beside numba's files (listed with them: removed with them)
    return os.path.join(d, "__pycache__", modname + ".sha256")


def _numba_sums(d, modname, fresh):
    """``{file name: sha256}`` of numba's cache files (``.nbi``, ``.nbc``) of
    ``modname`` in ``d``. Raises OSError (a listed file removed since)."""
    out = {}
    for path in sorted(numba_files(d, modname, fresh)):
        if path.endswith((".nbi", ".nbc")):
            out[os.path.basename(path)] = hashlib.sha256(_read_regular(path)).hexdigest()
    return out


def _state(d, modname, fresh):
    try:
        sums = _numba_sums(d, modname, fresh)
        if not sums:
            return "ok"
        recorded = _read_regular(_sums_path(d, modname))
    except FileNotFoundError:
        return "unrecorded"
    except OSError:
        return "damaged"
    return "ok" if recorded == _record_text(sums) else "damaged"


def files_state(d, modname):
    """``"ok"`` when numba's cache files of ``modname`` in ``d`` are the ones
    recorded when they were written (:func:`record_files`), or there are none;
    ``"unrecorded"`` when they have no record (written by an older texpr, or by
    a process that stopped before recording); ``"damaged"`` when they differ
    from the record. Machine code that still loads after damage (a flipped bit)
    would otherwise run as it is. A verdict other than ``"ok"`` is always from
    a fresh listing. Never raises."""
    if not numba_files(d, modname):
        # no files to verify: only a listing taken now may say so (files that
        # appeared since the shared one, its directory time unchanged, would
        # otherwise be loaded unverified and then recorded as they are)
        return _state(d, modname, fresh=True)
    state = _state(d, modname, fresh=False)
    return state if state == "ok" else _state(d, modname, fresh=True)


def _record_text(sums):
    return "\n".join(f"{h} {name}" for name, h in sums.items()).encode("ascii")


def _recorded(path):
    try:
        return _read_regular(path)
    except OSError:
        return None


def record_files(d, modname):
    """Record the sha256 of numba's cache files of ``modname`` in ``d`` (after a
    compile or a verified load; atomic). Never raises: an unrecorded file is
    only rebuilt by the next process."""
    path = _sums_path(d, modname)
    try:
        sums = _numba_sums(d, modname, fresh=False)
        if sums and _recorded(path) == _record_text(sums):
            return  # a verified load: the record stands
        # something changed (numba wrote files): record what a listing taken now holds
        sums = _numba_sums(d, modname, fresh=True)
        if sums and _recorded(path) != _record_text(sums):
            write_atomic(path, _record_text(sums))
    except OSError:
        pass


def changed_machine_code(d, modname):
    """Names of the machine-code files (``.nbc``) of ``modname`` in ``d`` whose
    content is not the one recorded for them. numba never rewrites such a file
    in place (a new overload gets a file of its own; its index, the ``.nbi``,
    changes), so this is damage even while other processes add overloads to
    the same module (the helper module, which every unit's compile reads).
    Files with no record are not judged. Never raises."""
    try:
        lines = _read_regular(_sums_path(d, modname)).decode("ascii").split("\n")
    except (OSError, UnicodeDecodeError):
        return []
    pc = os.path.join(d, "__pycache__")
    bad = []
    for line in lines:
        h, _, name = line.partition(" ")
        if not name.endswith(".nbc"):
            continue
        try:
            if hashlib.sha256(_read_regular(os.path.join(pc, name))).hexdigest() != h:
                bad.append(name)
        except FileNotFoundError:
            continue  # removed since (a cache clean): nothing of it loads
        except OSError:
            bad.append(name)
    return bad


def write_atomic(path, data):
    """Write ``data`` (bytes) to ``path`` through a temporary file in the same
    directory and a rename: readers see the old or the new content, never part.
    Raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _cache.remove_files([tmp])
        raise


_UNSET = object()


@contextlib.contextmanager
def in_tree_caches():
    """While inside, the numba caches made (``njit(cache=True)`` and
    ``cfunc(cache=True)`` create theirs when they decorate; a ``cfunc``
    compiles or loads right then) are in the ``__pycache__`` beside their
    function's file, whatever ``NUMBA_CACHE_DIR`` says: numba's choice would
    put them where no checksum covers them (a replaced unit ran with wrong
    values and no warning). Use it around executing a unit's or the helper
    module's text, under numba's compiler lock; then :func:`check_in_tree`."""
    saved = CompileResultCacheImpl.__dict__.get("_locator_classes", _UNSET)
    CompileResultCacheImpl._locator_classes = [InTreeCacheLocator]
    try:
        yield
    finally:
        if saved is _UNSET:
            del CompileResultCacheImpl._locator_classes
        else:
            CompileResultCacheImpl._locator_classes = saved


def check_in_tree(namespace, d):
    """Raise RuntimeError unless every numba function and C callback defined in
    ``namespace`` (a module executed from its file in ``d`` inside
    :func:`in_tree_caches`) caches in ``d/__pycache__`` or not at all
    (``NUMBA_CACHE_LOCATOR_CLASSES`` overrides the locators): the caller then
    compiles in memory."""
    want = os.path.realpath(os.path.join(d, "__pycache__"))
    for name, v in list(namespace.items()):
        if isinstance(v, Dispatcher):
            fn = v.py_func
        elif isinstance(v, CFunc):
            fn = v._pyfunc
        else:
            continue
        cache = getattr(v, "_cache", None)
        if fn.__globals__ is namespace and isinstance(cache, FunctionCache) \
                and os.path.realpath(cache._cache_path) != want:
            raise RuntimeError(f"numba would keep the machine code of {name} in "
                               f"{cache._cache_path}, not in {want}")
