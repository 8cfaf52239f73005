"""Reductions to few outputs: logsumexp of 1.28 M float64 values, texpr vs PyTorch and JAX.

Issue 48's fourth cause ("reductions to few outputs run on one core with one
accumulator") and its target: the logsumexp of 1.28 M float64 values, value
and gradient, within 1.5x JAX jit with x64. Also a float32 sum of squares over
the same count (a plain split reduction) for scale.

Each framework runs alone in a fresh process (``--peer``), with 2 threads:

* texpr: ``codegen.build`` of ``lse = log(sum(exp(x - max x))) + max x``
  (``te.nn.logsumexp``) and of the value with ``te.differentiate``'s gradient;
* PyTorch eager: ``torch.logsumexp`` and ``backward``;
* JAX: ``jax.jit(jax.scipy.special.logsumexp)`` and ``jax.jit(jax.value_and_grad(..))``
  with ``jax_enable_x64``.

Reported: the median milliseconds of ``--repeat`` calls (after one untimed call)
for the value alone and for value and gradient, and texpr's ratio to the faster
peer. Command (OpenBLAS's core-type overrides removed for the benchmark only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/shared/tools/quiet-run \\
        python benchmarks/bench_reductions.py [--repeat 50]

Measured 2026-12-07 23:44-23:47 UTC (load 1.1), two runs: logsumexp value 3.5-3.6 ms
against JAX 0.8-0.9 and PyTorch 1.9-2.0 (about 4x JAX); value and gradient 6.4-6.8 ms
against JAX 1.3-1.5 and PyTorch 4.1-5.2 (4.2-5.3x); the float32 sum of squares 0.10 ms
(value) and 0.18-0.19 ms (value and gradient), level with the peers.

Timings drift with the machine's load: compare numbers from one run only.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import median_ms as _median_ms  # noqa: E402

N = 1_280_000
PEERS = ("texpr", "torch", "jax")




def _data(dtype):
    import numpy as np
    return np.random.default_rng(0).standard_normal(N).astype(dtype)


def _texpr(repeat):
    import texpr as te
    from texpr import codegen

    out = {}
    for dtype, what in (("float64", "logsumexp"), ("float32", "sumsq")):
        x = te.placeholder((N,), name="x", dtype=dtype)
        if what == "logsumexp":
            y = te.nn.logsumexp(x, axis=0)
        else:
            r = te.reduce_axis(N, "r")
            y = te.compute((), lambda: te.sum(x[r] * x[r], axis=r), name="sumsq")
        value = codegen.build([y], [x])
        grad = te.differentiate(y, [x]).result[0]
        both = codegen.build([y, grad], [x])
        a = _data(dtype)
        out[f"{what} value"] = _median_ms(lambda: value(a), repeat)
        out[f"{what} value+grad"] = _median_ms(lambda: both(a), repeat)
    return out


def _torch(repeat):
    import torch
    torch.set_num_threads(2)
    out = {}
    for dtype, what in (("float64", "logsumexp"), ("float32", "sumsq")):
        a = torch.from_numpy(_data(dtype))

        def f(v, what=what):
            return torch.logsumexp(v, 0) if what == "logsumexp" else (v * v).sum()

        def value(a=a, f=f):
            with torch.no_grad():
                return f(a)

        def both(a=a, f=f):
            v = a.clone().requires_grad_(True)
            y = f(v)
            y.backward()
            return y, v.grad

        out[f"{what} value"] = _median_ms(value, repeat)
        out[f"{what} value+grad"] = _median_ms(both, repeat)
    return out


def _jax(repeat):
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    out = {}
    for dtype, what in (("float64", "logsumexp"), ("float32", "sumsq")):
        a = jnp.asarray(_data(dtype))
        f = logsumexp if what == "logsumexp" else (lambda v: (v * v).sum())
        value = jax.jit(f)
        both = jax.jit(jax.value_and_grad(f))
        out[f"{what} value"] = _median_ms(lambda: value(a).block_until_ready(), repeat)
        out[f"{what} value+grad"] = _median_ms(
            lambda: jax.block_until_ready(both(a)), repeat)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.peer:
        print(json.dumps({"texpr": _texpr, "torch": _torch, "jax": _jax}[args.peer](args.repeat)))
        return
    env = dict(os.environ, OMP_NUM_THREADS="2", NUMBA_NUM_THREADS="2",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=2")
    rows = {}
    for peer in PEERS:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--peer", peer,
                              "--repeat", str(args.repeat)], env=env, capture_output=True,
                             text=True)
        if out.returncode:
            sys.exit(f"{peer} failed:\n{out.stderr[-2000:]}")
        rows[peer] = json.loads(out.stdout.strip().splitlines()[-1])
    load = os.getloadavg()
    print(f"load average (1, 5, 15 min) after the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'case':24s} {'texpr':>9s} {'torch':>9s} {'jax':>9s}  texpr / best peer")
    for key in rows["texpr"]:
        best = min(rows["torch"][key], rows["jax"][key])
        print(f"{key:24s} {rows['texpr'][key]:8.2f}  {rows['torch'][key]:8.2f}  "
              f"{rows['jax'][key]:8.2f}   {rows['texpr'][key] / best:5.2f}x")


if __name__ == "__main__":
    main()
