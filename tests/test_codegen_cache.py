"""Kernel caches: in memory by the structure of the scheduled graph (names do not
matter), and on disk: a second process running the same program loads numba's
cached machine code instead of compiling (checked in subprocesses with their
own ``TEXPR_CACHE_DIR``)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from texpr import codegen
import texpr as te

PROGRAM = textwrap.dedent("""
    import json, time
    import numpy as np
    import texpr as te, codegen
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
