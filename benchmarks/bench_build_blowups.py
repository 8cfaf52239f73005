"""Cold build time of the two small programs whose builds blew up (issue 51).

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

``--no-hoist`` sets ``simplify.hoist.HOIST_TREE_NODES`` out of reach in the
workers: the builds as they were before the hoisting rule.

Command (OpenBLAS's core-type overrides removed for the benchmark only)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/shared/tools/quiet-run \\
        python benchmarks/bench_build_blowups.py [--cases gs_zeros,gs_reflection] [--no-hoist]

Timings drift with the machine's load: compare numbers from one run only.

Measured on the shared 2-core machine, 2026-12-07, quiet-run, one run after
the other (load average 6.2-8.7; seconds are differentiate + build, cold)::

    case                  before (--no-hoist)         after
    gs_zeros                9.4 s   314 MB   6 units    10.9 s  314 MB   6 units
    gs_reflection         127.0 s  2607 MB   7 units    13.0 s  386 MB  13 units
    gs_zeros_staged         6.8 s   252 MB   8 units     7.7 s  252 MB   8 units
    gs_reflection_staged    7.0 s   208 MB  10 units     8.0 s  208 MB  10 units
    bilateral              12.9 s   253 MB  22 units    13.1 s  261 MB  29 units
    bilateral_float        15.9 s   256 MB  22 units    13.5 s  267 MB  29 units

Reflection against zero padding: 13.5x before, 1.2x after. The reflection
sampler's gradient unit was 170 KB of source before (its grid gradient written
out as a tree: 11,619 nodes), 48 KB after (991 nodes; zero padding's: 1,227).
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
