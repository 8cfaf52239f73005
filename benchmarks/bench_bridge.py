"""Per-call overhead of the framework bridges over the texpr kernel itself.

For a small op (so the kernel's own time is small and the overhead shows), the
script times, as medians over many calls in one process:

* ``kernel``: ``Kernel.__call__`` on numpy arrays (the baseline);
* ``torch``: ``texpr.torch.op`` forward on CPU tensors (no autograd recording);
* ``torch+grad``: the same with inputs that require grad (autograd records);
* ``jax``: ``texpr.jax.op`` under ``jax.jit`` (``block_until_ready``);
* ``jax a+b``: a jitted ``a + b`` of the same arrays, JAX's own cost of a call,
* ``driver``: the kernel's units run by the compiled driver both bridges use
  (:mod:`texpr.codegen.backends.numba_cpu.native_call`), without a call's checks,

and prints each in microseconds with its overhead over ``kernel``. The rows
take turns (blocks of 20 calls, round by round) so that a shared machine's
load weighs on all alike. Target (issue 14): the bridge adds at most 30 us
per call.

    pip install -e '.[bench]'    # torch and jax
    python benchmarks/bench_bridge.py [--repeat 2000] [--size 16]

On a shared machine the host's load moves every row: the ``jax a+b`` row
(about 10-11 us on this machine when it is quiet) shows how loaded a run was.
"""

import argparse
import statistics
import time

import numpy as np


def _interleaved_us(rows, repeat, block=20):
    """Per row, the median over rounds of the mean time of ``block`` calls (us).
    The rows take turns round by round, so a shared machine's load drifts over
    all of them alike."""
    for _, fn, ctx in rows:
        with ctx():
            for _ in range(200):
                fn()
    times = {name: [] for name, _, _ in rows}
    for _ in range(max(1, repeat // block)):
        for name, fn, ctx in rows:
            with ctx():
                t0 = time.perf_counter()
                for _ in range(block):
                    fn()
                times[name].append((time.perf_counter() - t0) / block)
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


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

    floor = jax.jit(lambda a, b: a + b)  # JAX's own cost of calling a jitted function
    rows = [
        ("kernel", lambda: kernel(x, w), _null),
        ("torch", lambda: top(xt, wt), torch.no_grad),
        ("torch+grad", lambda: top(xg, wg), _null),
        ("jax (jit)", lambda: jitted(xj, wj).block_until_ready(), _null),
        ("jax a+b", lambda: floor(xj, wj).block_until_ready(), _null),
    ]
    from texpr.codegen.backends.numba_cpu import native_call

    driver = native_call.runner(kernel)
    if driver is not None:  # the units alone, from the bridges' compiled driver
        y = np.empty((n, n), dtype=np.float32)
        pointers = [x.ctypes.data, w.ctypes.data, y.ctypes.data]
        rows.append(("driver", lambda: driver.run(pointers), _null))
    print(f"op: {n}x{n} matmul, float32; per row the median over rounds of 20 calls "
          f"({args.repeat} calls), rows interleaved")
    us = _interleaved_us(rows, args.repeat)
    base = us["kernel"]
    for name, _, _ in rows:
        if name == "kernel":
            print(f"  {name:12s} {us[name]:9.1f} us")
        elif name == "driver":
            print(f"  {name:12s} {us[name]:9.1f} us   (the kernel's units from the compiled "
                  "driver the bridges use, no checks)")
        elif name == "jax a+b":
            print(f"  {name:12s} {us[name]:9.1f} us   (a jitted a + b: JAX's own call cost, "
                  "part of the jax row's overhead)")
        else:
            print(f"  {name:12s} {us[name]:9.1f} us   overhead {us[name] - base:+8.1f} us")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
