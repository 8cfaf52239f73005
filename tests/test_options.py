"""codegen.Options: every codegen knob in one frozen object (issue 49).

A build reads its knobs from the active Options (``build(options=)``,
``with codegen.options(...)``); the Options' fingerprint is in the symbolic
cache's key of the lowered program, so two processes sharing a cache get the
lowering of their own Options; a kernel runs under the Options it was built
with."""

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.options import RUN_TIME, Options, current, using

_CHILD = """
import json, sys
import texpr as te
from texpr import codegen, symcache
X = te.placeholder((256, 784), "X", "float32")
W = te.placeholder((128, 784), "W", "float32")
Y = te.nn.dense(X, W)
H = te.placeholder(Y.shape, "H", "float32")
dX, dW = te.differentiate(Y, [X, W], head=H).result
opts = json.loads(sys.argv[1])
kernel = codegen.build([Y, dX, dW], [X, W, H], options=opts)
print(json.dumps({"kinds": [u.kind for u in kernel.units], "hits": symcache.stats["hit"],
                  "fingerprint": kernel.options.fingerprint()}))
"""


def _child(options, cache):
    env = dict(os.environ, TEXPR_CACHE_DIR=str(cache))
    env.pop("TEXPR_SYMBOLIC_CACHE", None)
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(options)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_an_option_changed_between_processes_sharing_a_cache_changes_the_lowering(tmp_path):
    # the finding 1: the second process set BLAS_MIN_FLOP = 1 << 60 and still
    # got BLAS units, the first process's lowered program from the shared cache
    first = _child({}, tmp_path)
    assert first["kinds"].count("blas") == 3, first
    second = _child({"blas_min_flop": 1 << 60}, tmp_path)
    assert "blas" not in second["kinds"], second
    assert second["fingerprint"] != first["fingerprint"]
    again = _child({}, tmp_path)  # the default's entry is still there, and is used
    assert again["kinds"] == first["kinds"] and again["hits"] > first["hits"], (first, again)


def test_the_fingerprint_is_the_same_in_another_process():
    code = ("from texpr.codegen import Options; "
            "print(Options().fingerprint(), Options(unroll=4, chunks=False).fingerprint())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [Options().fingerprint(),
                                Options(unroll=4, chunks=False).fingerprint()]


def _another(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):  # (in range: unroll stays a power of two)
        return value * 2 if value else 1
    if isinstance(value, float):  # (in range: a fraction stays at most 1)
        return value / 2
    if isinstance(value, str):
        return "threads" if value == "openmp" else "openmp"
    return 7  # gemm_chunk_min_bytes: None (half the last-level cache)


def test_every_field_changes_the_fingerprint():
    base = Options()
    prints = {base.fingerprint()}
    for f in dataclasses.fields(Options):
        other = base.replace(**{f.name: _another(getattr(base, f.name))})
        assert other != base
        prints.add(other.fingerprint())
        assert other.changed() == {f.name: getattr(other, f.name)}
    assert len(prints) == len(dataclasses.fields(Options)) + 1
    assert Options().fingerprint() == base.fingerprint()  # and stable
    # equal Options, one fingerprint: 1 and 1.0 for a float field, numpy ints for ints
    assert Options(blas_min_efficiency=1).fingerprint() == \
        Options(blas_min_efficiency=1.0).fingerprint()
    assert Options(unroll=np.int64(4)) == Options(unroll=4)
    assert Options(unroll=np.int64(4)).fingerprint() == Options(unroll=4).fingerprint()


def test_the_context_manager_nests_and_restores():
    assert current() == Options()
    with codegen.options(unroll=4) as outer:
        assert current() is outer and current().unroll == 4
        with codegen.options(jam=2):  # on top of the outer block's
            assert (current().unroll, current().jam) == (4, 2)
            with using(Options()):  # an Options replaces all of them
                assert current() == Options()
            assert (current().unroll, current().jam) == (4, 2)
        assert (current().unroll, current().jam) == (4, Options().jam)
        with pytest.raises(RuntimeError):
            with codegen.options(jam=1):
                raise RuntimeError("inside")
        assert current() is outer
    assert current() == Options()


def test_another_thread_sees_the_defaults():
    seen = []
    with codegen.options(unroll=2):
        t = threading.Thread(target=lambda: seen.append(current().unroll))
        t.start()
        t.join()
    assert seen == [Options().unroll]


def test_bad_options_are_clear_errors():
    with pytest.raises(te.TexprError, match="no field unrol"):
        Options().replace(unrol=4)
    with pytest.raises(te.TexprError, match="unroll must be int"):
        Options(unroll=4.0)
    with pytest.raises(te.TexprError, match="chunk_runner must be"):
        Options(chunk_runner="gpu")
    X = te.placeholder((4,), "X", "float64")
    Y = te.compute((4,), lambda i: X[i] * 2.0, name="Y")
    with pytest.raises(te.TexprError, match="an Options or a dict"):
        codegen.build([Y], [X], options=42)
    with pytest.raises(te.TexprError, match="no field"):
        codegen.build([Y], [X], options={"nope": 1})
    assert current() == Options()


def test_a_kernel_keeps_its_options_through_a_pickle():
    X = te.placeholder((4,), "X", "float64")
    Y = te.compute((4,), lambda i: X[i] * 2.0, name="Y")
    with codegen.options(gemm_threads=1):
        k = codegen.build([Y], [X], options={"unroll": 2})
    assert (k.options.gemm_threads, k.options.unroll) == (1, 2)  # a dict: on the active
    assert current() == Options()  # build restored the caller's
    k2 = pickle.loads(pickle.dumps(k))
    assert k2.options == k.options
    np.testing.assert_array_equal(k2(np.arange(4.0))[0], np.arange(4.0) * 2)


def test_a_kernel_runs_under_its_own_run_time_options(monkeypatch):
    # the run-time fields are read from the Options the kernel was built with,
    # whatever the caller has active at the call
    from texpr.codegen.backends.numpy_host import gemm as G
    assert {"gemm_threads", "park_blas", "chunk_runner"} <= RUN_TIME
    X = te.placeholder((128, 256), "X", "float64")
    W = te.placeholder((96, 256), "W", "float64")
    k = codegen.build([te.nn.dense(X, W)], [X, W], options={"gemm_threads": 3,
                                                             "gemm_split_min": 1})
    assert k.units[0].kind == "blas"
    parts = []
    real = G._gemm_parts
    monkeypatch.setattr(G, "_gemm_parts", lambda: parts.append(real()) or parts[-1])
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((128, 256)), rng.standard_normal((96, 256))
    with codegen.options(gemm_threads=1):
        got = k(x, w)[0]
    assert parts == [3]
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-12, atol=1e-12)


def test_docs_list_every_field_with_its_default():
    from pathlib import Path
    text = (Path(__file__).parent.parent / "docs" / "options.md").read_text()
    for f in dataclasses.fields(Options):
        assert f"| `{f.name}` |" in text, f.name
    assert RUN_TIME <= {f.name for f in dataclasses.fields(Options)}


def test_run_time_fields_share_the_lowered_program(monkeypatch, tmp_path):
    from texpr import symcache
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path))
    X = te.placeholder((64, 96), "X", "float32")
    W = te.placeholder((48, 96), "W", "float32")
    Y = te.nn.dense(X, W, name="Y")
    codegen.build([Y], [X, W])
    stored = symcache.stats["store"]
    k = codegen.build([Y], [X, W], options={"gemm_threads": 2, "park_blas": False})
    assert symcache.stats["store"] == stored  # the default's program, loaded
    assert (k.options.gemm_threads, k.options.park_blas) == (2, False)
    codegen.build([Y], [X, W], options={"unroll": 4})
    assert symcache.stats["store"] == stored + 1  # a lowering field: a program of its own
    assert Options(gemm_threads=2).fingerprint(lowering_only=True) == \
        Options().fingerprint(lowering_only=True)
    assert Options(unroll=4).fingerprint(lowering_only=True) != \
        Options().fingerprint(lowering_only=True)
