"""texpr leaves its neighbours' settings alone (issue 48): importing the code
generator and running kernels changes no environment variable (OMP_WAIT_POLICY
above all: GNU OpenMP's wait policy is the whole process's, PyTorch's too) and
no BLAS thread count; OpenBLAS's workers are parked after a kernel call that
woke them (codegen/parking.py), and the kernel's values stay right.

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
import texpr.codegen.compile
""" + _DENSE + """
from texpr.codegen import gemm
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


def test_blas_workers_are_parked_after_a_kernel_that_woke_them():
    # OpenBLAS's worker threads exit when the call returns (they spun 0.1 s before),
    # start again at the next threaded GEMM with the values still right, and the
    # BLAS's thread count is what it was
    out = _child(_blas_threads() + """
from texpr import codegen
from texpr.codegen import gemm, parking
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
print(json.dumps({"libs": len(libs), "running": running, "parked": parked, "first": first,
                  "second": parking._PARKS[0] - parks - first,
                  "same_threads": blas_threads() == before}))
""")
    if out["libs"] == 0:
        pytest.skip("no OpenBLAS with a pthreads server in this environment")
    assert out["first"] == 1 and out["second"] == 1
    assert out["parked"] < out["running"]
    assert out["same_threads"]


def test_no_park_while_another_thread_may_be_in_the_blas():
    # another Python thread (here one waiting on an event) could be inside a BLAS
    # call: a shutdown then would hang both, so the kernel leaves the workers be;
    # texpr's own worker threads do not count
    out = _child("""
from texpr import codegen
from texpr.codegen import gemm, parking
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
from texpr.codegen import gemm, parking
""" + _DENSE + """
gemm.GEMM_THREADS = 1
check(kernel(x, w, h))
print(json.dumps({"parks": parking._PARKS[0]}))
""", {"TEXPR_PARK_BLAS": "0"})
    assert out["parks"] == 0
