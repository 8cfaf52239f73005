"""An RK4 integrator as ``te.scan``: value and gradient against the value alone (issue 51:
the gradient at most 4x the primal at s = 10 and s = 100 steps).

The ODE is issue 51's: ``y_0' = x_0``, ``y_i' = x_i * y_{i-1}`` over ``n`` components,
``s`` RK4 steps of size 0.01 from ``y(0) = Y0``; the stages ``k1..k4`` are stages of the
scan's body (tests/test_scan_checkpoint.py builds the same graph), the loss is
``sum(y * y)`` over every step. Per size and ``checkpoint=`` choice (``te.scan``'s:
docs/pipeline.md, "Scans"): median milliseconds of the compiled primal (the loss) and
of the compiled loss with ``d/dX`` and ``d/dY0``, their ratio, and the iteration
counts (``texpr.simplify.iteration_count``) of both.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_scan_rk4.py
    ... --sizes 1000,10 10000,100 --checkpoint auto recompute store --repeat 50

Measured 2026-12-07 on the 2-core machine (load average 3.5-5.5, checkpoint auto): n
1,000, s 10: 0.024 vs 0.074 ms (3.1x, within issue 51's 4x); n 1,000, s 100: 0.117 vs
0.628 ms (5.4x); n 10,000, s 100: 1.86 vs 13.9 ms (7.5x). The points visited are 3.9x
(s 10) and 4.0x (s 100) the primal's: the work per step is constant, the time is
not yet (the gradient's stages outside the scans stream whole (s, n) arrays, and
d_X reads them along s). ``store`` visits 4.6x and ran 3-5% slower than ``recompute``.

Timings drift between runs and machines: compare ratios from one run only.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))


from cases import median_ms as _median_ms  # noqa: E402 (one untimed call first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["1000,10", "1000,100", "10000,100"],
                    help="n,s pairs: components, RK4 steps")
    ap.add_argument("--checkpoint", nargs="+", default=["auto"],
                    choices=["auto", "store", "recompute"])
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()

    import texpr as te
    from texpr import codegen, simplify
    from test_scan_checkpoint import _rk4

    print(f"RK4 scan, float64, codegen.build defaults; load average {os.getloadavg()[0]:.2f}")
    print(f"{'n':>6} {'s':>4} {'checkpoint':>10} {'primal ms':>10} {'grad ms':>9} "
          f"{'ratio':>6} {'primal pts':>11} {'grad pts':>10} {'pts ratio':>9}")
    for size in args.sizes:
        n, s = (int(v) for v in size.split(","))
        for mode in args.checkpoint:
            (X, Y0), loss = _rk4(n, s, checkpoint=mode)
            grads = list(te.differentiate(loss, [X, Y0]).result)
            primal = codegen.build([loss], [X, Y0])
            both = codegen.build([loss] + grads, [X, Y0])
            rng = np.random.default_rng(0)
            x, y0 = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
            primal(x, y0)
            both(x, y0)
            tp = _median_ms(lambda: primal(x, y0), args.repeat)
            tg = _median_ms(lambda: both(x, y0), args.repeat)
            cp = simplify.iteration_count([loss])
            cg = simplify.iteration_count([loss] + grads)
            print(f"{n:6d} {s:4d} {mode:>10} {tp:10.3f} {tg:9.3f} {tg / tp:6.2f} "
                  f"{cp:11d} {cg:10d} {cg / cp:9.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
