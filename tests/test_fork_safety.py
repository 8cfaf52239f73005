"""Kernels in forked children (an attack's find): numba's GNU OpenMP layer kills a
child forked after it started at the child's first parallel loop ("fork()
called from a process already using GNU OpenMP, this is unsafe", SIGTERM),
so an ``os.fork`` or a ``fork`` multiprocessing pool after a kernel ran lost
its workers and ``Pool.map`` waited for good. Parallel units now run their
serial twins there (texpr.codegen.backends.numba_cpu.forksafe), the PyTorch bridge's compiled
driver falls back to the Python one, and a child starts compile workers of
its own. Each test failed (a killed child, a hang) before."""

import multiprocessing as mp

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import compile as cmp
from texpr.codegen.backends.numba_cpu import forksafe

from fork_testutil import FORKS_WITHOUT_JAX
from test_gemm_chunks import _run_in_child

pytestmark = FORKS_WITHOUT_JAX


COLS = 512


def _parallel_graph():
    # a map and a reduction over 4096 rows of 512: both stages run in parallel
    # (chunked units: codegen.backends.numba_cpu.chunks)
    X = te.placeholder((4096, COLS), name="X")
    W = te.placeholder((COLS,), name="W")
    j = te.reduce_axis(COLS, "j")
    Y = te.compute((4096,), lambda i: te.sum(te.tanh(X[i, j]) * W[j], axis=j), name="Y")
    return X, W, Y


def _feed():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((4096, COLS)).astype(np.float32),
            rng.standard_normal(COLS).astype(np.float32))


@pytest.mark.parametrize("how", ["chunks", "prange"])
def test_a_parallel_kernel_and_its_gradient_run_in_a_child_forked_after_they_ran(how):
    X, W, Y = _parallel_graph()
    H = te.placeholder((4096,), name="H")
    dX, dW = te.differentiate(Y, [X, W], head=H).result
    # prange: chunks off, numba's prange loops, their serial twins in the child
    k = codegen.build([Y, dX, dW], [X, W, H], options={"chunks": how == "chunks"})
    if how == "prange":
        assert "parallel=True" in k.source
    else:
        assert "prange(" not in k.source and sum(1 for u in k.units if u.chunks) >= 2
    x, w = _feed()
    h = np.linspace(-1, 1, 4096, dtype=np.float32)
    want = k(x, w, h)  # numba's threading layer starts here
    np.testing.assert_allclose(want[2], np.tanh(x).T @ h, rtol=1e-4, atol=1e-4)

    def child():
        got = k(x, w, h)
        same = all(np.allclose(g, v, rtol=1e-5, atol=1e-5) for g, v in zip(got, want))
        return same and forksafe.FORKED_FROM_OPENMP[0] == forksafe.openmp_started()
    assert _run_in_child(child, timeout=180) == b"1"


_POOL_KERNEL = []


def _pool_task(seed):
    k, x, w = _POOL_KERNEL[0]
    return float(k(x * seed, w)[0].sum())


def test_a_fork_pool_runs_a_parallel_kernel_the_parent_ran():
    X, W, Y = _parallel_graph()
    k = codegen.build([Y], [X, W])
    x, w = _feed()
    _POOL_KERNEL[:] = [(k, x, w)]
    want = [float(k(x * s, w)[0].sum()) for s in (1, 2)]
    with mp.get_context("fork").Pool(2) as pool:
        got = pool.map_async(_pool_task, [1, 2]).get(timeout=180)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_the_pytorch_bridge_runs_in_a_forked_child():
    torch = pytest.importorskip("torch")
    import texpr.torch

    X, W, Y = _parallel_graph()
    f = texpr.torch.op(Y, [X, W])
    x, w = (torch.from_numpy(a).requires_grad_() for a in _feed())
    y = f(x, w)
    y.sum().backward()
    want = (y.detach().numpy().copy(), x.grad.numpy().copy(), w.grad.numpy().copy())

    def child():
        # PyTorch's own OpenMP pool hangs in a forked child after the parent used
        # it (plain torch: a large clone() waits for good); one thread avoids it
        torch.set_num_threads(1)
        xc, wc = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        yc = f(xc, wc)
        yc.sum().backward()
        got = (yc.detach().numpy(), xc.grad.numpy(), wc.grad.numpy())
        return all(np.allclose(g, v, rtol=1e-5, atol=1e-5) for g, v in zip(got, want))
    assert _run_in_child(child, timeout=180) == b"1"


def test_a_forked_child_builds_with_compile_workers_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("TEXPR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TEXPR_COMPILE_HERE", "0")
    monkeypatch.setenv("TEXPR_COMPILE_WORKERS", "2")
    monkeypatch.setattr(cmp, "PARENT_COMPILES", False)
    codegen.clear_memory_cache()
    X, W, Y = _parallel_graph()
    H = te.placeholder((4096,), name="H")
    k = codegen.build([Y] + te.differentiate(Y, [X, W], head=H).result, [X, W, H])
    assert cmp._POOL is not None  # the parent's pool of compile workers
    x, w = _feed()
    h = np.linspace(-1, 1, 4096, dtype=np.float32)
    k(x, w, h)

    def child():
        assert cmp._POOL is None  # the parent's workers are not the child's
        j = te.reduce_axis(COLS, "j")
        Z = te.compute((4096,), lambda i: te.sum(te.sigmoid(X[i, j]) * W[j], axis=j), name="Z")
        dX, dW = te.differentiate(Z, [X, W], head=H).result
        got = codegen.build([Z, dX, dW], [X, W, H])(x, w, h)
        started = cmp._POOL is not None
        cmp._shutdown_pool()
        s = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
        return (started
                and np.allclose(got[0], s @ w, rtol=1e-4, atol=1e-4)
                and np.allclose(got[1], h[:, None] * s * (1 - s) * w, rtol=1e-4, atol=1e-5)
                and np.allclose(got[2], s.T @ h, rtol=1e-3, atol=1e-3))  # 4096-term sums
    assert _run_in_child(child, timeout=300) == b"1"
