"""Symbolic time: te.differentiate + the simplifier + iteration_count, per suite case.

The wall-clock cost of the symbolic work (no compilation) for every gradient
suite case at full size and for the 27-case conv sweep, as medians over
``--repeat`` fresh graphs. These figures were asserted by timed tests once;
timings belong here, where a loaded machine shows as a wide min-max instead of
a failing test.

    python benchmarks/bench_simplify.py --repeat 3
"""

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from texpr import simplify  # noqa: E402
from test_simplify_cases import gradients, suite, sweep_cases  # noqa: E402


def _seconds(build, repeat):
    ts = []
    for _ in range(repeat):
        Y, inputs, _ = build()
        t = time.perf_counter()
        grads, _H = gradients(Y, inputs)
        for g in grads:
            simplify.iteration_count([g])
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), min(ts), max(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"{'case':<22}{'median s':>10}{'min':>8}{'max':>8}")
    for name in sorted(suite(small=False)):
        med, lo, hi = _seconds(lambda: suite(small=False)[name], args.repeat)
        print(f"{name:<22}{med:>10.3f}{lo:>8.3f}{hi:>8.3f}")
    worst = []
    for (k, s, d), _case in sweep_cases():
        key = (k, s, d)
        med, lo, hi = _seconds(lambda: dict(sweep_cases())[key], args.repeat)
        worst.append((med, key))
    med, key = max(worst)
    print(f"conv sweep, 27 cases: slowest median {med:.3f} s at (K, stride, dilation) = {key}; "
          f"all {sum(m for m, _ in worst):.2f} s")


if __name__ == "__main__":
    main()
