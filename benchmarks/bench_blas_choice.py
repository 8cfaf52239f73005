"""Which BLAS for contraction stages: numpy's (``np.matmul``) or SciPy's through Numba's ``np.dot``.

The dense case of the suite (X 256x784, W 128x784, head 256x128): its three
GEMMs (forward ``X W^T``, ``dX = H W``, ``dW = H^T X``) run

* ``numpy-split``: ``np.matmul`` on numpy's OpenBLAS, each GEMM cut over worker
  threads, one BLAS thread each (``texpr.codegen.backends.numpy_host.gemm._matmul`` with
  ``codegen.options(gemm_threads=2)``: what texpr's contraction stages do on a loaded machine);
* ``numpy-mt``: one ``np.matmul`` call each, numpy's BLAS with its own threads
  (what they do otherwise);
* ``numba``: one ``@njit`` function calling ``np.dot`` three times (SciPy's
  BLAS through ``scipy.linalg.cython_blas``).

Alternating, medians of ``--repeat`` rounds, float32. Run with
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`` (see bench_suite.py).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args(argv)
    import numba
    from texpr import codegen
    from texpr.codegen.backends.numpy_host import gemm as G

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 784)).astype("float32")
    w = rng.standard_normal((128, 784)).astype("float32")
    h = rng.standard_normal((256, 128)).astype("float32")

    @numba.njit(nogil=True)
    def numba_gemms(x, w, h):
        return np.dot(x, w.T), np.dot(h, w), np.dot(h.T, x)

    def numpy_split():
        with codegen.options(gemm_threads=2), G._blas_threads_limited():
            return G._matmul(x, w.T), G._matmul(h, w), G._matmul(h.T, x)

    def numpy_mt():
        return np.matmul(x, w.T), np.matmul(h, w), np.matmul(h.T, x)

    runs = {"numpy-split": numpy_split, "numpy-mt": numpy_mt, "numba": lambda: numba_gemms(x, w, h)}
    refs = [a.astype("float64") for a in numpy_mt()]
    for name, f in runs.items():
        got = f()
        err = max(float(np.abs(g - r).max()) for g, r in zip(got, refs))
        print(f"{name:9s} max |difference| from numpy-mt {err:.1e}")
    times = {k: [] for k in runs}
    for _ in range(args.repeat):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    flop = 3 * 2 * 256 * 784 * 128
    for k, ts in times.items():
        ms = float(np.median(ts)) * 1e3
        print(f"{k:9s} {ms:7.2f} ms  {flop / ms / 1e6:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
