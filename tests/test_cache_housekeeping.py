"""Cache housekeeping (texpr.cache): ``python -m texpr.cache info|clear``, the size bound.

Kernel entries are made up as files of the names the kernel cache writes (a
module ``texpr_k_<key>.py`` and numba's ``__pycache__/texpr_k_<key>.*.nbi|nbc``),
so that no test compiles anything; symbolic entries are real ones.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import texpr as te
from texpr import cache, symcache


def _kernel(d, key, size, used):
    """A made-up kernel entry of ``3 * size`` bytes whose files were last used at ``used``."""
    (d / "__pycache__").mkdir(parents=True, exist_ok=True)
    paths = [d / f"texpr_k_{key}.py", d / "__pycache__" / f"texpr_k_{key}.kernel-1.py311.nbi",
             d / "__pycache__" / f"texpr_k_{key}.kernel-1.py311.1.nbc"]
    for p in paths:
        p.write_bytes(b"#" * size)
        os.utime(p, (used, used))
    return paths


def _symbolic(d, c):
    X = te.placeholder((3,), "X", "float64")
    k = te.reduce_axis(3, "k")
    L = te.compute((), lambda: te.sum(te.exp(X[k] * c), axis=k), name="L")
    (dX,) = te.differentiate(L, [X])
    x = np.array([0.1, -0.3, 0.7])
    np.testing.assert_allclose(te.evaluate(dX, {X: x}), c * np.exp(c * x), rtol=1e-12)
    return sorted((d / "symbolic").glob("*.pkl"))


def _cli(d, *args, **env):
    e = dict(os.environ, TEXPR_CACHE_DIR=str(d), **env)
    return subprocess.run([sys.executable, "-m", "texpr.cache", *args], env=e,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(d))
    monkeypatch.delenv("TEXPR_SYMBOLIC_CACHE", raising=False)
    monkeypatch.delenv("TEXPR_CACHE_SIZE_LIMIT", raising=False)
    symcache._WARNED.clear()
    return d


def test_info_counts_every_kind(cache_dir):
    now = time.time()
    _kernel(cache_dir, "a" * 32, 100, now)
    _kernel(cache_dir, "b" * 32, 50, now)
    sym = _symbolic(cache_dir, 0.5)
    (cache_dir / "unrelated.txt").write_text("not ours")
    r = cache.info()
    assert r["directory"] == str(cache_dir) and r["usable"]
    assert (r["kernel_modules"], r["kernel_bytes"]) == (2, 150)
    assert (r["numba_files"], r["numba_bytes"]) == (4, 300)
    assert r["symbolic_entries"] == len(sym) == 1  # the differentiate entry
    assert r["symbolic_bytes"] == sum(p.stat().st_size for p in sym)
    assert r["total_bytes"] == 450 + r["symbolic_bytes"]
    out = _cli(cache_dir, "info")
    assert out.returncode == 0, out.stderr
    assert str(cache_dir) in out.stdout
    assert "kernel modules:        2" in out.stdout and "numba files:           4" in out.stdout
    assert f"symbolic entries: {len(sym):>6}" in out.stdout


def test_clear_removes_our_files_only(cache_dir):
    now = time.time()
    _kernel(cache_dir, "a" * 32, 10, now)
    sym = _symbolic(cache_dir, 0.5)
    (cache_dir / "unrelated.txt").write_text("not ours")
    out = _cli(cache_dir, "clear", "--symbolic")
    assert out.returncode == 0, out.stderr
    assert f"removed {len(sym)} files" in out.stdout
    assert not any(p.exists() for p in sym) and (cache_dir / f"texpr_k_{'a' * 32}.py").exists()
    out = _cli(cache_dir, "clear")
    assert out.returncode == 0 and "removed 3 files" in out.stdout
    assert cache.info()["total_bytes"] == 0
    assert (cache_dir / "unrelated.txt").read_text() == "not ours"
    # a cleared cache works again: the result is recomputed and stored
    assert _symbolic(cache_dir, 0.5)


@pytest.mark.parametrize("how", ["a-file", "missing"])
def test_an_unusable_directory_never_raises(tmp_path, how):
    d = tmp_path / "blocker"
    if how == "a-file":
        d.write_text("x")
    for args in (("info",), ("clear",), ("clear", "--kernels")):
        out = _cli(d, *args)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    out = _cli(d, "info")
    assert "unusable" in out.stdout
    assert cache.clear(str(d)) == 0 and cache.enforce_size_bound(str(d), limit=1) == 0
    r = cache.info(str(d))
    assert not r["usable"] and r["total_bytes"] == 0
    if how == "a-file":
        assert d.read_text() == "x"


def test_the_size_bound_removes_least_recently_used_first(cache_dir):
    now = time.time()
    old = _kernel(cache_dir, "1" * 32, 1000, now - 400)
    mid = _kernel(cache_dir, "2" * 32, 1000, now - 300)
    new = _kernel(cache_dir, "3" * 32, 1000, now - 200)
    cache.touch(str(old[0]))  # used just now: the oldest write, the most recent use
    # 9000 bytes held, bound 7000: down to 6300 -> the least recently used (mid) goes
    assert cache.enforce_size_bound(limit=7000) == 3
    assert all(p.exists() for p in old + new) and not any(p.exists() for p in mid)
    # under the bound: nothing happens
    assert cache.enforce_size_bound(limit=7000) == 0
    # a bound below one entry keeps the most recently used one
    assert cache.enforce_size_bound(limit=10) == 3
    assert all(p.exists() for p in old) and not any(p.exists() for p in new)
    # touching keeps the module's modification time (numba's index records it)
    assert abs(old[0].stat().st_mtime - (now - 400)) < 1


def test_writing_a_symbolic_entry_enforces_the_bound(cache_dir, monkeypatch):
    now = time.time()
    stale = _kernel(cache_dir, "9" * 32, 4000, now - 1000)
    monkeypatch.setenv("TEXPR_CACHE_SIZE_LIMIT", "10K")
    sym = _symbolic(cache_dir, 0.25)
    assert sym and all(p.exists() for p in sym)
    assert not any(p.exists() for p in stale)
    assert cache.info()["total_bytes"] <= 10 * 1024


@pytest.mark.parametrize("text, want", [
    ("", cache.DEFAULT_SIZE_LIMIT), ("123", 123), ("10K", 10240), ("1.5G", int(1.5 * 1024 ** 3)),
    ("500MB", 500 * 1024 ** 2), ("2GiB", 2 * 1024 ** 3), ("0", None), ("lots", cache.DEFAULT_SIZE_LIMIT),
])
def test_size_limit_parsing(monkeypatch, text, want):
    monkeypatch.setenv("TEXPR_CACHE_SIZE_LIMIT", text)
    if text == "lots":  # the default, with a warning (tests/test_envvars.py)
        from texpr import envvars
        envvars._WARNED.clear()
        with pytest.warns(envvars.SettingWarning, match="TEXPR_CACHE_SIZE_LIMIT='lots'"):
            assert cache.size_limit() == want
    else:
        assert cache.size_limit() == want
