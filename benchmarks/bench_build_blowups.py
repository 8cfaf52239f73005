"""Cold build time of the programs whose builds blew up (issues 51 and 50).

Each case is ``te.differentiate`` (value and every gradient) + ``codegen.build``
of a program from tests/sampler_programs.py, in a fresh process with an empty
cache directory (kernel and symbolic caches), so numba's start-up in a process
is counted. Reported: seconds of the two phases, the peak resident memory of the
process, the numba units' count and total source size, and the load average
before the case.

* ``gs_zeros`` / ``gs_reflection``: ``grid_sample`` of a 3-channel 6x7 image
  on a 5x4 grid, bilinear, zero or reflection padding, the sample coordinates
  written inside the sampling stage (values and gradients of X and G).
* ``gs_zeros_staged`` / ``gs_reflection_staged``: the same, the coordinates
  written as stages of their own.
* ``bilateral``: a bilateral grid of an 8x8 image (scatter at a data-dependent
  bin, three 5-tap blurs, trilinear slice; the gradient of the image);
  ``bilateral_float``: its slice computes the cell in y and x through floating point.
* ``stacked_lstm``: 6 LSTM layers in one scan of 1,024 steps (12 coupled states, 14
  inputs; batch 4, hidden 16), the gradient of every input (issue 50's "bounded
  code per unit" case: once a 1.31 MB unit numba ran out of memory on).

``--no-hoist`` sets ``simplify.hoist.HOIST_TREE_NODES`` out of reach in the
workers: the builds as they were before the hoisting rule.

Command (OpenBLAS's core-type overrides removed for the benchmark only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/shared/tools/quiet-run \\
        python benchmarks/bench_build_blowups.py [--cases gs_zeros,gs_reflection] [--no-hoist]

Timings drift with the machine's load: compare numbers from one run only.

Measured on the shared 2-core machine, 2026-12-07 20:00-20:04 UTC, quiet-run,
"after" then "before" in one run (load average at each case's start in brackets;
seconds are differentiate + build, cold)::

    case                  before (--no-hoist)                after
    gs_zeros                8.7 s   314 MB   6 units [5.4]    8.8 s  314 MB   6 units [5.0]
    gs_reflection         109.8 s  2615 MB   7 units [5.2]   10.9 s  386 MB  13 units [5.1]
    gs_zeros_staged        10.1 s   252 MB   8 units [8.2]    6.0 s  252 MB   8 units [5.5]
    gs_reflection_staged   10.1 s   208 MB  10 units [8.7]    6.0 s  208 MB  10 units [5.5]
    bilateral              18.0 s   253 MB  22 units [9.5]    9.6 s  253 MB  22 units [5.4]
    bilateral_float        20.7 s   256 MB  22 units [11.4]  10.5 s  256 MB  22 units [5.4]

``stacked_lstm`` on 2026-12-07 23:39 UTC (load 2.1): differentiate 1.4 s, build 73.8 s,
peak 1,895 MB, 23 units of 126 KB source in all (issue 50's target: under 2 minutes and
4 GB; numba once ran out of memory on its 1.31 MB parameter-adjoint unit).

(The staged samplers and the bilateral grids build the same units before and
after: their differences are the load's.) Reflection against zero padding:
12.6x before, 1.24x after. The reflection sampler's grid-gradient unit was 170 KB
of source before (its body written out as a tree: 11,619 nodes), 46 KB after
(991 nodes; zero padding's: 44 KB, 1,227 nodes). An earlier run at load 5.5-6.5
gave 127.0 -> 13.0 s against 9.4-10.9 s for zero padding.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CASES = {
    "gs_zeros": ("grid_sample", dict(padding="zeros")),
    "gs_reflection": ("grid_sample", dict(padding="reflection")),
    "gs_zeros_staged": ("grid_sample", dict(padding="zeros", staged=True)),
    "gs_reflection_staged": ("grid_sample", dict(padding="reflection", staged=True)),
    "bilateral": ("bilateral_grid", {}),
    "bilateral_float": ("bilateral_grid", dict(float_coords=True)),
    "stacked_lstm": ("stacked_lstm", {}),
}


def job(name, no_hoist):
    """Build one case in this (fresh) process; prints a JSON line of its figures."""
    import resource
    import time

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import sampler_programs

    import texpr as te
    from texpr import codegen
    from texpr.simplify import hoist

    if no_hoist:
        hoist.HOIST_TREE_NODES = 1 << 62
    fn, kw = CASES[name]
    inputs, loss = getattr(sampler_programs, fn)(**kw)
    wrt = inputs[:-1]
    t0 = time.perf_counter()
    res = te.differentiate(loss, wrt)
    t1 = time.perf_counter()
    kernel = codegen.build([res.value] + list(res.result), inputs)
    t2 = time.perf_counter()
    units = [u for u in kernel._program.units if u.kind == "numba"]
    print(json.dumps(dict(
        case=name, differentiate_s=round(t1 - t0, 2), build_s=round(t2 - t1, 2),
        total_s=round(t2 - t0, 2),
        peak_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        units=len(units), source_kb=round(sum(len(u.module_source) for u in units) / 1024, 1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--no-hoist", action="store_true")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.job, args.no_hoist)
        return
    rows = []
    print(f"{'case':22s} {'diff s':>7s} {'build s':>8s} {'total s':>8s} {'peak MB':>8s} "
          f"{'units':>5s} {'src KB':>7s}  load (1, 5, 15 min) before")
    for name in args.cases.split(","):
        load = os.getloadavg()
        cache = tempfile.mkdtemp(prefix="texpr-blowup-")
        env = dict(os.environ, TEXPR_CACHE_DIR=cache)
        cmd = [sys.executable, os.path.abspath(__file__), "--job", name]
        if args.no_hoist:
            cmd.append("--no-hoist")
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load"] = [round(x, 2) for x in load]
        row["hoist"] = not args.no_hoist
        rows.append(row)
        print(f"{name:22s} {row['differentiate_s']:7.1f} {row['build_s']:8.1f} "
              f"{row['total_s']:8.1f} {row['peak_mb']:8d} {row['units']:5d} "
              f"{row['source_kb']:7.1f}  {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
