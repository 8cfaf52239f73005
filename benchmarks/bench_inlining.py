"""The inlining rule's choice, before and after, in one process, beside JAX and PyTorch.

A dense layer behind an activation with several derivative terms, ``Y = act(X) @ W``
(X 128x256, W 256x256, float32), value and gradients. The simplifier
(``texpr.simplify.inline``) computes the adjoint of ``S = act(X)`` once, as one
matmul, and then multiplies it by the local derivative; the older rule folded
the matmul into every derivative term (``tanh``: the matmul twice; ``sigmoid(x)
* x``: three times, and the derivative recomputed at every point of the
reduction). Both graphs are built here: ``rule`` (the simplifier as it is) and
``fold`` (``_fold_pays`` forced to say yes: the old form). Their kernels, JAX's
jit and PyTorch's autograd run alternating, ``--repeat`` rounds; the script
prints median ms, the ratios, and ``simplify.iteration_count`` of each dX.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_inlining.py
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import texpr as te  # noqa: E402
from texpr import codegen, simplify  # noqa: E402
from bench_suite import _set_threads  # noqa: E402

ACTS = {
    "tanh": (te.tanh, "tanh"),
    "swish": (lambda x: te.sigmoid(x) * x, "swish"),
}


def _graph(act, n, d, o):
    X = te.placeholder((n, d), "X", "float32")
    W = te.placeholder((d, o), "W", "float32")
    H = te.placeholder((n, o), "H", "float32")
    S = te.compute((n, d), lambda i, j: act(X[i, j]), name="S")
    k = te.reduce_axis(d, "k")
    Y = te.compute((n, o), lambda i, j: te.sum(S[i, k] * W[k, j], axis=k), name="Y")
    return X, W, H, Y


def texpr_kernel(act, shapes, fold):
    """(kernel, dX iteration count) of the value and gradients; ``fold``: the old rule."""
    from texpr.simplify import inline
    old = inline._fold_pays
    if fold:
        inline._fold_pays = lambda *a: True
    try:
        X, W, H, Y = _graph(act, *shapes)
        dX, dW = te.differentiate(Y, [X, W], head=H).result
        count = simplify.iteration_count([dX])
        return codegen.build([Y, dX, dW], [X, W, H]), count
    finally:
        inline._fold_pays = old


def peers(name, x, w, h):
    """``{framework: run closure}`` for JAX and PyTorch (those installed)."""
    out = {}
    try:
        import jax
        import jax.numpy as jnp
        f = jnp.tanh if name == "tanh" else (lambda v: jax.nn.sigmoid(v) * v)

        @jax.jit
        def vg(x, w, h):
            y, vjp = jax.vjp(lambda a, b: f(a) @ b, x, w)
            return (y,) + vjp(h)
        xs, ws, hs = jnp.asarray(x), jnp.asarray(w), jnp.asarray(h)
        out["jax"] = lambda: jax.block_until_ready(vg(xs, ws, hs))
    except ImportError:
        pass
    try:
        import torch
        tf = torch.tanh if name == "tanh" else (lambda v: torch.sigmoid(v) * v)
        xt = torch.from_numpy(x.copy()).requires_grad_(True)
        wt = torch.from_numpy(w.copy()).requires_grad_(True)
        ht = torch.from_numpy(h.copy())

        def run():
            y = tf(xt) @ wt
            return (y,) + torch.autograd.grad(y, (xt, wt), ht)
        out["torch"] = run
    except ImportError:
        pass
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="128,256,256", help="n,d,o: X n x d, W d x o")
    args = ap.parse_args(argv)
    _set_threads(args.threads)
    os.environ.setdefault("TEXPR_CACHE_DIR", tempfile.mkdtemp(prefix="texpr_bench_"))
    os.environ["TEXPR_SYMBOLIC_CACHE"] = "0"  # the two rules must both be simplified
    shapes = tuple(int(v) for v in args.shape.split(","))
    n, d, o = shapes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype("float32")
    w = (rng.standard_normal((d, o)) / np.sqrt(d)).astype("float32")
    h = rng.standard_normal((n, o)).astype("float32")
    print(f"Y = act(X) @ W, X {n}x{d}, W {d}x{o}, float32, value and gradients; "
          f"{args.threads} threads; median ms of {args.repeat} alternating rounds")
    print(f"{'act':6} {'variant':7} {'dX points':>11} {'ms':>8} {'/ best peer':>12}")
    for name, (act, _) in ACTS.items():
        runs, counts, results = {}, {}, {}
        for variant in ("rule", "fold"):
            kernel, counts[variant] = texpr_kernel(act, shapes, variant == "fold")
            runs[variant] = (lambda k=kernel: k(x, w, h))
            results[variant] = runs[variant]()
        for a, b in zip(results["rule"], results["fold"]):
            assert np.allclose(a, b, rtol=1e-3, atol=1e-3), "the two rules disagree"
        runs.update(peers(name, x, w, h))
        times = {k: [] for k in runs}
        for fn in runs.values():
            fn()
        for _ in range(args.repeat):
            for k, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        best = min([med[k] for k in ("jax", "torch") if k in med] or [float("nan")])
        for k in runs:
            pts = f"{counts[k]:,}" if k in counts else ""
            print(f"{name:6} {k:7} {pts:>11} {med[k]:8.3f} {med[k] / best:12.2f}")


if __name__ == "__main__":
    main()
