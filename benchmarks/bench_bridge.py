"""Per-call overhead of the framework bridges over the texpr kernel itself.

For a small op (so the kernel's own time is small and the overhead shows), the
script times, as medians over many calls in one process:

* ``kernel``: ``Kernel.__call__`` on numpy arrays (the baseline);
* ``torch``: ``texpr.torch.op`` forward on CPU tensors (no autograd recording);
* ``torch+grad``: the same with inputs that require grad (autograd records);
* ``jax``: ``texpr.jax.op`` under ``jax.jit`` (``block_until_ready``),

and prints each in microseconds with its overhead over ``kernel``. Target
(issue 14): the bridge adds at most 30 us per call.

    python benchmarks/bench_bridge.py [--repeat 2000] [--size 16]
"""

import argparse
import statistics
import time

import numpy as np


def _median_us(fn, repeat):
    for _ in range(min(200, repeat)):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--size", type=int, default=16)
    args = ap.parse_args()

    import texpr as te
    import texpr.jax
    import texpr.torch
    import jax
    import torch

    n = args.size
    X = te.placeholder((n, n), name="X")
    W = te.placeholder((n, n), name="W")
    k = te.reduce_axis(n, name="k")
    Y = te.compute((n, n), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")

    top = texpr.torch.op(Y, [X, W])
    jop = texpr.jax.op(Y, [X, W])
    kernel = top.kernel
    rng = np.random.default_rng(0)
    x, w = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    xg, wg = xt.clone().requires_grad_(), wt.clone().requires_grad_()
    xj, wj = jax.numpy.asarray(x), jax.numpy.asarray(w)
    jitted = jax.jit(jop)

    rows = [
        ("kernel", lambda: kernel(x, w)),
        ("torch", lambda: top(xt, wt)),
        ("torch+grad", lambda: top(xg, wg)),
        ("jax (jit)", lambda: jitted(xj, wj).block_until_ready()),
    ]
    base = None
    print(f"op: {n}x{n} matmul, float32, median of {args.repeat} calls")
    for name, fn in rows:
        with torch.no_grad() if name == "torch" else _null():
            us = _median_us(fn, args.repeat)
        if base is None:
            base = us
            print(f"  {name:12s} {us:9.1f} us")
        else:
            print(f"  {name:12s} {us:9.1f} us   overhead {us - base:+8.1f} us")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
