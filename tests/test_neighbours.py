"""texpr leaves its neighbours' settings alone (issue 48): importing the code
generator and running kernels changes no environment variable (OMP_WAIT_POLICY
above all: GNU OpenMP's wait policy is the whole process's, PyTorch's too) and
no BLAS thread count; OpenBLAS's workers are parked after a kernel call that
woke them (codegen/backends/numpy_host/parking.py), and the kernel's values stay right.

Each check runs in a fresh interpreter (``_child``): the environment a module
sets on import, OpenBLAS's worker threads and the other Python threads of the
process are per process. The kernels are GEMM-only (no numba compilation).
Timing lives in benchmarks/bench_neighbours.py.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import json, os, sys, threading
import numpy as np
import texpr as te
"""

# a dense layer's value and gradients: three GEMMs of 256 x 784 x 128 (more
# multiply-adds than OpenBLAS runs on one thread), values checked against numpy
_DENSE = """
X = te.placeholder((256, 784), "X", "float32")
W = te.placeholder((128, 784), "W", "float32")
Y = te.nn.dense(X, W)
H = te.placeholder(Y.shape, "H", "float32")
dX, dW = te.differentiate(Y, [X, W], head=H).result
kernel = codegen.build([Y, dX, dW], [X, W, H])
assert kernel.source.count("# BLAS:") == 3, kernel.source
rng = np.random.default_rng(0)
x, w, h = (rng.standard_normal(t.shape).astype("float32") for t in (X, W, H))
x64, w64, h64 = (a.astype("float64") for a in (x, w, h))
want = (x64 @ w64.T, h64 @ w64, h64.T @ x64)

def check(got):
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
"""


def _child(body, env=None):
    """Run ``_PRELUDE + body`` in a fresh interpreter; its last stdout line, as JSON."""
    full = dict(os.environ)
    full.pop("OMP_WAIT_POLICY", None)
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
                          capture_output=True, text=True, env=full, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _blas_threads():
    return """
from threadpoolctl import threadpool_info
def blas_threads():
    return [(i["filepath"], i["num_threads"]) for i in threadpool_info()]
"""


@pytest.mark.parametrize("user_policy", [None, "ACTIVE"])
def test_import_and_kernel_leave_the_environment_and_blas_threads(user_policy):
    # nothing in os.environ changes (OMP_WAIT_POLICY stays absent, or the user's),
    # nor the thread count of any library threadpoolctl sees (OpenMP, BLAS)
    env = {} if user_policy is None else {"OMP_WAIT_POLICY": user_policy}
    out = _child(_blas_threads() + """
before_env = dict(os.environ)
before = blas_threads()
from texpr import codegen
import texpr.codegen.backends.numba_cpu.compile
""" + _DENSE + """
from texpr.codegen.backends.numpy_host import gemm
for mode in (1, 2, 0):  # the BLAS's own threads, split on worker threads, the default
    gemm.GEMM_THREADS = mode
    check(kernel(x, w, h))
after_env = dict(os.environ)
changed = sorted(k for k in set(before_env) | set(after_env)
                 if before_env.get(k) != after_env.get(k))
after = dict(blas_threads())  # (libraries loaded since, numba's OpenMP: not compared)
print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY"), "changed": changed,
                  "same_threads": all(after.get(p) == n for p, n in before)}))
""", env)
    assert out["policy"] == user_policy
    assert out["changed"] == []
    assert out["same_threads"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_blas_workers_are_parked_after_a_kernel_that_woke_them():
    # OpenBLAS's worker threads exit when the call returns (they spun 0.1 s before),
    # start again at the next threaded GEMM with the values still right, and the
    # BLAS's thread count is what it was
    out = _child(_blas_threads() + """
from texpr import codegen
from texpr.codegen.backends.numpy_host import gemm
from texpr.codegen.backends.numpy_host import parking
""" + _DENSE + """
gemm.GEMM_THREADS = 1  # one call on the BLAS's own threads, whatever the load
def tasks():
    return len(os.listdir("/proc/self/task"))
before = blas_threads()
libs = parking.parkable_libraries()
x @ x.T  # a threaded GEMM: the workers run (and spin)
running = tasks()
parks = parking._PARKS[0]
check(kernel(x, w, h))
parked = tasks()
first = parking._PARKS[0] - parks
check(kernel(x, w, h))  # the workers start again for the next call's GEMMs
print(json.dumps({"libs": len(libs), "threads": min(n for _, n in before), "running": running, "parked": parked, "first": first,
                  "second": parking._PARKS[0] - parks - first,
                  "same_threads": blas_threads() == before}))
""")
    if out["libs"] == 0:
        pytest.skip("no OpenBLAS with a pthreads server in this environment")
    assert out["first"] == 1 and out["second"] == 1
    if out["threads"] < 2:
        pytest.skip("the BLAS runs on one thread here: it has no workers to park")
    assert out["parked"] < out["running"]
    assert out["same_threads"]


def test_no_park_while_another_thread_may_be_in_the_blas():
    # another Python thread (here one waiting on an event) could be inside a BLAS
    # call: a shutdown then would hang both, so the kernel leaves the workers be;
    # texpr's own worker threads do not count
    out = _child("""
from texpr import codegen
from texpr.codegen.backends.numpy_host import gemm
from texpr.codegen.backends.numpy_host import parking
""" + _DENSE + """
gemm.GEMM_THREADS = 1
parks = parking._PARKS[0]
check(kernel(x, w, h))
alone = parking._PARKS[0] - parks
ev = threading.Event()
t = threading.Thread(target=ev.wait, name="user-thread")
t.start()
parks = parking._PARKS[0]
check(kernel(x, w, h))
beside = parking._PARKS[0] - parks
ev.set(); t.join()
gemm.GEMM_THREADS = 2  # split GEMMs: texpr's own worker threads exist now
check(kernel(x, w, h))
gemm.GEMM_THREADS = 1
parks = parking._PARKS[0]
check(kernel(x, w, h))
own = parking._PARKS[0] - parks
print(json.dumps({"libs": len(parking.parkable_libraries()), "alone": alone,
                  "beside": beside, "own": own}))
""")
    if out["libs"] == 0:
        pytest.skip("no OpenBLAS with a pthreads server in this environment")
    assert out == {"libs": out["libs"], "alone": 1, "beside": 0, "own": 1}


def test_parking_off_by_environment():
    out = _child("""
from texpr import codegen
from texpr.codegen.backends.numpy_host import gemm
from texpr.codegen.backends.numpy_host import parking
""" + _DENSE + """
gemm.GEMM_THREADS = 1
check(kernel(x, w, h))
print(json.dumps({"parks": parking._PARKS[0]}))
""", {"TEXPR_PARK_BLAS": "0"})
    assert out["parks"] == 0


def test_parallel_units_run_on_one_thread_while_the_machine_is_oversubscribed(monkeypatch):
    # with the load average above the cores, a parallel unit (a chunked one here)
    # runs on the calling thread alone (OpenMP's spinning wait at a region's end
    # cost a time slice per unit); the values are the same, and numba's thread
    # count is restored after the call, also when the unit raises
    import numba
    import numpy as np

    import texpr as te
    from texpr import codegen
    from texpr.codegen.backends.numba_cpu import chunks
    from texpr.codegen.backends import workers
    from texpr.codegen.loopnest import stage
    from texpr.codegen.backends.numba_cpu import units

    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    for knob, v in (("PARALLEL_MIN_POINTS", 1), ("PARALLEL_POINTS", 1), ("PARALLEL_MIN_WORK", 0)):
        monkeypatch.setattr(stage, knob, v)
    X = te.placeholder((64, 48), "X", "float64")
    Y = te.compute((64, 48), lambda i, j: te.exp(X[i, j]) * 2.0 + X[i, (j + 1) % 48], name="Y")
    kernel = codegen.build([Y], [X])
    assert [u.chunks for u in kernel.units] == [64]  # one chunked unit, 64 rows
    x = np.random.default_rng(0).standard_normal((64, 48))
    want = te.evaluate([Y], {X: x})[0]
    seen = []
    real = chunks.threads
    monkeypatch.setattr(chunks, "threads", lambda: seen.append(numba.get_num_threads()) or real())
    before = numba.get_num_threads()
    for loaded in (False, True):
        monkeypatch.setattr(workers, "oversubscribed", lambda loaded=loaded: loaded)
        np.testing.assert_allclose(kernel(x)[0], want, rtol=1e-13, atol=0)
        assert numba.get_num_threads() == before
    assert before == 1 or (seen[0] == before and seen[-1] == 1)
    with units.one_thread():
        assert numba.get_num_threads() == 1
    with pytest.raises(RuntimeError):
        with units.one_thread():
            raise RuntimeError("inside")
    assert numba.get_num_threads() == before
