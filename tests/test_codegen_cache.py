"""Kernel caches: in memory by the structure of the scheduled graph (names do not
matter), and on disk: a second process running the same program loads numba's
cached machine code instead of compiling (checked in subprocesses with their
own ``TEXPR_CACHE_DIR``). Integrity: corrupt entries (the module, numba's .nbi
and .nbc files) are rebuilt with one warning and the right values; a cache
directory that cannot be used (a file, read-only, deleted while processes
build) degrades to compiling in memory."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest

from texpr import codegen
from texpr.codegen.backends.numba_cpu import runtime
import texpr as te

PROGRAM = textwrap.dedent("""
    import json, time
    import numpy as np
    import texpr as te
    from texpr import codegen
    X = te.placeholder((3, 8), "X", "float64")
    W = te.placeholder((4, 8), "W", "float64")
    k = te.reduce_axis(8, "k")
    Y = te.compute((3, 4), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    Z = te.compute((3, 4), lambda i, j: te.tanh(Y[i, j]), name="Z")
    t = time.perf_counter()
    kern = codegen.build([Z], [X, W])
    seconds = time.perf_counter() - t
    x, w = np.ones((3, 8)), np.full((4, 8), 0.1)
    z = kern(x, w)[0]
    print(json.dumps(dict(disk=kern.from_disk_cache, seconds=seconds, z=float(z[0, 0]),
                          path=kern.path)))
""")


def _run(cache):
    env = dict(os.environ, TEXPR_CACHE_DIR=str(cache))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_kernel_from_disk(tmp_path):
    first = _run(tmp_path)
    second = _run(tmp_path)
    assert not first["disk"]
    assert second["disk"]
    assert first["path"] == second["path"] and first["path"].startswith(str(tmp_path))
    assert second["z"] == first["z"] and abs(first["z"] - np.tanh(0.8)) < 1e-12
    assert any(p.endswith(".nbi") for _, _, files in os.walk(tmp_path) for p in files)


def test_memory_cache_ignores_names():
    def program(suffix):
        A = te.placeholder((5,), "A" + suffix, "float64")
        B = te.compute((5,), lambda i: A[i] * 3.0 + 1.0, name="B" + suffix)
        return A, B

    A1, B1 = program("one")
    A2, B2 = program("two")
    k1 = codegen.build([B1], [A1])
    k2 = codegen.build([B2], [A2])
    assert k2.from_memory_cache and k2.path == k1.path
    a = np.arange(5.0)
    np.testing.assert_array_equal(k2(a)[0], a * 3.0 + 1.0)
    assert "stage Btwo" in k2.source  # the source still names this graph's stages
    C = te.compute((5,), lambda i: A1[i] * 4.0 + 1.0, name="C")
    assert not codegen.build([C], [A1]).from_memory_cache


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "k"))
    assert codegen.cache_dir() == str(tmp_path / "k") and (tmp_path / "k").is_dir()


# ---- integrity ----------------------------------------------------------------------------

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache_prog.py")


def _helper(cache, *args, user=None):
    """Run tests/cache_prog.py (tiny kernels) in a subprocess; its JSON report."""
    env = dict(os.environ, TEXPR_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, HELPER, *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=600,
                         preexec_fn=None if user is None else (lambda: os.setuid(user)))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _module(cache):
    """The one unit module in ``cache`` (not the helper module, codegen.backends.numba_cpu.runtime)."""
    (path,) = [p for p in glob.glob(os.path.join(str(cache), "texpr_k_*.py"))
               if not os.path.basename(p).startswith(runtime.MODULE)]
    return path


def test_truncated_module_gives_right_values_and_is_repaired(tmp_path):
    """Half of the cached module cut: the next process once returned NaN silently
    (and the one after took the broken code from numba's cache)."""
    first = _helper(tmp_path, 3)
    assert first["err"] < 1e-12 and first["warnings"] == []
    path = _module(tmp_path)
    with open(path, "rb") as f:
        good = f.read()
    with open(path, "wb") as f:
        f.write(good[:len(good) // 2])
    second = _helper(tmp_path, 3)
    assert second["err"] < 1e-12  # not NaN
    assert len(second["warnings"]) == 1 and "discarded" in second["warnings"][0]
    with open(path, "rb") as f:
        assert f.read() == good
    third = _helper(tmp_path, 3)
    assert third["err"] < 1e-12 and third["disk"] == [True] and third["warnings"] == []


HELPERS_PROGRAM = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import texpr as te
    from texpr import codegen
    c = float(sys.argv[1])
    X = te.placeholder((3, 5), "X", "float32")
    I = te.placeholder((4,), "I", "int64")
    k = te.reduce_axis(5, "k")
    # a max (the helper _fmax_float32) of a gather (the check _ck), a zeroed sum
    # (_fill_*, inlined by numba: no machine code of its own) and integer arithmetic
    # on loaded values (_imul, _iadd)
    M = te.compute((4,), lambda i: te.max(X[I[i], k] * c, axis=k), name="M")
    S = te.compute((2,), lambda j: te.sum(M[j + 2 * k % 2], axis=k), name="S")
    N = te.compute((4,), lambda i: I[i] * 3 + I[3 - i], name="N")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kern = codegen.build([M, S, N], [X, I])
        x = np.arange(15, dtype=np.float32).reshape(3, 5) - 7
        ix = np.array([2, 0, 1, 2])
        m, s, n = kern(x, ix)
        try:
            kern(x, np.array([2, 0, 3, 2]))
            oob = False
        except te.OutOfBoundsError:
            oob = True
    want = (x[ix] * np.float32(c)).max(axis=1)
    ok = bool(np.array_equal(m, want) and np.array_equal(n, ix * 3 + ix[::-1]) and oob)
    msgs = [str(m.message) for m in caught if issubclass(m.category, codegen.CacheWarning)]
    print(json.dumps(dict(ok=ok, disk=kern.from_disk_cache, warnings=msgs)))
""")


def _run_helpers_program(cache, c):
    env = dict(os.environ, TEXPR_CACHE_DIR=str(cache), TEXPR_COMPILE_WORKERS="0")
    out = subprocess.run([sys.executable, "-c", HELPERS_PROGRAM, str(c)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("damage", ["module", "numba-files"])
def test_a_damaged_helper_module_is_rebuilt(tmp_path, damage):
    """The helpers every unit calls (codegen.backends.numba_cpu.runtime) are one module in the cache
    directory, with numba's machine code beside it: a truncated module or
    random-byte numba files are replaced (one warning) and every value is right."""
    first = _run_helpers_program(tmp_path, 2.0)
    assert first["ok"] and first["warnings"] == [] and not first["disk"]
    module = tmp_path / (runtime.MODULE + ".py")
    numba_files = sorted((tmp_path / "__pycache__").glob(runtime.MODULE + ".*"))
    assert module.exists() and numba_files  # the helpers' machine code is cached
    if damage == "module":
        good = module.read_bytes()
        module.write_bytes(good[:len(good) // 2])
    else:
        for p in numba_files:
            p.write_bytes(np.random.default_rng(3).bytes(200))
    # a new kernel (another constant): numba types its helper calls again
    second = _run_helpers_program(tmp_path, 3.0)
    assert second["ok"] and len(second["warnings"]) == 1, second
    if damage == "module":
        assert module.read_bytes() == good
    third = _run_helpers_program(tmp_path, 3.0)
    assert third["ok"] and third["disk"] and third["warnings"] == []


def _build_tiny(c):
    X = te.placeholder((3, 4), "X", "float64")
    W = te.placeholder((4,), "W", "float64")
    Y = te.compute((3, 4), lambda i, j: X[i, j] * c + W[j], name="Y")
    kernel = codegen.build([Y], [X, W])
    x, w = np.arange(12.0).reshape(3, 4), np.array([0.5, -1.0, 2.0, 3.0])
    np.testing.assert_allclose(kernel(x, w)[0], x * c + w, rtol=1e-15)
    return kernel


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in caught if issubclass(w.category, codegen.CacheWarning)]


@pytest.mark.parametrize("kind", [".py", ".nbi", ".nbc"])
@pytest.mark.parametrize("content", ["empty", "random"])
def test_corrupt_cache_files_are_rebuilt_once(tmp_path, monkeypatch, kind, content):
    """Empty or random-byte files (the module, numba's index or data) made every
    later process fail; now the entry is rebuilt, with one warning, and the
    next build loads it from disk again."""
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    codegen.clear_memory_cache()
    c = 7.25 + len(kind) + 0.5 * (content == "empty")  # an entry of this test's own
    _build_tiny(c)
    files = glob.glob(os.path.join(str(tmp_path), "**", "texpr_k_*" + kind), recursive=True)
    assert files
    for p in files:
        with open(p, "wb") as f:
            f.write(b"" if content == "empty" else np.random.default_rng(5).bytes(300))
    codegen.clear_memory_cache()
    kernel, caught = _caught(lambda: _build_tiny(c))
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert kernel.path is not None and kernel.path.startswith(str(tmp_path))
    codegen.clear_memory_cache()
    again, caught = _caught(lambda: _build_tiny(c))
    assert caught == [] and again.from_disk_cache
    codegen.clear_memory_cache()


def test_cache_dir_that_is_a_file_compiles_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(blocker))
    codegen.clear_memory_cache()
    (k1, k2), caught = _caught(lambda: (_build_tiny(2.5), _build_tiny(3.5)))
    assert k1.path is None and k2.path is None
    assert len(caught) == 1 and "in memory" in str(caught[0].message)
    assert blocker.read_text() == "x"
    codegen.clear_memory_cache()


@pytest.mark.parametrize("how", ["mode", "writes-fail"])
def test_read_only_cache_dir_compiles_in_memory(tmp_path, monkeypatch, how):
    """A directory the process cannot write. ``mode``: its permissions (when the
    tests run as root, whom permissions do not stop, ``os.access`` answers as
    for another user); ``writes-fail``: it looks writable but creating a file
    fails (a read-only mount, a full disk)."""
    cache = tmp_path / "ro"
    cache.mkdir()
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(cache))
    if how == "mode":
        cache.chmod(0o555)
        if os.geteuid() == 0:
            real = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
                False if os.path.abspath(p) == str(cache) and mode & os.W_OK
                else real(p, mode, **kw)))
    else:
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(cache))
        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    codegen.clear_memory_cache()
    try:
        (k1, k2), caught = _caught(lambda: (_build_tiny(4.5), _build_tiny(5.5)))
    finally:
        cache.chmod(0o755)
        codegen.clear_memory_cache()
    assert k1.path is None and k2.path is None
    assert len(caught) == 1 and "in memory" in str(caught[0].message)
    assert [p for p in os.listdir(cache) if p != "__pycache__"] == []


def test_concurrent_builds_survive_the_cache_dir_being_deleted(tmp_path):
    """Three processes build kernels while the cache directory is deleted over and
    over (20 of 33 builds once failed with FileNotFoundError): every build gives
    the right values, with at most one warning about the directory per process."""
    cache = tmp_path / "shared"
    env = dict(os.environ, TEXPR_CACHE_DIR=str(cache))
    procs = [subprocess.Popen([sys.executable, HELPER, str(first), "4"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for first in (10, 20, 30)]
    deletions = 0
    deadline = time.monotonic() + 600
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        shutil.rmtree(cache, ignore_errors=True)
        deletions += 1
        time.sleep(0.05)
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["err"] < 1e-12 and len(out["disk"]) == 4
        assert sum("cannot be used" in m for m in out["warnings"]) <= 1
    assert deletions > 10


def test_threads_building_at_once_get_no_cache_warning(tmp_path, monkeypatch):
    # each thread builds kernels of its own, compiled in that thread (one unit
    # each, no workers); CPython 3.11's compile() raced with another thread's
    # parse once ("AST constructor recursion depth mismatch"), and the cache's
    # fallback blamed the directory with a CacheWarning (an attack find)
    import threading

    import texpr as te
    from texpr import codegen
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    codegen.clear_memory_cache()
    results, errors = {}, []

    def work(t):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for n in (3, 4):
                    X = te.placeholder((t + 2, n), "X", "float64")
                    Y = te.compute((t + 2, n), lambda i, j: X[i, j] * (t + 1.5) + j, name="Y")
                    x = np.arange((t + 2) * n, dtype="float64").reshape(t + 2, n)
                    results[(t, n)] = (codegen.build([Y], [X])(x)[0], te.evaluate(Y, {X: x}))
            errors.extend(str(w.message) for w in caught
                          if issubclass(w.category, codegen.CacheWarning))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(results) == 8
    for got, want in results.values():
        np.testing.assert_allclose(got, want)


def _unit_nbc(cache):
    (path,) = [p for p in glob.glob(os.path.join(str(cache), "__pycache__", "texpr_k_*.nbc"))
               if not os.path.basename(p).startswith(runtime.MODULE)]
    return path


@pytest.mark.parametrize("damage", ["constant", "bitflip", "swap", "no_record"])
def test_machine_code_that_still_loads_after_damage_is_not_run(tmp_path, damage):
    """An attack changed the constant 1.375 to 1.875 inside a unit's ``.nbc``
    (one bit of the double): the next process loaded it and returned wrong
    values without a warning; a random bit flip crashed it (SIGSEGV), and two
    units' files swapped gave wrong values too. Numba's files are now checked
    against the sha256 recorded when they were written."""
    first = _helper(tmp_path, 3)
    assert first["err"] < 1e-12 and first["warnings"] == []
    nbc = _unit_nbc(tmp_path)
    with open(nbc, "rb") as f:
        good = f.read()
    if damage == "constant":  # c = 3.0 -> 3.5: 0x4008.. -> 0x400C..
        import struct
        old, new = struct.pack("<d", 3.0), struct.pack("<d", 3.5)
        assert old in good
        bad = good.replace(old, new)
    elif damage == "bitflip":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x10
        bad = bytes(bad)
    elif damage == "swap":  # another unit's machine code in its place
        other = _helper(tmp_path / "other", 5)
        assert other["err"] < 1e-12
        with open(_unit_nbc(tmp_path / "other"), "rb") as f:
            bad = f.read()
    else:  # the record removed (an older texpr wrote the files): rebuilt, silently
        for p in glob.glob(os.path.join(str(tmp_path), "__pycache__", "texpr_k_*.sha256")):
            os.remove(p)
        bad = good
    with open(nbc, "wb") as f:
        f.write(bad)
    second = _helper(tmp_path, 3)
    assert second["err"] < 1e-12
    if damage == "no_record":
        assert second["warnings"] == []
    else:
        assert len(second["warnings"]) == 1 and "checksums" in second["warnings"][0]
    third = _helper(tmp_path, 3)
    assert third["err"] < 1e-12 and third["disk"] == [True] and third["warnings"] == []
