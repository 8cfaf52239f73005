"""Attack on the shared helper module (codegen/backends/numba_cpu/runtime.py), both found on commit
8d2dbc2 and fixed: every helper now has one signature (``_fmax_float32``,
``_fmax_float64``, ...: one numba index file each), and a damaged numba file
warns once per cache directory and process (a directory in its place is removed).

1. Two processes saving different signatures of one helper (_fmax float32 and
   float64) into one fresh cache directory: numba's IndexDataCacheFile.save is
   load-index / write-index / write-data with no lock. If process X is paused
   between its index write and its data write while Y loads, writes index and
   data, X's data lands in the file Y's index maps Y's signature to. Every later
   process then loads float32 machine code for _fmax(float64, float64): float64
   max reductions are silently rounded to float32. (The helper is the first
   cache entry shared by several signatures across processes; a unit has one.)
   The harness only adds waits to numba's save; its logic is unchanged.
2. One damaged helper data file (a directory) gives one CacheWarning per new
   unit in one process (3 here), and again in every process.
3. A directory in place of the helper module's (or a unit's) .py made every
   later process compile in memory (one warning each); it is now removed and
   the module written again (found by the review of 717d3ec).
"""
import os
import subprocess
import sys
import textwrap

import pytest

PROG = textwrap.dedent('''
    import sys, warnings
    import numpy as np, texpr as te
    from texpr import codegen
    dt, c = sys.argv[1], float(sys.argv[2])
    X = te.placeholder((3, 5), "X", dt); I = te.placeholder((4,), "I", "int64")
    k = te.reduce_axis(5, "k")
    M = te.compute((4,), lambda i: te.max(X[I[i], k] * c, axis=k), name="M")
    x = np.random.default_rng(int(c)).standard_normal((3, 5)).astype(dt)
    ix = np.array([2, 0, 1, 2])
    (m,) = codegen.build([M], [X, I])(x, ix)
    ref = (x[ix] * np.asarray(c, dt)).max(axis=1)
    print("OK" if np.array_equal(m, ref) else f"WRONG {m!r} {ref!r}")
''')

HARNESS = textwrap.dedent('''
    import os, sys, time, itertools
    role, flags = sys.argv.pop(1), sys.argv.pop(1)
    import numba.core.caching as C
    def sig(n): open(os.path.join(flags, n), "w").close()
    def wait(n):
        t0 = time.time()
        while not os.path.exists(os.path.join(flags, n)) and time.time() - t0 < 60:
            time.sleep(0.01)
    orig = C.IndexDataCacheFile.save
    def save(self, key, data):
        if "_fmax" not in self._index_name:
            return orig(self, key, data)
        overloads = self._load_index()
        sig(role + "_loaded"); wait(("Y" if role == "X" else "X") + "_loaded")
        if role == "Y": wait("X_indexed")
        existing = set(overloads.values())
        for i in itertools.count(1):
            name = self._data_name(i)
            if name not in existing: break
        overloads[key] = name
        self._save_index(overloads)
        if role == "X": sig("X_indexed"); wait("Y_done")
        self._save_data(name, data)
        if role == "Y": sig("Y_done")
    C.IndexDataCacheFile.save = save
''') + PROG


def _env(d):
    env = dict(os.environ, TEXPR_CACHE_DIR=str(d), TEXPR_COMPILE_WORKERS="0")
    env.pop("TEXPR_CACHE_SIZE_LIMIT", None)
    return env


def test_concurrent_helper_saves_do_not_give_wrong_values(tmp_path):
    d, flags = tmp_path / "cache", tmp_path / "flags"
    flags.mkdir()
    h = tmp_path / "harness.py"
    h.write_text(HARNESS)
    p = tmp_path / "prog.py"
    p.write_text(PROG)
    px = subprocess.Popen([sys.executable, str(h), "X", str(flags), "float32", "2"],
                          env=_env(d), stdout=subprocess.PIPE, text=True)
    py = subprocess.Popen([sys.executable, str(h), "Y", str(flags), "float64", "2"],
                          env=_env(d), stdout=subprocess.PIPE, text=True)
    assert px.communicate(timeout=300)[0].strip() == "OK"
    assert py.communicate(timeout=300)[0].strip() == "OK"
    # a later, ordinary process builds a new float64 max kernel in that directory
    out = subprocess.run([sys.executable, str(p), "float64", "3"], env=_env(d),
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "OK", out.stdout + out.stderr


MULTI = textwrap.dedent('''
    import os, sys, glob, warnings
    import numpy as np, texpr as te
    from texpr import codegen
    def build(dt, c):
        X = te.placeholder((3, 5), "X", dt); I = te.placeholder((4,), "I", "int64")
        k = te.reduce_axis(5, "k")
        S = te.compute((4,), lambda i: te.sum(X[I[i], k] + c, axis=k), name="S")
        x = np.arange(15).reshape(3, 5).astype(dt); ix = np.array([2, 0, 1, 2])
        (s,) = codegen.build([S], [X, I])(x, ix)
        assert np.array_equal(s, (x[ix] + np.asarray(c, dt)).sum(axis=1, dtype=dt))
    if sys.argv[1] == "warm":
        for dt in ("float64", "float32", "int64"):
            build(dt, 1)
    else:
        # the gather's check _ck (_fill_* is inlined: no machine code of its own)
        damaged = 0
        for p in glob.glob(os.environ["TEXPR_CACHE_DIR"] + "/__pycache__/texpr_k_rt*_ck*.nbc"):
            os.remove(p); os.mkdir(p); damaged += 1
        with warnings.catch_warnings(record=True) as W:
            warnings.simplefilter("always")
            for dt, c in [("float64", 11), ("float32", 12), ("int64", 13)]:
                build(dt, c)
        print(damaged, len([w for w in W if issubclass(w.category, te.TexprWarning)]))
''')


def test_one_damaged_helper_file_gives_at_most_one_warning_per_process(tmp_path):
    d = tmp_path / "cache"
    p = tmp_path / "multi.py"
    p.write_text(MULTI)
    r = subprocess.run([sys.executable, str(p), "warm"], env=_env(d), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(p), "damage"], env=_env(d), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    damaged, warned = map(int, r.stdout.strip().splitlines()[-1].split())
    assert damaged >= 1 and warned <= 1  # (attack helper-30: a glob that found nothing)


def test_a_directory_in_place_of_a_module_file_is_repaired(tmp_path):
    # the helper module's and a unit's .py replaced by directories (with a file
    # inside): the next process removes them, writes the modules again and gets
    # the right values, with one warning per damaged entry
    d = tmp_path / "cache"
    p = tmp_path / "prog.py"
    p.write_text(PROG)
    r = subprocess.run([sys.executable, str(p), "float64", "2"], env=_env(d),
                       capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "OK", r.stdout + r.stderr
    mods = sorted(d.glob("texpr_k_*.py"))
    assert any(m.name.startswith("texpr_k_rt") for m in mods) and len(mods) >= 2
    for m in mods:
        m.unlink()
        m.mkdir()
        (m / "junk").write_text("x")
    r = subprocess.run([sys.executable, "-W", "always", str(p), "float64", "2"],
                       env=_env(d), capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "OK", r.stdout + r.stderr
    assert all(m.is_file() for m in mods)
    assert r.stderr.count("TexprWarning") + r.stderr.count("CacheWarning") <= len(mods)


SWAP = textwrap.dedent('''
    import glob, os, shutil, sys, warnings
    import numpy as np, texpr as te
    from texpr import codegen
    from texpr.codegen.backends.numba_cpu import runtime as R

    def build(kind, n):
        X = te.placeholder((n, 5), "X")
        k = te.reduce_axis(5, "k")
        f = te.max if kind == "max" else te.min
        M = te.compute((n,), lambda i: f(X[i, k], axis=k), name="M")
        x = np.random.default_rng(n).standard_normal((n, 5)).astype("float32")
        (m,) = codegen.build([M], [X])(x)
        return np.array_equal(m, x.max(1) if kind == "max" else x.min(1))

    def helper(name):
        d = os.environ["TEXPR_CACHE_DIR"]
        return glob.glob(os.path.join(d, "__pycache__", f"{R.MODULE}.{name}-*.nbc"))[0]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sys.argv[1] == "fill":
            ok = build("max", 6) and build("min", 6)
        else:
            ok = build("min", 7)  # this process loads and checks the helper module
            if sys.argv[1] == "swap":  # then _fmax's machine code becomes _fmin's
                shutil.copyfile(helper("_fmin_float32"), helper("_fmax_float32"))
            ok = ok and build("max", 8)  # a new unit: its compile reads _fmax
    warned = [w for w in caught if issubclass(w.category, codegen.CacheWarning)]
    print("OK" if ok else "WRONG", len(warned))
''')


def test_a_helper_replaced_while_a_process_runs_is_not_used(tmp_path):
    # helper-25 on 384f3cf: the helper module was checked once, when the process
    # loaded it; _fmax's machine code replaced by _fmin's afterwards was linked
    # into the next unit (its max gave minima) and recorded as good, so every
    # later process used it too. A unit that compiles first checks the helpers'
    # recorded machine code: one warning, the helpers compile again
    d = tmp_path / "cache"
    p = tmp_path / "swap.py"
    p.write_text(SWAP)

    def run(arg):
        r = subprocess.run([sys.executable, str(p), arg], env=_env(d), capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.split()[-2:]
    assert run("fill") == ["OK", "0"]
    assert run("swap") == ["OK", "1"]
    assert run("after") == ["OK", "0"]  # a later process: nothing bad was recorded
