"""Before/after timings of codegen tuning knobs, in one process, runs alternating.

Each *variant* is a list of ``codegen.Options`` fields (docs/options.md), as
keyword arguments: e.g. ``"split_lanes=10**6"`` (turns the grouped reductions
off), ``"tap_split=False, windows=False"`` (no tap splitting, no window
stages) or ``"pass"`` (the defaults); its kernels are built with
``codegen.build(..., options=...)``. For every case
of the gradient suite (docs/testing.md) the forward value and each gradient are built as separate kernels,
plus one kernel computing them all (as bench_suite.py times them); the variants'
kernels run in turn, ``--repeat`` rounds, so that a shared machine's load
weighs on all alike. Prints median ms per kernel and variant; results are
checked against the first variant's.

    python benchmarks/bench_variants.py --cases dense,cumsum "split_lanes=10**6" pass
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from texpr import codegen  # noqa: E402
import texpr as te  # noqa: E402
from cases import make_cases, random_inputs  # noqa: E402


def variant_options(variant):
    """The Options fields of a variant (``"unroll=4, chunks=False"``; ``"pass"``: none)."""
    if variant.strip() in ("", "pass"):
        return {}
    return eval(f"dict({variant})", {"__builtins__": {"dict": dict}})  # noqa: S307 - a developer's own command line


def case_kernels(case, variant):
    """``(labels, kernels, args)`` of one case built under ``variant``."""
    arrays = random_inputs(case)
    phs = [te.placeholder(s, n, d) for n, s, d, _ in case.inputs]
    out = case.texpr(*phs)
    h = te.placeholder(out.shape, "H", "float32")
    head = np.random.default_rng(1).standard_normal(out.shape).astype("float32")
    wrt = [p for p, (_, _, _, d) in zip(phs, case.inputs) if d]
    grads = list(te.differentiate(out, wrt, head=h).result)
    ins = phs + [h]
    with codegen.options(**variant_options(variant)):
        kernels = [codegen.build([t], ins) for t in [out] + grads]
        kernels.append(codegen.build([out] + grads, ins))
    labels = ["fwd"] + ["d" + p.name for p in wrt] + ["all"]
    return labels, kernels, list(arrays) + [head]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="+", help="codegen.Options fields as keyword arguments "
                    "(\"unroll=4, chunks=False\"), or \"pass\" for the defaults")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args(argv)
    # (the symbolic cache keys a lowered program by its Options too: no variant
    # gets another's program)
    cases = make_cases(args.scale)
    names = [n for n in args.cases.split(",") if n] or list(cases)
    for name in names:
        built = {v: case_kernels(cases[name], v) for v in args.variants}
        labels, _, feed = built[args.variants[0]]
        ref = [k(*feed) for k in built[args.variants[0]][1]]
        times = {v: [[] for _ in labels] for v in args.variants}
        for rnd in range(args.repeat + 1):
            for v in args.variants:
                for j, k in enumerate(built[v][1]):
                    t = time.perf_counter()
                    got = k(*feed)
                    if rnd == 0:  # warm-up round: check against the first variant
                        for g, r in zip(got, ref[j]):
                            err = np.abs(g - r).max() / max(float(np.abs(r).max()), 1e-30)
                            if err > 1e-4:
                                print(f"{name} [{v}] {labels[j]}: differs by {err:.1e}")
                    else:
                        times[v][j].append(time.perf_counter() - t)
        for v in args.variants:
            print(f"{name:20s} [{v}] " + " ".join(
                f"{lab} {np.median(ts) * 1e3:.2f}" for lab, ts in zip(labels, times[v])),
                flush=True)


if __name__ == "__main__":
    main()
