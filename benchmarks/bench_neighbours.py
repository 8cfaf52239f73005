"""PyTorch's training step beside texpr in one process, against PyTorch alone (issue 48:
texpr must not slow its neighbours).

The PyTorch step is bench_digits_step.py's (the digits CNN, batch 64: forward,
``loss.backward()``, SGD), on ``--threads`` threads. It is timed:

* **alone**: back to back, in a process of its own that never imports texpr's
  code generator (as PyTorch's users run it);
* **beside texpr**, in one process that imports ``texpr.codegen`` first (so
  that numba, texpr's chunked units and PyTorch share one GNU OpenMP runtime,
  the case where a process-wide OpenMP setting reaches PyTorch), right after:

  - ``solo``: another PyTorch step (back to back);
  - ``pause``: a busy wait of about a texpr digits step's length (what any
    neighbour that leaves PyTorch's workers idle for 2 ms costs it);
  - ``digits``: the digits step's texpr kernel (``parallel=True``; its GEMMs
    are too small for OpenBLAS's workers);
  - ``dense``: the value and gradient of bench_suite's ``dense`` case (256x784
    @ 784x128 float32, GEMMs OpenBLAS runs on its workers), which parks them
    when it returns (codegen/backends/numpy_host/parking.py);
  - ``dense, no park``: the same kernel with parking off for the call
    (the kernel's ``Options.park_blas``): the workers spin about 0.1 s.

  Blocks of ``--steps`` pairs (neighbour, then the timed PyTorch step) rotate
  over the five in each of ``--rounds`` rounds, with 0.15 s of sleep after a
  block so that no spinning worker reaches the next. texpr's
  ``Options.gemm_threads`` is ``--gemm-threads``, 1 by default: one call on the BLAS's own threads,
  what texpr's default picks on a machine whose load average is below its
  cores, fixed here so that a loaded machine measures the same path.

Each configuration runs in a fresh process, with PyTorch alone run again
between them (the load drifts):

* ``now``: texpr as it is (no OpenMP setting);
* ``torch-first``: the same, with PyTorch imported before texpr (numba then
  loads a second GNU OpenMP runtime: two thread pools share the cores);
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` in the environment, what importing
  texpr's code generator set for the whole process before (issue 48).

Measured 2026-12-07 on the 2-core machine while other jobs kept its load
average at 4-6 (no quiet window that day; 8 rounds x 10 steps): PyTorch alone
0.87 ms; beside texpr (``now``) 0.93 ms back to back (1.07x), 1.01 after a
pause (1.16x), 1.42 after the digits kernel (1.63x), 1.58 after the dense
kernel (1.81x) and 3.93 after the dense kernel with parking off (4.52x); with
``OMP_WAIT_POLICY=PASSIVE`` (texpr's setting before) 3.0-8.0 ms (3.4-9.2x).
Figures at that load move by 20-50% from run to run, and one process in ten
ran PyTorch's step at about 200 ms (alone too), so rerun on a quiet machine
before quoting a ratio against the issue's target.

Printed: medians in ms, PyTorch's step beside texpr / alone (the issue's
target: at most 1.1), and texpr's own kernel times per configuration (they
must not regress). Run quietly and without the machine's OpenBLAS overrides::

    /work/shared/tools/quiet-run env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \\
        python benchmarks/bench_neighbours.py
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CONFIGS = {
    "now": {},
    "torch-first": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
NEIGHBOURS = ("solo", "pause", "digits", "dense", "dense, no park")


def _digits_setup(batch):
    from texpr.examples import digits

    images, labels = digits.load_digits()
    x = digits.Model.inputs(images[:batch]).astype("float32")
    y = labels[:batch]
    model = digits.Model(batch, "float32")
    return model, model.init_weights(np.random.default_rng(0)), x, y


def worker(args):
    """One configuration, in this process: prints one JSON line of medians (ms)."""
    import bench_digits_step as bd

    if args.worker == "alone":
        model, params, x, y = _digits_setup(args.batch)
        step = bd.torch_step(params, x, y, args.threads)
        from cases import median_ms
        ms = median_ms(step, args.rounds * args.steps)
        assert "texpr.codegen" not in sys.modules
        print(json.dumps({"alone": ms}))
        return
    if args.worker == "torch-first":
        import torch
        torch.ones(2).add_(1)  # PyTorch's own OpenMP runtime loads before numba's
    from texpr import codegen  # (before PyTorch: one OpenMP runtime)
    import numba
    import texpr as te
    from bench_suite import texpr_value_and_grad
    from cases import make_cases, random_inputs

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    with codegen.options(gemm_threads=args.gemm_threads):  # the kernels keep it
        model, params, x, y = _digits_setup(args.batch)
        digits_step = bd.texpr_step(model, params, x, y, parallel=True)
        case = make_cases(1.0)["dense"]
        arrays = random_inputs(case)
        phs = [te.placeholder(shape, name, dtype) for name, shape, dtype, _ in case.inputs]
        head = np.random.default_rng(1).standard_normal(case.texpr(*phs).shape).astype("float32")
        dense_kernel, _, dense = texpr_value_and_grad(case, arrays, head)
    torch_step = bd.torch_step(params, x, y, args.threads)
    for _ in range(5):
        torch_step(), digits_step(), dense()
    pause_s = float(np.median([_timed(digits_step) for _ in range(20)]))

    def pause():
        t = time.perf_counter()
        while time.perf_counter() - t < pause_s:
            pass
    from texpr.codegen.backends.numpy_host import parking
    parked = dense_kernel.options

    def spinning():  # the dense kernel with OpenBLAS's workers left to spin
        dense_kernel.options = parked.replace(park_blas=False)
        try:
            dense()
        finally:
            dense_kernel.options = parked
    before = {"solo": None, "pause": pause, "digits": digits_step, "dense": dense,
              "dense, no park": spinning}
    after = {k: [] for k in NEIGHBOURS}
    own = {k: [] for k in own_keys()}
    for r in range(args.rounds):
        for k in NEIGHBOURS[r % len(NEIGHBOURS):] + NEIGHBOURS[:r % len(NEIGHBOURS)]:
            for _ in range(args.steps):
                if before[k] is not None:
                    t = _timed(before[k])
                    if k in own:
                        own[k].append(t)
                after[k].append(_timed(torch_step))
            time.sleep(0.15)  # OpenBLAS's workers stop spinning before the next block
    out = {f"torch after {k}": _ms(v) for k, v in after.items()}
    out.update({f"texpr {k}": _ms(v) for k, v in own.items()})
    out["parks"] = parking._PARKS[0]
    out["load"] = os.getloadavg()[0]
    out["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY")
    print(json.dumps(out))


def own_keys():
    """The texpr kernels timed in a worker."""
    return ("digits", "dense", "dense, no park")


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _ms(ts):
    return float(np.median(ts)) * 1e3


def _run(name, args):
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    env.update(CONFIGS.get(name, {}))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
           "--rounds", str(args.rounds), "--steps", str(args.steps),
           "--batch", str(args.batch), "--threads", str(args.threads),
           "--gemm-threads", str(args.gemm_threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: worker failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20, help="PyTorch steps per neighbour and round")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's, numba's and BLAS's threads")
    ap.add_argument("--gemm-threads", type=int, default=1,
                    help="texpr's codegen Options.gemm_threads (0: its default, by the load)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    os.environ.setdefault("TEXPR_CACHE_DIR", os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "texpr-bench-neighbours"))
    print(f"PyTorch's digits CNN step (batch {args.batch}, {args.threads} threads) beside "
          f"texpr vs alone; {args.rounds} rounds x {args.steps} steps; load average "
          f"{os.getloadavg()[0]:.2f}")
    alone = [_run("alone", args)["alone"]]
    rows = {}
    for name in args.configs.split(","):
        rows[name] = _run(name, args)
        alone.append(_run("alone", args)["alone"])  # alone between configurations: drift
    ref = float(np.median(alone))
    print(f"  torch alone (own process): {ref:.3f} ms (median of {len(alone)} processes: "
          + ", ".join(f"{a:.3f}" for a in alone) + ")")
    print("  PyTorch's step, ms (and / alone), right after:")
    print(f"  {'config':12s}" + "".join(f"{k:>17s}" for k in NEIGHBOURS) + "   load")
    for name, r in rows.items():
        cells = "".join(f"{r['torch after ' + k]:9.3f} {r['torch after ' + k] / ref:5.2f}x "
                        for k in NEIGHBOURS)
        print(f"  {name:12s}{cells}  {r['load']:.1f}")
    print("  texpr's kernels, ms:")
    print(f"  {'config':12s}" + "".join(f"{k:>17s}" for k in own_keys()) + "   parks")
    for name, r in rows.items():
        print(f"  {name:12s}" + "".join(f"{r['texpr ' + k]:17.3f}" for k in own_keys())
              + f"   {r['parks']}")
    print(f"  (PyTorch's step in ms and / alone; the target beside texpr is <= 1.1x; load "
          f"average now {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
