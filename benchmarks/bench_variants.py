"""Before/after timings of codegen tuning knobs, in one process, runs alternating.

Each *variant* is a Python statement run with ``L`` bound to :mod:`codegen.loopnest.stage`,
``T`` to :mod:`codegen.rewrite.tap_split`, ``W`` to :mod:`codegen.rewrite.windows` and ``S`` to
:mod:`codegen.analysis.shifts` (their upper-case constants are reset between variants),
e.g. ``"L.SPLIT_LANES = 10**6"`` (turns the grouped reductions off), ``"T.ENABLED =
W.ENABLED = False"`` (no tap splitting, no window stages) or ``"pass"`` (the defaults). For every case
of the gradient suite (docs/testing.md) the forward value and each gradient are built as separate kernels,
plus one kernel computing them all (as bench_suite.py times them); the variants'
kernels run in turn, ``--repeat`` rounds, so that a shared machine's load
weighs on all alike. Prints median ms per kernel and variant; results are
checked against the first variant's.

    python benchmarks/bench_variants.py --cases dense,cumsum "L.SPLIT_LANES = 10**6" pass
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from texpr import codegen  # noqa: E402
import texpr.codegen.loopnest.stage as L  # noqa: E402 - the tuning constants live there
import texpr.codegen.analysis.shifts as S  # noqa: E402
import texpr.codegen.rewrite.tap_split as T  # noqa: E402
import texpr.codegen.rewrite.windows as W  # noqa: E402
import texpr as te  # noqa: E402
from cases import make_cases, random_inputs  # noqa: E402

#: the modules whose knobs a variant may set, by the name it sees them under
MODULES = {"L": L, "T": T, "W": W, "S": S}


def _knobs():
    return {(m, k): getattr(mod, k) for m, mod in MODULES.items() for k in dir(mod)
            if k.isupper()}


def _reset(defaults):
    for (m, k), v in defaults.items():
        setattr(MODULES[m], k, v)


def case_kernels(case, variant, defaults):
    """``(labels, kernels, args)`` of one case built under ``variant``."""
    arrays = random_inputs(case)
    phs = [te.placeholder(s, n, d) for n, s, d, _ in case.inputs]
    out = case.texpr(*phs)
    h = te.placeholder(out.shape, "H", "float32")
    head = np.random.default_rng(1).standard_normal(out.shape).astype("float32")
    wrt = [p for p, (_, _, _, d) in zip(phs, case.inputs) if d]
    grads = list(te.differentiate(out, wrt, head=h).result)
    ins = phs + [h]
    _reset(defaults)
    try:
        exec(variant, dict(MODULES))  # noqa: S102 - a developer's own command line
        kernels = [codegen.build([t], ins) for t in [out] + grads]
        kernels.append(codegen.build([out] + grads, ins))
    finally:
        _reset(defaults)
    labels = ["fwd"] + ["d" + p.name for p in wrt] + ["all"]
    return labels, kernels, list(arrays) + [head]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="+", help="Python statements on L = codegen.loopnest.stage, "
                    "T = codegen.rewrite.tap_split, W = codegen.rewrite.windows, S = codegen.analysis.shifts")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args(argv)
    # the symbolic cache keys lowered programs by the graph, not by these knobs:
    # with it, every variant would get the first variant's program
    os.environ["TEXPR_SYMBOLIC_CACHE"] = "0"
    cases = make_cases(args.scale)
    names = [n for n in args.cases.split(",") if n] or list(cases)
    defaults = _knobs()
    for name in names:
        built = {v: case_kernels(cases[name], v, defaults) for v in args.variants}
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
