"""Numeric environment settings (texpr.envvars.env_number): every TEXPR_* number
texpr reads is parsed by one function; text, inf, nan, 1e400, negative values
and sizes beyond int64 give the documented default with one warning, never an
exception (issue 52, kind 4)."""

import os
import subprocess
import sys
import warnings

import pytest

from texpr import cache, envvars
from texpr.codegen.backends.numba_cpu import compile as K

BAD = ["inf", "-inf", "nan", "1e400", "-5", "lots", "1e30G", "K"]


def _no_warnings(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        value = fn()
    assert not got, [str(w.message) for w in got]
    return value


def _one_warning(fn, name, raw):
    envvars._WARNED.discard((name, raw))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        value = fn()
        again = fn()  # once per variable and value in a process
    assert value == again
    assert len(got) == 1, [str(w.message) for w in got]
    assert issubclass(got[0].category, envvars.SettingWarning)
    assert f"${name}={raw!r}" in str(got[0].message) and "default" in str(got[0].message)
    return value


@pytest.mark.parametrize("raw", BAD)
def test_cache_size_limit_not_a_finite_size_gives_the_default_with_a_warning(monkeypatch, raw):
    monkeypatch.setenv("TEXPR_CACHE_SIZE_LIMIT", raw)
    assert _one_warning(cache.size_limit, "TEXPR_CACHE_SIZE_LIMIT", raw) == \
        cache.DEFAULT_SIZE_LIMIT


@pytest.mark.parametrize("raw, want", [("0", None), ("10K", 10240), ("1.5g", int(1.5 * 2 ** 30)),
                                       ("2GiB", 2 * 2 ** 30), (" 77 ", 77), ("", 2 * 2 ** 30)])
def test_cache_size_limit_usable_values_warn_nothing(monkeypatch, raw, want):
    monkeypatch.setenv("TEXPR_CACHE_SIZE_LIMIT", raw)
    assert _no_warnings(cache.size_limit) == want


@pytest.mark.parametrize("raw", ["inf", "nan", "1e400"])
def test_cache_info_exits_0_whatever_the_size_limit(tmp_path, raw):
    env = dict(os.environ, TEXPR_CACHE_DIR=str(tmp_path), TEXPR_CACHE_SIZE_LIMIT=raw)
    r = subprocess.run([sys.executable, "-m", "texpr.cache", "info"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "of 2.0 GB" in r.stdout
    assert "TEXPR_CACHE_SIZE_LIMIT" in r.stderr and "default" in r.stderr


@pytest.mark.parametrize("raw", BAD + ["2.5"])
def test_compile_workers_not_a_count_gives_the_default_with_a_warning(monkeypatch, raw):
    monkeypatch.delenv("TEXPR_COMPILE_WORKERS", raising=False)
    default = K._workers_allowed()
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", raw)
    assert _one_warning(K._workers_allowed, "TEXPR_COMPILE_WORKERS", raw) == default
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "0")
    assert _no_warnings(K._workers_allowed) == 0
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "3")
    assert _no_warnings(K._workers_allowed) == 3


@pytest.mark.parametrize("raw", BAD)
def test_compile_timeout_not_a_finite_number_gives_the_default_with_a_warning(monkeypatch, raw):
    # inf made concurrent.futures.wait raise OverflowError, nan a timeout of 0
    monkeypatch.setenv("TEXPR_COMPILE_TIMEOUT", raw)
    assert _one_warning(K._timeout, "TEXPR_COMPILE_TIMEOUT", raw) == K._DEFAULT_TIMEOUT
    monkeypatch.setenv("TEXPR_COMPILE_TIMEOUT", "2.5")
    assert _no_warnings(K._timeout) == 2.5


def test_every_numeric_setting_is_read_by_env_number():
    # the rule: no module parses a TEXPR_* number from os.environ itself
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pattern = re.compile(r"(int|float)\(\s*os\.environ")
    found = []
    for sub in ("texpr", "codegen", "simplify"):
        for dirpath, _dirs, files in os.walk(os.path.join(root, sub)):
            for f in files:
                if f.endswith(".py"):
                    with open(os.path.join(dirpath, f)) as fh:
                        if pattern.search(fh.read()):
                            found.append(os.path.join(dirpath, f))
    assert found == []
