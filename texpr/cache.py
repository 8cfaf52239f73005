"""The on-disk cache: where it is, what it holds, its size bound, ``info`` and ``clear``.

One directory holds everything texpr keeps between runs:

* **kernel modules** ``texpr_k_<key>.py`` (the generated source, written by
  :mod:`texpr.codegen.backends.numba_cpu.compile`) and **numba files**
  ``__pycache__/texpr_k_<key>.*.nbi|.nbc`` (numba's machine code for them),
  among them the helper module ``texpr_k_rt<hash>.py`` every unit imports
  (:mod:`texpr.codegen.backends.numba_cpu.runtime`);
* **symbolic entries** ``symbolic/<key>.pkl`` (results of ``te.differentiate``,
  ``texpr.simplify.simplify`` and codegen's lowering, see :mod:`texpr.symcache`).

The directory is ``$TEXPR_CACHE_DIR``, else ``$XDG_CACHE_HOME/texpr``, else
``~/.cache/texpr`` (the same rule as ``texpr.codegen.backends.numba_cpu.compile.cache_dir``).

Size bound: ``$TEXPR_CACHE_SIZE_LIMIT`` bytes (suffixes ``K``, ``M``, ``G``
accepted; default ``2G``; ``0`` turns the bound off). When texpr writes an
entry and the cache holds more, the least recently used entries are removed
first (a kernel module goes with its numba files) until it holds at most 90%
of the bound; the entry used last is always kept. "Used" is the file's access
time, which texpr sets explicitly whenever it loads an entry (the modification
time of a kernel module is left alone: numba's index records it).

Command line::

    python -m texpr.cache info     # directory, entries and bytes of each kind
    python -m texpr.cache clear    # remove every entry (kernels and symbolic)
    python -m texpr.cache clear --symbolic   # only the symbolic entries
    python -m texpr.cache clear --kernels    # only kernel modules and numba files

An unusable directory (a file, unreadable, deleted while running) never
raises: :func:`info` reports it, :func:`clear` and :func:`enforce_size_bound`
do nothing.
"""

import os
import shutil
import sys
import time

from .envvars import env_number

__all__ = ["cache_dir", "info", "clear", "enforce_size_bound", "size_limit", "touch",
           "SYMBOLIC_SUBDIR", "DEFAULT_SIZE_LIMIT"]

#: the subfolder of the symbolic entries
SYMBOLIC_SUBDIR = "symbolic"
#: the default size bound in bytes (2 GB)
DEFAULT_SIZE_LIMIT = 2 * 1024 ** 3
_KERNEL_PREFIX = "texpr_k_"


def cache_dir(create=True):
    """The cache directory (``$TEXPR_CACHE_DIR``, else ``$XDG_CACHE_HOME/texpr``,
    else ``~/.cache/texpr``), as an absolute path (a relative one is taken from
    the working directory now: modules loaded from it keep pointing at it after
    a ``chdir``); created when ``create``.

    Raises OSError when it cannot be created (e.g. the path is a file)."""
    d = os.environ.get("TEXPR_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "texpr")
    d = os.path.abspath(d)
    if create:
        os.makedirs(d, exist_ok=True)
    return d


def size_limit():
    """The size bound in bytes from ``$TEXPR_CACHE_SIZE_LIMIT`` (default 2 GB);
    None when it is ``0`` (no bound). A value that is not a finite size >= 0
    (text, ``inf``, ``nan``, ``1e400``, a negative one) gives the default, with
    one :class:`texpr.envvars.SettingWarning`."""
    value = env_number("TEXPR_CACHE_SIZE_LIMIT", DEFAULT_SIZE_LIMIT, sizes=True,
                       expected="a byte size >= 0 (suffixes K, M, G, T; 0: no bound)")
    return None if value == 0 else value


def touch(path):
    """Mark ``path`` as used now (its access time; the modification time is kept).
    Never raises."""
    try:
        st = os.stat(path)
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
    except OSError:
        pass


def _entries(d):
    """The entries of cache directory ``d``: a dict ``(kind, name) -> list of
    (path, bytes, last use)``, kind ``"kernel"`` (a module with its numba files)
    or ``"symbolic"``. Files of other names are not texpr's and are ignored."""
    groups = {}

    def add(kind, name, entry):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return
        groups.setdefault((kind, name), []).append(
            (entry.path, st.st_size, max(st.st_atime, st.st_mtime)))

    def scan(path):
        try:
            with os.scandir(path) as it:
                return [e for e in it]
        except OSError:
            return []

    for e in scan(d):
        if e.name.startswith(_KERNEL_PREFIX) and e.name.endswith(".py") and e.is_file():
            add("kernel", e.name[:-3], e)
    for e in scan(os.path.join(d, "__pycache__")):
        if e.name.startswith(_KERNEL_PREFIX) and e.name.endswith((".nbi", ".nbc", ".sha256")) \
                and e.is_file():
            add("kernel", e.name.split(".", 1)[0], e)
    for e in scan(os.path.join(d, SYMBOLIC_SUBDIR)):
        if e.name.endswith(".pkl") and e.is_file():
            add("symbolic", e.name[:-4], e)
    return groups


def info(d=None):
    """What the cache holds.

    Args:
        d: the directory (default :func:`cache_dir`, not created).
    Returns:
        dict: ``directory``, ``usable`` (bool), ``reason`` (why not, else ""),
        ``kernel_modules`` / ``numba_files`` / ``symbolic_entries`` (counts),
        ``kernel_bytes`` / ``numba_bytes`` / ``symbolic_bytes``, ``total_bytes``,
        ``size_limit`` (bytes or None). Never raises.
    """
    out = dict(directory=None, usable=True, reason="", kernel_modules=0, numba_files=0,
               symbolic_entries=0, kernel_bytes=0, numba_bytes=0, symbolic_bytes=0,
               total_bytes=0, size_limit=size_limit())
    try:
        d = cache_dir(create=False) if d is None else d
        out["directory"] = d
        if not os.path.exists(d):
            out.update(usable=False, reason="it does not exist (nothing cached yet)")
            return out
        if not os.path.isdir(d):
            out.update(usable=False, reason="it is not a directory")
            return out
        if not os.access(d, os.R_OK | os.X_OK):
            out.update(usable=False, reason="it is not readable")
            return out
        if not os.access(d, os.W_OK):
            out.update(usable=False, reason="it is not writable (entries are read only)")
        for (kind, _name), files in _entries(d).items():
            for path, size, _used in files:
                if kind == "symbolic":
                    out["symbolic_entries"] += 1
                    out["symbolic_bytes"] += size
                elif path.endswith(".py"):
                    out["kernel_modules"] += 1
                    out["kernel_bytes"] += size
                else:
                    out["numba_files"] += 1
                    out["numba_bytes"] += size
        out["total_bytes"] = out["kernel_bytes"] + out["numba_bytes"] + out["symbolic_bytes"]
    except Exception as exc:  # noqa: BLE001 - housekeeping never raises
        out.update(usable=False, reason=f"{type(exc).__name__}: {exc}")
    return out


def remove_files(paths):
    """Unlink ``paths`` (a file already gone is skipped; a directory in the place
    of a cache file is removed with its contents); how many were removed."""
    n = 0
    for p in paths:
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
            n += 1
        except OSError:
            pass
    return n


def clear(d=None, kernels=True, symbolic=True):
    """Remove the cache's entries (kernel modules with their numba files, and/or
    symbolic entries); files of other names are left alone.

    Returns the number of files removed. Never raises (an unusable directory
    removes nothing). Kernels already loaded by running processes keep working.
    """
    try:
        d = cache_dir(create=False) if d is None else d
        paths = []
        for (kind, _name), files in _entries(d).items():
            if (kind == "kernel" and kernels) or (kind == "symbolic" and symbolic):
                paths.extend(p for p, _s, _u in files)
        return remove_files(paths)
    except Exception:  # noqa: BLE001
        return 0


#: directory -> (bytes it held at the last scan plus those written since, time of the scan)
_ESTIMATE = {}
#: how long (seconds) a scan's total is trusted before the directory is scanned again
RESCAN_SECONDS = 30.0


def enforce_size_bound(d=None, limit=None, keep=(), written=None):
    """Remove the least recently used entries until the cache holds at most 90%
    of ``limit`` bytes (default :func:`size_limit`), if it holds more than
    ``limit``. The most recently used entry and the files ``keep`` (paths) are
    never removed. Returns the number of files removed; never raises.

    ``written``: the bytes just written, when the caller knows them: then the
    directory is scanned only when the total of the last scan (at most
    :data:`RESCAN_SECONDS` old) plus what this process wrote since passes the
    bound, so that frequent small writes do not each list the directory."""
    try:
        explicit = limit is not None
        limit = size_limit() if limit is None else limit
        if limit is None:
            return 0
        d = cache_dir(create=False) if d is None else d
        now = time.monotonic()
        if written is not None and not explicit:
            est = _ESTIMATE.get(d)
            if est is not None and now - est[1] < RESCAN_SECONDS and est[0] + written <= limit:
                _ESTIMATE[d] = (est[0] + written, est[1])
                return 0
        groups = _entries(d)
        sizes = {k: sum(s for _p, s, _u in v) for k, v in groups.items()}
        total = sum(sizes.values())
        _ESTIMATE[d] = (total, now)
        if total <= limit:
            return 0
        keep = {os.path.abspath(p) for p in keep}
        order = sorted(groups, key=lambda k: max(u for _p, _s, u in groups[k]))
        removed = 0
        target = int(limit * 0.9)
        for k in order[:-1]:  # the most recent entry stays
            if total <= target:
                break
            paths = [p for p, _s, _u in groups[k]]
            if any(os.path.abspath(p) in keep for p in paths):
                continue
            removed += remove_files(paths)
            total -= sizes[k]
        _ESTIMATE[d] = (total, now)
        return removed
    except Exception:  # noqa: BLE001
        return 0


def _fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def main(argv=None):
    """``python -m texpr.cache info|clear [--symbolic|--kernels]``; returns the exit status."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m texpr.cache",
                                description="Inspect or clear texpr's on-disk cache.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="directory, entries and bytes of each kind")
    c = sub.add_parser("clear", help="remove cached entries")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--symbolic", action="store_true", help="only the symbolic entries")
    g.add_argument("--kernels", action="store_true",
                   help="only kernel modules and their numba files")
    args = p.parse_args(argv)
    if args.command == "info":
        r = info()
        print(f"directory: {r['directory']}")
        if r["reason"]:
            print(f"  ({'unusable: ' if not r['usable'] else ''}{r['reason']})")
        print(f"kernel modules:   {r['kernel_modules']:>6} entries  {_fmt_bytes(r['kernel_bytes']):>10}")
        print(f"numba files:      {r['numba_files']:>6} files    {_fmt_bytes(r['numba_bytes']):>10}")
        print(f"symbolic entries: {r['symbolic_entries']:>6} entries  "
              f"{_fmt_bytes(r['symbolic_bytes']):>10}")
        lim = r["size_limit"]
        print(f"total:            {_fmt_bytes(r['total_bytes'])} of "
              f"{'no bound' if lim is None else _fmt_bytes(lim)} (TEXPR_CACHE_SIZE_LIMIT)")
        return 0
    kernels = not args.symbolic
    symbolic = not args.kernels
    n = clear(kernels=kernels, symbolic=symbolic)
    try:
        d = cache_dir(create=False)
    except Exception:  # noqa: BLE001
        d = "?"
    print(f"removed {n} files from {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
